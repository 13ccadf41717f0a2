// Softmax cross-entropy with an ignore index: fp32 kernel vs double reference; reference backward vs central
// differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "support/numeric.h"
#include "ampipe/kernels/cross_entropy.h"

using namespace ampipe;
using namespace ampipe::kernels;

namespace {
using Vec = std::vector<double>;
using ampipe::testing::fd;
using ampipe::testing::randn;
using ampipe::testing::to_tensor;

struct CeRef {
  Vec loss, lse;
};
CeRef ref_forward(const Vec& logits, const std::vector<int32_t>& t, int64_t rows, int64_t v) {
  CeRef o{Vec(size_t(rows)), Vec(size_t(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, logits[size_t(r * v + j)]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(logits[size_t(r * v + j)] - mx);
    o.lse[size_t(r)] = mx + std::log(s);
    o.loss[size_t(r)] = t[size_t(r)] == kIgnoreIndex ? 0.0 : o.lse[size_t(r)] - logits[size_t(r * v + t[size_t(r)])];
  }
  return o;
}
Vec ref_backward(const Vec& dloss, const Vec& logits, const std::vector<int32_t>& t, int64_t rows, int64_t v) {
  const CeRef f = ref_forward(logits, t, rows, v);
  Vec d(logits.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (t[size_t(r)] == kIgnoreIndex) continue;
    for (int64_t j = 0; j < v; ++j)
      d[size_t(r * v + j)] =
          (std::exp(logits[size_t(r * v + j)] - f.lse[size_t(r)]) - (j == t[size_t(r)] ? 1.0 : 0.0)) * dloss[size_t(r)];
  }
  return d;
}

std::vector<int32_t> random_targets(int64_t rows, int64_t v, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> u(0, int32_t(v - 1));
  std::vector<int32_t> t(static_cast<size_t>(rows));
  for (auto& e : t) e = u(rng);
  for (size_t i = 1; i < t.size(); i += 3) t[i] = kIgnoreIndex;  // every third row from row 1 is ignored
  return t;
}
}  // namespace

TEST(CrossEntropy, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(41);
  const int64_t rows = 6, v = 8;
  const Vec x = randn(size_t(rows * v), rng, 0.0, 2.0), r = randn(size_t(rows), rng);
  const std::vector<int32_t> t = random_targets(rows, v, rng);
  const Vec d = ref_backward(r, x, t, rows, v);
  auto loss = [&](const Vec& lg) {
    const CeRef f = ref_forward(lg, t, rows, v);
    double s = 0;
    for (size_t i = 0; i < f.loss.size(); ++i) s += r[i] * f.loss[i];
    return s;
  };
  // step 1e-6: truncation ~1e-12, rounding ~1e-16 * |loss| / 1e-6 ~ 1e-9; 1e-6 is safe.
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(d[i], fd(loss, x, i), 1e-6) << i;
}

TEST(CrossEntropy, ForwardAndBackwardMatchDoubleReference) {
  std::mt19937 rng(42);
  struct Case {
    int64_t rows, v;
    double offset;  // large logits: a naive log(sum(exp)) overflows
  };
  for (const Case c : {Case{7, 13, 0.0}, Case{1, 1, 0.0}, Case{5, 1003, 0.0}, Case{4, 50, 1000.0}, Case{3, 257, -300.0}}) {
    const Vec x = randn(size_t(c.rows * c.v), rng, c.offset, 3.0), dl = randn(size_t(c.rows), rng);
    const std::vector<int32_t> t = random_targets(c.rows, c.v, rng);
    const Tensor xt = to_tensor(x, {c.rows, c.v});
    Tensor loss = Tensor::empty({c.rows}), lse = Tensor::empty({c.rows}), d = Tensor::empty({c.rows, c.v});
    d.fill(777.0f);
    cross_entropy_forward(xt, t, loss, lse);
    cross_entropy_backward(to_tensor(dl, {c.rows}), xt, t, lse, d);
    const CeRef ref = ref_forward(x, t, c.rows, c.v);
    // lse = max + log(sum): the fp32 sum over V terms <= 1 has relative error ~ sqrt(V) 2^-24, log adds an
    // ulp, and |lse| ~ |offset| rounds to ulp(offset); loss = lse - logit[t] loses nothing more. Tolerance
    // 2e-6 * max(1, |ref|) for lse and 2e-6 * max(1, |lse|) absolute for the loss (same error, smaller value).
    for (int64_t r = 0; r < c.rows; ++r) {
      const double s = std::max(1.0, std::abs(ref.lse[size_t(r)]));
      EXPECT_NEAR(lse.get(r), ref.lse[size_t(r)], 2e-6 * s) << "lse " << r;
      EXPECT_NEAR(loss.get(r), ref.loss[size_t(r)], 2e-6 * s) << "loss " << r;
      if (t[size_t(r)] == kIgnoreIndex) {
        EXPECT_EQ(loss.get(r), 0.0f);
      }
    }
    // dlogits = (exp(x - lse) - onehot) dloss: exp of an argument with absolute error ~ulp(lse) (= 6e-5 at
    // |lse| ~ 1000) gives that relative error on each probability: 4e-6 + 1e-7 |offset| of max(1, |ref|).
    const Vec rd = ref_backward(dl, x, t, c.rows, c.v);
    const double tol = 4e-6 + 1e-7 * std::abs(c.offset);
    for (size_t i = 0; i < rd.size(); ++i)
      ASSERT_NEAR(d.get(int64_t(i)), rd[i], tol * std::max(1.0, std::abs(rd[i]))) << "dlogits " << i;
    for (int64_t r = 0; r < c.rows; ++r)
      if (t[size_t(r)] == kIgnoreIndex) {
        for (int64_t j = 0; j < c.v; ++j) ASSERT_EQ(d.get(r * c.v + j), 0.0f) << "ignored row " << r;
      }
  }
}

TEST(CrossEntropy, AllRowsIgnoredGiveZeroLossAndGrad) {
  const Tensor x = Tensor::from({1, 2, 3, 4, 5, 6}, {2, 3});
  const std::vector<int32_t> t{kIgnoreIndex, kIgnoreIndex};
  Tensor loss = Tensor::empty({2}), lse = Tensor::empty({2}), d = Tensor::empty({2, 3});
  cross_entropy_forward(x, t, loss, lse);
  cross_entropy_backward(Tensor::from({1, 1}, {2}), x, t, lse, d);
  EXPECT_EQ(loss.to_vector(), (std::vector<float>{0, 0}));
  EXPECT_EQ(d.to_vector(), std::vector<float>(6, 0.0f));
  EXPECT_NEAR(lse.get(0), std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)), 1e-6 * 4);  // still written
}

TEST(CrossEntropy, BackwardInPlaceOverLogits) {
  std::mt19937 rng(43);
  const int64_t rows = 5, v = 19;
  Tensor x = to_tensor(randn(size_t(rows * v), rng), {rows, v});
  const std::vector<int32_t> t = random_targets(rows, v, rng);
  const Tensor dl = to_tensor(randn(size_t(rows), rng), {rows});
  Tensor loss = Tensor::empty({rows}), lse = Tensor::empty({rows}), d = Tensor::empty({rows, v});
  cross_entropy_forward(x, t, loss, lse);
  cross_entropy_backward(dl, x, t, lse, d);
  cross_entropy_backward(dl, x, t, lse, x);
  for (int64_t i = 0; i < rows * v; ++i) ASSERT_EQ(x.get(i), d.get(i)) << i;
}
