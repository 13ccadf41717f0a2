// Megatron-LM launch-script flags that `ampipe train` accepts with Megatron's meaning (docs/training.md, "Megatron
// launch scripts"): --max-position-embeddings, --train-samples, --split, --attention-dropout, --distributed-backend.
// Their rules live here, apart from TrainConfig::validate's AMPipe rules, which calls validate_megatron_args.
#pragma once

#include <string>

#include "ampipe/train/text_data.h"
#include "ampipe/train/train_config.h"

namespace ampipe::train {

// The rules of the flags above (ConfigError naming the flag, the value and the rule).
void validate_megatron_args(const TrainConfig& c);
// The data split: --split when given, else 1 - --valid-fraction, --valid-fraction, 0.
DataSplit data_split(const TrainConfig& c);
// --train-samples N (Megatron: train for N samples): sets train_iters = N / global batch for `world` ranks; a
// remainder is not trained (Megatron's integer division). ConfigError when N is below one global batch.
void resolve_train_samples(TrainConfig& c, int world);

}  // namespace ampipe::train
