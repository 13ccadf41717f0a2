// MoE router (DeepSpeed-MoE top-1 / top-2), index form. Rules and notation: gate.h.
#include "ampipe/model/gate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/core/parallel.h"
#include "ampipe/core/philox.h"
#include "ampipe/kernels/gemm.h"
#include "ampipe/kernels/softmax.h"

namespace ampipe::model {

namespace {

constexpr float kJitterEps = 1e-2f;   // DeepSpeed multiplicative_jitter epsilon
constexpr float kRenormEps = FLT_EPSILON;  // torch.finfo(torch.float32).eps, top-2 renormalisation floor

constexpr int kMaxTopk = 8;  // Megatron-Core's router: up to 8 experts per token here

void validate(const GateConfig& cfg) {
  if (cfg.router == Router::megatron) {
    if (cfg.topk < 1 || cfg.topk > kMaxTopk)
      throw ConfigError(fmt::format("--moe-router-topk {} is not supported: Megatron-Core's router takes 1 to {} "
                                    "experts per token here", cfg.topk, kMaxTopk));
    if (cfg.num_experts < cfg.topk)
      throw ConfigError(fmt::format("--num-experts {} is smaller than --moe-router-topk {}; every token needs {} "
                                    "distinct experts", cfg.num_experts, cfg.topk, cfg.topk));
    if (!(cfg.topk_scaling_factor > 0) || !std::isfinite(cfg.topk_scaling_factor))
      throw ConfigError(fmt::format("--moe-router-topk-scaling-factor {} is invalid: it must be a positive number",
                                    cfg.topk_scaling_factor));
    if (cfg.noisy_gate_policy != NoisyGatePolicy::none)
      throw ConfigError("--noisy-gate-policy is DeepSpeed-MoE's (--moe-model-type deepspeed_moe): Megatron-Core's "
                        "router has no gate noise");
    AMPIPE_CHECK(cfg.expert_bias.empty() || int64_t(cfg.expert_bias.size()) == cfg.num_experts,
                 "expert bias of {} for {} experts", cfg.expert_bias.size(), cfg.num_experts);
    AMPIPE_CHECK(cfg.balancing != Balancing::seq_aux_loss || cfg.micro_batch >= 1, "seq_aux_loss: micro-batch {}",
                 cfg.micro_batch);
    AMPIPE_CHECK(cfg.expert_capacity_factor < 0 || cfg.expert_capacity_factor > 0, "capacity factor {}",
                 cfg.expert_capacity_factor);  // LayerConfig::validate refuses 0 and NaN
    AMPIPE_CHECK(cfg.balancing != Balancing::sinkhorn ||
                     (cfg.score_function == (cfg.topk == 1 ? ScoreFunction::sigmoid : ScoreFunction::softmax) &&
                      cfg.pre_softmax == (cfg.topk > 1) && cfg.topk_scaling_factor == 1.0 && cfg.group_topk == 0 &&
                      cfg.expert_bias.empty()),
                 "sinkhorn balancing without use_sinkhorn_scores");
    if (cfg.num_groups == 0 && cfg.group_topk == 0) return;
    const int64_t G = cfg.num_groups, g = cfg.group_topk;
    if (G < 1 || cfg.num_experts % G != 0)
      throw ConfigError(fmt::format("--moe-router-num-groups {} is invalid: it must divide --num-experts {} into "
                                    "equal groups", G, cfg.num_experts));
    if (g < 1 || g > G || cfg.topk < g || (cfg.num_experts / G) * g < cfg.topk)
      throw ConfigError(fmt::format("--moe-router-group-topk {} is invalid with --moe-router-num-groups {} and "
                                    "--moe-router-topk {}: it must be 1 .. {} groups, at most the topk, and the groups "
                                    "kept must hold at least topk experts", g, G, cfg.topk, G));
    return;
  }
  if (cfg.topk != 1 && cfg.topk != 2)
    throw ConfigError(fmt::format("--moe-router-topk {} is not supported; the DeepSpeed-MoE gate is top-1 or top-2",
                                  cfg.topk));
  if (cfg.num_experts < cfg.topk)
    throw ConfigError(fmt::format("--num-experts {} is smaller than --moe-router-topk {}; every token needs {} "
                                  "distinct experts", cfg.num_experts, cfg.topk, cfg.topk));
  if (!(cfg.capacity_factor > 0.0))
    throw ConfigError(fmt::format("--moe-train-capacity-factor {} must be > 0", cfg.capacity_factor));
  if (cfg.min_capacity < 0)
    throw ConfigError(fmt::format("--moe-min-capacity {} must be >= 0", cfg.min_capacity));
}

// Uniform noise in [1 - eps, 1 + eps) for features [0, h) of one token: the same numbers as
// 1 - eps + 2 * eps * core::philox_uniform(key, token, j), one Philox block per 4 features.
void jitter_row(const core::PhiloxKey& key, uint64_t token, int64_t h, float* noise) {
  const std::array<uint32_t, 2> k2{uint32_t(key.seed), uint32_t(key.seed >> 32)};
  for (int64_t q = 0; q * 4 < h; ++q) {
    const core::Philox4 ctr{uint32_t(uint64_t(q)), uint32_t(token), (key.layer << 8) | uint32_t(key.purpose),
                            uint32_t(token >> 32)};
    const core::Philox4 w = core::philox4x32_10(ctr, k2);
    for (int64_t r = 0; r < 4 && q * 4 + r < h; ++r) {
      const float u = float(w[size_t(r)] >> 8) * (1.0f / 16777216.0f);
      noise[q * 4 + r] = (1.0f - kJitterEps) + 2.0f * kJitterEps * u;
    }
  }
}

core::PhiloxKey key_of(const GateConfig& cfg, core::RngPurpose p) { return {cfg.seed, cfg.layer, p}; }

bool jitter_on(const GateConfig& cfg) { return cfg.training && cfg.noisy_gate_policy == NoisyGatePolicy::jitter; }
bool rsample_on(const GateConfig& cfg) {
  return cfg.training && cfg.topk == 1 && cfg.noisy_gate_policy == NoisyGatePolicy::rsample;
}

// Gumbel(0, 1) sample keyed by (token, expert): u mapped to the open interval (0, 1) by a half-step shift.
double gumbel(const core::PhiloxKey& key, uint64_t token, uint64_t expert) {
  const double u = (double(core::philox_u32(key, token, expert) >> 8) + 0.5) * (1.0 / 16777216.0);
  return -std::log(-std::log(u));
}

}  // namespace

void GateStats::reset(int64_t E, int64_t seqs) {
  sum_probs.assign(size_t(E), 0.0);
  sum_mask1.assign(size_t(E), 0.0);
  seq_probs.assign(size_t(seqs * E), 0.0);
  seq_mask.assign(size_t(seqs * E), 0.0);
  tokens = 0;
  sum_lse2 = 0;
}

void GateStats::accumulate(const GateStats& o) {
  if (sum_probs.empty() && tokens == 0)
    reset(int64_t(o.sum_probs.size()), o.sum_probs.empty() ? 0 : int64_t(o.seq_probs.size() / o.sum_probs.size()));
  AMPIPE_CHECK(o.sum_probs.size() == sum_probs.size() && o.sum_mask1.size() == sum_mask1.size() &&
                   o.seq_probs.size() == seq_probs.size(),
               "GateStats over {} experts += stats over {}", sum_probs.size(), o.sum_probs.size());
  for (size_t e = 0; e < sum_probs.size(); ++e) {
    sum_probs[e] += o.sum_probs[e];
    sum_mask1[e] += o.sum_mask1[e];
  }
  for (size_t i = 0; i < seq_probs.size(); ++i) {
    seq_probs[i] += o.seq_probs[i];
    seq_mask[i] += o.seq_mask[i];
  }
  tokens += o.tokens;
  sum_lse2 += o.sum_lse2;
}

int64_t gate_capacity(int64_t S, int64_t E, int k, double capacity_factor, int64_t min_capacity) {
  AMPIPE_CHECK(S >= 0 && E >= 1 && (k == 1 || k == 2), "gate_capacity S={} E={} k={}", S, E, k);
  // DeepSpeed _capacity: torch.ceil((S / E) * torch.tensor(k * capacity_factor)): a Python double times a
  // float32 tensor, evaluated in float32.
  const float prod = float(double(S) / double(E)) * float(double(k) * capacity_factor);
  if (!(prod < float(S))) return S;  // also a product too large for int64 (e.g. a factor of 1e300): every token fits
  int64_t C = int64_t(std::ceil(prod));
  if (C < min_capacity) C = min_capacity;
  if (C > S) C = S;
  return C;
}

int64_t megatron_expert_capacity(int64_t S, int64_t E, int k, double factor) {
  AMPIPE_CHECK(S >= 0 && E >= 1 && k >= 1, "megatron_expert_capacity S={} E={} k={}", S, E, k);
  if (factor < 0) return S;
  const double C = std::ceil((double(S * k) / double(E)) * factor);  // Python's math.ceil of a double
  return C >= double(S) ? S : int64_t(C);
}

void use_sinkhorn_scores(GateConfig& cfg) {
  if (cfg.balancing != Balancing::sinkhorn) return;
  cfg.score_function = cfg.topk == 1 ? ScoreFunction::sigmoid : ScoreFunction::softmax;
  cfg.pre_softmax = cfg.topk > 1;
  cfg.topk_scaling_factor = 1.0;
  cfg.num_groups = cfg.group_topk = 0;
  cfg.expert_bias.clear();
}

std::vector<double> sinkhorn_columns(const float* logits, int64_t S, int64_t E) {
  AMPIPE_CHECK(S >= 0 && E >= 1, "sinkhorn over [{}, {}]", S, E);
  std::vector<double> cost(static_cast<size_t>(S * E)), d0(static_cast<size_t>(S), 1.0);
  std::vector<double> d1(static_cast<size_t>(E), 1.0), d1_old = d1;
  for (int64_t i = 0; i < S * E; ++i) cost[size_t(i)] = std::exp(double(logits[i]));
  constexpr double kEps = 1e-8, kTol = 1e-4;
  double error = 1e9;
  for (int it = 0; S > 0 && error > kTol && it < kSinkhornMaxIterations; ++it) {
    for (int64_t t = 0; t < S; ++t) {
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += d1[size_t(e)] * cost[size_t(t * E + e)];
      d0[size_t(t)] = (1.0 / double(S)) / (sum + kEps);
    }
    std::vector<double> col(static_cast<size_t>(E), 0.0);
    for (int64_t t = 0; t < S; ++t)
      for (int64_t e = 0; e < E; ++e) col[size_t(e)] += d0[size_t(t)] * cost[size_t(t * E + e)];
    error = 0;
    for (int64_t e = 0; e < E; ++e) {
      d1[size_t(e)] = (1.0 / double(E)) / (col[size_t(e)] + kEps);
      error += std::abs(d1_old[size_t(e)] - d1[size_t(e)]);
    }
    error /= double(E);
    d1_old = d1;
  }
  return d1;
}

namespace {
// The router's softmax and top-k are the kernels' (kernels/softmax.h): the same rounding and the same ties.
using kernels::softmax_row;
using kernels::topk_row;

// Sinkhorn routing's choices for one token: the k largest exp(logit_e) d1_e (ties -> the lower index), from its
// logits `row` and the call's column scaling d1 (sinkhorn_columns).
void sinkhorn_top_k(const float* row, const double* d1, int64_t E, int64_t k, int32_t* out) {
  for (int64_t i = 0; i < k; ++i) {
    int32_t best = -1;
    double best_v = 0;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < i; ++j) taken |= out[j] == int32_t(e);
      const double v = std::exp(double(row[e])) * d1[e];
      if (!taken && (best < 0 || v > best_v)) best = int32_t(e), best_v = v;
    }
    out[i] = best;
  }
}

// Per-token scratch of the routing below, sized once per chunk (megatron_select) instead of once per token.
struct RouteScratch {
  std::vector<float> biased, score, masked;
  std::vector<int32_t> top, groups;
};

// Group-limited top-k (Megatron's group_limited_topk): the k largest of row among the experts of the group_topk
// groups whose k/group_topk largest scores sum highest (ties -> the lower group, then the lower expert).
void group_top_k(const float* row, int64_t E, int64_t k, int64_t G, int64_t g, RouteScratch& sc, int32_t* out) {
  const int64_t per = E / G, best = k / g;
  std::vector<float>& score = sc.score;
  std::vector<float>& masked = sc.masked;
  std::vector<int32_t>& top = sc.top;
  score.assign(size_t(G), 0.0f);
  masked.assign(size_t(E), -INFINITY);
  top.resize(size_t(best));
  for (int64_t j = 0; j < G; ++j) {
    topk_row(row + j * per, per, best, top.data());
    for (int64_t i = 0; i < best; ++i) score[size_t(j)] += row[j * per + top[size_t(i)]];
  }
  std::vector<int32_t>& groups = sc.groups;
  groups.resize(size_t(g));
  topk_row(score.data(), G, g, groups.data());
  for (int32_t j : groups)
    for (int64_t e = j * per; e < (j + 1) * per; ++e) masked[size_t(e)] = row[e];
  topk_row(masked.data(), E, k, out);
}

// The routing choices from the routing scores `row` (plain or group-limited).
void route_top_k(const GateConfig& cfg, const float* row, int64_t E, RouteScratch& sc, int32_t* out) {
  if (cfg.group_topk > 0) return group_top_k(row, E, cfg.topk, cfg.num_groups, cfg.group_topk, sc, out);
  topk_row(row, E, cfg.topk, out);
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// lse of the logits row[0, E) (the z-loss), fp32 as Megatron's logsumexp.
float log_sum_exp(const float* row, int64_t E) {
  float mx = row[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, row[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) sum += std::exp(row[e] - mx);
  return mx + std::log(sum);
}

// Token t's choices and weights from its logits `row`, which it turns into the aux losses' scores in place (the
// softmax, or sigmoid's s; q = s / (sum s + 1e-20) is the aux score then, returned through `aux`). With `sinkhorn`
// (the call's column scaling d1, training with sinkhorn balancing) the choices are sinkhorn_top_k's instead.
void megatron_route_token(const GateConfig& cfg, float* row, int64_t E, RouteScratch& sc, const double* sinkhorn,
                          int32_t* choice, float* w, float* aux) {
  const int64_t k = cfg.topk;
  const float sf = float(cfg.topk_scaling_factor);
  if (sinkhorn) sinkhorn_top_k(row, sinkhorn, E, k, choice);
  if (cfg.score_function == ScoreFunction::sigmoid) {
    float total = 0.0f;
    for (int64_t e = 0; e < E; ++e) total += (row[e] = sigmoid(row[e]));
    if (!sinkhorn && cfg.expert_bias.empty()) {
      route_top_k(cfg, row, E, sc, choice);
    } else if (!sinkhorn) {
      sc.biased.assign(row, row + E);
      for (int64_t e = 0; e < E; ++e) sc.biased[size_t(e)] += cfg.expert_bias[size_t(e)];
      route_top_k(cfg, sc.biased.data(), E, sc, choice);
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) sum += row[choice[i]];
    for (int64_t i = 0; i < k; ++i) w[i] = (k > 1 ? row[choice[i]] / (sum + 1e-20f) : row[choice[i]]) * sf;
    for (int64_t e = 0; e < E; ++e) aux[e] = row[e] / (total + 1e-20f);
    return;
  }
  if (!cfg.pre_softmax) {  // top-k of the logits, the softmax over those k
    AMPIPE_CHECK(!sinkhorn, "sinkhorn routing with k > 1 takes the pre-softmax weights");
    route_top_k(cfg, row, E, sc, choice);
    const float mx = row[choice[0]];
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) sum += (w[i] = std::exp(row[choice[i]] - mx));
    for (int64_t i = 0; i < k; ++i) w[i] = w[i] / sum * sf;
  }
  softmax_row(row, E);
  if (cfg.pre_softmax) {  // top-k of the probabilities, their values as weights
    if (!sinkhorn) route_top_k(cfg, row, E, sc, choice);
    for (int64_t i = 0; i < k; ++i) w[i] = row[choice[i]] * sf;
  }
  std::copy(row, row + E, aux);
}

// Megatron-Core's router on the logits in ctx.probs (GateConfig::router): choices, weights, the scores (in place:
// the full softmax, or sigmoid's s) and the aux-loss sums (whole-chunk and, for seq_aux_loss, per sequence).
void megatron_select(const GateConfig& cfg, GateCtx& ctx) {
  GateRouting& r = ctx.routing;
  const int64_t S = r.S, E = r.E, k = r.k;
  const bool sigmoid_fn = cfg.score_function == ScoreFunction::sigmoid;
  const bool own_aux_map = sigmoid_fn || cfg.group_topk > 0 || !cfg.expert_bias.empty();
  const bool seq = cfg.balancing == Balancing::seq_aux_loss;
  ctx.choice_count.assign(size_t(k * E), 0);
  ctx.topk_weight.assign(size_t(S * k), 0.0f);
  ctx.lse.assign(cfg.z_loss_coeff != 0 ? size_t(S) : 0, 0.0f);
  ctx.logits.assign(cfg.z_loss_coeff != 0 && sigmoid_fn ? size_t(S * E) : 0, 0.0f);
  ctx.seq.assign(seq ? size_t(S) : 0, 0);
  float* P = ctx.probs.data<float>();
  std::vector<float> aux(static_cast<size_t>(E));
  std::vector<int32_t> aux_choice(static_cast<size_t>(k));
  std::vector<double> counts(static_cast<size_t>(E), 0.0);
  RouteScratch scratch;
  // Sinkhorn balancing (training): the column scaling of this call's logits, before they become scores
  const std::vector<double> d1 =
      cfg.balancing == Balancing::sinkhorn && cfg.training ? sinkhorn_columns(P, S, E) : std::vector<double>{};
  for (int64_t t = 0; t < S; ++t) {
    float* row = P + t * E;
    int32_t* choice = r.expert.data() + t * k;
    if (!ctx.lse.empty()) {  // the z-loss: lse = max + log sum exp(logit - max)
      const float lse = log_sum_exp(row, E);
      ctx.lse[size_t(t)] = lse;
      ctx.stats.sum_lse2 += double(lse) * double(lse);
      if (!ctx.logits.empty()) std::copy(row, row + E, ctx.logits.begin() + t * E);
    }
    megatron_route_token(cfg, row, E, scratch, d1.empty() ? nullptr : d1.data(), choice,
                         ctx.topk_weight.data() + t * k, aux.data());
    for (int64_t i = 0; i < k; ++i) ++ctx.choice_count[size_t(i * E + choice[i])];
    const int32_t* mapped = choice;
    if (own_aux_map) {
      topk_row(aux.data(), E, k, aux_choice.data());
      mapped = aux_choice.data();
    }
    for (int64_t e = 0; e < E; ++e) ctx.stats.sum_probs[size_t(e)] += double(aux[size_t(e)]);
    for (int64_t i = 0; i < k; ++i) counts[size_t(mapped[i])] += 1.0;
    if (!seq) continue;
    const int64_t b = int64_t((ctx.tokens.at(t) - cfg.token_base) % uint64_t(cfg.micro_batch));
    ctx.seq[size_t(t)] = int32_t(b);
    for (int64_t e = 0; e < E; ++e) ctx.stats.seq_probs[size_t(b * E + e)] += double(aux[size_t(e)]);
    for (int64_t i = 0; i < k; ++i) ctx.stats.seq_mask[size_t(b * E + mapped[i])] += 1.0 / double(k);
  }
  for (int64_t e = 0; e < E; ++e)
    ctx.stats.sum_mask1[size_t(e)] = cfg.balancing == Balancing::aux_loss ? counts[size_t(e)] / double(k) : 0.0;
}

// Megatron-Core's capacity drops (GateConfig::expert_capacity_factor): keep[t*k+i] = 0 for the choices each expert
// cannot take, by --moe-token-drop-policy. Without a capacity (or when it holds every token) nothing is dropped.
std::vector<uint8_t> megatron_kept(const GateCtx& ctx) {
  const GateRouting& r = ctx.routing;
  const int64_t S = r.S, E = r.E, k = r.k;
  std::vector<uint8_t> keep(size_t(S * k), 1);
  const int64_t cap = megatron_expert_capacity(S, E, int(k), ctx.cfg.expert_capacity_factor);
  if (cap >= S) return keep;
  std::vector<std::vector<int64_t>> of(static_cast<size_t>(E));  // each expert's choices t*k+i
  for (int64_t ci = 0; ci < S * k; ++ci) of[size_t(r.expert[size_t(ci)])].push_back(ci);
  const bool by_probs = ctx.cfg.drop_policy == DropPolicy::probs;
  for (std::vector<int64_t>& list : of) {
    if (int64_t(list.size()) <= cap) continue;
    // The earlier token first (global order); by probs the larger weight first, ties to the earlier token.
    std::stable_sort(list.begin(), list.end(), [&](int64_t a, int64_t b) {
      if (by_probs && ctx.topk_weight[size_t(a)] != ctx.topk_weight[size_t(b)])
        return ctx.topk_weight[size_t(a)] > ctx.topk_weight[size_t(b)];
      return ctx.tokens.at(a / k) < ctx.tokens.at(b / k);
    });
    for (size_t j = size_t(cap); j < list.size(); ++j) keep[size_t(list[j])] = 0;
  }
  return keep;
}

// Megatron-Core's router: choice i of expert e takes the slot after every earlier kept choice's (dropped ones: -1).
void megatron_assign(int64_t C, GateCtx& ctx) {
  GateRouting& r = ctx.routing;
  const int64_t S = r.S, E = r.E, k = r.k;
  const std::vector<uint8_t> keep = megatron_kept(ctx);
  std::vector<int32_t> kept_count(size_t(k * E), 0);
  for (int64_t ci = 0; ci < S * k; ++ci)
    if (keep[size_t(ci)]) ++kept_count[size_t((ci % k) * E + r.expert[size_t(ci)])];
  std::vector<int32_t> next(size_t(k * E), 0);  // first slot of choice i of expert e
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 1; i < k; ++i)
      next[size_t(i * E + e)] = next[size_t((i - 1) * E + e)] + kept_count[size_t((i - 1) * E + e)];
  for (int64_t t = 0; t < S; ++t)
    for (int64_t i = 0; i < k; ++i) {
      if (!keep[size_t(t * k + i)]) continue;  // slot -1, weight 0 (gate_assign_forward's defaults)
      const int32_t e = r.expert[size_t(t * k + i)];
      const int32_t s = next[size_t(i * E + e)]++;
      AMPIPE_CHECK(s < C, "Megatron-Core's router: slot {} of expert {} beyond the capacity {}", s, e, C);
      r.slot[size_t(t * k + i)] = s;
      r.weight[size_t(t * k + i)] = ctx.topk_weight[size_t(t * k + i)];
      r.slot_token[size_t(e * C + s)] = int32_t(t);
      ++r.expert_count[size_t(e)];
    }
}
}  // namespace

void gate_select_forward(const Tensor& x, const Tensor& Wg, const GateConfig& cfg, const TokenMap& tokens, GateCtx& ctx,
                         kernels::ComputeContext& kc) {
  validate(cfg);
  AMPIPE_CHECK(x.dim() == 2 && x.size(0) >= 1, "gate input x {} must be [S, h] with S >= 1", shape_str(x.shape()));
  const int64_t S = x.size(0), h = x.size(1), E = cfg.num_experts, k = cfg.topk;
  AMPIPE_CHECK(Wg.dtype() == DType::f32 && Wg.dim() == 2 && Wg.size(0) == E && Wg.size(1) == h &&
                   Wg.strides()[1] == 1,
               "gate weight {} {} vs E={} h={}", dtype_name(Wg.dtype()), shape_str(Wg.shape()), E, h);
  ctx.cfg = cfg;
  ctx.tokens = tokens;

  // Gate input in fp32, with jitter: x_gate = x * noise. [S, h]
  const bool jitter = jitter_on(cfg);
  if (x.dtype() == DType::f32 && !jitter && x.strides()[1] == 1) {
    ctx.x_gate = x;  // a view: the layer keeps x alive until the backward
  } else {
    // A buffer the caller planned for it is reused (it must not be x itself).
    if (!ctx.x_gate.defined() || ctx.x_gate.shape() != Shape{S, h} || !ctx.x_gate.is_contiguous() ||
        ctx.x_gate.dtype() != DType::f32 || ctx.x_gate.raw() == x.raw())
      ctx.x_gate = Tensor::empty({S, h});
    ctx.x_gate.copy_from(x);
    if (jitter) {
      const core::PhiloxKey key = key_of(cfg, core::RngPurpose::gate_jitter);
      std::vector<float> noise(static_cast<size_t>(h));
      float* xg = ctx.x_gate.data<float>();
      for (int64_t t = 0; t < S; ++t) {
        jitter_row(key, tokens.at(t), h, noise.data());
        for (int64_t j = 0; j < h; ++j) xg[t * h + j] *= noise[size_t(j)];
      }
    }
  }

  // logits = x_gate @ Wg^T: [S, h] x [h, E] -> [S, E], fp32; softmax in place below.
  if (!ctx.probs.defined() || ctx.probs.shape() != Shape{S, E} || !ctx.probs.is_contiguous())
    ctx.probs = Tensor::empty({S, E});
  kernels::gemm(ctx.x_gate, kernels::Trans::n, Wg, kernels::Trans::t, ctx.probs, false, 1.0f, kc);

  GateRouting& r = ctx.routing;
  r.S = S;
  r.E = E;
  r.k = k;
  r.expert.assign(size_t(S * k), -1);
  const bool seq = cfg.router == Router::megatron && cfg.balancing == Balancing::seq_aux_loss;
  ctx.stats.reset(E, seq ? cfg.micro_batch : 0);
  ctx.stats.tokens = double(S);
  ctx.first_count.assign(size_t(E), 0);
  ctx.second_count.assign(size_t(E), 0);

  if (cfg.router == Router::megatron) return megatron_select(cfg, ctx);
  const bool rsample = rsample_on(cfg);
  const core::PhiloxKey rs_key = key_of(cfg, core::RngPurpose::gate_rsample);
  float* P = ctx.probs.data<float>();
  for (int64_t t = 0; t < S; ++t) {
    float* row = P + t * E;
    int32_t e1 = -1;
    if (rsample) {  // argmax over logits + Gumbel noise (computed in double), ties -> lower index
      double best = -INFINITY;
      for (int64_t e = 0; e < E; ++e) {
        const double v = double(row[e]) + gumbel(rs_key, tokens.at(t), uint64_t(e));
        if (e1 < 0 || v > best) best = v, e1 = int32_t(e);
      }
    }
    softmax_row(row, E);
    if (!rsample) {
      e1 = 0;
      for (int64_t e = 1; e < E; ++e)
        if (row[e] > row[e1]) e1 = int32_t(e);
    }
    r.expert[size_t(t * k)] = e1;
    ++ctx.first_count[size_t(e1)];
    if (k == 2) {
      int32_t e2 = -1;
      for (int64_t e = 0; e < E; ++e)
        if (e != e1 && (e2 < 0 || row[e] > row[e2])) e2 = int32_t(e);
      r.expert[size_t(t * k + 1)] = e2;
      ++ctx.second_count[size_t(e2)];
    }
    for (int64_t e = 0; e < E; ++e) ctx.stats.sum_probs[size_t(e)] += double(row[e]);
  }
  for (int64_t e = 0; e < E; ++e) ctx.stats.sum_mask1[size_t(e)] = double(ctx.first_count[size_t(e)]);
}

int64_t gate_required_capacity(const GateCtx& ctx) {
  int64_t need = 0;
  if (ctx.cfg.router == Router::megatron) {  // each expert keeps min(its choices, the capacity)
    const int64_t E = ctx.routing.E;
    const int64_t cap =
        megatron_expert_capacity(ctx.routing.S, E, int(ctx.routing.k), ctx.cfg.expert_capacity_factor);
    for (int64_t e = 0; e < E; ++e) {
      int64_t all = 0;
      for (int64_t i = 0; i < ctx.routing.k; ++i) all += ctx.choice_count[size_t(i * E + e)];
      need = std::max(need, std::min(all, cap));
    }
    return need;
  }
  for (size_t e = 0; e < ctx.first_count.size(); ++e)
    need = std::max<int64_t>(need, int64_t(ctx.first_count[e]) + (ctx.routing.k == 2 ? ctx.second_count[e] : 0));
  return need;
}

void gate_assign_forward(int64_t C, GateCtx& ctx) {
  GateRouting& r = ctx.routing;
  const int64_t S = r.S, E = r.E, k = r.k;
  AMPIPE_CHECK(C >= 1 && C <= int64_t(INT32_MAX), "capacity {} (S={}, E={})", C, S, E);
  AMPIPE_CHECK(int64_t(r.expert.size()) == S * k && ctx.probs.numel() == S * E,
               "gate_assign_forward before gate_select_forward");
  r.C = C;
  r.slot.assign(size_t(S * k), -1);
  r.weight.assign(size_t(S * k), 0.0f);
  r.slot_token.assign(size_t(E * C), -1);
  r.expert_count.assign(size_t(E), 0);
  const float* P = ctx.probs.data<float>();
  if (ctx.cfg.router == Router::megatron) return megatron_assign(C, ctx);

  if (k == 1) {
    // Which tokens each over-full expert keeps. keep[t] = 1 unless dropped.
    std::vector<uint8_t> keep(size_t(S), 1);
    bool any_full = false;
    for (int64_t e = 0; e < E; ++e) any_full |= ctx.first_count[size_t(e)] > C;
    if (any_full) {
      // Tokens grouped by expert, token order within an expert (counting sort).
      std::vector<int32_t> offset(size_t(E + 1), 0), bucket(static_cast<size_t>(S));
      for (int64_t e = 0; e < E; ++e) offset[size_t(e + 1)] = offset[size_t(e)] + ctx.first_count[size_t(e)];
      std::vector<int32_t> fill(offset.begin(), offset.end() - 1);
      for (int64_t t = 0; t < S; ++t) bucket[size_t(fill[size_t(r.expert[size_t(t)])]++)] = int32_t(t);
      const core::PhiloxKey rts_key = key_of(ctx.cfg, core::RngPurpose::gate_rts);
      std::vector<std::pair<float, int32_t>> pri;
      for (int64_t e = 0; e < E; ++e) {
        const int32_t b = offset[size_t(e)], n = ctx.first_count[size_t(e)];
        if (n <= C) continue;
        if (!ctx.cfg.use_rts) {  // first C in token order
          for (int32_t i = int32_t(C); i < n; ++i) keep[size_t(bucket[size_t(b + i)])] = 0;
          continue;
        }
        // RTS: keep the C highest priorities u(global token); equal u -> lower token first.
        pri.resize(size_t(n));
        for (int32_t i = 0; i < n; ++i) {
          const int32_t t = bucket[size_t(b + i)];
          pri[size_t(i)] = {core::philox_uniform(rts_key, ctx.tokens.at(t), 0), t};
        }
        std::nth_element(pri.begin(), pri.begin() + C, pri.end(), [](const auto& a, const auto& c) {
          return a.first > c.first || (a.first == c.first && a.second < c.second);
        });
        for (size_t i = size_t(C); i < pri.size(); ++i) keep[size_t(pri[i].second)] = 0;
      }
    }
    // Slots: rank in token order among kept tokens of the expert. The same loop fills slot_token.
    for (int64_t t = 0; t < S; ++t) {
      if (!keep[size_t(t)]) continue;
      const int32_t e = r.expert[size_t(t)];
      const int32_t s = r.expert_count[size_t(e)]++;
      r.slot[size_t(t)] = s;
      r.weight[size_t(t)] = P[t * E + e];  // not renormalised
      r.slot_token[size_t(e * C + s)] = int32_t(t);
    }
    return;
  }

  // Top-2: first choices take slots [0, first_count[e]) in token order, second choices queue after all first
  // choices of that expert; slot >= C is dropped (first come, first served).
  std::vector<int32_t> run1(size_t(E), 0), run2(size_t(E), 0);
  for (int64_t t = 0; t < S; ++t) {
    const int32_t e1 = r.expert[size_t(t * 2)], e2 = r.expert[size_t(t * 2 + 1)];
    const int64_t s1 = run1[size_t(e1)]++;
    const int64_t s2 = int64_t(ctx.first_count[size_t(e2)]) + run2[size_t(e2)]++;
    const float p1 = s1 < C ? P[t * E + e1] : 0.0f, p2 = s2 < C ? P[t * E + e2] : 0.0f;
    const float denom = std::max(p1 + p2, kRenormEps);
    if (s1 < C) {
      r.slot[size_t(t * 2)] = int32_t(s1);
      r.weight[size_t(t * 2)] = p1 / denom;
      r.slot_token[size_t(e1 * C + s1)] = int32_t(t);
      ++r.expert_count[size_t(e1)];
    }
    if (s2 < C) {
      r.slot[size_t(t * 2 + 1)] = int32_t(s2);
      r.weight[size_t(t * 2 + 1)] = p2 / denom;
      r.slot_token[size_t(e2 * C + s2)] = int32_t(t);
      ++r.expert_count[size_t(e2)];
    }
  }
}

void gate_forward(const Tensor& x, const Tensor& Wg, const GateConfig& cfg, const TokenMap& tokens, GateCtx& ctx,
                  kernels::ComputeContext& kc) {
  gate_select_forward(x, Wg, cfg, tokens, ctx, kc);
  const int64_t S = x.size(0);
  const bool padded = cfg.router == Router::megatron && cfg.expert_capacity_factor >= 0 && cfg.pad_to_capacity;
  const int64_t C = padded ? megatron_expert_capacity(S, cfg.num_experts, cfg.topk, cfg.expert_capacity_factor)
                    : cfg.no_drop || cfg.router == Router::megatron
                        ? gate_required_capacity(ctx)
                        : gate_capacity(S, cfg.num_experts, cfg.topk, cfg.capacity_factor, cfg.min_capacity);
  gate_assign_forward(C, ctx);
}

double aux_loss_from_sums(const GateStats& total) {
  if (total.tokens <= 0) return 0.0;
  const double E = double(total.sum_probs.size()), N = total.tokens;
  double acc = 0.0;
  if (!total.seq_probs.empty()) {  // seq_aux_loss: each sequence's aux loss (S_b = N / B tokens), averaged
    const double B = double(total.seq_probs.size()) / E, Sb = N / B;
    for (size_t i = 0; i < total.seq_probs.size(); ++i) acc += (total.seq_probs[i] / Sb) * (total.seq_mask[i] / Sb);
    return E * acc / B;
  }
  for (size_t e = 0; e < total.sum_probs.size(); ++e) acc += (total.sum_probs[e] / N) * (total.sum_mask1[e] / N);
  return E * acc;
}

double z_loss_from_sums(const GateStats& total, double coeff) {
  return total.tokens > 0 && coeff != 0 ? coeff * total.sum_lse2 / total.tokens : 0.0;
}

namespace {
// Megatron's router, token t: dp holds d l / d probs of the aux loss; turns it into d logits, with the routing
// weights' gradient dw [k] added (through the full softmax when pre-softmax, else through the softmax over the k
// chosen logits, whose gradient reaches only them).
void megatron_weight_backward(const GateCtx& ctx, int64_t t, const float* dw, const float* p, float* dp) {
  const GateRouting& r = ctx.routing;
  const int64_t E = r.E, k = r.k;
  const int32_t* choice = r.expert.data() + t * k;
  const float* w = ctx.topk_weight.data() + t * k;
  const float sf = float(ctx.cfg.topk_scaling_factor);
  if (ctx.cfg.score_function == ScoreFunction::sigmoid) {  // p = s = sigmoid(logits); dp holds d l / d q
    float total = 0.0f, dot = 0.0f;
    for (int64_t e = 0; e < E; ++e) total += p[e];
    const float D = total + 1e-20f;
    for (int64_t e = 0; e < E; ++e) dot += dp[e] * p[e] / D;
    for (int64_t e = 0; e < E; ++e) dp[e] = (dp[e] - dot) / D;  // q = s / D: d s_j = (d q_j - sum_e d q_e q_e) / D
    if (k == 1) {
      dp[choice[0]] += sf * dw[0];  // w = sf * s
    } else {  // w_i = sf * s_i / Dk: d s_i += sf (dw_i - sum_j dw_j u_j) / Dk, u = w / sf
      float sum = 0.0f, udot = 0.0f;
      for (int64_t i = 0; i < k; ++i) sum += p[choice[i]];
      for (int64_t i = 0; i < k; ++i) udot += dw[i] * w[i] / sf;
      for (int64_t i = 0; i < k; ++i) dp[choice[i]] += sf * (dw[i] - udot) / (sum + 1e-20f);
    }
    for (int64_t e = 0; e < E; ++e) dp[e] *= p[e] * (1.0f - p[e]);  // sigmoid'
    return;
  }
  if (ctx.cfg.pre_softmax)
    for (int64_t i = 0; i < k; ++i) dp[choice[i]] += sf * dw[i];  // w_i = sf * p[choice_i]
  kernels::softmax_backward_row(p, dp, dp, E);
  if (ctx.cfg.pre_softmax) return;
  // w_i = sf * q_i, q = softmax(chosen logits): d l_i = q_i (sf dw_i - sum_j q_j sf dw_j)
  float qdot = 0.0f;  // sum_j q_j sf dw_j = sum_j w_j dw_j
  for (int64_t i = 0; i < k; ++i) qdot += w[i] * dw[i];
  for (int64_t i = 0; i < k; ++i) dp[choice[i]] += w[i] / sf * (sf * dw[i] - qdot);
}
}  // namespace

void gate_backward(const Tensor& d_weight, float d_l_aux, const GateStats& total, const GateCtx& ctx,
                   const Tensor& Wg, Tensor& dlogits, Tensor& dx_accum, Tensor& dWg_accum,
                   kernels::ComputeContext& kc) {
  const GateRouting& r = ctx.routing;
  const int64_t S = r.S, E = r.E, k = r.k, h = ctx.x_gate.size(1);
  AMPIPE_CHECK(d_weight.dtype() == DType::f32 && d_weight.is_contiguous() && d_weight.numel() == S * k,
               "d_weight {} {} vs [S={}, k={}]", dtype_name(d_weight.dtype()), shape_str(d_weight.shape()), S, k);
  AMPIPE_CHECK(dlogits.dtype() == DType::f32 && dlogits.is_contiguous() && dlogits.shape() == Shape({S, E}),
               "dlogits {} vs [{}, {}]", shape_str(dlogits.shape()), S, E);
  AMPIPE_CHECK(dx_accum.dtype() == DType::f32 && dx_accum.dim() == 2 && dx_accum.size(0) == S &&
                   dx_accum.size(1) == h && dx_accum.strides()[1] == 1,
               "dx_accum {} {} vs [{}, {}] fp32", dtype_name(dx_accum.dtype()), shape_str(dx_accum.shape()), S, h);
  AMPIPE_CHECK(dWg_accum.dtype() == DType::f32 && dWg_accum.shape() == Wg.shape(), "dWg_accum {} vs Wg {}",
               shape_str(dWg_accum.shape()), shape_str(Wg.shape()));
  AMPIPE_CHECK((d_l_aux == 0.0f && ctx.lse.empty()) || (total.tokens > 0 && int64_t(total.sum_mask1.size()) == E),
               "aux-loss backward needs the global GateStats (tokens {}, {} experts)", total.tokens,
               total.sum_mask1.size());

  const float* P = ctx.probs.data<float>();
  const float* dw = d_weight.data<float>();
  float* dl = dlogits.data<float>();
  // d l_aux / d probs[t, e] = d_l_aux * E * Sm_e / N^2, the same for every token of every chunk.
  // seq_aux_loss: per sequence b, d_l_aux * E * Sm_be / (S_b^2 B), S_b = N / B.
  const bool seq = !total.seq_mask.empty();
  const int64_t B = seq ? int64_t(total.seq_mask.size()) / E : 1;
  AMPIPE_CHECK(!seq || int64_t(ctx.seq.size()) == S, "seq_aux_loss backward without the tokens' sequences");
  std::vector<float> daux(size_t(B * E), 0.0f);
  if (d_l_aux != 0.0f) {
    const double Sb = total.tokens / double(B);
    const std::vector<double>& m = seq ? total.seq_mask : total.sum_mask1;
    for (int64_t i = 0; i < B * E; ++i)
      daux[size_t(i)] = float(double(d_l_aux) * double(E) * m[size_t(i)] / (Sb * Sb * double(B)));
  }

  parallel_for(S, rows_grain(4 * E), [&](int64_t t0_, int64_t t1_) {
    for (int64_t t = t0_; t < t1_; ++t) {
      const float* p = P + t * E;
      float* dp = dl + t * E;  // d probs first, then turned into d logits in place
      const float* da = daux.data() + (seq ? int64_t(ctx.seq[size_t(t)]) * E : 0);
      for (int64_t e = 0; e < E; ++e) dp[e] = da[e];
      if (ctx.cfg.router == Router::megatron) {
        megatron_weight_backward(ctx, t, dw + t * k, p, dp);
        if (!ctx.lse.empty()) {  // the z-loss: d z / d logit_e = coeff * 2 lse_t softmax_e / N
          const float g = float(2.0 * ctx.cfg.z_loss_coeff * double(ctx.lse[size_t(t)]) / total.tokens);
          if (ctx.logits.empty())
            for (int64_t e = 0; e < E; ++e) dp[e] += g * p[e];
          else  // sigmoid: the softmax from the saved logits, exp(logit - lse)
            for (int64_t e = 0; e < E; ++e) dp[e] += g * std::exp(ctx.logits[size_t(t * E + e)] - ctx.lse[size_t(t)]);
        }
        continue;
      }
      if (k == 1) {
        if (r.slot[size_t(t)] >= 0) dp[r.expert[size_t(t)]] += dw[t];  // w = p[e1]
      } else {
        // w_i = p_i / D, D = max(p1 + p2, eps) over surviving choices. D > eps (torch.clamp passes the gradient
        // when p1 + p2 >= eps): dL/dp_j = (dw_j - sum_i dw_i w_i) / D; otherwise D = eps is constant.
        const bool kept1 = r.slot[size_t(t * 2)] >= 0, kept2 = r.slot[size_t(t * 2 + 1)] >= 0;
        const int32_t e1 = r.expert[size_t(t * 2)], e2 = r.expert[size_t(t * 2 + 1)];
        const float p1 = kept1 ? p[e1] : 0.0f, p2 = kept2 ? p[e2] : 0.0f, s = p1 + p2;
        const float dw1 = dw[t * 2], dw2 = dw[t * 2 + 1];
        if (s >= kRenormEps) {
          const float dot = (kept1 ? dw1 * r.weight[size_t(t * 2)] : 0.0f) +
                            (kept2 ? dw2 * r.weight[size_t(t * 2 + 1)] : 0.0f);
          if (kept1) dp[e1] += (dw1 - dot) / s;
          if (kept2) dp[e2] += (dw2 - dot) / s;
        } else {
          if (kept1) dp[e1] += dw1 / kRenormEps;
          if (kept2) dp[e2] += dw2 / kRenormEps;
        }
      }
      kernels::softmax_backward_row(p, dp, dp, E);  // dlogit_e = p_e * (dp_e - sum_j p_j dp_j)
    }
  });

  // dWg += dlogits^T @ x_gate: [E, S] x [S, h] -> [E, h]
  kernels::gemm(dlogits, kernels::Trans::t, ctx.x_gate, kernels::Trans::n, dWg_accum, /*accumulate=*/true, 1.0f, kc);
  // d x_gate = dlogits @ Wg: [S, E] x [E, h] -> [S, h]; with jitter dx += d x_gate * noise.
  if (!jitter_on(ctx.cfg)) {
    kernels::gemm(dlogits, kernels::Trans::n, Wg, kernels::Trans::n, dx_accum, /*accumulate=*/true, 1.0f, kc);
    return;
  }
  const core::PhiloxKey key = key_of(ctx.cfg, core::RngPurpose::gate_jitter);
  const float* W = Wg.data<float>();
  const int64_t wld = Wg.strides()[0];
  float* dx = dx_accum.data<float>();
  const int64_t ld = dx_accum.strides()[0];
  parallel_for(S, rows_grain(2 * h), [&](int64_t t0, int64_t t1) {
    std::vector<float> noise(static_cast<size_t>(h)), row(static_cast<size_t>(h));
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(row.begin(), row.end(), 0.0f);
      for (int64_t e = 0; e < E; ++e) {
        const float g = dl[t * E + e];
        if (g == 0.0f) continue;
        const float* w = W + e * wld;
        for (int64_t j = 0; j < h; ++j) row[size_t(j)] += g * w[j];
      }
      jitter_row(key, ctx.tokens.at(t), h, noise.data());
      for (int64_t j = 0; j < h; ++j) dx[t * ld + j] += row[size_t(j)] * noise[size_t(j)];
    }
  });
}

void update_expert_bias(std::span<float> bias, std::span<const float> counts, double rate) {
  AMPIPE_CHECK(bias.size() == counts.size() && !bias.empty(), "expert bias of {} for {} counts", bias.size(),
               counts.size());
  float sum = 0.0f;
  for (const float n : counts) sum += n;
  const float mean = sum / float(counts.size()), r = float(rate);
  for (size_t e = 0; e < bias.size(); ++e) {
    const float offset = mean - counts[e];
    bias[e] += (offset > 0.0f ? 1.0f : offset < 0.0f ? -1.0f : 0.0f) * r;
  }
}

}  // namespace ampipe::model
