// LayerNorm over the last dimension, fp32.
//
// Notation: rows = tokens in the slice (s/M * b, the [s, b, h] activation viewed as [rows, h]), h = hidden.
//
//   mean[r] = (1/h) sum_j x[r, j]
//   var[r]  = (1/h) sum_j (x[r, j] - mean[r])^2      biased (divide by h); fp32, corrected two-pass
//   rstd[r] = 1 / sqrt(var[r] + eps)                  eps is added to the variance, inside the sqrt
//   y[r, j] = (x[r, j] - mean[r]) * rstd[r] * gamma[j] + beta[j]
//
// All tensors are fp32 and contiguous: x, y, dy, dx are 2-D [rows, h] (use Tensor::view to flatten [s, b, h]);
// gamma, beta, dgamma_accum, dbeta_accum are 1-D [h]; mean, rstd are 1-D [rows].
#pragma once

#include "ampipe/core/tensor.h"

namespace ampipe::kernels {

// y: [rows, h], mean, rstd: [rows]; all three are overwritten. mean and rstd are the saved context read by
// layernorm_backward. y may alias x (in place).
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                       Tensor& mean, Tensor& rstd);

// With xhat = (x - mean) * rstd and g = dy * gamma:
//   dx     = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))   overwritten, or added (+=) when accumulate_dx
//   dgamma += sum_r dy * xhat,   dbeta += sum_r dy              always accumulate (chunks and micro-batches sum)
// accumulate_dx = true is for residual paths: dx += LN'(dy) where dx already holds the other branch's gradient.
// dx must not alias dy or x.
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma_accum, Tensor& dbeta_accum,
                        bool accumulate_dx = false);

}  // namespace ampipe::kernels
