// The `ampipe` command line: subcommands, flags with Megatron / MindSpeed spellings, validation and output.
// User errors (ConfigError) print one line "ampipe: error: ..." and exit with code 2.
#pragma once

namespace ampipe::cli {

int main(int argc, char** argv);

}  // namespace ampipe::cli
