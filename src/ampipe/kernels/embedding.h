// Token + position embedding, forward and backward (fp32).
//
// Notation: T rows (tokens), h hidden, V vocabulary, b micro-batch; row t of the [s, b] layout sits at sequence row
// t / b, whose position is pos[t / b].
//   forward:  x[t] = wte[tokens[t]] + wpe[pos[t / b]]                      x [T, h] overwritten
//   backward: dwte[tokens[t]] += dx[t],  dwpe[pos[t / b]] += dx[t]          dwte [V, h], dwpe [P, h] accumulated
// Without a position table (wpe, dwpe undefined: rotary or no position embeddings) the wpe terms are left out.
// A token outside [0, V) stops with its value and row.
#pragma once

#include <cstdint>
#include <span>

#include "ampipe/core/tensor.h"

namespace ampipe::kernels {

void embedding_forward(const Tensor& wte, const Tensor& wpe, std::span<const int32_t> tokens,
                       std::span<const int64_t> pos, int64_t b, Tensor& x);
void embedding_backward(const Tensor& dx, std::span<const int32_t> tokens, std::span<const int64_t> pos, int64_t b,
                        Tensor& dwte_accum, Tensor& dwpe_accum);

}  // namespace ampipe::kernels
