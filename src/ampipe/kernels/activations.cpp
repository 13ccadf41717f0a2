#include "ampipe/kernels/activations.h"
#include "ampipe/kernels/checks.h"
#include "ampipe/core/parallel.h"
#include "ampipe/kernels/simd_math.h"

#include <cmath>
#include <cstring>

#ifdef AMPIPE_SIMD_AVX2
#define AMPIPE_ACT_AVX2 1
#endif

namespace ampipe::kernels {
namespace {
using detail::check_f32;
using detail::check_2d;
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

#ifdef AMPIPE_ACT_AVX2
// ---- AVX2 + FMA element-wise math, 8 lanes ----------------------------------------------------------------------
using simd::exp8;

// Phi(x) = 0.5 erfc(-x / sqrt(2)), via erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), z = |x| / sqrt(2) >= 0
// (Numerical Recipes erfcc, relative error < 1.2e-7 for all z, so both tails keep their relative accuracy; no
// 1 + erf cancellation for x << 0). Phi = 1 - erfc(z)/2 for x >= 0, erfc(z)/2 for x < 0. -z^2 is formed exactly
// (hi + lo by FMA), so large |x| lose nothing to it. `ez2`, when given, receives exp(-z^2) = exp(-x^2 / 2).
inline __m256 phi8(__m256 x, __m256* ez2 = nullptr) {
  // |x| clamped to 16: beyond it erfc(|x|/sqrt(2)) and exp(-x^2/2) are 0 in fp32 anyway (x^2/2 > 87.3), and x*x
  // cannot overflow (x = +-inf or 1e30 would give inf - inf in the split below).
  const __m256 ax = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(16.0f));
  const __m256 z = _mm256_mul_ps(ax, _mm256_set1_ps(kInvSqrt2));
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(z, _mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f)));
  __m256 p = _mm256_set1_ps(0.17087277f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.82215223f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.48851587f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.13520398f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.27886807f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.18628806f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.09678418f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.37409196f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.00002368f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.26551223f));
  // z^2 = x^2 / 2 = z2 + z2lo exactly (x*x split by FMA, then halved): no rounding of z enters the exponent.
  const __m256 xx = _mm256_mul_ps(ax, ax);
  const __m256 z2 = _mm256_mul_ps(xx, _mm256_set1_ps(0.5f));
  const __m256 z2lo = _mm256_mul_ps(_mm256_fmsub_ps(ax, ax, xx), _mm256_set1_ps(0.5f));
  const __m256 arg = _mm256_sub_ps(_mm256_sub_ps(p, z2lo), z2);
  const __m256 half_erfc = _mm256_mul_ps(_mm256_mul_ps(t, exp8(arg)), _mm256_set1_ps(0.5f));
  if (ez2) *ez2 = exp8(_mm256_sub_ps(_mm256_sub_ps(_mm256_setzero_ps(), z2lo), z2));
  const __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), half_erfc), half_erfc, neg);
}

// Runs f(i, n) over [0, count) in blocks of 8; the last partial block goes through a padded copy so every element
// is computed by the same vector code whatever its position. f takes (pointers advanced by i) via `body`.
template <typename Body>
inline void for_each8(int64_t count, Body&& body) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) body(i, int64_t(8));
  if (i < count) body(i, count - i);
}
// Loads n <= 8 floats (zero padded) / stores the first n lanes.
inline __m256 load8(const float* p, int64_t n) {
  if (n == 8) return _mm256_loadu_ps(p);
  alignas(32) float buf[8] = {};
  std::memcpy(buf, p, size_t(n) * sizeof(float));
  return _mm256_load_ps(buf);
}
inline void store8(float* p, __m256 v, int64_t n) {
  if (n == 8) return _mm256_storeu_ps(p, v);
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  std::memcpy(p, buf, size_t(n) * sizeof(float));
}
// Stores the first n lanes at element i of an fp32 or bf16 output (bf16: each value rounded once, as copy_from does).
inline void store_out(void* y, DType t, int64_t i, __m256 v, int64_t n) {
  if (t == DType::f32) return store8(static_cast<float*>(y) + i, v, n);
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  bf16* o = static_cast<bf16*>(y) + i;
  for (int64_t q = 0; q < n; ++q) o[q] = f32_to_bf16(buf[q]);
}
#endif
inline void set_out(void* y, DType t, int64_t i, float v) {
  if (t == DType::f32)
    static_cast<float*>(y)[i] = v;
  else
    static_cast<bf16*>(y)[i] = f32_to_bf16(v);
}
// An activation's output (y, or the backward's dx): fp32 or bf16 (the bf16 copy a GEMM reads, written without an
// fp32 pass), contiguous.
void check_out(const Tensor& y, const char* op, const Shape& want) {
  AMPIPE_CHECK(y.defined() && (y.dtype() == DType::f32 || y.dtype() == DType::bf16) && y.is_contiguous() &&
                   y.shape() == want,
               "{}: the output must be a contiguous f32 or bf16 tensor of shape {}, got {} {}", op, shape_str(want),
               y.defined() ? dtype_name(y.dtype()) : "undefined", shape_str(y.shape()));
}
}  // namespace

void gelu_forward(const Tensor& x, Tensor& y) {
  check_2d(x, "gelu_forward", "x");
  check_f32(x, "gelu_forward", "x", x.shape());
  check_out(y, "gelu_forward", x.shape());
  const float* xp = x.data<float>();
  void* yp = y.raw();
  const DType yt = y.dtype();
  const int64_t n = x.numel();
#ifdef AMPIPE_ACT_AVX2
  // gelu(x) = x * Phi(x), Phi as in phi8: within ~3e-7 * max(1, |gelu|) of the std::erf form (tests: 2e-6 of a
  // double reference), and more accurate than it for x << 0 (no 1 + erf cancellation).
  parallel_for(n, kElementGrain, [&](int64_t b, int64_t e) {
    for_each8(e - b, [&](int64_t i, int64_t cnt) {
      const __m256 v = load8(xp + b + i, cnt);
      store_out(yp, yt, b + i, _mm256_mul_ps(v, phi8(v)), cnt);
    });
  });
#else
  parallel_for(n, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = xp[i];
      set_out(yp, yt, i, 0.5f * v * (1.0f + std::erf(v * kInvSqrt2)));
    }
  });
#endif
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  check_2d(x, "gelu_backward", "x");
  check_f32(dy, "gelu_backward", "dy", x.shape());
  check_f32(x, "gelu_backward", "x", x.shape());
  check_out(dx, "gelu_backward", x.shape());
  const float* dyp = dy.data<float>();
  const float* xp = x.data<float>();
  void* dxp = dx.raw();
  const DType dt = dx.dtype();
  const int64_t n = x.numel();
#ifdef AMPIPE_ACT_AVX2
  parallel_for(n, kElementGrain, [&](int64_t b, int64_t end) {
    for_each8(end - b, [&](int64_t i, int64_t cnt) {
      const __m256 v = load8(xp + b + i, cnt), d = load8(dyp + b + i, cnt);
      __m256 e;
      const __m256 cdf = phi8(v, &e);
      const __m256 pdf = _mm256_mul_ps(_mm256_set1_ps(kInvSqrt2Pi), e);
      store_out(dxp, dt, b + i, _mm256_mul_ps(d, _mm256_add_ps(cdf, _mm256_mul_ps(v, pdf))), cnt);
    });
  });
#else
  parallel_for(n, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = xp[i];
      const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
      set_out(dxp, dt, i, dyp[i] * (cdf + v * pdf));
    }
  });
#endif
}

void swiglu_forward(const Tensor& x, Tensor& y) {
  check_2d(x, "swiglu_forward", "x");
  const int64_t rows = x.size(0), two_f = x.size(1), f = two_f / 2;
  AMPIPE_CHECK(two_f % 2 == 0, "swiglu_forward: x must be [rows, 2F], got {}", shape_str(x.shape()));
  check_f32(x, "swiglu_forward", "x", {rows, two_f});
  check_out(y, "swiglu_forward", {rows, f});
  const float* xp = x.data<float>();
  void* yp = y.raw();
  const DType yt = y.dtype();
  parallel_for(rows, rows_grain(two_f), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* a = xp + r * two_f;
      const float* g = a + f;
      const int64_t yr = r * f;  // the row's first output element
#ifdef AMPIPE_ACT_AVX2
      // The same operations in the same order; exp8 is within ~1 ulp of std::exp.
      for_each8(f, [&](int64_t j, int64_t cnt) {
        const __m256 av = load8(a + j, cnt), gv = load8(g + j, cnt);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), av));
        store_out(yp, yt, yr + j, _mm256_mul_ps(_mm256_div_ps(av, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), gv), cnt);
      });
#else
      for (int64_t j = 0; j < f; ++j) set_out(yp, yt, yr + j, a[j] / (1.0f + std::exp(-a[j])) * g[j]);
#endif
    }
  });
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  check_2d(x, "swiglu_backward", "x");
  const int64_t rows = x.size(0), two_f = x.size(1), f = two_f / 2;
  AMPIPE_CHECK(two_f % 2 == 0, "swiglu_backward: x must be [rows, 2F], got {}", shape_str(x.shape()));
  check_f32(dy, "swiglu_backward", "dy", {rows, f});
  check_f32(x, "swiglu_backward", "x", {rows, two_f});
  check_out(dx, "swiglu_backward", {rows, two_f});
  const float* dyp = dy.data<float>();
  const float* xp = x.data<float>();
  void* dxp = dx.raw();
  const DType dt = dx.dtype();
  parallel_for(rows, rows_grain(3 * f), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* a = xp + r * two_f;
      const float* g = a + f;
      const float* dyr = dyp + r * f;
      const int64_t da = r * two_f, dg = da + f;  // the row's first da and dg elements in dx
#ifdef AMPIPE_ACT_AVX2
      for_each8(f, [&](int64_t j, int64_t cnt) {  // all loads before the stores: dx may alias x
        const __m256 av = load8(a + j, cnt), gv = load8(g + j, cnt), d = load8(dyr + j, cnt);
        const __m256 one = _mm256_set1_ps(1.0f);
        const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), av))));
        const __m256 da_v = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(d, gv), sig),
                                          _mm256_add_ps(one, _mm256_mul_ps(av, _mm256_sub_ps(one, sig))));
        store_out(dxp, dt, da + j, da_v, cnt);
        store_out(dxp, dt, dg + j, _mm256_mul_ps(_mm256_mul_ps(d, av), sig), cnt);
      });
      continue;
#endif
      for (int64_t j = 0; j < f; ++j) {
        const float av = a[j], gv = g[j], d = dyr[j];  // all reads before the writes: dx may alias x
        const float sig = 1.0f / (1.0f + std::exp(-av));  // exp overflows to inf for av << 0: sig = 0, as it should
        set_out(dxp, dt, da + j, d * gv * sig * (1.0f + av * (1.0f - sig)));
        set_out(dxp, dt, dg + j, d * av * sig);
      }
    }
  });
}

}  // namespace ampipe::kernels
