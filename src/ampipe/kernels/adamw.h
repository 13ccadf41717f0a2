// The AdamW update of one fp32 tensor (Loshchilov & Hutter; torch.optim.AdamW's order), given the step's scalars.
// train/adamw.h computes those from the hyper-parameters and the step count and walks the parameters.
//
//   g = clip_coef * grad;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p * decay - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
// with step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t), decay = 1 - lr * weight_decay (1 for
// tensors without weight decay). param, m, v are updated in place; grad is read. All fp32, contiguous, one shape.
#pragma once

#include "ampipe/core/tensor.h"

namespace ampipe::kernels {

struct AdamWScalars {
  float b1 = 0.9f, b2 = 0.999f;
  float step_size = 0, inv_sqrt_bc2 = 1, eps = 1e-8f;
  float decay = 1, clip_coef = 1;
};

void adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWScalars& s);

}  // namespace ampipe::kernels
