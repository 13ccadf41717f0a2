// Sequence parallelism's row layout (docs/ampipe.md, "Tensor and sequence parallelism"). With tp ranks t and AMPipe
// degree M, tp rank r holds s/t of the s sequence positions of an [s, b, h] activation: for every chunk c (positions
// [c*s/M, (c+1)*s/M)) its r-th sub-block of s/(M*t) positions, chunks in order. So every AMPipe chunk is spread
// over all tp ranks (MindSpeed's permuted layout), and at M = 1 this is Megatron's contiguous split. The layer's
// outputs and everything exported are in the natural order; only the residual stream between layers is permuted.
#pragma once

#include "ampipe/core/tensor.h"

namespace ampipe::model {

// Rank r's rows [s/t, b, h] of a natural-order activation [s, b, h] (the _into forms write a given tensor).
Tensor sequence_shard(const Tensor& full, int M, int t, int r);
void sequence_shard_into(const Tensor& full, Tensor& out, int M, int t, int r);
// The natural-order [s, b, h] activation from every rank's rows, `shards` = [t * s/t, b, h] in tp-rank order
// (an all-gather of sequence_shard's results).
Tensor sequence_unshard(const Tensor& shards, int M, int t);
void sequence_unshard_into(const Tensor& shards, Tensor& out, int M, int t);

}  // namespace ampipe::model
