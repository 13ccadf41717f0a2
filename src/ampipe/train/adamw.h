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

// A slice of one parameter that the optimizer updates: elements [begin, end) of parameter `param`'s flat
// (row-major) data. The distributed optimizer (train/grad_layout.h) gives each data-parallel rank the slices of its
// shard; without it every parameter is one whole segment.
struct AdamWSegment {
  size_t param = 0;
  int64_t begin = 0, end = 0;
};

class AdamW {
 public:
  AdamW() = default;
  // Every parameter whole: segment i is parameter i, and its moments have the parameter's shape.
  explicit AdamW(const std::vector<NamedParam>& params);
  // These slices only (the distributed optimizer): segment k's moments are [end - begin] vectors.
  AdamW(const std::vector<NamedParam>& params, std::vector<AdamWSegment> segments);
  // One update of every segment with its gradient (the same elements of the parameter's grad) times clip_coef.
  void step(std::vector<NamedParam>& params, double lr, double weight_decay, double beta1, double beta2, double eps,
            float clip_coef);
  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  const std::vector<AdamWSegment>& segments() const { return seg_; }
  // exp_avg / exp_avg_sq of segment k (whole parameters: of parameter k, in its local shape).
  Tensor& exp_avg(size_t k) { return m_[k]; }
  Tensor& exp_avg_sq(size_t k) { return v_[k]; }

 private:
  std::vector<AdamWSegment> seg_;
  std::vector<Tensor> m_, v_;
  int64_t t_ = 0;
};

}  // namespace ampipe::train
