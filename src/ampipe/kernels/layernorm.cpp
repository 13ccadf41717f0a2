#include "ampipe/kernels/layernorm.h"
#include "ampipe/kernels/checks.h"
#include "ampipe/kernels/lanes.h"
#include "ampipe/core/parallel.h"

#include <algorithm>
#include <cmath>

namespace ampipe::kernels {
namespace {
using detail::kLanes;
using detail::lane_sum;
using detail::sum_lanes;

void check_f32(const Tensor& t, const char* name, const Shape& want) { detail::check_f32(t, "layernorm", name, want); }
}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                       Tensor& mean, Tensor& rstd) {
  AMPIPE_CHECK(x.dim() == 2, "layernorm_forward: x must be 2-D [rows, h], got {}", shape_str(x.shape()));
  const int64_t rows = x.size(0), h = x.size(1);
  AMPIPE_CHECK(h > 0, "layernorm_forward: h = 0");
  check_f32(x, "x", {rows, h});
  check_f32(gamma, "gamma", {h});
  check_f32(beta, "beta", {h});
  check_f32(y, "y", {rows, h});
  check_f32(mean, "mean", {rows});
  check_f32(rstd, "rstd", {rows});
  const float* xp = x.data<float>();
  const float* gp = gamma.data<float>();
  const float* bp = beta.data<float>();
  float* yp = y.data<float>();
  float* mp = mean.data<float>();
  float* rp = rstd.data<float>();
  const float inv_h = 1.0f / float(h);
  parallel_for(rows, rows_grain(h), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * h;
      float* yr = yp + r * h;
      // Corrected two-pass (Chan, Golub & LeVeque): m0 = sum(x)/h, then over d = x - m0 accumulate sum(d) and
      // sum(d^2); mean = m0 + sum(d)/h and var = (sum(d^2) - sum(d)^2/h)/h. No cancellation when |mean| >> std, and
      // the rounding error of the first pass's mean is removed by the second.
      const int64_t hv = h - h % kLanes;
      const float m0 = sum_lanes(h, [&](int64_t j) { return xr[j]; }) * inv_h;
      float accd[kLanes] = {}, accq[kLanes] = {};
      for (int64_t j = 0; j < hv; j += kLanes)
        for (int l = 0; l < kLanes; ++l) {
          const float d = xr[j + l] - m0;
          accd[l] += d;
          accq[l] += d * d;
        }
      for (int64_t j = hv; j < h; ++j) {
        const float d = xr[j] - m0;
        accd[j - hv] += d;
        accq[j - hv] += d * d;
      }
      const float sd = lane_sum(accd), sq = lane_sum(accq);
      const float m = m0 + sd * inv_h;
      const float var = std::max(0.0f, (sq - sd * sd * inv_h) * inv_h);
      const float rs = 1.0f / std::sqrt(var + eps);
      for (int64_t j = 0; j < h; ++j) yr[j] = (xr[j] - m) * rs * gp[j] + bp[j];
      mp[r] = m;
      rp[r] = rs;
    }
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma_accum, Tensor& dbeta_accum,
                        bool accumulate_dx) {
  AMPIPE_CHECK(x.dim() == 2, "layernorm_backward: x must be 2-D [rows, h], got {}", shape_str(x.shape()));
  const int64_t rows = x.size(0), h = x.size(1);
  AMPIPE_CHECK(h > 0, "layernorm_backward: h = 0");
  check_f32(dy, "dy", {rows, h});
  check_f32(x, "x", {rows, h});
  check_f32(gamma, "gamma", {h});
  check_f32(mean, "mean", {rows});
  check_f32(rstd, "rstd", {rows});
  check_f32(dx, "dx", {rows, h});
  check_f32(dgamma_accum, "dgamma_accum", {h});
  check_f32(dbeta_accum, "dbeta_accum", {h});
  const float* dyp = dy.data<float>();
  const float* xp = x.data<float>();
  const float* gp = gamma.data<float>();
  const float* mp = mean.data<float>();
  const float* rp = rstd.data<float>();
  float* dxp = dx.data<float>();
  float* dgp = dgamma_accum.data<float>();
  float* dbp = dbeta_accum.data<float>();
  const float inv_h = 1.0f / float(h);
  // dgamma, dbeta: summed over the rows in row order, the columns spread over the threads (the same sums at any
  // thread count). First, since dx may alias dy.
  parallel_for(h, kColumnGrain, [&](int64_t j0, int64_t j1) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* dyr = dyp + r * h;
      const float* xr = xp + r * h;
      const float m = mp[r], rs = rp[r];
      for (int64_t j = j0; j < j1; ++j) {
        dgp[j] += dyr[j] * ((xr[j] - m) * rs);
        dbp[j] += dyr[j];
      }
    }
  });
  parallel_for(rows, rows_grain(h), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* dyr = dyp + r * h;
      const float* xr = xp + r * h;
      float* dxr = dxp + r * h;
      const float m = mp[r], rs = rp[r];
      const int64_t hv = h - h % kLanes;
      float acc_g[kLanes] = {}, acc_gx[kLanes] = {};
      for (int64_t j = 0; j < hv; j += kLanes)
        for (int l = 0; l < kLanes; ++l) {
          const float xhat = (xr[j + l] - m) * rs;
          const float g = dyr[j + l] * gp[j + l];
          acc_g[l] += g;
          acc_gx[l] += g * xhat;
        }
      for (int64_t j = hv; j < h; ++j) {
        const float xhat = (xr[j] - m) * rs;
        const float g = dyr[j] * gp[j];
        acc_g[j - hv] += g;
        acc_gx[j - hv] += g * xhat;
      }
      const float sum_g = lane_sum(acc_g), sum_gx = lane_sum(acc_gx);
      const float mean_g = sum_g * inv_h, mean_gx = sum_gx * inv_h;
      if (accumulate_dx) {
        for (int64_t j = 0; j < h; ++j) {
          const float xhat = (xr[j] - m) * rs;
          dxr[j] += rs * (dyr[j] * gp[j] - mean_g - xhat * mean_gx);
        }
      } else {
        for (int64_t j = 0; j < h; ++j) {
          const float xhat = (xr[j] - m) * rs;
          dxr[j] = rs * (dyr[j] * gp[j] - mean_g - xhat * mean_gx);
        }
      }
    }
  });
}

}  // namespace ampipe::kernels
