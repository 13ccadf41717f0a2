// The products below must round to fp32 before any add (the documented rule); the project builds with
// gnu++20, whose default -ffp-contract=fast would fuse residual + x * m into an FMA.
#pragma GCC optimize("fp-contract=off")

#include "ampipe/kernels/dropout.h"
#include "ampipe/kernels/checks.h"
#include "ampipe/core/parallel.h"

#include <algorithm>

namespace ampipe::kernels {
namespace {
using detail::check_f32;

constexpr int64_t kBlock = 256;  // features per mask block (a multiple of 4: one Philox call per 4 features)

// m[i] for features [f0, f0 + n) of token t, n <= kBlock, f0 % 4 == 0. Same numbers as philox_uniform(key, t, f)
// (tests compare them), but one Philox call per 4 features instead of one per feature.
void mask_block(const core::PhiloxKey& key, uint64_t t, int64_t f0, int64_t n, float p, float scale, float* m) {
  const std::array<uint32_t, 2> k{uint32_t(key.seed), uint32_t(key.seed >> 32)};
  const uint32_t c2 = (key.layer << 8) | uint32_t(key.purpose);
  for (int64_t i = 0; i < n; i += 4) {
    const uint64_t f = uint64_t(f0 + i);
    const core::Philox4 w = core::philox4x32_10({uint32_t(f >> 2), uint32_t(t), c2, uint32_t(t >> 32)}, k);
    const int64_t lanes = std::min<int64_t>(4, n - i);
    for (int64_t q = 0; q < lanes; ++q) {
      const float u = float(w[size_t(q)] >> 8) * (1.0f / 16777216.0f);
      m[i + q] = u >= p ? scale : 0.0f;
    }
  }
}

// Calls body(row, col0, n, m) for every block of every row, m = the block's multipliers; rows spread over the
// threads (each row's mask depends on its token only).
template <typename Body>
void for_each_mask_block(int64_t rows, int64_t h, float p, const core::PhiloxKey& key, uint64_t token_begin,
                         Body&& body) {
  const float scale = 1.0f / (1.0f - p);
  parallel_for(rows, rows_grain(h), [&](int64_t r0, int64_t r1) {
    alignas(64) float m[kBlock];
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j0 = 0; j0 < h; j0 += kBlock) {
        const int64_t n = std::min(kBlock, h - j0);
        mask_block(key, token_begin + uint64_t(r), j0, n, p, scale, m);
        body(r, j0, n, m);
      }
  });
}


void check_p(float p, const char* op) {
  AMPIPE_CHECK(p >= 0.0f && p <= 1.0f, "{}: dropout probability p = {} is outside [0, 1]", op, p);
}
}  // namespace

void dropout_mask(const core::PhiloxKey& key, uint64_t token, uint64_t feature0, int64_t n, float p, float* m) {
  check_p(p, "dropout_mask");
  const float scale = 1.0f / (1.0f - p);
  const std::array<uint32_t, 2> k{uint32_t(key.seed), uint32_t(key.seed >> 32)};
  const uint32_t c2 = (key.layer << 8) | uint32_t(key.purpose);
  int64_t i = 0;
  while (i < n) {
    const uint64_t f = feature0 + uint64_t(i);
    const core::Philox4 w = core::philox4x32_10({uint32_t(f >> 2), uint32_t(token), c2, uint32_t(token >> 32)}, k);
    for (uint64_t lane = f & 3; lane < 4 && i < n; ++lane, ++i) {
      const float u = float(w[size_t(lane)] >> 8) * (1.0f / 16777216.0f);
      m[i] = u >= p ? scale : 0.0f;
    }
  }
}

void dropout_forward(const Tensor& x, float p, const core::PhiloxKey& key, uint64_t token_begin, Tensor& y) {
  check_p(p, "dropout_forward");
  AMPIPE_CHECK(x.dim() == 2, "dropout_forward: x must be 2-D [rows, h], got {}", shape_str(x.shape()));
  const int64_t rows = x.size(0), h = x.size(1);
  check_f32(x, "dropout_forward", "x", {rows, h});
  check_f32(y, "dropout_forward", "y", {rows, h});
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  if (p == 0.0f) {
    if (yp != xp)
      parallel_for(rows * h, kElementGrain, [&](int64_t i0, int64_t i1) { std::copy(xp + i0, xp + i1, yp + i0); });
    return;
  }
  for_each_mask_block(rows, h, p, key, token_begin, [&](int64_t r, int64_t j0, int64_t n, const float* m) {
    const float* xr = xp + r * h + j0;
    float* yr = yp + r * h + j0;
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * m[i];
  });
}

void dropout_add_forward(const Tensor& x, const Tensor& residual, float p, const core::PhiloxKey& key,
                         uint64_t token_begin, Tensor& y) {
  check_p(p, "dropout_add_forward");
  AMPIPE_CHECK(x.dim() == 2, "dropout_add_forward: x must be 2-D [rows, h], got {}", shape_str(x.shape()));
  const int64_t rows = x.size(0), h = x.size(1);
  check_f32(x, "dropout_add_forward", "x", {rows, h});
  check_f32(residual, "dropout_add_forward", "residual", {rows, h});
  check_f32(y, "dropout_add_forward", "y", {rows, h});
  const float* xp = x.data<float>();
  const float* rp = residual.data<float>();
  float* yp = y.data<float>();
  if (p == 0.0f) {
    parallel_for(rows * h, kElementGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) yp[i] = rp[i] + xp[i];
    });
    return;
  }
  for_each_mask_block(rows, h, p, key, token_begin, [&](int64_t r, int64_t j0, int64_t n, const float* m) {
    const float* xr = xp + r * h + j0;
    const float* rr = rp + r * h + j0;
    float* yr = yp + r * h + j0;
    for (int64_t i = 0; i < n; ++i) yr[i] = rr[i] + xr[i] * m[i];
  });
}

void dropout_backward(const Tensor& dy, float p, const core::PhiloxKey& key, uint64_t token_begin, Tensor& dx,
                      bool accumulate) {
  check_p(p, "dropout_backward");
  AMPIPE_CHECK(dy.dim() == 2, "dropout_backward: dy must be 2-D [rows, h], got {}", shape_str(dy.shape()));
  const int64_t rows = dy.size(0), h = dy.size(1);
  check_f32(dy, "dropout_backward", "dy", {rows, h});
  check_f32(dx, "dropout_backward", "dx", {rows, h});
  const float* dyp = dy.data<float>();
  float* dxp = dx.data<float>();
  if (p == 0.0f) {
    if (accumulate)
      parallel_for(rows * h, kElementGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) dxp[i] += dyp[i];
      });
    else if (dxp != dyp)
      parallel_for(rows * h, kElementGrain,
                   [&](int64_t i0, int64_t i1) { std::copy(dyp + i0, dyp + i1, dxp + i0); });
    return;
  }
  for_each_mask_block(rows, h, p, key, token_begin, [&](int64_t r, int64_t j0, int64_t n, const float* m) {
    const float* dyr = dyp + r * h + j0;
    float* dxr = dxp + r * h + j0;
    if (accumulate)
      for (int64_t i = 0; i < n; ++i) dxr[i] += dyr[i] * m[i];
    else
      for (int64_t i = 0; i < n; ++i) dxr[i] = dyr[i] * m[i];
  });
}

}  // namespace ampipe::kernels
