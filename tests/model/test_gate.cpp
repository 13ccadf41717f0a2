// Tests of the DeepSpeed-MoE gate (src/ampipe/model/gate.h).
// Notation: S tokens, h hidden, E experts, k choices, C capacity, M chunks.
// The reference below is written in double and in DeepSpeed's dense style (one-hot masks, cumsum locations), so
// it checks the index form's slot rules independently of the implementation's loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "ampipe/core/philox.h"
#include "ampipe/model/gate.h"

using namespace ampipe;
using namespace ampipe::model;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Double reference (DeepSpeed top1gating / top2gating, dense form)

struct RefGate {
  int64_t C = 0;
  std::vector<int> expert, slot;  // [S, k]
  std::vector<double> weight;     // [S, k]
  std::vector<double> probs;      // [S, E]
  std::vector<double> sort_key;   // [S, E] what the choice was made on (probs, or logits + Gumbel)
  std::vector<double> sum_p, sum_m;
};

double ref_gumbel(const core::PhiloxKey& key, uint64_t t, uint64_t e) {
  const double u = (double(core::philox_u32(key, t, e) >> 8) + 0.5) / 16777216.0;
  return -std::log(-std::log(u));
}

// C < 0: capacity from the config (gate_capacity, or the largest load with no_drop).
RefGate ref_gate(const std::vector<double>& x, int64_t S, int64_t h, const std::vector<double>& Wg,
                 const GateConfig& cfg, int64_t token0, int64_t C = -1) {
  const int64_t E = cfg.num_experts, k = cfg.topk;
  RefGate g;
  std::vector<double> logits(size_t(S * E));
  const bool jitter = cfg.training && cfg.noisy_gate_policy == NoisyGatePolicy::jitter;
  const bool rsample = cfg.training && k == 1 && cfg.noisy_gate_policy == NoisyGatePolicy::rsample;
  for (int64_t t = 0; t < S; ++t)
    for (int64_t e = 0; e < E; ++e) {
      double acc = 0;
      for (int64_t j = 0; j < h; ++j) {
        double xv = x[size_t(t * h + j)];
        if (jitter)
          xv *= 1.0 - 1e-2 + 2e-2 * core::philox_uniform({cfg.seed, cfg.layer, core::RngPurpose::gate_jitter},
                                                         uint64_t(token0 + t), uint64_t(j));
        acc += xv * Wg[size_t(e * h + j)];
      }
      logits[size_t(t * E + e)] = acc;
    }
  g.probs.resize(size_t(S * E));
  g.sort_key.resize(size_t(S * E));
  for (int64_t t = 0; t < S; ++t) {
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, logits[size_t(t * E + e)]);
    for (int64_t e = 0; e < E; ++e) sum += std::exp(logits[size_t(t * E + e)] - mx);
    for (int64_t e = 0; e < E; ++e) {
      g.probs[size_t(t * E + e)] = std::exp(logits[size_t(t * E + e)] - mx) / sum;
      g.sort_key[size_t(t * E + e)] =
          rsample ? logits[size_t(t * E + e)] +
                        ref_gumbel({cfg.seed, cfg.layer, core::RngPurpose::gate_rsample}, uint64_t(token0 + t),
                                   uint64_t(e))
                  : g.probs[size_t(t * E + e)];
    }
  }
  auto argmax = [&](int64_t t, int exclude) {
    int best = -1;
    for (int e = 0; e < E; ++e)
      if (e != exclude && (best < 0 || g.sort_key[size_t(t * E + e)] > g.sort_key[size_t(t * E + best)])) best = e;
    return best;
  };
  // one-hot masks [S, E]
  std::vector<int> mask1(size_t(S * E), 0), mask2(size_t(S * E), 0);
  g.expert.assign(size_t(S * k), -1);
  for (int64_t t = 0; t < S; ++t) {
    const int e1 = argmax(t, -1);
    mask1[size_t(t * E + e1)] = 1;
    g.expert[size_t(t * k)] = e1;
    if (k == 2) {
      // second choice by prob (the Gumbel of RSample is top-1 only)
      int e2 = -1;
      for (int e = 0; e < E; ++e)
        if (e != e1 && (e2 < 0 || g.probs[size_t(t * E + e)] > g.probs[size_t(t * E + e2)])) e2 = e;
      mask2[size_t(t * E + e2)] = 1;
      g.expert[size_t(t * k + 1)] = e2;
    }
  }
  g.sum_p.assign(size_t(E), 0);
  g.sum_m.assign(size_t(E), 0);
  std::vector<int> load(size_t(E), 0);
  for (int64_t t = 0; t < S; ++t)
    for (int64_t e = 0; e < E; ++e) {
      g.sum_p[size_t(e)] += g.probs[size_t(t * E + e)];
      g.sum_m[size_t(e)] += mask1[size_t(t * E + e)];
      load[size_t(e)] += mask1[size_t(t * E + e)] + mask2[size_t(t * E + e)];
    }
  if (C < 0)
    C = cfg.no_drop ? *std::max_element(load.begin(), load.end())
                    : gate_capacity(S, E, cfg.topk, cfg.capacity_factor, cfg.min_capacity);
  g.C = C;
  g.slot.assign(size_t(S * k), -1);
  g.weight.assign(size_t(S * k), 0);
  if (k == 1) {
    std::vector<int> keep = mask1;
    if (cfg.use_rts) {  // top-C of mask1 * u per expert (equal u: lower token)
      for (int64_t e = 0; e < E; ++e) {
        std::vector<std::pair<double, int64_t>> pr;
        for (int64_t t = 0; t < S; ++t)
          if (mask1[size_t(t * E + e)])
            pr.push_back({-double(core::philox_uniform({cfg.seed, cfg.layer, core::RngPurpose::gate_rts},
                                                       uint64_t(token0 + t), 0)),
                          t});
        std::sort(pr.begin(), pr.end());
        for (size_t i = size_t(C); i < pr.size(); ++i) keep[size_t(pr[i].second * E + e)] = 0;
      }
    } else {  // locations1 = cumsum(mask1) - 1 < C
      for (int64_t e = 0; e < E; ++e) {
        int64_t cum = 0;
        for (int64_t t = 0; t < S; ++t)
          if (mask1[size_t(t * E + e)] && cum++ >= C) keep[size_t(t * E + e)] = 0;
      }
    }
    for (int64_t e = 0; e < E; ++e) {  // slot = cumsum(kept mask) - 1
      int64_t cum = 0;
      for (int64_t t = 0; t < S; ++t)
        if (keep[size_t(t * E + e)]) {
          g.slot[size_t(t)] = int(cum++);
          g.weight[size_t(t)] = g.probs[size_t(t * E + e)];
        }
    }
    return g;
  }
  // top-2: locations1 = cumsum(mask1) - 1; locations2 = cumsum(mask2) - 1 + sum(mask1)
  std::vector<int64_t> loc1(size_t(S * E)), loc2(size_t(S * E));
  for (int64_t e = 0; e < E; ++e) {
    int64_t c1 = 0, c2 = 0;
    for (int64_t t = 0; t < S; ++t) {
      c1 += mask1[size_t(t * E + e)];
      c2 += mask2[size_t(t * E + e)];
      loc1[size_t(t * E + e)] = c1 - 1;
      loc2[size_t(t * E + e)] = c2 - 1;
    }
    for (int64_t t = 0; t < S; ++t) loc2[size_t(t * E + e)] += c1;
  }
  for (int64_t t = 0; t < S; ++t) {
    const int e1 = g.expert[size_t(t * 2)], e2 = g.expert[size_t(t * 2 + 1)];
    const int64_t l1 = loc1[size_t(t * E + e1)], l2 = loc2[size_t(t * E + e2)];
    const double g1 = l1 < C ? g.probs[size_t(t * E + e1)] : 0, g2 = l2 < C ? g.probs[size_t(t * E + e2)] : 0;
    const double denom = std::max(g1 + g2, double(FLT_EPSILON));
    if (l1 < C) g.slot[size_t(t * 2)] = int(l1), g.weight[size_t(t * 2)] = g1 / denom;
    if (l2 < C) g.slot[size_t(t * 2 + 1)] = int(l2), g.weight[size_t(t * 2 + 1)] = g2 / denom;
  }
  return g;
}

// ---------------------------------------------------------------------------------------------------------------
// Helpers

Tensor tensor_of(const std::vector<double>& v, Shape s, DType dt = DType::f32) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from(f, std::move(s), dt);
}

std::vector<double> randn(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> nd(0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = double(float(nd(rng)));  // exactly representable in fp32
  return v;
}

GateConfig make_cfg(int64_t E, int k) {
  GateConfig c;
  c.num_experts = E;
  c.topk = k;
  c.capacity_factor = 1.0;
  c.min_capacity = 0;
  c.seed = 77;
  c.layer = 3;
  return c;
}

// The per-choice slots and the per-slot table are the same relation, and kept slots are compact.
void expect_consistent(const GateRouting& r) {
  std::vector<int> filled(size_t(r.E), 0);
  for (int64_t t = 0; t < r.S; ++t)
    for (int64_t i = 0; i < r.k; ++i) {
      const int s = r.slot[size_t(t * r.k + i)];
      if (s < 0) {
        EXPECT_EQ(r.weight[size_t(t * r.k + i)], 0.0f);
        continue;
      }
      ASSERT_LT(s, r.C);
      const int e = r.expert[size_t(t * r.k + i)];
      EXPECT_EQ(r.slot_token[size_t(e * r.C + s)], t) << "e=" << e << " s=" << s;
      ++filled[size_t(e)];
    }
  for (int64_t e = 0; e < r.E; ++e) {
    EXPECT_EQ(filled[size_t(e)], r.expert_count[size_t(e)]);
    for (int64_t c = 0; c < r.C; ++c)
      EXPECT_EQ(r.slot_token[size_t(e * r.C + c)] >= 0, c < filled[size_t(e)]) << "e=" << e << " c=" << c;
  }
}

// Gate with logits chosen by hand: h = E, Wg = I, x = logits.
void gate_logits(const std::vector<std::vector<double>>& logits, GateConfig cfg, int64_t C, GateCtx& ctx) {
  const int64_t S = int64_t(logits.size()), E = int64_t(logits[0].size());
  std::vector<double> x, w(size_t(E * E), 0.0);
  for (const auto& row : logits) x.insert(x.end(), row.begin(), row.end());
  for (int64_t e = 0; e < E; ++e) w[size_t(e * E + e)] = 1.0;
  cfg.num_experts = E;
  gate_select_forward(tensor_of(x, {S, E}), tensor_of(w, {E, E}), cfg, 0, ctx);
  gate_assign_forward(C, ctx);
  expect_consistent(ctx.routing);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

TEST(GateCapacity, Formula) {
  // C = clamp(ceil(S / E * cf * k), min_capacity, S); exact integers need no rounding argument.
  EXPECT_EQ(gate_capacity(12, 4, 1, 1.0, 0), 3);
  EXPECT_EQ(gate_capacity(12, 4, 2, 1.0, 0), 6);     // k = 2 doubles the factor
  EXPECT_EQ(gate_capacity(12, 4, 1, 1.0, 4), 4);     // below min_capacity -> min_capacity
  EXPECT_EQ(gate_capacity(10, 4, 1, 1.1, 0), 3);     // 2.75 -> 3
  EXPECT_EQ(gate_capacity(10, 4, 2, 1.25, 0), 7);    // 6.25 -> 7
  EXPECT_EQ(gate_capacity(7, 3, 1, 1.0, 0), 3);      // 2.33 -> 3
  EXPECT_EQ(gate_capacity(100, 8, 1, 1.5, 4), 19);   // 18.75 -> 19
  EXPECT_EQ(gate_capacity(1024, 8, 2, 1.1, 4), 282); // 281.6 -> 282
  EXPECT_EQ(gate_capacity(5, 4, 2, 4.0, 0), 5);      // 10 > S -> S
  EXPECT_EQ(gate_capacity(64, 4, 2, 1e300, 0), 64);  // a product beyond int64 (fp32 inf): every token fits
  EXPECT_EQ(gate_capacity(2, 4, 1, 1.0, 4), 2);      // min_capacity 4 first, then > S -> S
  EXPECT_EQ(gate_capacity(6, 4, 2, 0.5, 1), 2);      // 1.5 -> 2
  EXPECT_EQ(gate_capacity(6, 4, 1, 0.1, 1), 1);      // 0.15 -> 1
}

TEST(GateTop2, SecondChoicesQueueAfterAllFirstChoices) {
  // E = 3. Choices (first, second): t0 (0,1), t1 (1,0), t2 (0,2), t3 (1,0).
  const std::vector<std::vector<double>> L = {{2, 1, 0}, {1, 2, 0}, {2, 0, 1}, {1, 2, 0}};
  GateCtx ctx;
  gate_logits(L, make_cfg(3, 2), /*C=*/4, ctx);
  const GateRouting& r = ctx.routing;
  // first choices: e0 <- t0 (0), t2 (1); e1 <- t1 (0), t3 (1)
  // second choices after all first choices: t0 -> e1 slot 2; t1 -> e0 slot 2; t2 -> e2 slot 0; t3 -> e0 slot 3
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 1, 0, 0, 2, 1, 0}));
  EXPECT_EQ(r.slot, (std::vector<int32_t>{0, 2, 0, 2, 1, 0, 1, 3}));
  EXPECT_EQ(r.slot_token, (std::vector<int32_t>{0, 2, 1, 3, /*e1*/ 1, 3, 0, -1, /*e2*/ 2, -1, -1, -1}));
  // nothing dropped: w1 + w2 = 1 and w1 / w2 = exp(l1 - l2) (fp32 softmax: 1e-6)
  for (int t = 0; t < 4; ++t) {
    EXPECT_NEAR(r.weight[size_t(2 * t)] + r.weight[size_t(2 * t + 1)], 1.0, 1e-6);
    EXPECT_NEAR(r.weight[size_t(2 * t)] / r.weight[size_t(2 * t + 1)], std::exp(1.0), 1e-5);
  }
  EXPECT_EQ(gate_required_capacity(ctx), 4);  // e0 gets 2 first + 2 second choices
}

TEST(GateTop2, DropsFirstComeFirstServedAndRenormalises) {
  const std::vector<std::vector<double>> L = {{2, 1, 0}, {1, 2, 0}, {2, 0, 1}, {1, 2, 0}};
  {
    GateCtx ctx;
    gate_logits(L, make_cfg(3, 2), /*C=*/3, ctx);  // only t3's second choice (e0 slot 3) overflows
    const GateRouting& r = ctx.routing;
    EXPECT_EQ(r.slot, (std::vector<int32_t>{0, 2, 0, 2, 1, 0, 1, -1}));
    EXPECT_EQ(r.weight[7], 0.0f);
    EXPECT_EQ(r.weight[6], 1.0f);  // p1 / p1: the surviving choice gets weight 1 exactly
    EXPECT_NEAR(r.weight[2] + r.weight[3], 1.0, 1e-6);
  }
  {
    GateCtx ctx;
    gate_logits(L, make_cfg(3, 2), /*C=*/1, ctx);
    const GateRouting& r = ctx.routing;
    // e0 first: t0 kept, t2 dropped; e1 first: t1 kept, t3 dropped; second choices start at slot 2 on e0, e1
    // (dropped) and slot 0 on e2 (t2 kept).
    EXPECT_EQ(r.slot, (std::vector<int32_t>{0, -1, 0, -1, -1, 0, -1, -1}));
    EXPECT_EQ(r.weight[0], 1.0f);
    EXPECT_EQ(r.weight[5], 1.0f);  // t2 keeps only its second choice
    EXPECT_EQ(r.weight[6], 0.0f);  // t3 is dropped entirely: zero MoE output
    EXPECT_EQ(r.weight[7], 0.0f);
    EXPECT_EQ(r.slot_token, (std::vector<int32_t>{0, 1, 2}));
  }
}

TEST(GateTop1, DropsInTokenOrderWithoutRtsAndKeepsRawProb) {
  // All five tokens prefer e1.
  const std::vector<std::vector<double>> L = {{0, 1}, {0, 2}, {0, 3}, {0, 1.5}, {0, 0.5}};
  GateConfig cfg = make_cfg(2, 1);
  cfg.use_rts = false;
  GateCtx ctx;
  gate_logits(L, cfg, /*C=*/2, ctx);
  const GateRouting& r = ctx.routing;
  EXPECT_EQ(r.slot, (std::vector<int32_t>{0, 1, -1, -1, -1}));
  EXPECT_EQ(r.slot_token, (std::vector<int32_t>{-1, -1, 0, 1}));
  // not renormalised: the weight is the softmax prob (fp32 softmax vs double: 1e-6)
  EXPECT_NEAR(r.weight[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(r.weight[1], 1.0 / (1.0 + std::exp(-2.0)), 1e-6);
  EXPECT_EQ(ctx.stats.sum_mask1, (std::vector<double>{0, 5}));  // before dropping
}

TEST(GateTop1, RtsKeepsHighestPriorityForAnyChunking) {
  // 24 tokens, all routed to e0 (E = 2); per chunk the kept tokens must be the C highest
  // u = philox_uniform(seed, layer, gate_rts, global token, 0), whichever chunking (M = 1, 2, 3, 4).
  const int64_t S = 24, C = 3;
  std::vector<std::vector<double>> L(size_t(S), std::vector<double>{1.0, 0.0});
  GateConfig cfg = make_cfg(2, 1);
  const core::PhiloxKey key{cfg.seed, cfg.layer, core::RngPurpose::gate_rts};
  std::vector<double> x, w = {1, 0, 0, 1};
  for (const auto& row : L) x.insert(x.end(), row.begin(), row.end());
  const Tensor X = tensor_of(x, {S, 2}), W = tensor_of(w, {2, 2});
  std::set<int64_t> kept_m1;
  for (int64_t M : {1, 2, 3, 4}) {
    const int64_t Sc = S / M;
    for (int64_t c = 0; c < M; ++c) {
      GateCtx ctx;
      gate_select_forward(X.rows(c * Sc, (c + 1) * Sc), W, cfg, c * Sc, ctx);
      gate_assign_forward(C, ctx);
      expect_consistent(ctx.routing);
      std::vector<std::pair<float, int64_t>> pr;
      for (int64_t t = 0; t < Sc; ++t) pr.push_back({-core::philox_uniform(key, uint64_t(c * Sc + t), 0), t});
      std::sort(pr.begin(), pr.end());
      std::set<int64_t> want, got;
      for (int64_t i = 0; i < C; ++i) want.insert(pr[size_t(i)].second);
      int32_t prev = -1;
      for (int64_t s = 0; s < C; ++s) {  // slots in token order
        const int32_t t = ctx.routing.slot_token[size_t(s)];
        EXPECT_GT(t, prev);
        prev = t;
        got.insert(t);
      }
      EXPECT_EQ(got, want) << "M=" << M << " c=" << c;
      if (M == 1) kept_m1 = got;
    }
  }
  // Keyed by the global index, not the chunk-local one: the same rows with another token0 keep other tokens.
  GateCtx shifted;
  gate_select_forward(X, W, cfg, /*token0=*/1000, shifted);
  gate_assign_forward(C, shifted);
  std::set<int64_t> got(shifted.routing.slot_token.begin(), shifted.routing.slot_token.begin() + C);
  EXPECT_NE(got, kept_m1);
}

TEST(Gate, NoDropDropsNothing) {
  std::mt19937 rng(5);
  const int64_t S = 20, h = 6, E = 4;
  const auto x = randn(size_t(S * h), rng), w = randn(size_t(E * h), rng);
  for (int k : {1, 2}) {
    GateConfig cfg = make_cfg(E, k);
    cfg.capacity_factor = 0.05;  // would drop almost everything
    cfg.no_drop = true;
    GateCtx ctx;
    gate_forward(tensor_of(x, {S, h}), tensor_of(w, {E, h}), cfg, 0, ctx);
    expect_consistent(ctx.routing);
    for (int32_t s : ctx.routing.slot) EXPECT_GE(s, 0) << "k=" << k;
    EXPECT_EQ(ctx.routing.C, gate_required_capacity(ctx));
    EXPECT_EQ(ctx.routing.C, *std::max_element(ctx.routing.expert_count.begin(), ctx.routing.expert_count.end()));
    if (k == 2) {
      for (int64_t t = 0; t < S; ++t)
        EXPECT_NEAR(ctx.routing.weight[size_t(2 * t)] + ctx.routing.weight[size_t(2 * t + 1)], 1.0, 1e-6);
    }
  }
}

// The index form against the dense DeepSpeed-style double reference, for every policy, with drops.
TEST(Gate, MatchesDenseDoubleReference) {
  std::mt19937 rng(11);
  const int64_t S = 40, h = 12, E = 5;
  const auto x = randn(size_t(S * h), rng), w = randn(size_t(E * h), rng, 0.5);
  for (int k : {1, 2})
    for (NoisyGatePolicy pol : {NoisyGatePolicy::none, NoisyGatePolicy::jitter, NoisyGatePolicy::rsample})
      for (bool rts : {true, false})
        for (DType dt : {DType::f32, DType::bf16}) {
          GateConfig cfg = make_cfg(E, k);
          cfg.noisy_gate_policy = pol;
          cfg.use_rts = rts;
          const int64_t token0 = 96;
          GateCtx ctx;
          const Tensor X = tensor_of(x, {S, h}, dt);
          gate_forward(X, tensor_of(w, {E, h}), cfg, token0, ctx);
          const auto xr = X.to_vector();  // bf16-rounded input for the reference
          const RefGate ref = ref_gate(std::vector<double>(xr.begin(), xr.end()), S, h, w, cfg, token0);
          const GateRouting& r = ctx.routing;
          const std::string what = fmt::format("k={} policy={} rts={} {}", k, int(pol), rts, dtype_name(dt));
          expect_consistent(r);
          ASSERT_EQ(r.C, ref.C) << what;
          EXPECT_EQ(r.expert, std::vector<int32_t>(ref.expert.begin(), ref.expert.end())) << what;
          EXPECT_EQ(r.slot, std::vector<int32_t>(ref.slot.begin(), ref.slot.end())) << what;
          // fp32 logits over h = 12 and fp32 softmax vs double: ~1e-7; 1e-5 leaves room for renormalisation.
          for (size_t i = 0; i < r.weight.size(); ++i) EXPECT_NEAR(r.weight[i], ref.weight[i], 1e-5) << what;
          for (int64_t e = 0; e < E; ++e) {
            EXPECT_NEAR(ctx.stats.sum_probs[size_t(e)], ref.sum_p[size_t(e)], 1e-5) << what;
            EXPECT_EQ(ctx.stats.sum_mask1[size_t(e)], ref.sum_m[size_t(e)]) << what;
          }
          EXPECT_TRUE(std::count(r.slot.begin(), r.slot.end(), -1) > 0) << what << ": the case should drop";
        }
}

TEST(GateAuxLoss, ChunkSumsEqualWholeBatch) {
  std::mt19937 rng(3);
  const int64_t S = 12, h = 8, E = 4;
  const auto x = randn(size_t(S * h), rng), w = randn(size_t(E * h), rng);
  const Tensor X = tensor_of(x, {S, h}), W = tensor_of(w, {E, h});
  for (int k : {1, 2}) {
    const GateConfig cfg = make_cfg(E, k);
    GateCtx whole;
    gate_forward(X, W, cfg, 0, whole);
    const double l1 = aux_loss_from_sums(whole.stats);
    // the formula, in double from the reference's probs: E * sum_e mean_t(p) * mean_t(mask1)
    const RefGate ref = ref_gate(x, S, h, w, cfg, 0);
    double want = 0;
    for (int64_t e = 0; e < E; ++e) want += ref.sum_p[size_t(e)] / S * ref.sum_m[size_t(e)] / S;
    want *= double(E);
    EXPECT_NEAR(l1, want, 1e-6);  // fp32 probs summed in double: ~1e-7
    for (int64_t M : {2, 3, 4}) {
      GateStats total;
      for (int64_t c = 0; c < M; ++c) {
        GateCtx ctx;
        gate_forward(X.rows(c * S / M, (c + 1) * S / M), W, cfg, c * S / M, ctx);
        total.accumulate(ctx.stats);
      }
      EXPECT_EQ(total.tokens, double(S));
      // Per-token probs are the same fp32 numbers up to the GEMM's blocking; 1e-6 relative.
      EXPECT_NEAR(aux_loss_from_sums(total), l1, 1e-6 * l1) << "k=" << k << " M=" << M;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Backward: dx and dWg of  loss = sum_c <r_c, weights_c> + a * l_aux(sums over all chunks)  against central
// differences of the double reference. Routing is fixed under the 1e-6 steps: the case is chosen with a margin
// > 1e-3 between the compared scores, and drops depend only on the routing order.

namespace {

struct FdCase {
  int64_t S, h, E;
  int k;
  NoisyGatePolicy policy;
  int64_t M;
};

double ref_loss(const std::vector<double>& x, const std::vector<double>& w, const FdCase& fc, const GateConfig& cfg,
                const std::vector<double>& r, double a, std::vector<RefGate>* out = nullptr) {
  const int64_t Sc = fc.S / fc.M;
  double loss = 0;
  std::vector<double> sp(size_t(fc.E), 0), sm(size_t(fc.E), 0);
  for (int64_t c = 0; c < fc.M; ++c) {
    std::vector<double> xc(x.begin() + c * Sc * fc.h, x.begin() + (c + 1) * Sc * fc.h);
    const RefGate g = ref_gate(xc, Sc, fc.h, w, cfg, c * Sc);
    for (int64_t i = 0; i < Sc * fc.k; ++i) loss += r[size_t(c * Sc * fc.k + i)] * g.weight[size_t(i)];
    for (int64_t e = 0; e < fc.E; ++e) sp[size_t(e)] += g.sum_p[size_t(e)], sm[size_t(e)] += g.sum_m[size_t(e)];
    if (out) out->push_back(g);
  }
  double aux = 0;
  for (int64_t e = 0; e < fc.E; ++e) aux += sp[size_t(e)] / fc.S * sm[size_t(e)] / fc.S;
  return loss + a * double(fc.E) * aux;
}

// Smallest gap between consecutive sorted scores of any token (the choices flip only if a step crosses it).
double min_gap(const RefGate& g, int64_t E) {
  double gap = INFINITY;
  for (size_t t = 0; t * size_t(E) < g.sort_key.size(); ++t) {
    std::vector<double> v(g.sort_key.begin() + t * E, g.sort_key.begin() + (t + 1) * E);
    std::sort(v.rbegin(), v.rend());
    for (size_t i = 0; i + 1 < v.size(); ++i) gap = std::min(gap, v[i] - v[i + 1]);
  }
  return gap;
}

void check_backward(const FdCase& fc) {
  const std::string what = fmt::format("k={} policy={} M={}", fc.k, int(fc.policy), fc.M);
  GateConfig cfg = make_cfg(fc.E, fc.k);
  cfg.noisy_gate_policy = fc.policy;
  cfg.capacity_factor = 1.0;  // per chunk C = ceil(S_c / E * k): some choices drop
  const double a = 0.7;       // d_l_aux, i.e. the aux-loss coefficient
  // First seed whose case has well separated choices and at least one dropped choice (and, for top-2, a token
  // whose second choice alone was dropped, to cover w1 = 1).
  std::vector<double> x, w, r;
  std::vector<RefGate> gates;
  for (unsigned seed = 1;; ++seed) {
    ASSERT_LT(seed, 500u) << what;
    std::mt19937 rng(seed);
    x = randn(size_t(fc.S * fc.h), rng);
    w = randn(size_t(fc.E * fc.h), rng, 0.6);
    r = randn(size_t(fc.S * fc.k), rng);
    gates.clear();
    ref_loss(x, w, fc, cfg, r, a, &gates);
    bool ok = true, drop = false, second_only = fc.k == 1;
    for (const auto& g : gates) {
      ok &= min_gap(g, fc.E) > 1e-3;
      for (size_t i = 0; i < g.slot.size(); ++i) drop |= g.slot[i] < 0;
      if (fc.k == 2)
        for (size_t t = 0; 2 * t < g.slot.size(); ++t) second_only |= g.slot[2 * t] >= 0 && g.slot[2 * t + 1] < 0;
    }
    if (ok && drop && second_only) break;
  }

  // Implementation: gate each chunk, sum the stats, then backward every chunk with the global sums.
  const int64_t Sc = fc.S / fc.M;
  const Tensor X = tensor_of(x, {fc.S, fc.h}), W = tensor_of(w, {fc.E, fc.h});
  std::vector<GateCtx> ctx(size_t(fc.M));
  GateStats total;
  for (int64_t c = 0; c < fc.M; ++c) {
    gate_forward(X.rows(c * Sc, (c + 1) * Sc), W, cfg, c * Sc, ctx[size_t(c)]);
    total.accumulate(ctx[size_t(c)].stats);
  }
  Tensor dx = Tensor::zeros({fc.S, fc.h}), dW = Tensor::zeros({fc.E, fc.h}), dlogits = Tensor::zeros({Sc, fc.E});
  for (int64_t c = 0; c < fc.M; ++c) {
    std::vector<double> rc(r.begin() + c * Sc * fc.k, r.begin() + (c + 1) * Sc * fc.k);
    Tensor dxc = dx.rows(c * Sc, (c + 1) * Sc);
    gate_backward(tensor_of(rc, {Sc, fc.k}), float(a), total, ctx[size_t(c)], W, dlogits, dxc, dW);
  }
  auto fd = [&](std::vector<double>& v, size_t i) {
    const double step = 1e-6, keep = v[i];
    v[i] = keep + step;
    const double up = ref_loss(x, w, fc, cfg, r, a);
    v[i] = keep - step;
    const double dn = ref_loss(x, w, fc, cfg, r, a);
    v[i] = keep;
    return (up - dn) / (2 * step);
  };
  // Central differences in double: truncation ~step^2 and rounding ~1e-16/1e-6 = 1e-10. The implementation is
  // fp32 (softmax, renormalisation, GEMM over h or S terms): ~1e-6 relative; 2e-5 absolute + 1e-4 relative.
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = fd(x, i);
    EXPECT_NEAR(dx.get(int64_t(i)), want, 2e-5 + 1e-4 * std::abs(want)) << what << " dx[" << i << "]";
  }
  for (size_t i = 0; i < w.size(); ++i) {
    const double want = fd(w, i);
    EXPECT_NEAR(dW.get(int64_t(i)), want, 2e-5 + 1e-4 * std::abs(want)) << what << " dWg[" << i << "]";
  }
}

}  // namespace

TEST(GateBackward, MatchesFiniteDifferencesTop1) {
  for (auto pol : {NoisyGatePolicy::none, NoisyGatePolicy::jitter})
    for (int64_t M : {1, 2}) check_backward({12, 8, 4, 1, pol, M});
}

TEST(GateBackward, MatchesFiniteDifferencesTop2) {
  for (auto pol : {NoisyGatePolicy::none, NoisyGatePolicy::jitter})
    for (int64_t M : {1, 2}) check_backward({12, 8, 4, 2, pol, M});
}

// dx and dWg accumulate (+=): two identical backward calls give twice one call.
TEST(GateBackward, Accumulates) {
  std::mt19937 rng(9);
  const int64_t S = 6, h = 8, E = 4;
  const Tensor X = tensor_of(randn(size_t(S * h), rng), {S, h}), W = tensor_of(randn(size_t(E * h), rng), {E, h});
  const Tensor dwt = tensor_of(randn(size_t(S * 2), rng), {S, 2});
  GateCtx ctx;
  gate_forward(X, W, make_cfg(E, 2), 0, ctx);
  Tensor dl = Tensor::empty({S, E});
  Tensor dx1 = Tensor::zeros({S, h}), dW1 = Tensor::zeros({E, h}), dx2 = Tensor::zeros({S, h}),
         dW2 = Tensor::zeros({E, h});
  gate_backward(dwt, 0.5f, ctx.stats, ctx, W, dl, dx1, dW1);
  gate_backward(dwt, 0.5f, ctx.stats, ctx, W, dl, dx2, dW2);
  gate_backward(dwt, 0.5f, ctx.stats, ctx, W, dl, dx2, dW2);
  // x + x is exact in fp32
  for (int64_t i = 0; i < S * h; ++i) EXPECT_FLOAT_EQ(dx2.get(i), 2 * dx1.get(i));
  for (int64_t i = 0; i < E * h; ++i) EXPECT_FLOAT_EQ(dW2.get(i), 2 * dW1.get(i));
}

TEST(GateConfigErrors, RejectsBadTopkAndExperts) {
  const Tensor X = Tensor::zeros({4, 3}), W = Tensor::zeros({1, 3});
  GateCtx ctx;
  GateConfig cfg = make_cfg(1, 3);
  EXPECT_THROW(gate_forward(X, W, cfg, 0, ctx), ConfigError);
  cfg.topk = 2;  // two choices need two experts
  EXPECT_THROW(gate_forward(X, W, cfg, 0, ctx), ConfigError);
}

// ---- Megatron-Core's router (--moe-model-type megatron_moe) ----

namespace {
GateConfig megatron_cfg(int64_t E, int k, bool pre_softmax = false, double scale = 1.0) {
  GateConfig c = make_cfg(E, k);
  c.router = Router::megatron;
  c.pre_softmax = pre_softmax;
  c.topk_scaling_factor = scale;
  return c;
}
// Megatron's router in double, from its description (topk_routing_with_score_function, softmax): the loss
// sum_t,i r[t,i] w[t,i] + a * l_aux, l_aux = E / (S^2 k) sum_e (sum_t p[t,e]) * c_e, of one call over S tokens.
double megatron_ref_loss(const std::vector<double>& x, const std::vector<double>& w, int64_t S, int64_t h, int64_t E,
                         int k, bool pre, double sf, const std::vector<double>& r, double a) {
  double loss = 0;
  std::vector<double> sp(size_t(E), 0), cnt(size_t(E), 0);
  for (int64_t t = 0; t < S; ++t) {
    std::vector<double> l(static_cast<size_t>(E)), p(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t j = 0; j < h; ++j) l[size_t(e)] += x[size_t(t * h + j)] * w[size_t(e * h + j)];
    const double mx = *std::max_element(l.begin(), l.end());
    double z = 0;
    for (int64_t e = 0; e < E; ++e) z += (p[size_t(e)] = std::exp(l[size_t(e)] - mx));
    for (double& v : p) v /= z;
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int u, int v) { return l[size_t(u)] > l[size_t(v)]; });
    double zk = 0;
    for (int i = 0; i < k; ++i) zk += std::exp(l[size_t(order[size_t(i)])] - mx);
    for (int i = 0; i < k; ++i) {
      const int e = order[size_t(i)];
      const double wt = pre ? p[size_t(e)] : std::exp(l[size_t(e)] - mx) / zk;
      loss += r[size_t(t * k + i)] * sf * wt;
      cnt[size_t(e)] += 1;
    }
    for (int64_t e = 0; e < E; ++e) sp[size_t(e)] += p[size_t(e)];
  }
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += sp[size_t(e)] * cnt[size_t(e)];
  return loss + a * double(E) / (double(S) * double(S) * k) * aux;
}
}  // namespace

// By hand: x = the logits (Wg the identity), two tokens, E = 4, top-3. Token 0 [1, 3, 2, 0] picks experts 1, 2, 0
// with weights softmax(3, 2, 1) = (0.665241, 0.244728, 0.090031); token 1 [0, 0, 1, 2] picks 3, 2 and 0 (the tie
// of experts 0 and 1 goes to the lower index). Every choice has a slot (no capacity): an expert's first choices in
// token order, then its second choices, then its third.
TEST(GateMegatron, TopkSoftmaxWeightsSlotsAndAuxLossByHand) {
  const Tensor X = tensor_of({1, 3, 2, 0, 0, 0, 1, 2}, {2, 4});
  const Tensor W = tensor_of({1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}, {4, 4});
  GateCtx ctx;
  gate_forward(X, W, megatron_cfg(4, 3), 0, ctx);
  const GateRouting& r = ctx.routing;
  EXPECT_EQ(r.expert, (std::vector<int32_t>{1, 2, 0, 3, 2, 0}));
  const double w0[] = {0.6652409557748219, 0.2447284710547976, 0.0900305731703805};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(r.weight[size_t(i)], w0[i], 1e-6);
    EXPECT_NEAR(r.weight[size_t(3 + i)], w0[i], 1e-6);  // (2, 1, 0) above the minimum: the same softmax
  }
  // loads: expert 0: 2 (both third choices), 1: 1, 2: 2 (a second choice each), 3: 1; capacity = the largest
  EXPECT_EQ(r.C, 2);
  EXPECT_EQ(r.expert_count, (std::vector<int32_t>{2, 1, 2, 1}));
  EXPECT_EQ(r.slot, (std::vector<int32_t>{0, 0, 0, 0, 1, 1}));
  // aux loss: E / (N^2 k) sum_e Sp_e c_e with the full softmax's Sp
  double sp[4] = {0, 0, 0, 0};
  for (const auto& row : {std::vector<double>{1, 3, 2, 0}, std::vector<double>{0, 0, 1, 2}}) {
    double z = 0;
    for (double v : row) z += std::exp(v);
    for (int e = 0; e < 4; ++e) sp[e] += std::exp(row[size_t(e)]) / z;
  }
  const double want = 4.0 / (4.0 * 3.0) * (sp[0] * 2 + sp[1] * 1 + sp[2] * 2 + sp[3] * 1);
  EXPECT_NEAR(aux_loss_from_sums(ctx.stats), want, 1e-6);
  // pre-softmax with a scaling factor: the full softmax's probabilities, times 2
  gate_forward(X, W, megatron_cfg(4, 3, /*pre_softmax=*/true, 2.0), 0, ctx);
  double z0 = std::exp(1) + std::exp(3) + std::exp(2) + 1;
  EXPECT_NEAR(ctx.routing.weight[0], 2 * std::exp(3) / z0, 1e-6);
  EXPECT_NEAR(ctx.routing.weight[2], 2 * std::exp(1) / z0, 1e-6);
}

// The backward (routing weights and aux loss) against central differences of the double reference, top-1/3/8,
// default and pre-softmax, with a scaling factor.
TEST(GateMegatron, BackwardMatchesFiniteDifferences) {
  const int64_t S = 6, h = 5, E = 8;
  for (const int k : {1, 3, 8})
    for (const bool pre : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "k=" << k << (pre ? " pre-softmax" : ""));
      const double sf = 1.5, a = 0.7;
      std::mt19937 rng(uint32_t(11 + k + pre));
      std::vector<double> x = randn(size_t(S * h), rng), w = randn(size_t(E * h), rng, 0.7),
                          r = randn(size_t(S * k), rng);
      GateCtx ctx;
      const GateConfig cfg = megatron_cfg(E, k, pre, sf);
      const Tensor W = tensor_of(w, {E, h});
      gate_forward(tensor_of(x, {S, h}), W, cfg, 0, ctx);
      Tensor dx = Tensor::zeros({S, h}), dW = Tensor::zeros({E, h}), dl = Tensor::zeros({S, E});
      gate_backward(tensor_of(r, {S, k}), float(a), ctx.stats, ctx, W, dl, dx, dW);
      auto fd = [&](std::vector<double>& v, size_t i) {
        const double keep = v[i], step = 1e-6;
        v[i] = keep + step;
        const double up = megatron_ref_loss(x, w, S, h, E, k, pre, sf, r, a);
        v[i] = keep - step;
        const double dn = megatron_ref_loss(x, w, S, h, E, k, pre, sf, r, a);
        v[i] = keep;
        return (up - dn) / (2 * step);
      };
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx.get(int64_t(i)), fd(x, i), 3e-5) << "dx " << i;
      for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(dW.get(int64_t(i)), fd(w, i), 3e-5) << "dWg " << i;
    }
}

// The router z-loss (--moe-z-loss-coeff): z = coeff * mean_t logsumexp(logits_t)^2 by hand, and its gradient (with
// the routing weights' and the aux loss's) against central differences of a double-precision z.
TEST(GateMegatron, ZLossByHandAndFiniteDifferences) {
  const Tensor X = tensor_of({1, 3, 2, 0, 0, 0, 1, 2}, {2, 4});
  const Tensor I = tensor_of({1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}, {4, 4});
  GateConfig cfg = megatron_cfg(4, 2);
  cfg.z_loss_coeff = 0.1;
  GateCtx ctx;
  gate_forward(X, I, cfg, 0, ctx);
  const double lse0 = std::log(std::exp(1) + std::exp(3) + std::exp(2) + 1),
               lse1 = std::log(1 + 1 + std::exp(1) + std::exp(2));
  EXPECT_NEAR(z_loss_from_sums(ctx.stats, cfg.z_loss_coeff), 0.1 * (lse0 * lse0 + lse1 * lse1) / 2, 1e-6);
  EXPECT_EQ(z_loss_from_sums(ctx.stats, 0.0), 0.0);

  const int64_t S = 5, h = 3, E = 4, k = 2;
  std::mt19937 rng(5);
  std::vector<double> x = randn(size_t(S * h), rng), w = randn(size_t(E * h), rng, 0.7);
  const Tensor W = tensor_of(w, {E, h});
  gate_forward(tensor_of(x, {S, h}), W, cfg, 0, ctx);
  Tensor dx = Tensor::zeros({S, h}), dW = Tensor::zeros({E, h}), dl = Tensor::zeros({S, E});
  gate_backward(Tensor::zeros({S, k}), 0.0f, ctx.stats, ctx, W, dl, dx, dW);  // the z-loss alone
  auto z_of = [&] {
    double acc = 0;
    for (int64_t t = 0; t < S; ++t) {
      double l[4], mx = -1e300, sum = 0;
      for (int64_t e = 0; e < E; ++e) {
        l[e] = 0;
        for (int64_t j = 0; j < h; ++j) l[e] += x[size_t(t * h + j)] * w[size_t(e * h + j)];
        mx = std::max(mx, l[e]);
      }
      for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
      acc += std::pow(mx + std::log(sum), 2);
    }
    return 0.1 * acc / double(S);
  };
  auto fd = [&](std::vector<double>& v, size_t i) {
    const double keep = v[i], step = 1e-6;
    v[i] = keep + step;
    const double up = z_of();
    v[i] = keep - step;
    const double dn = z_of();
    v[i] = keep;
    return (up - dn) / (2 * step);
  };
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx.get(int64_t(i)), fd(x, i), 3e-5) << "dx " << i;
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(dW.get(int64_t(i)), fd(w, i), 3e-5) << "dWg " << i;
}

// DeepSeek-V3's routing by hand (sigmoid scores s = 1 / (1 + e^-l), top-2, E = 4): token [0, 1, 2, -1] has
// s = (0.5, 0.731059, 0.880797, 0.268941). Alone it picks experts 2, 1 with weights s / (s_2 + s_1) =
// (0.546428, 0.453572). With 2 groups ({0, 1}, {2, 3}) and --moe-router-group-topk 1, a group's score is the sum of
// its top k / group_topk = 2 scores (1.231059 against 1.149738), so group 0 is kept: experts 1, 0, weights
// (0.593846, 0.406154). An expert bias (0, 0, 0, 0.7) changes the choice (biased scores 0.5, 0.731, 0.881, 0.969:
// experts 3, 2) but not the weights, which are the unbiased scores' (0.233919, 0.766081 before the factor 2).
TEST(GateMegatron, SigmoidGroupsAndExpertBiasByHand) {
  const Tensor X = tensor_of({0, 1, 2, -1}, {1, 4});
  const Tensor I = tensor_of({1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}, {4, 4});
  GateConfig cfg = megatron_cfg(4, 2);
  cfg.score_function = ScoreFunction::sigmoid;
  GateCtx ctx;
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(ctx.routing.expert, (std::vector<int32_t>{2, 1}));
  EXPECT_NEAR(ctx.routing.weight[0], 0.880797 / (0.880797 + 0.731059), 1e-6);
  EXPECT_NEAR(ctx.routing.weight[1], 0.731059 / (0.880797 + 0.731059), 1e-6);
  cfg.num_groups = 2;
  cfg.group_topk = 1;
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(ctx.routing.expert, (std::vector<int32_t>{1, 0}));
  EXPECT_NEAR(ctx.routing.weight[0], 0.593846, 1e-6);
  EXPECT_NEAR(ctx.routing.weight[1], 0.406154, 1e-6);
  cfg.num_groups = 0;
  cfg.group_topk = 0;
  cfg.expert_bias = {0.0f, 0.0f, 0.0f, 0.7f};
  cfg.topk_scaling_factor = 2.0;
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(ctx.routing.expert, (std::vector<int32_t>{3, 2}));
  EXPECT_NEAR(ctx.routing.weight[0], 2 * 0.268941 / (0.268941 + 0.880797), 2e-6);
  EXPECT_NEAR(ctx.routing.weight[1], 2 * 0.880797 / (0.268941 + 0.880797), 2e-6);
}

// Megatron's get_updated_expert_bias: counts (3, 1, 2, 2) have mean 2, so the bias moves by rate * (-1, +1, 0, 0):
// the overloaded expert down, the idle one up, the balanced ones not at all (sign(0) = 0).
TEST(GateMegatron, ExpertBiasUpdateByHand) {
  std::vector<float> bias = {0.1f, -0.2f, 0.0f, 0.05f};
  const std::vector<float> counts = {3, 1, 2, 2};
  update_expert_bias(bias, counts, 0.001);
  EXPECT_FLOAT_EQ(bias[0], 0.099f);
  EXPECT_FLOAT_EQ(bias[1], -0.199f);
  EXPECT_FLOAT_EQ(bias[2], 0.0f);
  EXPECT_FLOAT_EQ(bias[3], 0.05f);
}

// The per-sequence aux loss by hand (seq_aux_loss, Megatron's _apply_seq_aux_loss): a micro-batch of b = 2 sequences
// of one token each ([s, b] order: token t is sequence t mod b), E = 2, top-1. Token 0 [1, 0]: P = (0.731059,
// 0.268941), expert 0; token 1 [0, 2]: P = (0.119203, 0.880797), expert 1. Each sequence's loss is
// E / (S_b^2 k) sum_e Sp_be c_be = 2 P[choice]: 1.462117 and 1.761594, mean 1.611856; the batch-wide aux loss of
// the same choices would be 2 / 4 (0.850262 + 1.149738) = 1.
TEST(GateMegatron, SeqAuxLossByHand) {
  const Tensor X = tensor_of({1, 0, 0, 2}, {2, 2});
  const Tensor I = tensor_of({1, 0, 0, 1}, {2, 2});
  GateConfig cfg = megatron_cfg(2, 1);
  cfg.balancing = Balancing::seq_aux_loss;
  cfg.micro_batch = 2;
  GateCtx ctx;
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(ctx.routing.expert, (std::vector<int32_t>{0, 1}));
  const double p0 = 1 / (1 + std::exp(-1.0)), p1 = 1 / (1 + std::exp(-2.0));
  EXPECT_NEAR(aux_loss_from_sums(ctx.stats), (2 * p0 + 2 * p1) / 2, 1e-6);
  cfg.balancing = Balancing::aux_loss;
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_NEAR(aux_loss_from_sums(ctx.stats), 1.0, 1e-6);
}

// Megatron-Core's capacity by hand (apply_router_token_dropping, pre-softmax top-1 so the weights differ): 4 tokens,
// E = 2; tokens 0, 1, 2 choose expert 0 with p = 0.880797, 0.731059, 0.952574, token 3 expert 1. Factor 0.5:
// C = ceil(4 * 1 / 2 * 0.5) = 1: by probs expert 0 keeps token 2, by position token 0; the dropped choices have no
// slot and weight 0. Factor 1.5: C = 3, nothing dropped; padded, the capacity is 3 whatever the loads.
TEST(GateMegatron, CapacityDropsByProbsAndPositionByHand) {
  EXPECT_EQ(megatron_expert_capacity(10, 4, 2, 1.0), 5);
  EXPECT_EQ(megatron_expert_capacity(10, 4, 2, 1.1), 6);  // ceil(5.5)
  EXPECT_EQ(megatron_expert_capacity(10, 4, 2, -1.0), 10);  // no capacity
  EXPECT_EQ(megatron_expert_capacity(10, 4, 2, 3.0), 10);   // more than the tokens: all of them
  const Tensor X = tensor_of({2, 0, 1, 0, 3, 0, 0, 1}, {4, 2});
  const Tensor I = tensor_of({1, 0, 0, 1}, {2, 2});
  GateConfig cfg = megatron_cfg(2, 1, /*pre_softmax=*/true);
  cfg.expert_capacity_factor = 0.5;
  GateCtx ctx;
  gate_forward(X, I, cfg, 0, ctx);
  const GateRouting& r = ctx.routing;
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 0, 0, 1}));
  EXPECT_EQ(r.slot, (std::vector<int32_t>{-1, -1, 0, 0}));
  EXPECT_EQ(r.weight[0], 0.0f);
  EXPECT_EQ(r.weight[1], 0.0f);
  EXPECT_NEAR(r.weight[2], 1 / (1 + std::exp(-3.0)), 1e-6);
  EXPECT_EQ(r.C, 1);
  EXPECT_EQ(r.expert_count, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(gate_required_capacity(ctx), 1);
  // the aux loss counts the choices before dropping: c = (3, 1)
  EXPECT_EQ(ctx.stats.sum_mask1, (std::vector<double>{3, 1}));
  cfg.drop_policy = DropPolicy::position;
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(r.slot, (std::vector<int32_t>{0, -1, -1, 0}));
  cfg.expert_capacity_factor = 1.5;
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(r.slot, (std::vector<int32_t>{0, 1, 2, 0}));
  EXPECT_EQ(r.C, 3);  // the largest load
  cfg.expert_capacity_factor = 0.5;
  cfg.pad_to_capacity = true;
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(r.C, 1);
  cfg.expert_capacity_factor = 2.0;  // C = ceil(4) = 4 = S: every expert padded to all 4 tokens
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(r.C, 4);
  EXPECT_EQ(r.expert_count, (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(r.slot_token, (std::vector<int32_t>{0, 1, 2, -1, 3, -1, -1, -1}));
}

// Sinkhorn balancing (--moe-router-load-balancing-type sinkhorn), by hand. Two tokens, two experts, the logits
// [[1, 0], [1, 0.5]] (x = the logits, Wg the identity): both prefer expert 0. Sinkhorn scales the rows and columns
// of A = exp(logits) until every row sums to 1/2 and every column to 1/2; a 2 x 2 matrix with those sums is
// [[u, 1/2 - u], [1/2 - u, u]], and scaling keeps the cross ratio a00 a11 / (a01 a10) = e^0.5, so
// u / (1/2 - u) = e^0.25: u = e^0.25 / (2 (1 + e^0.25)) = 0.28112 > 1/4. Token 0 goes to expert 0 and token 1 to
// expert 1 (plain top-1: both to expert 0). Top-1 weights are the sigmoid of the chosen logit; top-2 weights the full
// softmax's probabilities, ordered by the normalised matrix (token 1: expert 1 first), unscaled.
TEST(GateMegatron, SinkhornBalancesByHand) {
  const Tensor X = tensor_of({1, 0, 1, 0.5}, {2, 2});
  const Tensor I = tensor_of({1, 0, 0, 1}, {2, 2});
  const std::vector<double> d1 = sinkhorn_columns(X.data<float>(), 2, 2);
  ASSERT_EQ(d1.size(), 2u);
  std::vector<double> d0(2), norm(4);
  for (int t = 0; t < 2; ++t)  // d0 as the last sweep computes it from d1
    d0[size_t(t)] = 0.5 / (std::exp(double(X.get(t * 2))) * d1[0] + std::exp(double(X.get(t * 2 + 1))) * d1[1] + 1e-8);
  for (int t = 0; t < 2; ++t)
    for (int e = 0; e < 2; ++e) norm[size_t(t * 2 + e)] = d0[size_t(t)] * std::exp(double(X.get(t * 2 + e))) * d1[size_t(e)];
  const double u = std::exp(0.25) / (2 * (1 + std::exp(0.25)));
  EXPECT_NEAR(norm[0], u, 2e-4);
  EXPECT_NEAR(norm[3], u, 2e-4);
  EXPECT_NEAR(norm[1], 0.5 - u, 2e-4);
  EXPECT_NEAR(norm[0] + norm[2], 0.5, 2e-4);  // the columns too

  auto sig = [](double z) { return 1 / (1 + std::exp(-z)); };
  GateConfig cfg = megatron_cfg(2, 1, /*pre_softmax=*/false, /*scale=*/3.0);  // the scale has no effect
  cfg.balancing = Balancing::sinkhorn;
  use_sinkhorn_scores(cfg);
  EXPECT_EQ(cfg.score_function, ScoreFunction::sigmoid);
  EXPECT_EQ(cfg.topk_scaling_factor, 1.0);
  GateCtx ctx;
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(ctx.routing.expert, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(ctx.routing.weight[0], sig(1), 1e-6);
  EXPECT_NEAR(ctx.routing.weight[1], sig(0.5), 1e-6);
  EXPECT_EQ(ctx.stats.sum_mask1, (std::vector<double>{0, 0}));  // no aux loss
  cfg.training = false;  // evaluation: the top-1 of the scores
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(ctx.routing.expert, (std::vector<int32_t>{0, 0}));
  EXPECT_NEAR(ctx.routing.weight[1], sig(1), 1e-6);

  cfg = megatron_cfg(2, 2, /*pre_softmax=*/false, /*scale=*/3.0);
  cfg.balancing = Balancing::sinkhorn;
  use_sinkhorn_scores(cfg);
  EXPECT_TRUE(cfg.pre_softmax);
  gate_forward(X, I, cfg, 0, ctx);
  EXPECT_EQ(ctx.routing.expert, (std::vector<int32_t>{0, 1, 1, 0}));
  const double p0 = sig(1), p1 = sig(0.5);  // softmax(a, b)[0] = sigmoid(a - b)
  EXPECT_NEAR(ctx.routing.weight[0], p0, 1e-6);
  EXPECT_NEAR(ctx.routing.weight[1], 1 - p0, 1e-6);
  EXPECT_NEAR(ctx.routing.weight[2], 1 - p1, 1e-6);
  EXPECT_NEAR(ctx.routing.weight[3], p1, 1e-6);
}

// Sinkhorn's choices carry no gradient: the backward is the chosen scores' (sigmoid for top-1, the full softmax
// otherwise). Top-1, S = 2 tokens as above, upstream dw = (0.3, -0.7): d logit[t, chosen] = dw s (1 - s), the other
// logit none; top-2: d logits = softmax backward of dP, dP[t, e] = dw of the choice of e.
TEST(GateMegatron, SinkhornBackwardByHand) {
  const Tensor X = tensor_of({1, 0, 1, 0.5}, {2, 2});
  const Tensor I = tensor_of({1, 0, 0, 1}, {2, 2});
  auto sig = [](double z) { return 1 / (1 + std::exp(-z)); };
  for (const int k : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "k=" << k);
    GateConfig cfg = megatron_cfg(2, k);
    cfg.balancing = Balancing::sinkhorn;
    use_sinkhorn_scores(cfg);
    GateCtx ctx;
    gate_forward(X, I, cfg, 0, ctx);
    const std::vector<double> dw = k == 1 ? std::vector<double>{0.3, -0.7} : std::vector<double>{0.3, -0.7, 0.2, 0.9};
    Tensor dx = Tensor::zeros({2, 2}), dW = Tensor::zeros({2, 2}), dl = Tensor::zeros({2, 2});
    gate_backward(tensor_of(dw, {2, static_cast<int64_t>(k)}), 0.0f, ctx.stats, ctx, I, dl, dx, dW);
    double want[4];
    if (k == 1) {  // token 0 chose expert 0 (logit 1), token 1 expert 1 (logit 0.5)
      want[0] = 0.3 * sig(1) * (1 - sig(1)), want[1] = 0;
      want[2] = 0, want[3] = -0.7 * sig(0.5) * (1 - sig(0.5));
    } else {  // choices (0, 1) and (1, 0); with two experts d logit_0 = p0 p1 (dP_0 - dP_1) = -d logit_1
      const double q0 = sig(1), q1 = sig(0.5);
      want[0] = q0 * (1 - q0) * (0.3 - (-0.7)), want[1] = -want[0];
      want[2] = q1 * (1 - q1) * (0.9 - 0.2), want[3] = -want[2];
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(dl.get(i), want[i], 1e-6) << "dlogits " << i;
      EXPECT_NEAR(dx.get(i), want[i], 1e-6) << "dx " << i;  // Wg = I
    }
  }
}
