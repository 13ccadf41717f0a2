#include "ampipe/train/megatron_args.h"

#include <cmath>
#include <utility>

#include "ampipe/core/error.h"

namespace ampipe::train {

void validate_megatron_args(const TrainConfig& c) {
  const int64_t s = c.layer.seq_length;
  if (c.max_position_embeddings < 0 || (c.max_position_embeddings > 0 && c.max_position_embeddings < s))
    throw ConfigError(fmt::format("--max-position-embeddings {} is invalid: it must be >= --seq-length {} (a position "
                                  "embedding row per position of a sequence)",
                                  c.max_position_embeddings, s));
  if (c.distributed_backend != "mpi")  // (the flags turn Megatron's nccl and gloo into mpi, with a note)
    throw ConfigError(fmt::format("--distributed-backend {} is not supported: this engine communicates over MPI only "
                                  "(pass mpi, Megatron's nccl or gloo, or leave the flag out)",
                                  c.distributed_backend));
  if (c.train_samples < 0)
    throw ConfigError(fmt::format("--train-samples {} is invalid: it must be >= 1", c.train_samples));
  if (!c.split.empty()) (void)parse_split(c.split);
  // --no-load-optim, --finetune and --use-checkpoint-args without --load (or with a --load directory that holds no
  // checkpoint yet) are no-ops, as in Megatron: there is nothing to load.
  (void)c.moe_layers();  // --moe-layer-freq, --first-k-dense-replace against --num-layers
}

DataSplit data_split(const TrainConfig& c) {
  if (c.valid_fraction > 0 || c.split.empty()) return DataSplit{1.0 - c.valid_fraction, c.valid_fraction, 0.0};
  return parse_split(c.split);
}

void resolve_train_samples(TrainConfig& c, int world) {
  if (c.train_samples <= 0) return;
  const int64_t G = c.global_batch(world);
  if (c.train_samples < G)
    throw ConfigError(fmt::format("--train-samples {} is invalid: it is fewer than one global batch ({} sequences; "
                                  "--train-iters = --train-samples / global batch)",
                                  c.train_samples, G));
  c.train_iters = c.train_samples / G;
}

}  // namespace ampipe::train
