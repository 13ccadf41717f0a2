// LayerNorm: fp32 kernel against a double reference; the reference's backward against central differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "support/numeric.h"
#include "ampipe/kernels/layernorm.h"

using namespace ampipe;
using namespace ampipe::kernels;

namespace {
using Vec = std::vector<double>;
using ampipe::testing::fd;
using ampipe::testing::randn;
using ampipe::testing::to_tensor;

struct LnRef {
  Vec y, mean, rstd;
};

// Naive double reference (two-pass, biased variance, eps inside the sqrt).
LnRef ref_forward(const Vec& x, const Vec& gamma, const Vec& beta, double eps, int64_t rows, int64_t h) {
  LnRef o{Vec(x.size()), Vec(size_t(rows)), Vec(size_t(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < h; ++j) m += x[size_t(r * h + j)];
    m /= double(h);
    for (int64_t j = 0; j < h; ++j) v += (x[size_t(r * h + j)] - m) * (x[size_t(r * h + j)] - m);
    v /= double(h);
    const double rs = 1.0 / std::sqrt(v + eps);
    for (int64_t j = 0; j < h; ++j)
      o.y[size_t(r * h + j)] = (x[size_t(r * h + j)] - m) * rs * gamma[size_t(j)] + beta[size_t(j)];
    o.mean[size_t(r)] = m;
    o.rstd[size_t(r)] = rs;
  }
  return o;
}

struct LnGrads {
  Vec dx, dgamma, dbeta;
};

LnGrads ref_backward(const Vec& dy, const Vec& x, const Vec& gamma, double eps, int64_t rows, int64_t h) {
  const LnRef f = ref_forward(x, gamma, Vec(size_t(h), 0.0), eps, rows, h);
  LnGrads g{Vec(x.size()), Vec(size_t(h)), Vec(size_t(h))};
  for (int64_t r = 0; r < rows; ++r) {
    const double m = f.mean[size_t(r)], rs = f.rstd[size_t(r)];
    double sg = 0, sgx = 0;
    for (int64_t j = 0; j < h; ++j) {
      const size_t i = size_t(r * h + j);
      const double xhat = (x[i] - m) * rs, gg = dy[i] * gamma[size_t(j)];
      sg += gg;
      sgx += gg * xhat;
      g.dgamma[size_t(j)] += dy[i] * xhat;
      g.dbeta[size_t(j)] += dy[i];
    }
    for (int64_t j = 0; j < h; ++j) {
      const size_t i = size_t(r * h + j);
      const double xhat = (x[i] - m) * rs;
      g.dx[i] = rs * (dy[i] * gamma[size_t(j)] - sg / double(h) - xhat * sgx / double(h));
    }
  }
  return g;
}

double max_abs(const Vec& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::abs(e));
  return m;
}

// max_i |got_i - ref_i| <= tol * max(1, max_i |ref_i|)
void expect_close(const Tensor& got, const Vec& ref, double tol, const char* what) {
  ASSERT_EQ(got.numel(), int64_t(ref.size())) << what;
  const double scale = std::max(1.0, max_abs(ref));
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(got.get(int64_t(i)), ref[i], tol * scale) << what << " i=" << i;
}
}  // namespace

TEST(LayerNorm, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(11);
  const int64_t rows = 6, h = 8;
  const double eps = 1e-5;
  const Vec x = randn(size_t(rows * h), rng), gamma = randn(size_t(h), rng, 1.0, 0.5),
            beta = randn(size_t(h), rng), r = randn(size_t(rows * h), rng);
  auto dot = [&](const Vec& y) {
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
    return s;
  };
  const LnGrads g = ref_backward(r, x, gamma, eps, rows, h);
  // Central differences with step 1e-6: truncation ~1e-12, rounding ~1e-16 * |loss| / 1e-6 ~ 1e-9; 1e-6 is safe.
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(g.dx[i], fd([&](const Vec& v) { return dot(ref_forward(v, gamma, beta, eps, rows, h).y); }, x, i),
                1e-6) << "dx " << i;
  for (size_t j = 0; j < size_t(h); ++j) {
    EXPECT_NEAR(g.dgamma[j], fd([&](const Vec& v) { return dot(ref_forward(x, v, beta, eps, rows, h).y); }, gamma, j),
                1e-6) << "dgamma " << j;
    EXPECT_NEAR(g.dbeta[j], fd([&](const Vec& v) { return dot(ref_forward(x, gamma, v, eps, rows, h).y); }, beta, j),
                1e-6) << "dbeta " << j;
  }
}

TEST(LayerNorm, ForwardMatchesDoubleReference) {
  std::mt19937 rng(12);
  struct Case {
    int64_t rows, h;
    double offset;  // |mean| >> std tests the variance numerics
  };
  for (const Case c : {Case{7, 13, 0.0}, Case{1, 1, 0.0}, Case{3, 64, 0.0}, Case{5, 1000, 0.0}, Case{4, 257, 300.0},
                       Case{2, 1024, 1e4}}) {
    const Vec x = randn(size_t(c.rows * c.h), rng, c.offset), gamma = randn(size_t(c.h), rng, 1.0, 0.5),
              beta = randn(size_t(c.h), rng);
    const float eps = 1e-5f;
    Tensor y = Tensor::empty({c.rows, c.h}), mean = Tensor::empty({c.rows}), rstd = Tensor::empty({c.rows});
    layernorm_forward(to_tensor(x, {c.rows, c.h}), to_tensor(gamma, {c.h}), to_tensor(beta, {c.h}), eps, y, mean,
                      rstd);
    const LnRef ref = ref_forward(x, gamma, beta, double(eps), c.rows, c.h);
    // y = O(1) carries a few ulps (sums over h in 8 fp32 lanes: ~sqrt(h/8) * 2^-24) plus the rounding of the
    // fp32 mean itself, half an ulp of |mean| = 2^-24 * offset, divided by std = 1; that part is inherent to an
    // fp32 mean. Tolerance: 2e-5 + 4 * 2^-24 * offset of max(1, |y|). A one-pass E[x^2] - E[x]^2 variance would
    // be off by O(1) for the offset 1e4 case (E[x^2] = 1e8 has an ulp of 8 against a variance of 1).
    expect_close(y, ref.y, 2e-5 + 4 * 0x1p-24 * c.offset, "y");
    for (int64_t r = 0; r < c.rows; ++r) {
      EXPECT_NEAR(mean.get(r), ref.mean[size_t(r)], 1e-6 * std::max(1.0, std::abs(ref.mean[size_t(r)])))
          << "mean " << r;
      EXPECT_NEAR(rstd.get(r), ref.rstd[size_t(r)], 2e-5 * ref.rstd[size_t(r)]) << "rstd " << r;
    }
  }
}

TEST(LayerNorm, ConstantRowGivesBetaAndRstdFromEps) {
  // var = 0: rstd = 1/sqrt(eps) exactly as documented (eps inside the sqrt), y = beta.
  Tensor x = Tensor::from(std::vector<float>(10, 3.5f), {2, 5});
  Tensor gamma = Tensor::from({1, 2, 3, 4, 5}, {5}), beta = Tensor::from({-1, 0, 1, 2, 3}, {5});
  Tensor y = Tensor::empty({2, 5}), mean = Tensor::empty({2}), rstd = Tensor::empty({2});
  layernorm_forward(x, gamma, beta, 1e-2f, y, mean, rstd);
  for (int64_t i = 0; i < 10; ++i) EXPECT_FLOAT_EQ(y.get(i), beta.get(i % 5));
  EXPECT_FLOAT_EQ(rstd.get(0), 10.0f);
  EXPECT_FLOAT_EQ(mean.get(1), 3.5f);
}

TEST(LayerNorm, BackwardMatchesDoubleReference) {
  std::mt19937 rng(13);
  for (const auto& [rows, h] : {std::pair<int64_t, int64_t>{7, 13}, {1, 1}, {6, 8}, {5, 1000}, {3, 257}}) {
    const Vec x = randn(size_t(rows * h), rng, 2.0, 3.0), gamma = randn(size_t(h), rng, 1.0, 0.5),
              beta = randn(size_t(h), rng), dy = randn(size_t(rows * h), rng);
    const float eps = 1e-5f;
    const Tensor xt = to_tensor(x, {rows, h}), gt = to_tensor(gamma, {h});
    Tensor y = Tensor::empty({rows, h}), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
    layernorm_forward(xt, gt, to_tensor(beta, {h}), eps, y, mean, rstd);
    // Parameter gradients accumulate onto what is there; dx is overwritten (start it with garbage).
    const Vec dg0 = randn(size_t(h), rng), db0 = randn(size_t(h), rng);
    Tensor dx = Tensor::empty({rows, h}), dgamma = to_tensor(dg0, {h}), dbeta = to_tensor(db0, {h});
    dx.fill(12345.0f);
    layernorm_backward(to_tensor(dy, {rows, h}), xt, gt, mean, rstd, dx, dgamma, dbeta);
    LnGrads ref = ref_backward(dy, x, gamma, double(eps), rows, h);
    for (int64_t j = 0; j < h; ++j) {
      ref.dgamma[size_t(j)] += dg0[size_t(j)];
      ref.dbeta[size_t(j)] += db0[size_t(j)];
    }
    // dx = rstd * (g - mean(g) - xhat mean(g xhat)): fp32 sums over h with 8 lanes and one cancellation;
    // error ~ sqrt(h) * 2^-24 * rstd * |g| ~ 1e-6 relative for h = 1000. 1e-5 of max(1, max|ref|) has margin.
    // dgamma, dbeta are fp32 sums over rows (<= 7 terms) plus the accumulation: a few ulps; 1e-5 likewise.
    expect_close(dx, ref.dx, 1e-5, "dx");
    expect_close(dgamma, ref.dgamma, 1e-5, "dgamma");
    expect_close(dbeta, ref.dbeta, 1e-5, "dbeta");
  }
}

TEST(LayerNorm, AccumulateDxAddsToTheOtherBranch) {
  std::mt19937 rng(14);
  const int64_t rows = 7, h = 13;
  const Tensor x = to_tensor(randn(size_t(rows * h), rng), {rows, h}), gamma = to_tensor(randn(size_t(h), rng), {h}),
               beta = to_tensor(randn(size_t(h), rng), {h}), dy = to_tensor(randn(size_t(rows * h), rng), {rows, h});
  Tensor y = Tensor::empty({rows, h}), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
  layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd);
  Tensor dx_over = Tensor::empty({rows, h}), dg = Tensor::zeros({h}), db = Tensor::zeros({h});
  layernorm_backward(dy, x, gamma, mean, rstd, dx_over, dg, db);
  const Tensor residual_grad = to_tensor(randn(size_t(rows * h), rng), {rows, h});
  Tensor dx_acc = residual_grad.clone(), dg2 = Tensor::zeros({h}), db2 = Tensor::zeros({h});
  layernorm_backward(dy, x, gamma, mean, rstd, dx_acc, dg2, db2, /*accumulate_dx=*/true);
  // The same value added on top of the other branch; the compiler may fuse the last multiply-add differently in
  // the two loops (FMA contraction), so allow a few ulps of the operands: 1e-6 * (|residual| + |dx|).
  for (int64_t i = 0; i < rows * h; ++i)
    ASSERT_NEAR(dx_acc.get(i), residual_grad.get(i) + dx_over.get(i),
                1e-6 * (std::abs(residual_grad.get(i)) + std::abs(dx_over.get(i)))) << i;
  // Accumulating twice into the same parameter gradient doubles it (chunks / micro-batches sum); the second
  // pass adds its rows onto the first's total, a different fp32 order: 1e-5 of max(1, |value|) (7 rows of O(1)).
  layernorm_backward(dy, x, gamma, mean, rstd, dx_over, dg, db);
  for (int64_t j = 0; j < h; ++j) {
    EXPECT_NEAR(dg.get(j), 2 * dg2.get(j), 1e-5 * std::max(1.0f, std::abs(dg.get(j))));
    EXPECT_NEAR(db.get(j), 2 * db2.get(j), 1e-5 * std::max(1.0f, std::abs(db.get(j))));
  }
}

TEST(LayerNorm, InPlaceForward) {
  std::mt19937 rng(15);
  const int64_t rows = 3, h = 17;
  Tensor x = to_tensor(randn(size_t(rows * h), rng), {rows, h});
  const Tensor gamma = to_tensor(randn(size_t(h), rng), {h}), beta = to_tensor(randn(size_t(h), rng), {h});
  Tensor y = Tensor::empty({rows, h}), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
  layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd);
  layernorm_forward(x, gamma, beta, 1e-5f, x, mean, rstd);
  for (int64_t i = 0; i < rows * h; ++i) ASSERT_EQ(x.get(i), y.get(i));
}
