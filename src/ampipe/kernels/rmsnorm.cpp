#include "ampipe/kernels/rmsnorm.h"
#include "ampipe/kernels/checks.h"
#include "ampipe/kernels/lanes.h"
#include "ampipe/core/parallel.h"

#include <cmath>

namespace ampipe::kernels {
namespace {
using detail::sum_lanes;

void check_f32(const Tensor& t, const char* name, const Shape& want) { detail::check_f32(t, "rmsnorm", name, want); }
}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, Tensor& y, Tensor& rstd) {
  AMPIPE_CHECK(x.dim() == 2, "rmsnorm_forward: x must be 2-D [rows, h], got {}", shape_str(x.shape()));
  const int64_t rows = x.size(0), h = x.size(1);
  AMPIPE_CHECK(h > 0, "rmsnorm_forward: h = 0");
  check_f32(x, "x", {rows, h});
  check_f32(gamma, "gamma", {h});
  check_f32(y, "y", {rows, h});
  check_f32(rstd, "rstd", {rows});
  const float* xp = x.data<float>();
  const float* gp = gamma.data<float>();
  float* yp = y.data<float>();
  float* rp = rstd.data<float>();
  const float inv_h = 1.0f / float(h);
  parallel_for(rows, rows_grain(h), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * h;
      const float rs = 1.0f / std::sqrt(sum_lanes(h, [&](int64_t j) { return xr[j] * xr[j]; }) * inv_h + eps);
      float* yr = yp + r * h;
      for (int64_t j = 0; j < h; ++j) yr[j] = xr[j] * rs * gp[j];
      rp[r] = rs;
    }
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd, Tensor& dx,
                      Tensor& dgamma_accum, bool accumulate_dx) {
  AMPIPE_CHECK(x.dim() == 2, "rmsnorm_backward: x must be 2-D [rows, h], got {}", shape_str(x.shape()));
  const int64_t rows = x.size(0), h = x.size(1);
  AMPIPE_CHECK(h > 0, "rmsnorm_backward: h = 0");
  check_f32(dy, "dy", {rows, h});
  check_f32(x, "x", {rows, h});
  check_f32(gamma, "gamma", {h});
  check_f32(rstd, "rstd", {rows});
  check_f32(dx, "dx", {rows, h});
  check_f32(dgamma_accum, "dgamma_accum", {h});
  const float* dyp = dy.data<float>();
  const float* xp = x.data<float>();
  const float* gp = gamma.data<float>();
  const float* rp = rstd.data<float>();
  float* dxp = dx.data<float>();
  float* dgp = dgamma_accum.data<float>();
  const float inv_h = 1.0f / float(h);
  // dgamma: summed over the rows in row order, the columns spread over the threads (as in layernorm.cpp). First,
  // since dx may alias dy.
  parallel_for(h, kColumnGrain, [&](int64_t j0, int64_t j1) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* dyr = dyp + r * h;
      const float* xr = xp + r * h;
      const float rs = rp[r];
      for (int64_t j = j0; j < j1; ++j) dgp[j] += dyr[j] * (xr[j] * rs);
    }
  });
  parallel_for(rows, rows_grain(h), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* dyr = dyp + r * h;
      const float* xr = xp + r * h;
      float* dxr = dxp + r * h;
      const float rs = rp[r];
      // mean_j(g * xhat) = rstd * mean_j(dy * gamma * x)
      const float s = sum_lanes(h, [&](int64_t j) { return dyr[j] * gp[j] * xr[j]; });
      const float mean_gx = s * rs * inv_h;
      for (int64_t j = 0; j < h; ++j) {
        const float xhat = xr[j] * rs;
        const float d = rs * (dyr[j] * gp[j] - xhat * mean_gx);
        dxr[j] = accumulate_dx ? dxr[j] + d : d;
      }
    }
  });
}

}  // namespace ampipe::kernels
