// Dropout with a position-keyed mask, fp32. No mask is stored: the backward regenerates it.
//
// Notation: rows = tokens of the slice, h = features (hidden). x, y, dy, dx, residual: fp32, contiguous, 2-D
// [rows, h] (use Tensor::view to flatten [s, b, h]; the flattened row index is the token index t = s_i * b + b_i).
//
// The rule, exactly (so another framework can reproduce it bit for bit):
//   token t   = token_begin + r        global token index of row r (row 0 of this slice is token_begin)
//   feature f = j                      column index in [0, h)
//   u         = core::philox_uniform(key, t, f)
//             = float(w >> 8) * 2^-24, w = word (f & 3) of Philox-4x32-10 with
//               counter (f >> 2, t mod 2^32, (key.layer << 8) | key.purpose, t >> 32),
//               key (key.seed mod 2^32, key.seed >> 32)        (see core/philox.h)
//   keep      = (u >= p)                                       fp32 comparison; p is the drop probability
//   scale     = 1.0f / (1.0f - p)                              computed in fp32
//   m         = keep ? scale : 0.0f
//   y[r, j]   = x[r, j] * m                                    one fp32 multiply (a dropped -x gives -0.0,
//                                                              a dropped inf or NaN gives NaN, as x*mask*scale)
//   dropout_add_forward: y[r, j] = residual[r, j] + x[r, j] * m, the product rounded to fp32 before the add
//                                                              (never fused into an FMA)
// p must be in [0, 1]. p == 0 keeps everything with scale 1, so y == x exactly (the kernels then skip Philox);
// p == 1 drops everything. The mask depends only on (seed, layer, purpose, token, feature): never on call order,
// on how rows are chunked, or on which rank computes them.
#pragma once

#include <cstdint>

#include "ampipe/core/philox.h"
#include "ampipe/core/tensor.h"

namespace ampipe::kernels {

// The keep decision of one element, as defined above.
inline bool dropout_keep(const core::PhiloxKey& key, uint64_t token, uint64_t feature, float p) {
  return core::philox_uniform(key, token, feature) >= p;
}

// m[i] = (keep(key, token, feature0 + i) ? 1 / (1 - p) : 0) for i < n, the rule above for n consecutive features of
// one token (one Philox call per 4 features; feature0 need not be a multiple of 4). p in [0, 1).
void dropout_mask(const core::PhiloxKey& key, uint64_t token, uint64_t feature0, int64_t n, float p, float* m);

// y = dropout(x), overwritten; y may alias x.
void dropout_forward(const Tensor& x, float p, const core::PhiloxKey& key, uint64_t token_begin, Tensor& y);

// y = residual + dropout(x), overwritten (the residual-stream form after attention and after the MoE);
// y may alias x or residual. Its backward: d residual = dy, dx = dropout_backward(dy).
void dropout_add_forward(const Tensor& x, const Tensor& residual, float p, const core::PhiloxKey& key,
                         uint64_t token_begin, Tensor& y);

// dx = dy * m with the same m as the forward (same p, key, token_begin); overwritten, or added (+=) when
// accumulate. dx may alias dy (only without accumulate).
void dropout_backward(const Tensor& dy, float p, const core::PhiloxKey& key, uint64_t token_begin, Tensor& dx,
                      bool accumulate = false);

}  // namespace ampipe::kernels
