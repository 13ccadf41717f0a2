// Rotary position embeddings (kernels/rope) against a double reference written from Megatron-Core's description
// (rotate_half: t * cos + [-t2, t1] * sin over the first rot_dim channels, inv_freq = 1 / base^(2i / rot_dim)), the
// properties RoPE exists for (q_i . k_j depends only on i - j; the inverse is the transpose), and Llama 3's
// frequency scaling against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "support/numeric.h"
#include "ampipe/kernels/rope.h"

using namespace ampipe;
using namespace ampipe::kernels;

namespace {
using Vec = std::vector<double>;
using ampipe::testing::randn;
using ampipe::testing::to_tensor;

// One head's d channels at position p, in double: frequencies 1 / base^(2i / r), pairs (i, i + r/2) or (2i, 2i+1).
Vec ref_rotate(const Vec& x, double p, int64_t r, double base, bool interleaved) {
  Vec y = x;
  for (int64_t i = 0; i < r / 2; ++i) {
    const double a = p / std::pow(base, double(2 * i) / double(r));
    const size_t lo = size_t(interleaved ? 2 * i : i), hi = size_t(interleaved ? 2 * i + 1 : i + r / 2);
    y[lo] = x[lo] * std::cos(a) - x[hi] * std::sin(a);
    y[hi] = x[hi] * std::cos(a) + x[lo] * std::sin(a);
  }
  return y;
}

Vec head(const Tensor& t, int64_t row, int64_t col0, int64_t d) {
  Vec v(static_cast<size_t>(d));
  for (int64_t j = 0; j < d; ++j) v[size_t(j)] = t.data<float>()[row * t.size(1) + col0 + j];
  return v;
}
}  // namespace

// Every head of every token against the double reference, in a strided view (the q columns of a fused buffer,
// the columns around it untouched), for full and partial rotation, both pair layouts and scattered positions
// (context parallelism's halves). Angles up to 4000 rad in fp32 carry ~2e-4 absolute error (as Megatron's fp32
// freqs do); the tolerance is set by that, not by the rotation.
TEST(Rope, MatchesDoubleReference) {
  const int64_t b = 2, heads = 3, d = 16, ld = heads * d + 5;
  const std::vector<int64_t> pos = {0, 1, 7, 4000, 33};
  for (const int64_t r : {int64_t(16), int64_t(8)})
    for (const bool inter : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "rot_dim " << r << (inter ? " interleaved" : ""));
      std::mt19937 rng(uint32_t(r + inter));
      const Vec x = randn(size_t(int64_t(pos.size()) * b * ld), rng);
      Tensor buf = to_tensor(x, {int64_t(pos.size()) * b, ld});
      Tensor view = buf.cols(2, 2 + heads * d);
      RopeSpec spec{r, 10000, inter};
      rope_apply(spec, view, heads, d, b, pos, /*inverse=*/false);
      const Tensor orig = to_tensor(x, {int64_t(pos.size()) * b, ld});
      for (size_t i = 0; i < pos.size(); ++i)
        for (int64_t bb = 0; bb < b; ++bb) {
          const int64_t row = int64_t(i) * b + bb;
          for (int64_t hh = 0; hh < heads; ++hh) {
            const Vec want = ref_rotate(head(orig, row, 2 + hh * d, d), double(pos[i]), r, 10000, inter);
            const Vec got = head(buf, row, 2 + hh * d, d);
            const double tol = pos[i] > 100 ? 2e-3 : 1e-6;
            for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(got[size_t(j)], want[size_t(j)], tol) << "pos " << pos[i];
            for (int64_t j = r; j < d; ++j) EXPECT_EQ(got[size_t(j)], want[size_t(j)]);  // passed through exactly
          }
          for (int64_t c : {int64_t(0), int64_t(1), ld - 3, ld - 2, ld - 1})  // outside the view: untouched
            EXPECT_EQ(buf.data<float>()[row * ld + c], orig.data<float>()[row * ld + c]);
        }
    }
}

// The inverse rotation undoes the forward one (it is the transpose, which the backward applies to dq, dk), and
// the dot product of a rotated q at position i with a rotated k at position j depends only on i - j.
TEST(Rope, InverseIsTransposeAndDotsDependOnDistance) {
  const int64_t d = 8;
  std::mt19937 rng(5);
  const Vec q = randn(size_t(d), rng), k = randn(size_t(d), rng);
  const RopeSpec spec{d, 500, false};
  auto rotated = [&](const Vec& v, int64_t p, bool inverse) {
    Tensor t = to_tensor(v, {1, d});
    const std::vector<int64_t> at = {p};
    rope_apply(spec, t, 1, d, 1, at, inverse);
    return head(t, 0, 0, d);
  };
  const Vec back = rotated(rotated(q, 37, false), 37, true);
  for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(back[size_t(j)], q[size_t(j)], 1e-6);
  auto dot = [&](int64_t i, int64_t j) {
    const Vec a = rotated(q, i, false), c = rotated(k, j, false);
    double s = 0;
    for (int64_t e = 0; e < d; ++e) s += a[size_t(e)] * c[size_t(e)];
    return s;
  };
  EXPECT_NEAR(dot(10, 3), dot(27, 20), 1e-5);
  EXPECT_NEAR(dot(5, 5), dot(0, 0), 1e-5);
  EXPECT_GT(std::abs(dot(10, 3) - dot(10, 9)), 1e-3);  // and it does depend on the distance
}

// Interpolation divides the positions: position 12 with factor 4 is position 3 without.
TEST(Rope, InterpolationScalesPositions) {
  const int64_t d = 8;
  std::mt19937 rng(6);
  const Vec x = randn(size_t(d), rng);
  Tensor a = to_tensor(x, {1, d}), c = to_tensor(x, {1, d});
  const std::vector<int64_t> p12 = {12}, p3 = {3};
  RopeSpec spec{d, 10000, false, 0.25};
  rope_apply(spec, a, 1, d, 1, p12, false);
  spec.position_scale = 1.0;
  rope_apply(spec, c, 1, d, 1, p3, false);
  for (int64_t j = 0; j < d; ++j) EXPECT_FLOAT_EQ(a.data<float>()[j], c.data<float>()[j]);
}

// Llama 3's scaling by hand (factor 8, low 1, high 4, context 8192): with base 500000 and r = 8 the frequencies are
// 1, 500000^-0.25 = 0.0376, 500000^-0.5 = 1.414e-3, 500000^-0.75 = 5.318e-5; their wavelengths 2 pi / f are 6.28,
// 167, 4443 and 118148. Below 2048 kept; above 8192 divided by 8; 4443 in the band: smooth = (8192 / 4443 - 1) / 3
// = 0.2813, f = (1 - smooth) f / 8 + smooth f.
TEST(Rope, Llama3ScalingByHand) {
  RopeSpec spec{8, 500000, false};
  spec.llama3_scaling = true;
  const std::vector<float> f = rope_inv_freq(spec);
  ASSERT_EQ(f.size(), 4u);
  const double f2 = std::pow(500000.0, -0.5), f3 = std::pow(500000.0, -0.75);
  const double smooth = (8192.0 / (2 * std::numbers::pi / f2) - 1.0) / 3.0;
  EXPECT_NEAR(f[0], 1.0, 1e-7);
  EXPECT_NEAR(f[1], std::pow(500000.0, -0.25), 1e-8);
  EXPECT_NEAR(f[2], (1 - smooth) * f2 / 8 + smooth * f2, 1e-9);
  EXPECT_NEAR(f[3], f3 / 8, 1e-11);
  EXPECT_NEAR(smooth, 0.2813, 1e-3);
}
