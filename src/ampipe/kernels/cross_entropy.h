// Softmax cross-entropy over a vocabulary, fp32, numerically stable (max-subtracted log-sum-exp).
//
// Notation: rows = tokens (s * b flattened, or a slice of them), V = vocabulary size.
// logits, dlogits: fp32 contiguous 2-D [rows, V]; loss, lse, dloss: fp32 contiguous 1-D [rows];
// targets: int32 [rows], each in [0, V) or kIgnoreIndex.
#pragma once

#include <cstdint>
#include <span>

#include "ampipe/core/tensor.h"

namespace ampipe::kernels {

// A target equal to this contributes loss 0 and gradient 0 (padding, or positions without a label).
inline constexpr int32_t kIgnoreIndex = -1;

//   m[r]    = max_j logits[r, j]
//   lse[r]  = m[r] + log(sum_j exp(logits[r, j] - m[r]))
//   loss[r] = lse[r] - logits[r, targets[r]],   or 0 when targets[r] == kIgnoreIndex
// loss and lse are overwritten (lse is written for ignored rows too); lse is the saved context for the backward.
// Per-row losses: the caller reduces them (sum or mean over non-ignored rows) and scales dloss to match.
void cross_entropy_forward(const Tensor& logits, std::span<const int32_t> targets, Tensor& loss, Tensor& lse);

//   dlogits[r, j] = (exp(logits[r, j] - lse[r]) - [j == targets[r]]) * dloss[r]
// and 0 for the whole row when targets[r] == kIgnoreIndex. dlogits is overwritten and may alias logits.
void cross_entropy_backward(const Tensor& dloss, const Tensor& logits, std::span<const int32_t> targets,
                            const Tensor& lse, Tensor& dlogits);

}  // namespace ampipe::kernels
