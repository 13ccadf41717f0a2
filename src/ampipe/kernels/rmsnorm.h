// RMSNorm over the last dimension, fp32 (Megatron-Core's --normalization RMSNorm, Zhang & Sennrich 2019).
//
// Notation as layernorm.h: x, y, dy, dx are 2-D [rows, h]; gamma, dgamma_accum [h]; rstd [rows].
//
//   ms[r]   = (1/h) sum_j x[r, j]^2                 fp32, kLanes partial sums in a fixed order
//   rstd[r] = 1 / sqrt(ms[r] + eps)                 eps inside the sqrt (Megatron-Core, Apex, Hugging Face)
//   y[r, j] = x[r, j] * rstd[r] * gamma[j]           no mean subtraction, no bias
//
// Backward, with xhat = x * rstd and g = dy * gamma:
//   dx      = rstd * (g - xhat * mean_j(g * xhat))  overwritten, or added (+=) when accumulate_dx
//   dgamma += sum_r dy * xhat                        always accumulates (chunks and micro-batches sum)
#pragma once

#include "ampipe/core/tensor.h"

namespace ampipe::kernels {

// y: [rows, h], rstd: [rows]; both overwritten (rstd is the saved context of the backward). y may alias x.
void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, Tensor& y, Tensor& rstd);

// dx must not alias dy or x.
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd, Tensor& dx,
                      Tensor& dgamma_accum, bool accumulate_dx = false);

}  // namespace ampipe::kernels
