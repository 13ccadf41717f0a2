#include "ampipe/kernels/adamw.h"

#include <cmath>

#include "ampipe/core/error.h"
#include "ampipe/core/parallel.h"

namespace ampipe::kernels {

void adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWScalars& s) {
  const int64_t n = param.numel();
  AMPIPE_CHECK(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n,
               "adamw_update: param {} grad {} exp_avg {} exp_avg_sq {} elements", n, grad.numel(), exp_avg.numel(),
               exp_avg_sq.numel());
  float* __restrict__ p = param.data<float>();
  const float* __restrict__ g = grad.data<float>();
  float* __restrict__ m = exp_avg.data<float>();
  float* __restrict__ v = exp_avg_sq.data<float>();
  parallel_for(n, kElementGrain, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const float gk = g[k] * s.clip_coef;
      m[k] = s.b1 * m[k] + (1.0f - s.b1) * gk;
      v[k] = s.b2 * v[k] + (1.0f - s.b2) * gk * gk;
      p[k] = p[k] * s.decay - s.step_size * m[k] / (std::sqrt(v[k]) * s.inv_sqrt_bc2 + s.eps);
    }
  });
}

}  // namespace ampipe::kernels
