// Rotary position embeddings (RoPE, Megatron's --position-embedding-type rope): q and k of every head rotated, pair
// by pair, by an angle proportional to the token's position, so that q_i . k_j depends on i - j only.
//
// Notation: d head dim, r = rot_dim rotated channels of each head (Megatron: int(d * --rotary-percent); the channels
// [r, d) pass through), f_i = 1 / base^(2i / r) for i < r/2 (fp32, as Megatron computes its inv_freq), p the
// token's position (times 1 / --rotary-seq-len-interpolation-factor), angle a_i = p * f_i in fp32.
// Each pair (x, y) of channels becomes (x cos a_i - y sin a_i, y cos a_i + x sin a_i); the pair of frequency i is
// (i, i + r/2) (Megatron's and Hugging Face's rotate_half, the default) or (2i, 2i + 1) (--rotary-interleaved).
// The inverse (angle -a_i) is the transpose: the backward rotates dq, dk with it.
// Llama 3's frequency scaling (--use-rope-scaling, --rope-scaling-factor) rescales f_i once, as Megatron does
// (low-frequency factor 1, high 4, original context 8192).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ampipe/core/tensor.h"

namespace ampipe::kernels {

struct RopeSpec {
  int64_t rot_dim = 0;  // rotated channels per head (even, <= d); 0: no rotary embedding
  double base = 10000;  // --rotary-base
  bool interleaved = false;          // --rotary-interleaved
  double position_scale = 1.0;       // 1 / --rotary-seq-len-interpolation-factor
  bool llama3_scaling = false;       // --use-rope-scaling
  double scaling_factor = 8.0;       // --rope-scaling-factor
  bool on() const { return rot_dim > 0; }
};

// f_i for i < rot_dim / 2 (fp32, after Llama 3's scaling if set).
std::vector<float> rope_inv_freq(const RopeSpec& spec);

// Rotates, in place, the `heads` heads of head dim d in x [rows * b, heads * d] (fp32, any row stride, e.g. the q or
// k columns of a fused qkv buffer): row i*b + bb has position positions[i]. inverse: by -a (the gradient).
void rope_apply(const RopeSpec& spec, Tensor& x, int64_t heads, int64_t d, int64_t b,
                std::span<const int64_t> positions, bool inverse);

}  // namespace ampipe::kernels
