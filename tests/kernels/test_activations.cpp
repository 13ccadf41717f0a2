// GeLU (exact erf form) and SwiGLU: fp32 kernels against double references; references against central differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "support/numeric.h"
#include "ampipe/kernels/activations.h"

using namespace ampipe;
using namespace ampipe::kernels;

namespace {
using Vec = std::vector<double>;
using ampipe::testing::fd;
using ampipe::testing::randn;
using ampipe::testing::to_tensor;

double ref_gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double ref_gelu_grad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}
double ref_silu(double a) { return a / (1.0 + std::exp(-a)); }

// x: [rows, 2F] (a = columns [0, F), g = columns [F, 2F)) -> [rows, F]
Vec ref_swiglu(const Vec& x, int64_t rows, int64_t f) {
  Vec y(size_t(rows * f));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < f; ++j)
      y[size_t(r * f + j)] = ref_silu(x[size_t(r * 2 * f + j)]) * x[size_t(r * 2 * f + f + j)];
  return y;
}
Vec ref_swiglu_backward(const Vec& dy, const Vec& x, int64_t rows, int64_t f) {
  Vec dx(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const double a = x[size_t(r * 2 * f + j)], g = x[size_t(r * 2 * f + f + j)], d = dy[size_t(r * f + j)];
      const double s = 1.0 / (1.0 + std::exp(-a));
      dx[size_t(r * 2 * f + j)] = d * g * s * (1.0 + a * (1.0 - s));
      dx[size_t(r * 2 * f + f + j)] = d * a * s;
    }
  return dx;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
// Element-wise: |got - ref| <= tol * max(1, |ref|)
void expect_close(const Tensor& got, const Vec& ref, double tol, const char* what) {
  ASSERT_EQ(got.numel(), int64_t(ref.size())) << what;
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(got.get(int64_t(i)), ref[i], tol * std::max(1.0, std::abs(ref[i]))) << what << " i=" << i;
}
// Inputs with the extremes that break naive formulas (exp overflow in sigmoid, erf saturation).
Vec with_extremes(Vec v) {
  const double ext[] = {0.0, -0.0, 1e-30, -1e-30, 8.0, -8.0, 30.0, -30.0, 100.0, -100.0, 1e4, -1e4};
  for (size_t i = 0; i < std::size(ext) && i < v.size(); ++i) v[i * 3 % v.size()] = ext[i];
  return v;
}
}  // namespace

TEST(Gelu, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(21);
  const Vec x = randn(48, rng, 0.0, 2.0), r = randn(48, rng);
  auto loss = [&](const Vec& v) {
    Vec y(v.size());
    for (size_t i = 0; i < v.size(); ++i) y[i] = ref_gelu(v[i]);
    return dot(r, y);
  };
  // step 1e-6: truncation ~1e-12 |f'''|, rounding ~1e-16 |loss| / 1e-6 ~ 1e-9: 1e-6 is safe.
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(r[i] * ref_gelu_grad(x[i]), fd(loss, x, i), 1e-6) << i;
}

TEST(Gelu, ForwardAndBackwardMatchDoubleReference) {
  std::mt19937 rng(22);
  for (const auto& [rows, f] : {std::pair<int64_t, int64_t>{7, 13}, {1, 1}, {4, 1000}, {3, 33}}) {
    const Vec x = with_extremes(randn(size_t(rows * f), rng, 0.0, 3.0)), dy = randn(size_t(rows * f), rng);
    const Tensor xt = to_tensor(x, {rows, f});
    Tensor y = Tensor::empty({rows, f}), dx = Tensor::empty({rows, f});
    gelu_forward(xt, y);
    gelu_backward(to_tensor(dy, {rows, f}), xt, dx);
    Vec ry(x.size()), rdx(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      ry[i] = ref_gelu(x[i]);
      rdx[i] = dy[i] * ref_gelu_grad(x[i]);
    }
    // fp32 erf/exp are accurate to ~2 ulp and the formulas add ~3 roundings: ~1e-6 relative. Near the
    // negative tail gelu(x) = x Phi(x) is tiny and 1 + erf cancels: absolute error ~ 2^-24 |x|, hence the
    // max(1, |ref|) scale. 2e-6 has margin.
    expect_close(y, ry, 2e-6, "gelu y");
    expect_close(dx, rdx, 2e-6, "gelu dx");
  }
}

TEST(Gelu, InPlace) {
  std::mt19937 rng(23);
  Tensor x = to_tensor(randn(26, rng), {2, 13});
  Tensor y = Tensor::empty({2, 13});
  gelu_forward(x, y);
  gelu_forward(x, x);
  for (int64_t i = 0; i < 26; ++i) ASSERT_EQ(x.get(i), y.get(i));
}

TEST(Swiglu, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(24);
  const int64_t rows = 6, f = 8;
  const Vec x = randn(size_t(rows * 2 * f), rng, 0.0, 2.0), r = randn(size_t(rows * f), rng);
  const Vec dx = ref_swiglu_backward(r, x, rows, f);
  auto loss = [&](const Vec& v) { return dot(r, ref_swiglu(v, rows, f)); };
  // step 1e-6: error ~1e-9 (see Gelu); 1e-6 is safe.
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], fd(loss, x, i), 1e-6) << i;
}

TEST(Swiglu, ForwardAndBackwardMatchDoubleReference) {
  std::mt19937 rng(25);
  for (const auto& [rows, f] : {std::pair<int64_t, int64_t>{7, 13}, {1, 1}, {4, 1000}, {3, 33}}) {
    const Vec x = with_extremes(randn(size_t(rows * 2 * f), rng, 0.0, 3.0)), dy = randn(size_t(rows * f), rng);
    const Tensor xt = to_tensor(x, {rows, 2 * f});
    Tensor y = Tensor::empty({rows, f}), dx = Tensor::empty({rows, 2 * f});
    swiglu_forward(xt, y);
    swiglu_backward(to_tensor(dy, {rows, f}), xt, dx);
    // fp32 exp (~1 ulp), a divide and 1-3 multiplies: ~5 roundings, ~4e-7 relative to the product of the
    // operands' magnitudes; 1 + a (1 - s) cancels for a ~ -1.28 (d silu/da = 0 there) so the absolute error is
    // relative to |dy g| rather than to the result: scale by max(1, |ref|) with operands O(3) -> 2e-6 * 10.
    expect_close(y, ref_swiglu(x, rows, f), 2e-6, "swiglu y");
    expect_close(dx, ref_swiglu_backward(dy, x, rows, f), 2e-5, "swiglu dx");
    for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_TRUE(std::isfinite(dx.get(i))) << i;
  }
}

TEST(Swiglu, LayoutIsGateFirstThenLinear) {
  // One row, F = 2: x = [a0, a1, g0, g1]; y = [silu(a0) g0, silu(a1) g1].
  const Tensor x = Tensor::from({1.0f, -2.0f, 3.0f, 0.5f}, {1, 4});
  Tensor y = Tensor::empty({1, 2});
  swiglu_forward(x, y);
  EXPECT_NEAR(y.get(0), ref_silu(1.0) * 3.0, 1e-6);
  EXPECT_NEAR(y.get(1), ref_silu(-2.0) * 0.5, 1e-6);
}

TEST(Swiglu, BackwardInPlaceOverTheInput) {
  std::mt19937 rng(26);
  const int64_t rows = 3, f = 11;
  Tensor x = to_tensor(randn(size_t(rows * 2 * f), rng), {rows, 2 * f});
  const Tensor dy = to_tensor(randn(size_t(rows * f), rng), {rows, f});
  Tensor dx = Tensor::empty({rows, 2 * f});
  swiglu_backward(dy, x, dx);
  swiglu_backward(dy, x, x);
  for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_EQ(x.get(i), dx.get(i)) << i;
}

// A bf16 output (the copy the next GEMM reads in bf16 mode) is the fp32 output rounded once: bit for bit what
// Tensor::copy_from makes of it, for both activations, forward and backward, over rows that are not a multiple of the
// 8-lane vectors (the padded tail too).
TEST(Activations, Bf16OutputsAreTheFp32OutputsRoundedOnce) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int64_t rows = 37, f = 21;
  auto random = [&](Shape shape) {
    Tensor t = Tensor::empty(std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, nd(rng));
    return t;
  };
  auto expect_rounded = [](const Tensor& f32, const Tensor& b16, const char* what) {
    const Tensor want = f32.to(DType::bf16);
    ASSERT_EQ(b16.dtype(), DType::bf16);
    for (int64_t i = 0; i < f32.numel(); ++i)
      ASSERT_EQ(b16.get(i), want.get(i)) << what << " element " << i;
  };
  const Tensor x = random({rows, f}), dy = random({rows, f});
  Tensor y32 = Tensor::empty({rows, f}), y16 = Tensor::empty({rows, f}, DType::bf16);
  gelu_forward(x, y32);
  gelu_forward(x, y16);
  expect_rounded(y32, y16, "gelu forward");
  Tensor dx32 = Tensor::empty({rows, f}), dx16 = Tensor::empty({rows, f}, DType::bf16);
  gelu_backward(dy, x, dx32);
  gelu_backward(dy, x, dx16);
  expect_rounded(dx32, dx16, "gelu backward");
  const Tensor x2 = random({rows, 2 * f});
  swiglu_forward(x2, y32);
  swiglu_forward(x2, y16);
  expect_rounded(y32, y16, "swiglu forward");
  Tensor d2_32 = Tensor::empty({rows, 2 * f}), d2_16 = Tensor::empty({rows, 2 * f}, DType::bf16);
  swiglu_backward(dy, x2, d2_32);
  swiglu_backward(dy, x2, d2_16);
  expect_rounded(d2_32, d2_16, "swiglu backward");
}
