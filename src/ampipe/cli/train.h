// `ampipe train`: trains a GPT-MoE on the bundled corpus or --data-path (docs/training.md).
#pragma once

#include "ampipe/cli/train_flags.h"

namespace ampipe::cli {

int run_train(TrainFlags& flags);

}  // namespace ampipe::cli
