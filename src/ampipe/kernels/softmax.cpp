#include "ampipe/kernels/softmax.h"
#include "ampipe/kernels/checks.h"
#include "ampipe/core/parallel.h"

#include <algorithm>
#include <cmath>

namespace ampipe::kernels {
namespace {
using detail::check_f32;
using detail::check_2d;
}  // namespace

void softmax_row(float* row, int64_t n) {
  float mx = row[0];
  for (int64_t j = 1; j < n; ++j) mx = std::fmax(mx, row[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
}

void softmax_backward_row(const float* y, const float* dy, float* dx, int64_t n) {
  float dot = 0.0f;
  for (int64_t j = 0; j < n; ++j) dot += dy[j] * y[j];
  for (int64_t j = 0; j < n; ++j) dx[j] = y[j] * (dy[j] - dot);
}

void topk_row(const float* row, int64_t n, int64_t k, int32_t* idx) {
  for (int64_t i = 0; i < k; ++i) {
    // Scan in ascending index order and replace only on strictly greater: the lowest index wins ties.
    int32_t best = -1;
    for (int64_t j = 0; j < n; ++j) {
      bool taken = false;
      for (int64_t q = 0; q < i; ++q) taken |= idx[q] == int32_t(j);
      if (!taken && (best < 0 || row[j] > row[best])) best = int32_t(j);
    }
    idx[i] = best;
  }
}

void softmax_forward(const Tensor& x, Tensor& y) {
  check_2d(x, "softmax_forward", "x");
  const int64_t rows = x.size(0), n = x.size(1);
  AMPIPE_CHECK(n > 0, "softmax_forward: 0 columns");
  check_f32(x, "softmax_forward", "x", {rows, n});
  check_f32(y, "softmax_forward", "y", {rows, n});
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  parallel_for(rows, rows_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (yp != xp) std::copy(xp + r * n, xp + (r + 1) * n, yp + r * n);
      softmax_row(yp + r * n, n);
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
  parallel_for(rows, rows_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) softmax_backward_row(yp + r * n, dyp + r * n, dxp + r * n, n);
  });
}

void topk_rows(const Tensor& probs, int k, std::span<int32_t> idx, Tensor& val) {
  check_2d(probs, "topk_rows", "probs");
  const int64_t rows = probs.size(0), e = probs.size(1);
  AMPIPE_CHECK(1 <= k && k <= e, "topk_rows: k = {} must be in [1, E = {}]", k, e);
  check_f32(probs, "topk_rows", "probs", {rows, e});
  check_f32(val, "topk_rows", "val", {rows, int64_t(k)});
  AMPIPE_CHECK(int64_t(idx.size()) == rows * k, "topk_rows: idx has {} elements, want rows {} x k {}",
               idx.size(), rows, k);
  const float* pp = probs.data<float>();
  float* vp = val.data<float>();
  parallel_for(rows, rows_grain(4 * e), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* pr = pp + r * e;
      for (int64_t j = 0; j < e; ++j) AMPIPE_CHECK(!std::isnan(pr[j]), "topk_rows: NaN at row {} column {}", r, j);
      int32_t* ir = idx.data() + r * k;
      topk_row(pr, e, k, ir);
      for (int i = 0; i < k; ++i) vp[r * k + i] = pr[ir[i]];
    }
  });
}

}  // namespace ampipe::kernels
