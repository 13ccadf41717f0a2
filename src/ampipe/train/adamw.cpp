#include "ampipe/train/adamw.h"

#include "ampipe/kernels/adamw.h"

#include "ampipe/core/error.h"

#include <cmath>
#include <numbers>

namespace ampipe::train {

double learning_rate(const TrainConfig& cfg, int64_t it) {
  const int64_t W = cfg.lr_warmup_iters, D = cfg.lr_decay_iters > 0 ? cfg.lr_decay_iters : cfg.train_iters;
  if (it < W) return cfg.lr * double(it + 1) / double(W);
  if (cfg.lr_decay_style == "constant" || D <= W) return cfg.lr;
  const double ratio = std::min(1.0, double(it - W) / double(D - W));
  const double coeff =
      cfg.lr_decay_style == "linear" ? 1.0 - ratio : 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return cfg.min_lr + (cfg.lr - cfg.min_lr) * coeff;
}

AdamW::AdamW(const std::vector<NamedParam>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    seg_.push_back({i, 0, params[i].param.numel()});
    m_.push_back(Tensor::zeros(params[i].param.shape()));
    v_.push_back(Tensor::zeros(params[i].param.shape()));
  }
}

AdamW::AdamW(const std::vector<NamedParam>& params, std::vector<AdamWSegment> segments) : seg_(std::move(segments)) {
  for (const AdamWSegment& s : seg_) {
    AMPIPE_CHECK(s.param < params.size() && 0 <= s.begin && s.begin < s.end && s.end <= params[s.param].param.numel(),
                 "AdamW segment [{}, {}) of parameter {} is out of range", s.begin, s.end, s.param);
    m_.push_back(Tensor::zeros({s.end - s.begin}));
    v_.push_back(Tensor::zeros({s.end - s.begin}));
  }
}

void AdamW::step(std::vector<NamedParam>& params, double lr, double weight_decay, double beta1, double beta2,
                 double eps, float clip_coef) {
  ++t_;
  kernels::AdamWScalars sc;
  sc.b1 = float(beta1);
  sc.b2 = float(beta2);
  const float bc1 = float(1.0 - std::pow(beta1, double(t_))), bc2 = float(1.0 - std::pow(beta2, double(t_)));
  sc.step_size = float(lr) / bc1;
  sc.inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  sc.eps = float(eps);
  sc.clip_coef = clip_coef;
  for (size_t k = 0; k < seg_.size(); ++k) {
    const AdamWSegment& s = seg_[k];
    NamedParam& np = params[s.param];
    sc.decay = np.decay ? float(1.0 - lr * weight_decay) : 1.0f;
    if (m_[k].shape() == np.param.shape()) {
      kernels::adamw_update(np.param, np.grad, m_[k], v_[k], sc);
    } else {
      Tensor p = np.param.view({np.param.numel()}).rows(s.begin, s.end);
      const Tensor g = np.grad.view({np.grad.numel()}).rows(s.begin, s.end);
      kernels::adamw_update(p, g, m_[k], v_[k], sc);
    }
  }
}

}  // namespace ampipe::train
