#include "ampipe/cli/app.h"

int main(int argc, char** argv) { return ampipe::cli::main(argc, argv); }
