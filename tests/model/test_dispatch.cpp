// Tests of dispatch / combine in index form (src/ampipe/model/dispatch.h).
// Notation: S tokens, h hidden, E experts, k choices, C capacity.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ampipe/model/dispatch.h"
#include "ampipe/model/gate.h"

using namespace ampipe;
using namespace ampipe::model;

namespace {

std::vector<double> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<double> nd(0, 1);
  std::vector<double> v(n);
  for (auto& x : v) x = double(float(nd(rng)));  // exactly representable in fp32
  return v;
}

Tensor tensor_of(const std::vector<double>& v, Shape s, DType dt = DType::f32) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from(f, std::move(s), dt);
}

// A routing from the real gate on random data, with a capacity small enough to drop some choices.
GateCtx routed(int64_t S, int64_t h, int64_t E, int k, double capacity_factor, unsigned seed) {
  std::mt19937 rng(seed);
  GateConfig cfg;
  cfg.num_experts = E;
  cfg.topk = k;
  cfg.capacity_factor = capacity_factor;
  cfg.min_capacity = 0;
  cfg.seed = 5;
  GateCtx ctx;
  gate_forward(tensor_of(randn(size_t(S * h), rng), {S, h}), tensor_of(randn(size_t(E * h), rng), {E, h}), cfg, 0,
               ctx);
  return ctx;
}

// Double references.
std::vector<double> ref_dispatch(const std::vector<double>& x, const GateRouting& r, int64_t h) {
  std::vector<double> d(size_t(r.E * r.C * h), 0.0);
  for (int64_t t = 0; t < r.S; ++t)
    for (int64_t i = 0; i < r.k; ++i) {
      const int s = r.slot[size_t(t * r.k + i)];
      if (s < 0) continue;
      for (int64_t j = 0; j < h; ++j) d[size_t((r.expert[size_t(t * r.k + i)] * r.C + s) * h + j)] = x[size_t(t * h + j)];
    }
  return d;
}

std::vector<double> ref_combine(const std::vector<double>& y, const std::vector<double>& w, const GateRouting& r,
                                int64_t h) {
  std::vector<double> out(size_t(r.S * h), 0.0);
  for (int64_t t = 0; t < r.S; ++t)
    for (int64_t i = 0; i < r.k; ++i) {
      const int s = r.slot[size_t(t * r.k + i)];
      if (s < 0) continue;
      for (int64_t j = 0; j < h; ++j)
        out[size_t(t * h + j)] += w[size_t(t * r.k + i)] * y[size_t((r.expert[size_t(t * r.k + i)] * r.C + s) * h + j)];
    }
  return out;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double fd(const auto& loss, std::vector<double>& v, size_t i, double step = 1e-6) {
  const double keep = v[i];
  v[i] = keep + step;
  const double up = loss();
  v[i] = keep - step;
  const double dn = loss();
  v[i] = keep;
  return (up - dn) / (2 * step);
}

int64_t count_dropped(const GateRouting& r) {
  int64_t n = 0;
  for (int32_t s : r.slot) n += s < 0;
  return n;
}

}  // namespace

// Dispatch, identity experts, combine: unit weights (top-1) or renormalised weights (top-2, w1 + w2 = 1 over the
// kept choices) give back x on every token with a kept choice, and zero on tokens whose choices were all dropped.
TEST(DispatchCombine, IdentityOnKeptTokensZeroOnDropped) {
  const int64_t S = 30, h = 7, E = 4;
  for (int k : {1, 2}) {
    GateCtx ctx = routed(S, h, E, k, /*capacity_factor=*/0.5, 21 + k);
    GateRouting r = ctx.routing;
    ASSERT_GT(count_dropped(r), 0);
    if (k == 1)
      for (size_t i = 0; i < r.weight.size(); ++i) r.weight[i] = r.slot[i] >= 0 ? 1.0f : 0.0f;
    std::mt19937 rng(4);
    const Tensor x = tensor_of(randn(size_t(S * h), rng), {S, h});
    Tensor d = Tensor::empty({E, r.C, h}), out = Tensor::empty({S, h});
    d.fill(7.0f);  // every row must be overwritten: filled slots with x, empty ones with zero
    dispatch_forward(x, r, d);
    combine_forward(d, r, out);
    int64_t all_dropped = 0;
    for (int64_t t = 0; t < S; ++t) {
      bool kept = false;
      for (int i = 0; i < k; ++i) kept |= r.slot[size_t(t * k + i)] >= 0;
      all_dropped += !kept;
      for (int64_t j = 0; j < h; ++j) {
        // top-1: w = 1 exactly; top-2: w1 + w2 = 1 up to fp32 rounding of the renormalisation (1e-6 relative)
        if (kept)
          EXPECT_NEAR(out.get(t * h + j), x.get(t * h + j), 1e-6 * (1 + std::abs(x.get(t * h + j)))) << "k=" << k;
        else
          EXPECT_EQ(out.get(t * h + j), 0.0f) << "k=" << k << " t=" << t;
      }
    }
    EXPECT_GT(all_dropped, 0) << "k=" << k << ": the case should drop a whole token";
    for (int64_t ec = 0; ec < E * r.C; ++ec) {
      if (r.slot_token[size_t(ec)] >= 0) continue;
      for (int64_t j = 0; j < h; ++j) EXPECT_EQ(d.get(ec * h + j), 0.0f);
    }
  }
}

// bf16 activations: dispatch copies bf16 rows bit for bit, and converts exactly between bf16 and fp32.
TEST(Dispatch, Bf16RowsAndConversion) {
  const int64_t S = 10, h = 5, E = 3;
  GateCtx ctx = routed(S, h, E, 2, 1.0, 8);
  const GateRouting& r = ctx.routing;
  std::mt19937 rng(6);
  const Tensor xb = tensor_of(randn(size_t(S * h), rng), {S, h}, DType::bf16);
  Tensor db = Tensor::empty({E, r.C, h}, DType::bf16), df = Tensor::empty({E, r.C, h});
  dispatch_forward(xb, r, db);
  dispatch_forward(xb, r, df);
  for (int64_t ec = 0; ec < E * r.C; ++ec) {
    const int32_t t = r.slot_token[size_t(ec)];
    for (int64_t j = 0; j < h; ++j) {
      const float want = t < 0 ? 0.0f : xb.get(t * h + j);
      EXPECT_EQ(db.get(ec * h + j), want);
      EXPECT_EQ(df.get(ec * h + j), want);
    }
  }
}

// Forward against the double reference; backward against central differences of it.
//   dispatch: loss = <g, D(x)>        -> dx
//   combine:  loss = <g, combine(y, w)> -> dy, d_weight
// Both are (bi)linear, so central differences in double are exact up to rounding (~1e-10); the kernels sum at
// most k (dispatch: one) products per element, or h = 8 for d_weight, in fp32: 1e-5 covers it for O(1) values.
TEST(DispatchCombine, BackwardMatchesFiniteDifferences) {
  const int64_t S = 9, h = 8, E = 3;
  for (int k : {1, 2}) {
    GateCtx ctx = routed(S, h, E, k, 0.4, 31 + k);
    const GateRouting& r = ctx.routing;
    ASSERT_GT(count_dropped(r), 0) << "k=" << k;
    std::mt19937 rng(100 + k);
    std::vector<double> x = randn(size_t(S * h), rng), y = randn(size_t(E * r.C * h), rng);
    std::vector<double> w(r.weight.begin(), r.weight.end());
    const std::vector<double> gd = randn(size_t(E * r.C * h), rng), go = randn(size_t(S * h), rng);

    // forward
    Tensor d = Tensor::empty({E, r.C, h}), out = Tensor::empty({S, h});
    dispatch_forward(tensor_of(x, {S, h}), r, d);
    const auto dref = ref_dispatch(x, r, h);
    for (size_t i = 0; i < dref.size(); ++i) EXPECT_EQ(d.get(int64_t(i)), float(dref[i]));  // a copy: exact
    combine_forward(tensor_of(y, {E, r.C, h}), r, out);
    const auto oref = ref_combine(y, w, r, h);
    for (size_t i = 0; i < oref.size(); ++i) EXPECT_NEAR(out.get(int64_t(i)), oref[i], 1e-5);

    // dispatch backward (accumulates onto a non-zero dx)
    Tensor dx = Tensor::empty({S, h});
    dx.fill(0.25f);
    dispatch_backward(tensor_of(gd, {E, r.C, h}), r, dx);
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = fd([&] { return dot(gd, ref_dispatch(x, r, h)); }, x, i);
      EXPECT_NEAR(dx.get(int64_t(i)) - 0.25, want, 1e-5) << "k=" << k << " dx[" << i << "]";
    }

    // combine backward
    Tensor dy = Tensor::empty({E, r.C, h}), dw = Tensor::empty({S, k});
    dy.fill(3.0f);  // overwritten, empty slots included
    combine_backward(tensor_of(go, {S, h}), tensor_of(y, {E, r.C, h}), r, dy, dw);
    for (size_t i = 0; i < y.size(); ++i) {
      const double want = fd([&] { return dot(go, ref_combine(y, w, r, h)); }, y, i);
      EXPECT_NEAR(dy.get(int64_t(i)), want, 1e-5) << "k=" << k << " dy[" << i << "]";
    }
    for (size_t i = 0; i < w.size(); ++i) {
      // a dropped choice has no gradient (its weight does not reach the output)
      const double want = fd([&] { return dot(go, ref_combine(y, w, r, h)); }, w, i);
      EXPECT_NEAR(dw.get(int64_t(i)), want, 1e-5) << "k=" << k << " dw[" << i << "]";
    }
  }
}
