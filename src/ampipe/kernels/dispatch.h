// Dispatch and combine in index form (docs/layer.md §6.4): the row gathers and scatters between a chunk's tokens and
// the experts' capacity slots, given a routing (model/gate.h computes it; model/dispatch.h adapts it).
//
// Notation: S = tokens of the call (one AMPipe chunk: S_c), h = hidden, E = experts, C = capacity, k = choices.
//   dispatch:  D[e, c, :] = x[slot_token[e, c], :]                 (empty slot: zero)      [S, h] -> [E, C, h]
//   combine:   out[t, :]  = sum_{kept choices i} w[t, i] * Y[e_i, slot_i, :]  (none kept: zero)  [E, C, h] -> [S, h]
// Each kept choice occupies exactly one slot and each filled slot names exactly one token, so dispatch is a
// gather with a scatter-add backward, and combine is a weighted gather. Loops over rows (each row a contiguous
// h-vector), spread over the threads with the same sums at any thread count (core/parallel.h); no allocation.
#pragma once

#include <cstdint>
#include <vector>

#include "ampipe/core/tensor.h"

namespace ampipe::kernels {

// A routing, viewed: arrays owned by the caller.
struct Routing {
  int64_t S = 0, E = 0, k = 0, C = 0;
  const int32_t* expert = nullptr;      // [S, k] chosen expert (also for dropped choices)
  const int32_t* slot = nullptr;        // [S, k] slot in [0, C), or -1 if dropped
  const float* weight = nullptr;        // [S, k] combine weight; 0 if dropped
  const int32_t* slot_token = nullptr;  // [E, C] source token of each slot, or -1 if empty
};

// x: [S, h] fp32 or bf16 (any row stride); out: [E, C, h] contiguous, fp32 or bf16 (converted), overwritten.
void dispatch_forward(const Tensor& x, const Routing& r, Tensor& out);
// d_out: [E, C, h] fp32 contiguous; dx_accum: [S, h] fp32, accumulated (+=) at each filled slot's token, each
// token's slots added in slot order.
void dispatch_backward(const Tensor& d_out, const Routing& r, Tensor& dx_accum);

// y: [E, C, h] fp32 contiguous (expert outputs after the combine all-to-all); out: [S, h] fp32 or bf16
// (any row stride), overwritten; sums in fp32.
void combine_forward(const Tensor& y, const Routing& r, Tensor& out);
// d_out: [S, h] fp32 (any row stride); y: as in the forward.
// dy: [E, C, h] fp32 contiguous, overwritten: w[t, i] * d_out[t] at each kept choice's slot, zero elsewhere.
// d_weight: [S, k] fp32 contiguous, overwritten: <d_out[t], y[e_i, slot_i]> for kept choices, 0 for dropped ones.
void combine_backward(const Tensor& d_out, const Tensor& y, const Routing& r, Tensor& dy, Tensor& d_weight);

// The packing between buffer layouts (a chunk's [E, C, h] slots, the pieces of an all-to-all buffer, the experts'
// rows): rows [src_row, src_row + rows) of src into rows [dst_row, dst_row + rows) of dst, for every block, dtypes
// converted as Tensor::copy_from does. src and dst are 2-D with the same columns; blocks must not overlap in dst.
// The blocks are spread over the threads (each copied whole by one), in one parallel loop.
struct RowBlock {
  int64_t src_row = 0, dst_row = 0, rows = 0;
};
void copy_row_blocks(const Tensor& src, Tensor& dst, const std::vector<RowBlock>& blocks);

}  // namespace ampipe::kernels
