// The GEMM forms the blocks use (in the layer's compute context, LayerState::ctx), and the one way a value reaches
// the compute dtype.
#pragma once

#include "ampipe/kernels/gemm.h"
#include "ampipe/model/layer_state.h"

namespace ampipe::model {

// y = x W^T for x [rows, in] and W [out, in] (overwritten).
inline void linear_forward(const Tensor& x, const Tensor& w, Tensor& y, kernels::ComputeContext& ctx) {
  kernels::gemm(x, kernels::Trans::n, w, kernels::Trans::t, y, false, 1.0f, ctx);
}
// dx = dy W (overwritten).
inline void linear_input_grad(const Tensor& dy, const Tensor& w, Tensor& dx, kernels::ComputeContext& ctx) {
  kernels::gemm(dy, kernels::Trans::n, w, kernels::Trans::n, dx, false, 1.0f, ctx);
}
// dW += dy^T x (rows of dy and x: the GEMM's K, so the more rows per call the better).
inline void linear_weight_grad(const Tensor& dy, const Tensor& x, Tensor& dw_accum, kernels::ComputeContext& ctx) {
  kernels::gemm(dy, kernels::Trans::t, x, kernels::Trans::n, dw_accum, /*accumulate=*/true, 1.0f, ctx);
}

// Linear biases (--add-bias-linear): y[r, :] += b for every row of y (fp32, [rows, k], rows may be strided), and
// db += the column sums of dy (fp32 or bf16; the bias gradient, accumulated in fp32).
void add_bias(Tensor y, const Tensor& b);
void add_column_sums(const Tensor& dy, Tensor& db);

// The same three forms for a batch of `n` experts at once (--moe-grouped-gemm): x, w, y are expert 0's matrices and
// expert i's start sx, sw, sy elements after expert i-1's, in the same buffers.
inline void grouped_linear_forward(const Tensor& x, int64_t sx, const Tensor& w, int64_t sw, Tensor& y, int64_t sy,
                                   int64_t n, kernels::ComputeContext& ctx) {
  kernels::gemm_batched(x, kernels::Trans::n, w, kernels::Trans::t, y, n, sx, sw, sy, false, ctx);
}
inline void grouped_linear_weight_grad(const Tensor& dy, int64_t sdy, const Tensor& x, int64_t sx, Tensor& dw_accum,
                                       int64_t sdw, int64_t n, kernels::ComputeContext& ctx) {
  kernels::gemm_batched(dy, kernels::Trans::t, x, kernels::Trans::n, dw_accum, n, sdy, sx, sdw, /*accumulate=*/true,
                        ctx);
}

// `src` itself in fp32 mode; in bf16 mode its copy, converted (bf16 rounds to nearest even, fp32 widens exactly),
// in buffer `copy`: the whole buffer for chunk c (converted), or rows of chunk c of a [T, *] buffer
// (converted_rows).
inline Tensor converted(const LayerState& s, const Tensor& src, Buf copy, int c) {
  if (!s.bf16()) return src;
  Tensor dst = s.mem.get(copy, c);
  dst.copy_from(src);
  return dst;
}
inline Tensor converted_rows(const LayerState& s, const Tensor& src, Buf copy, int c) {
  if (!s.bf16()) return src;
  Tensor dst = s.rows(copy, c);
  dst.copy_from(src);
  return dst;
}

}  // namespace ampipe::model
