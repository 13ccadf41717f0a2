#include "ampipe/kernels/activations.h"

#include <cmath>

namespace ampipe::kernels {
namespace {
void check_f32(const Tensor& t, const char* op, const char* name, const Shape& want) {
  AMPIPE_CHECK(t.defined() && t.dtype() == DType::f32 && t.is_contiguous() && t.shape() == want,
               "{}: {} must be a contiguous f32 tensor of shape {}, got {} {}{}", op, name, shape_str(want),
               t.defined() ? dtype_name(t.dtype()) : "undefined", shape_str(t.shape()),
               t.defined() && !t.is_contiguous() ? " (non-contiguous)" : "");
}
void check_2d(const Tensor& t, const char* op, const char* name) {
  AMPIPE_CHECK(t.dim() == 2, "{}: {} must be 2-D, got {}", op, name, shape_str(t.shape()));
}
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
}  // namespace

void gelu_forward(const Tensor& x, Tensor& y) {
  check_2d(x, "gelu_forward", "x");
  check_f32(x, "gelu_forward", "x", x.shape());
  check_f32(y, "gelu_forward", "y", x.shape());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = xp[i];
    yp[i] = 0.5f * v * (1.0f + std::erf(v * kInvSqrt2));
  }
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  check_2d(x, "gelu_backward", "x");
  check_f32(dy, "gelu_backward", "dy", x.shape());
  check_f32(x, "gelu_backward", "x", x.shape());
  check_f32(dx, "gelu_backward", "dx", x.shape());
  const float* dyp = dy.data<float>();
  const float* xp = x.data<float>();
  float* dxp = dx.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = xp[i];
    const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
    dxp[i] = dyp[i] * (cdf + v * pdf);
  }
}

void swiglu_forward(const Tensor& x, Tensor& y) {
  check_2d(x, "swiglu_forward", "x");
  const int64_t rows = x.size(0), two_f = x.size(1), f = two_f / 2;
  AMPIPE_CHECK(two_f % 2 == 0, "swiglu_forward: x must be [rows, 2F], got {}", shape_str(x.shape()));
  check_f32(x, "swiglu_forward", "x", {rows, two_f});
  check_f32(y, "swiglu_forward", "y", {rows, f});
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = xp + r * two_f;
    const float* g = a + f;
    float* yr = yp + r * f;
    for (int64_t j = 0; j < f; ++j) yr[j] = a[j] / (1.0f + std::exp(-a[j])) * g[j];
  }
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  check_2d(x, "swiglu_backward", "x");
  const int64_t rows = x.size(0), two_f = x.size(1), f = two_f / 2;
  AMPIPE_CHECK(two_f % 2 == 0, "swiglu_backward: x must be [rows, 2F], got {}", shape_str(x.shape()));
  check_f32(dy, "swiglu_backward", "dy", {rows, f});
  check_f32(x, "swiglu_backward", "x", {rows, two_f});
  check_f32(dx, "swiglu_backward", "dx", {rows, two_f});
  const float* dyp = dy.data<float>();
  const float* xp = x.data<float>();
  float* dxp = dx.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = xp + r * two_f;
    const float* g = a + f;
    const float* dyr = dyp + r * f;
    float* da = dxp + r * two_f;
    float* dg = da + f;
    for (int64_t j = 0; j < f; ++j) {
      const float av = a[j], gv = g[j], d = dyr[j];  // all reads before the writes: dx may alias x
      const float sig = 1.0f / (1.0f + std::exp(-av));  // exp overflows to inf for av << 0: sig = 0, as it should
      da[j] = d * gv * sig * (1.0f + av * (1.0f - sig));
      dg[j] = d * av * sig;
    }
  }
}

}  // namespace ampipe::kernels
