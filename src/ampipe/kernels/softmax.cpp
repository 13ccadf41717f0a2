#include "ampipe/kernels/softmax.h"
#include "ampipe/kernels/checks.h"
#include "ampipe/core/parallel.h"

#include <cmath>

namespace ampipe::kernels {
namespace {
using detail::check_f32;
using detail::check_2d;
}  // namespace

void softmax_forward(const Tensor& x, Tensor& y) {
  check_2d(x, "softmax_forward", "x");
  const int64_t rows = x.size(0), n = x.size(1);
  AMPIPE_CHECK(n > 0, "softmax_forward: 0 columns");
  check_f32(x, "softmax_forward", "x", {rows, n});
  check_f32(y, "softmax_forward", "y", {rows, n});
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  parallel_for(rows, rows_grain(n), [&](int64_t r0_, int64_t r1_) {
    for (int64_t r = r0_; r < r1_; ++r) {
      const float* xr = xp + r * n;
      float* yr = yp + r * n;
      float mx = xr[0];
      for (int64_t j = 1; j < n; ++j) mx = std::fmax(mx, xr[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        yr[j] = std::exp(xr[j] - mx);
        sum += yr[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < n; ++j) yr[j] *= inv;
    }
  });
}

void softmax_backward(const Tensor& dy, const Tensor& y, Tensor& dx) {
  check_2d(y, "softmax_backward", "y");
  const int64_t rows = y.size(0), n = y.size(1);
  check_f32(dy, "softmax_backward", "dy", {rows, n});
  check_f32(y, "softmax_backward", "y", {rows, n});
  check_f32(dx, "softmax_backward", "dx", {rows, n});
  const float* dyp = dy.data<float>();
  const float* yp = y.data<float>();
  float* dxp = dx.data<float>();
  parallel_for(rows, rows_grain(n), [&](int64_t r0_, int64_t r1_) {
    for (int64_t r = r0_; r < r1_; ++r) {
      const float* dyr = dyp + r * n;
      const float* yr = yp + r * n;
      float* dxr = dxp + r * n;
      float dot = 0.0f;
      for (int64_t j = 0; j < n; ++j) dot += dyr[j] * yr[j];
      for (int64_t j = 0; j < n; ++j) dxr[j] = yr[j] * (dyr[j] - dot);
    }
  });
}

void topk_rows(const Tensor& probs, int k, std::span<int32_t> idx, Tensor& val) {
  check_2d(probs, "topk_rows", "probs");
  const int64_t rows = probs.size(0), e = probs.size(1);
  AMPIPE_CHECK(1 <= k && k <= e, "topk_rows: k = {} must be in [1, E = {}]", k, e);
  AMPIPE_CHECK(e <= 1024, "topk_rows: E = {} is above 1024; this selection is O(k E) per row", e);
  check_f32(probs, "topk_rows", "probs", {rows, e});
  check_f32(val, "topk_rows", "val", {rows, int64_t(k)});
  AMPIPE_CHECK(int64_t(idx.size()) == rows * k, "topk_rows: idx has {} elements, want rows {} x k {}",
               idx.size(), rows, k);
  const float* pp = probs.data<float>();
  float* vp = val.data<float>();
  parallel_for(rows, rows_grain(4 * e), [&](int64_t r0_, int64_t r1_) {
    bool taken[1024];
    for (int64_t r = r0_; r < r1_; ++r) {
      const float* pr = pp + r * e;
      for (int64_t j = 0; j < e; ++j) {
        AMPIPE_CHECK(!std::isnan(pr[j]), "topk_rows: NaN at row {} column {}", r, j);
        taken[j] = false;
      }
      for (int i = 0; i < k; ++i) {
        // Scan in ascending index order and replace only on strictly greater: the lowest index wins ties.
        int64_t best = -1;
        for (int64_t j = 0; j < e; ++j)
          if (!taken[j] && (best < 0 || pr[j] > pr[best])) best = j;
        taken[best] = true;
        idx[size_t(r * k + i)] = int32_t(best);
        vp[r * k + i] = pr[best];
      }
    }
  });
}

}  // namespace ampipe::kernels
