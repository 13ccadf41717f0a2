// Position-keyed dropout: the mask is a function of (seed, layer, purpose, token, feature) only.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ampipe/kernels/dropout.h"

using namespace ampipe;
using namespace ampipe::kernels;
using core::PhiloxKey;
using core::RngPurpose;

namespace {
using Vec = std::vector<double>;

Tensor randn(Shape s, std::mt19937& rng) {
  std::normal_distribution<float> nd{0.0f, 1.0f};
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, nd(rng));
  return t;
}

// The documented rule, element by element, straight from core::philox_uniform.
float ref_multiplier(const PhiloxKey& key, uint64_t token, uint64_t feature, float p) {
  return core::philox_uniform(key, token, feature) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

// Double reference of y = dropout(x) for the finite-difference check.
Vec ref_dropout(const Vec& x, int64_t rows, int64_t h, float p, const PhiloxKey& key, uint64_t t0) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < h; ++j)
      y[size_t(r * h + j)] = x[size_t(r * h + j)] * double(ref_multiplier(key, t0 + uint64_t(r), uint64_t(j), p));
  return y;
}

const PhiloxKey kKey{0x123456789abcdefull, 3, RngPurpose::attn_dropout};
}  // namespace

TEST(Dropout, ForwardIsBitExactToTheDocumentedRule) {
  std::mt19937 rng(51);
  // h = 13 (not a multiple of 4) and h = 300 (more than one 256-feature block, ragged tail); tokens above 2^32.
  for (const auto& [rows, h, t0] : {std::tuple<int64_t, int64_t, uint64_t>{7, 13, 0}, {3, 300, 1000},
                                    {2, 5, (uint64_t(1) << 32) - 1}}) {
    for (float p : {0.1f, 0.5f, 0.9f}) {
      const Tensor x = randn({rows, h}, rng), res = randn({rows, h}, rng);
      Tensor y = Tensor::empty({rows, h}), ya = Tensor::empty({rows, h});
      dropout_forward(x, p, kKey, t0, y);
      dropout_add_forward(x, res, p, kKey, t0, ya);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < h; ++j) {
          const int64_t i = r * h + j;
          const float m = ref_multiplier(kKey, t0 + uint64_t(r), uint64_t(j), p);
          EXPECT_EQ(dropout_keep(kKey, t0 + uint64_t(r), uint64_t(j), p), m != 0.0f);
          volatile float prod = x.get(i) * m;  // rounded to fp32 before the add, as documented (no FMA)
          ASSERT_EQ(y.get(i), prod) << r << "," << j;
          ASSERT_EQ(ya.get(i), res.get(i) + prod) << r << "," << j;
        }
    }
  }
}

TEST(Dropout, ChunkedRowsEqualOneCall) {
  std::mt19937 rng(52);
  const int64_t h = 37;
  const uint64_t t0 = 96;  // a slice that does not start at token 0
  const Tensor x = randn({12, h}, rng);
  Tensor all = Tensor::empty({12, h}), part = Tensor::empty({12, h});
  dropout_forward(x, 0.3f, kKey, t0, all);
  Tensor p0 = part.rows(0, 5), p1 = part.rows(5, 12);
  dropout_forward(x.rows(5, 12), 0.3f, kKey, t0 + 5, p1);  // order of calls must not matter either
  dropout_forward(x.rows(0, 5), 0.3f, kKey, t0, p0);
  EXPECT_EQ(all.to_vector(), part.to_vector());
}

TEST(Dropout, KeyFieldsChangeTheMask) {
  const Tensor x = Tensor::from(std::vector<float>(4 * 64, 1.0f), {4, 64});
  auto mask = [&](PhiloxKey k, uint64_t t0) {
    Tensor y = Tensor::empty({4, 64});
    dropout_forward(x, 0.5f, k, t0, y);
    return y.to_vector();
  };
  const auto base = mask(kKey, 0);
  EXPECT_EQ(base, mask(kKey, 0));
  EXPECT_NE(base, mask({kKey.seed + 1, kKey.layer, kKey.purpose}, 0));
  EXPECT_NE(base, mask({kKey.seed, kKey.layer + 1, kKey.purpose}, 0));
  EXPECT_NE(base, mask({kKey.seed, kKey.layer, RngPurpose::mlp_dropout}, 0));
  EXPECT_NE(base, mask(kKey, 4));
}

TEST(Dropout, KeepFractionIsNearOneMinusP) {
  const int64_t rows = 512, h = 1024;  // n = 524288 elements
  const Tensor x = Tensor::from(std::vector<float>(size_t(rows * h), 1.0f), {rows, h});
  Tensor y = Tensor::empty({rows, h});
  for (float p : {0.1f, 0.5f}) {
    dropout_forward(x, p, kKey, 0, y);
    const float* yp = y.data<float>();
    int64_t kept = 0;
    for (int64_t i = 0; i < rows * h; ++i) {
      kept += yp[i] != 0.0f;
      ASSERT_TRUE(yp[i] == 0.0f || yp[i] == 1.0f / (1.0f - p)) << i;
    }
    // Binomial: sd of the fraction = sqrt(p (1-p) / n) <= 7e-4; 5 sd = 3.5e-3.
    EXPECT_NEAR(double(kept) / double(rows * h), 1.0 - p, 3.5e-3) << "p=" << p;
  }
}

TEST(Dropout, ZeroAndOneProbability) {
  std::mt19937 rng(53);
  const Tensor x = randn({7, 13}, rng), res = randn({7, 13}, rng);
  Tensor y = Tensor::empty({7, 13});
  dropout_forward(x, 0.0f, kKey, 0, y);
  EXPECT_EQ(y.to_vector(), x.to_vector());  // identity
  dropout_add_forward(x, res, 0.0f, kKey, 0, y);
  for (int64_t i = 0; i < 91; ++i) ASSERT_EQ(y.get(i), res.get(i) + x.get(i));
  dropout_forward(x, 1.0f, kKey, 0, y);
  for (int64_t i = 0; i < 91; ++i) ASSERT_EQ(std::abs(y.get(i)), 0.0f);  // everything dropped
}

TEST(Dropout, ReferenceBackwardMatchesFiniteDifferences) {
  // Dropout is linear with the fixed mask: d<r, y>/dx = r * m. Checked on h = 8, rows = 6.
  std::mt19937 rng(54);
  const int64_t rows = 6, h = 8;
  const float p = 0.4f;
  Vec x(size_t(rows * h)), r(size_t(rows * h));
  std::normal_distribution<double> nd(0, 1);
  for (auto& e : x) e = nd(rng);
  for (auto& e : r) e = nd(rng);
  auto loss = [&](const Vec& v) {
    const Vec y = ref_dropout(v, rows, h, p, kKey, 10);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    Vec up = x, dn = x;
    up[i] += 1e-6;
    dn[i] -= 1e-6;
    const double fd = (loss(up) - loss(dn)) / 2e-6;
    // step 1e-6: linear, so only rounding ~1e-16 |loss| / 1e-6 ~ 1e-9; 1e-6 is safe.
    EXPECT_NEAR(r[i] * ref_multiplier(kKey, 10 + i / size_t(h), i % size_t(h), p), fd, 1e-6) << i;
  }
}

TEST(Dropout, BackwardRegeneratesTheForwardMask) {
  std::mt19937 rng(55);
  const int64_t rows = 9, h = 300;
  const float p = 0.25f;
  const uint64_t t0 = 77;
  // Forward on ones gives the multiplier m itself; the backward must apply exactly the same m.
  const Tensor ones = Tensor::from(std::vector<float>(size_t(rows * h), 1.0f), {rows, h});
  Tensor m = Tensor::empty({rows, h});
  dropout_forward(ones, p, kKey, t0, m);
  const Tensor dy = randn({rows, h}, rng);
  Tensor dx = Tensor::empty({rows, h});
  dx.fill(5.0f);
  dropout_backward(dy, p, kKey, t0, dx);
  for (int64_t i = 0; i < rows * h; ++i) ASSERT_EQ(dx.get(i), dy.get(i) * m.get(i)) << i;  // one fp32 multiply
  // Accumulate: dx += dy * m on top of what is there.
  const Tensor base = randn({rows, h}, rng);
  Tensor acc = base.clone();
  dropout_backward(dy, p, kKey, t0, acc, /*accumulate=*/true);
  for (int64_t i = 0; i < rows * h; ++i) {
    volatile float prod = dy.get(i) * m.get(i);
    ASSERT_EQ(acc.get(i), base.get(i) + prod) << i;
  }
  // p = 0: the backward is the identity too.
  dropout_backward(dy, 0.0f, kKey, t0, dx);
  EXPECT_EQ(dx.to_vector(), dy.to_vector());
}
