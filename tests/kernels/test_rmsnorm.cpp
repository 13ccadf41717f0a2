// RMSNorm: fp32 kernel against a double reference written from the formula (Megatron-Core / Hugging Face's
// LlamaRMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma), and the reference's backward against central differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "support/numeric.h"
#include "ampipe/kernels/rmsnorm.h"

using namespace ampipe;
using namespace ampipe::kernels;

namespace {
using Vec = std::vector<double>;
using ampipe::testing::fd;
using ampipe::testing::randn;
using ampipe::testing::to_tensor;

Vec ref_forward(const Vec& x, const Vec& gamma, double eps, int64_t rows, int64_t h, Vec* rstd = nullptr) {
  Vec y(x.size());
  if (rstd) rstd->assign(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < h; ++j) ms += x[size_t(r * h + j)] * x[size_t(r * h + j)];
    const double rs = 1.0 / std::sqrt(ms / double(h) + eps);
    for (int64_t j = 0; j < h; ++j) y[size_t(r * h + j)] = x[size_t(r * h + j)] * rs * gamma[size_t(j)];
    if (rstd) (*rstd)[size_t(r)] = rs;
  }
  return y;
}

// d/dx of sum(dy * y) by the chain rule written out: y_j = x_j rs g_j, rs = (ms + eps)^(-1/2), ms = mean x^2.
void ref_backward(const Vec& dy, const Vec& x, const Vec& gamma, double eps, int64_t rows, int64_t h, Vec& dx,
                  Vec& dgamma) {
  dx.assign(x.size(), 0.0);
  dgamma.assign(size_t(h), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < h; ++j) ms += x[size_t(r * h + j)] * x[size_t(r * h + j)];
    ms /= double(h);
    const double rs = 1.0 / std::sqrt(ms + eps);
    double s = 0;  // sum_j dy_j g_j x_j
    for (int64_t j = 0; j < h; ++j) s += dy[size_t(r * h + j)] * gamma[size_t(j)] * x[size_t(r * h + j)];
    const double drs = s, dms = -0.5 * std::pow(ms + eps, -1.5) * drs;  // d/drs, then d/dms
    for (int64_t j = 0; j < h; ++j) {
      const size_t i = size_t(r * h + j);
      dx[i] = dy[i] * gamma[size_t(j)] * rs + dms * 2.0 * x[i] / double(h);
      dgamma[size_t(j)] += dy[i] * x[i] * rs;
    }
  }
}

void expect_close(const Tensor& got, const Vec& ref, double tol, const char* what) {
  ASSERT_EQ(got.numel(), int64_t(ref.size())) << what;
  double scale = 1;
  for (double e : ref) scale = std::max(scale, std::abs(e));
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got.get(int64_t(i)), ref[i], tol * scale) << what << " i=" << i;
}
}  // namespace

TEST(RmsNorm, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(21);
  const int64_t rows = 5, h = 9;
  const double eps = 1e-5;
  const Vec x = randn(size_t(rows * h), rng), gamma = randn(size_t(h), rng, 1.0, 0.5), r = randn(x.size(), rng);
  auto dot = [&](const Vec& y) {
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
    return s;
  };
  Vec dx, dgamma;
  ref_backward(r, x, gamma, eps, rows, h, dx, dgamma);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(dx[i], fd([&](const Vec& v) { return dot(ref_forward(v, gamma, eps, rows, h)); }, x, i), 1e-6) << i;
  for (size_t j = 0; j < size_t(h); ++j)
    EXPECT_NEAR(dgamma[j], fd([&](const Vec& v) { return dot(ref_forward(x, v, eps, rows, h)); }, gamma, j), 1e-6)
        << j;
}

TEST(RmsNorm, KernelMatchesDoubleReference) {
  std::mt19937 rng(22);
  for (auto [rows, h, mean] : {std::tuple{int64_t(7), int64_t(13), 0.0}, std::tuple{int64_t(1), int64_t(1), 0.0},
                               std::tuple{int64_t(4), int64_t(1000), 0.0}, std::tuple{int64_t(3), int64_t(257), 5.0}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " h " << h);
    const Vec x = randn(size_t(rows * h), rng, mean), gamma = randn(size_t(h), rng, 1.0, 0.5),
              dy = randn(x.size(), rng);
    const float eps = 1e-6f;
    Tensor y = Tensor::empty({rows, h}), rstd = Tensor::empty({rows});
    const Tensor xt = to_tensor(x, {rows, h}), gt = to_tensor(gamma, {h});
    rmsnorm_forward(xt, gt, eps, y, rstd);
    Vec rs_ref;
    expect_close(y, ref_forward(x, gamma, double(eps), rows, h, &rs_ref), 2e-6, "y");
    for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(rstd.get(r), rs_ref[size_t(r)], 2e-6 * rs_ref[size_t(r)]);
    Vec dx_ref, dg_ref;
    ref_backward(dy, x, gamma, double(eps), rows, h, dx_ref, dg_ref);
    Tensor dx = Tensor::zeros({rows, h}), dg = Tensor::zeros({h});
    rmsnorm_backward(to_tensor(dy, {rows, h}), xt, gt, rstd, dx, dg);
    expect_close(dx, dx_ref, 2e-5, "dx");
    expect_close(dg, dg_ref, 2e-5, "dgamma");
    // accumulate: dx += and dgamma += a second time gives twice the reference
    rmsnorm_backward(to_tensor(dy, {rows, h}), xt, gt, rstd, dx, dg, /*accumulate_dx=*/true);
    Vec dx2 = dx_ref, dg2 = dg_ref;
    for (double& v : dx2) v *= 2;
    for (double& v : dg2) v *= 2;
    expect_close(dx, dx2, 2e-5, "dx accumulated");
    expect_close(dg, dg2, 2e-5, "dgamma accumulated");
  }
}

TEST(RmsNorm, ZeroRowGivesZeroAndRstdFromEps) {
  Tensor x = Tensor::zeros({2, 4}), gamma = Tensor::from({1, 2, 3, 4}, {4});
  Tensor y = Tensor::empty({2, 4}), rstd = Tensor::empty({2});
  rmsnorm_forward(x, gamma, 1e-4f, y, rstd);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(y.get(i), 0.0f);
  EXPECT_FLOAT_EQ(rstd.get(0), 100.0f);  // 1 / sqrt(0 + 1e-4)
}
