// This rank's peak memory in `ampipe train`, estimated before the model is built (docs/training.md, "Memory"): the
// layer stack's part (schedule/memory_estimate.h: layer parameters, gradients, bf16 copies, the Plan's planned
// activation and communication buffers) plus what the trainer holds around it: the embedding, position embedding,
// final LayerNorm and (untied) output layer with their gradients; AdamW's two fp32 moments of every local
// parameter; the flat gradient buffers of the data-parallel all-reduce (one fp32 copy of every local gradient);
// the head's buffers (logits [T, V], the [T, h] LayerNorm input and output gradients, the embedding output, the
// upstream gradient, sequence parallelism's gathers); the data order (one int64 per training sample); and, with
// --save or --load, the checkpoint's buffers (a save gathers every sharded tensor and both its moments whole and
// builds the optimizer file in memory; a load reads the optimizer file whole and parses it).
// All in overflow-checked arithmetic: a size that does not fit is a ConfigError naming the flags.
#pragma once

#include <cstdint>

#include "ampipe/schedule/memory_estimate.h"
#include "ampipe/train/train_config.h"

namespace ampipe::train {

// cfg.vocab_size must be the data's (it is after load_corpus). train_samples: the samples of the training split
// (the data order's permutation); 0 if unknown.
// world: the ranks (with --use-distributed-optimizer the AdamW state is 1/(dp x cp) of the dense parameters' and
// 1/(dp x cp / ep) of the experts', train/grad_layout.h; padding aside).
// Pipeline stages (--pipeline-model-parallel-size): the estimate of stage `stage` (its layers, the embedding on the
// first, the head on the last, the received activations it keeps), or with stage -1 of the stage whose total is the
// largest.
schedule::MemoryEstimate estimate_train_memory(const TrainConfig& cfg, int64_t train_samples = 0, int world = 1,
                                               int stage = -1);

}  // namespace ampipe::train
