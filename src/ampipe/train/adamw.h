// AdamW (Loshchilov & Hutter; torch.optim.AdamW's update order) on fp32 master weights, and the learning-rate
// schedule (linear warm-up, then Megatron's --lr-decay-style: constant, linear or cosine to --min-lr).
//
// The parameters are the fp32 tensors the layers read (in --bf16 mode each layer step makes its bf16 GEMM copies
// from them), so they are the master weights; the optimizer state (exp_avg, exp_avg_sq) is fp32 too.
//
//   step t (1-based): g = clip_coef * grad
//   p  *= 1 - lr * weight_decay                       (decoupled; only for params with decay = true)
//   m   = beta1 m + (1 - beta1) g;    v = beta2 v + (1 - beta2) g^2
//   p  -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
#pragma once

#include <cstdint>
#include <vector>

#include "ampipe/core/tensor.h"
#include "ampipe/train/gpt_model.h"
#include "ampipe/train/train_config.h"

namespace ampipe::train {

// lr of iteration it (0-based), Megatron's schedule: lr * (it + 1) / W during the warm-up (W = --lr-warmup-iters),
// then, with D = --lr-decay-iters (0: --train-iters) and r = min(1, (it - W) / (D - W)):
//   constant: lr;  linear: min_lr + (lr - min_lr) * (1 - r);  cosine: min_lr + (lr - min_lr) * (1 + cos(pi r)) / 2.
// After D the decaying styles stay at min_lr.
double learning_rate(const TrainConfig& cfg, int64_t it);

class AdamW {
 public:
  explicit AdamW(const std::vector<NamedParam>& params);
  // One update of every parameter with its gradient times clip_coef.
  void step(std::vector<NamedParam>& params, double lr, double weight_decay, double beta1, double beta2, double eps,
            float clip_coef);
  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  // exp_avg / exp_avg_sq of parameter i (same local shapes as the parameter).
  Tensor& exp_avg(size_t i) { return m_[i]; }
  Tensor& exp_avg_sq(size_t i) { return v_[i]; }

 private:
  std::vector<Tensor> m_, v_;
  int64_t t_ = 0;
};

}  // namespace ampipe::train
