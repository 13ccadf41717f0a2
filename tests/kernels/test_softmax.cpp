// Row softmax (fp32 kernel vs double reference; reference backward vs central differences) and top-k ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "support/numeric.h"
#include "ampipe/kernels/softmax.h"

using namespace ampipe;
using namespace ampipe::kernels;

namespace {
using Vec = std::vector<double>;
using ampipe::testing::fd;
using ampipe::testing::randn;
using ampipe::testing::to_tensor;

Vec ref_softmax(const Vec& x, int64_t rows, int64_t n) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[size_t(r * n + j)]);
    for (int64_t j = 0; j < n; ++j) s += std::exp(x[size_t(r * n + j)] - mx);
    for (int64_t j = 0; j < n; ++j) y[size_t(r * n + j)] = std::exp(x[size_t(r * n + j)] - mx) / s;
  }
  return y;
}
Vec ref_softmax_backward(const Vec& dy, const Vec& y, int64_t rows, int64_t n) {
  Vec dx(y.size());
  for (int64_t r = 0; r < rows; ++r) {
    double d = 0;
    for (int64_t j = 0; j < n; ++j) d += dy[size_t(r * n + j)] * y[size_t(r * n + j)];
    for (int64_t j = 0; j < n; ++j) dx[size_t(r * n + j)] = y[size_t(r * n + j)] * (dy[size_t(r * n + j)] - d);
  }
  return dx;
}

// |got - ref| <= tol * max(1, max|ref|)
void expect_close(const Tensor& got, const Vec& ref, double tol, const char* what) {
  ASSERT_EQ(got.numel(), int64_t(ref.size())) << what;
  double scale = 1;
  for (double e : ref) scale = std::max(scale, std::abs(e));
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got.get(int64_t(i)), ref[i], tol * scale) << what << " i=" << i;
}
}  // namespace

TEST(Softmax, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(31);
  const int64_t rows = 6, n = 8;
  const Vec x = randn(size_t(rows * n), rng, 0.0, 2.0), r = randn(size_t(rows * n), rng);
  const Vec dx = ref_softmax_backward(r, ref_softmax(x, rows, n), rows, n);
  auto loss = [&](const Vec& v) {
    const Vec y = ref_softmax(v, rows, n);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
    return s;
  };
  // step 1e-6: truncation ~1e-12, rounding ~1e-16 / 1e-6 = 1e-10; 1e-6 is safe.
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], fd(loss, x, i), 1e-6) << i;
}

TEST(Softmax, ForwardAndBackwardMatchDoubleReference) {
  std::mt19937 rng(32);
  struct Case {
    int64_t rows, n;
    double offset;  // large logits: only a max-subtracted softmax stays finite
  };
  for (const Case c : {Case{7, 13, 0.0}, Case{1, 1, 0.0}, Case{5, 64, 1000.0}, Case{3, 1001, -500.0}, Case{9, 8, 0.0}}) {
    const Vec x = randn(size_t(c.rows * c.n), rng, c.offset, 3.0), dy = randn(size_t(c.rows * c.n), rng);
    Tensor y = Tensor::empty({c.rows, c.n}), dx = Tensor::empty({c.rows, c.n});
    softmax_forward(to_tensor(x, {c.rows, c.n}), y);
    softmax_backward(to_tensor(dy, {c.rows, c.n}), y, dx);
    const Vec ry = ref_softmax(x, c.rows, c.n);
    // x - max is exact-ish (fp32 subtraction of nearby values: error <= ulp(|offset|) = 6e-5 for 1000, which
    // moves y by that relative amount); exp ~1 ulp; the sum over n terms ~n 2^-24. y <= 1: 1e-4 * offset/1000 +
    // 2e-6 absolute covers it.
    const double tol_y = 2e-6 + 1e-7 * std::abs(c.offset);
    expect_close(y, ry, tol_y, "y");
    // The kernel's backward is checked on its own (from the kernel's y against the reference formula on that
    // same y), so only its arithmetic is measured: a dot over n terms and one multiply, ~1e-6 relative.
    std::vector<float> yf = y.to_vector();
    const Vec rdx = ref_softmax_backward(dy, Vec(yf.begin(), yf.end()), c.rows, c.n);
    expect_close(dx, rdx, 2e-6, "dx");
  }
}

TEST(Softmax, InPlace) {
  std::mt19937 rng(33);
  Tensor x = to_tensor(randn(39, rng), {3, 13});
  Tensor y = Tensor::empty({3, 13});
  softmax_forward(x, y);
  softmax_forward(x, x);
  for (int64_t i = 0; i < 39; ++i) ASSERT_EQ(x.get(i), y.get(i));
}

TEST(TopK, MatchesSortByValueDescendingThenIndexAscending) {
  std::mt19937 rng(34);
  const int64_t rows = 50, e = 16;
  // Values quantised to 1/4 so that ties are frequent.
  std::uniform_int_distribution<int> q(0, 5);
  std::vector<float> p(size_t(rows * e));
  for (auto& v : p) v = float(q(rng)) * 0.25f;
  const Tensor probs = Tensor::from(p, {rows, e});
  for (int k : {1, 2, 3, 16}) {
    std::vector<int32_t> idx(size_t(rows * k), -7);
    Tensor val = Tensor::empty({rows, int64_t(k)});
    topk_rows(probs, k, idx, val);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int32_t> order(static_cast<size_t>(e));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(r * e + a)] > p[size_t(r * e + b)]; });
      for (int i = 0; i < k; ++i) {
        ASSERT_EQ(idx[size_t(r * k + i)], order[size_t(i)]) << "row " << r << " slot " << i << " k " << k;
        ASSERT_EQ(val.get(r * k + i), p[size_t(r * e + order[size_t(i)])]);
      }
    }
  }
}

TEST(TopK, TiesGoToTheLowerIndexFirst) {
  const Tensor probs = Tensor::from({0.25f, 0.5f, 0.25f, 0.5f,     // two ties at the top, two below
                                     0.1f, 0.1f, 0.1f, 0.1f,       // all equal
                                     -0.0f, 0.0f, -1.0f, 0.0f},    // +0 and -0 are equal
                                    {3, 4});
  std::vector<int32_t> idx(9);
  Tensor val = Tensor::empty({3, 3});
  topk_rows(probs, 3, idx, val);
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 3, 0, /**/ 0, 1, 2, /**/ 0, 1, 3}));
  EXPECT_EQ(val.get(0), 0.5f);
  EXPECT_EQ(val.get(2), 0.25f);
}

// The raw row forms the router runs (model/gate.cpp) against hand-computed values: softmax of (0, ln 3) is (1/4,
// 3/4); its backward in place over dy = (1, 0): dot = 1/4, dx = (1/4 * 3/4, 3/4 * -1/4) = (3/16, -3/16); topk_row of
// a row of 1100 columns (above the old 1024 limit) with ties.
TEST(SoftmaxRow, HandComputedValuesAndTheRowTopK) {
  float row[2] = {0.0f, std::log(3.0f)};
  softmax_row(row, 2);
  EXPECT_NEAR(row[0], 0.25f, 1e-7f);
  EXPECT_NEAR(row[1], 0.75f, 1e-7f);
  const float y[2] = {0.25f, 0.75f};
  float d[2] = {1.0f, 0.0f};
  softmax_backward_row(y, d, d, 2);  // in place
  EXPECT_FLOAT_EQ(d[0], 3.0f / 16.0f);
  EXPECT_FLOAT_EQ(d[1], -3.0f / 16.0f);
  std::vector<float> wide(1100, 0.0f);
  wide[1099] = 2.0f;
  wide[7] = 1.0f;
  wide[900] = 1.0f;
  int32_t idx[4] = {};
  topk_row(wide.data(), 1100, 4, idx);
  EXPECT_EQ(idx[0], 1099);
  EXPECT_EQ(idx[1], 7);    // the tie at 1.0: the lower index first
  EXPECT_EQ(idx[2], 900);
  EXPECT_EQ(idx[3], 0);    // then the zeros, lowest index first
}
