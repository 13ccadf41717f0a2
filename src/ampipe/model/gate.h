// MoE router: the DeepSpeed-MoE top-1 / top-2 gate (MindSpeed `--moe-model-type deepspeed_moe`), index form.
//
// Notation (reference §6): S = tokens of this call (S_c for one AMPipe chunk), h = hidden, E = experts,
// k = choices per token (1 or 2), C = capacity (slots per expert; C_c for a chunk), N = tokens summed over every
// chunk of the layer step (the aux-loss denominator).
//
// One call routes the S tokens of one chunk. `tokens` gives their global indices (t = s_index * b + b_index
// in the natural [s, b] layout; a plain integer is the index of token 0 of a contiguous run), so every random draw (jitter, RSample, RTS) is keyed by position and does not depend on
// how the sequence is chunked.
//
// Forward, in two phases so that a caller can agree on the capacity between them:
//   gate_select_forward: x [S, h] -> logits = x_fp32 @ Wg^T [S, E] (fp32 always, kernels::gemm) -> softmax
//                        (fp32) -> each token's k experts, the chunk's aux-loss sums.
//   gate_assign_forward: capacity C -> slots, drops, weights, and per (expert, slot) the source token.
// gate_forward runs both with the capacity from gate_capacity(), or, with `no_drop`, from
// gate_required_capacity() (local; see there for the multi-rank hook).
//
// Rules (pinned by tests/model/test_gate.cpp):
// - Capacity: C = ceil(S / E * capacity_factor * k) computed in fp32 as DeepSpeed's _capacity does
//   (float(S / E) * float(k * capacity_factor)), then if C < min_capacity -> min_capacity, then if C > S -> S.
// - Ties (argmax, top-2): the lower expert index wins. The second choice excludes the first.
// - Top-1: expert = argmax of probs, or of logits + Gumbel noise with noisy_gate_policy RSample (training only;
//   Gumbel g = -log(-log u), u = (philox_uniform * 2^24 + 0.5) / 2^24 in (0, 1), keyed (seed, layer,
//   gate_rsample, global token, expert)); the weight is still the clean softmax prob.
//   Random token selection (use_rts, default on): an expert receiving more than C tokens keeps the C with the
//   highest priority u = philox_uniform(seed, layer, gate_rts, global token, 0) (equal u: lower token index
//   first); without RTS it keeps the first C in token order. Slot = rank in token order among the kept tokens of
//   that expert. Weight = prob of the chosen expert, NOT renormalised.
// - Top-2: first-choice slot = running count of first choices of that expert in token order; second-choice
//   slot = running count of second choices PLUS the total number of first choices of that expert (before
//   dropping), so second choices queue after all first choices. A choice with slot >= C is dropped (first come,
//   first served). Weights: p1, p2 = probs of the surviving choices (0 if dropped), w_i = p_i / max(p1 + p2,
//   eps) with eps = FLT_EPSILON (torch.finfo(float32).eps as DeepSpeed uses), so a token whose second choice
//   was dropped gets w1 = 1. RSample does not apply to top-2 (DeepSpeed's top2gating never reads it); it is
//   ignored there. The second choice is taken by prob (not Gumbel-sampled as newer DeepSpeed's
//   top2_2nd_expert_sampling does).
// - Jitter (noisy_gate_policy Jitter, training only, top-1 and top-2): the gate input is multiplied by
//   noise = 1 - eps + 2 * eps * u, eps = 1e-2, u = philox_uniform(seed, layer, gate_jitter, global token,
//   feature) (DeepSpeed's multiplicative_jitter). Only the gate sees the noisy input; dispatch uses clean x.
// - A dropped choice has slot -1 and weight 0; a token whose choices are all dropped gets a zero MoE output.
// - Aux loss (load balancing), from sums over every chunk of the layer step:
//     l_aux = E * sum_e (Sp_e / N) * (Sm_e / N),  Sp_e = sum_t probs[t, e],  Sm_e = sum_t mask1[t, e]
//   where mask1 is the one-hot of the FIRST choice BEFORE capacity dropping (top-1 and top-2, as DeepSpeed).
//   DeepSpeed's top-1 writes sum_e(me * ce) * E and its top-2 writes mean_e(me * ce) * E * E; both equal the
//   formula above. l_aux is returned without any coefficient: the caller scales it (--moe-aux-loss-coeff) via
//   the upstream gradient d_l_aux passed to gate_backward. Because the sums are global, M chunks give exactly
//   the M = 1 loss and gradient (MindSpeed applied a per-chunk loss once per chunk, ~M x the intended one).
//   d l_aux / d probs[t, e] = E * (Sm_e / N) / N; the mask is not differentiable.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ampipe/core/tensor.h"
#include "ampipe/kernels/context.h"
#include "ampipe/model/token_map.h"

namespace ampipe::model {

// --noisy-gate-policy None | Jitter | RSample
enum class NoisyGatePolicy : uint8_t { none, jitter, rsample };

// Which router (--moe-model-type): DeepSpeed-MoE's top-1/top-2 gate with a capacity (deepspeed_moe, the rules
// above), or Megatron-Core's top-k router (megatron_moe; dropless unless a capacity factor is given):
// - Choices: the k largest logits (--moe-router-pre-softmax: the k largest softmax probabilities; the same experts,
//   ties -> the lower expert index), k = 1 .. 8; choice i is the i-th largest.
// - Weights: the softmax over the k chosen logits (pre-softmax: the full softmax's probabilities of the chosen
//   experts, not renormalised), times --moe-router-topk-scaling-factor. Without a capacity (below) every choice is
//   kept (the slots of expert e: its first choices in token order, then its second choices, ...).
// - Aux loss (--moe-router-load-balancing-type aux_loss, Megatron's switch_load_balancing_loss_func):
//   l_aux = E / (N^2 k) * sum_e Sp_e * c_e, c_e = the choices of expert e (all k of every token), the full softmax's
//   Sp_e as above. Written into GateStats as sum_mask1 = c_e / k, so aux_loss_from_sums and the backward are the
//   same code. `none`: no aux loss (sum_mask1 = 0).
// No noise (Jitter, RSample, RTS are DeepSpeed's) and none of DeepSpeed's capacity flags apply to it.
// Its variants (Megatron's topk_routing_with_score_function, compute_routing_scores_for_aux_loss):
// - --moe-router-score-function sigmoid: s = sigmoid(logits) (fp32); choices: the k largest s + b (b the expert
//   bias, --moe-router-enable-expert-bias; 0 without); weights: s of the chosen, divided by (their sum + 1e-20)
//   when k > 1, times the scaling factor. The aux losses read q = s / (sum_e s + 1e-20) instead of the softmax.
// - --moe-router-num-groups G, --moe-router-group-topk g (group-limited routing): the E experts in G groups of E/G
//   consecutive ones; a group's score is the sum of its k/g largest routing scores; the g best groups (ties -> the
//   lower group) are kept and the k choices made among their experts only.
// - The aux losses' counts c_e are the top-k of their own scores (softmax, or q), without groups or bias, as
//   Megatron's routing_map_for_aux_loss (the routing choices themselves when neither applies).
// - --moe-router-load-balancing-type seq_aux_loss: l = (1/B) sum_b E / (S_b^2 k) sum_e Sp_be c_be, the aux loss of
//   each sequence b of the micro-batch (S_b = N/B tokens; Sp_be, c_be its tokens' sums), averaged (Megatron's
//   _apply_seq_aux_loss).
// - Expert bias (aux-loss-free balancing): b is state the router does not train; after each step it moves by
//   --moe-router-bias-update-rate towards balance: b_e += rate * sign(mean_j n_j - n_e), n_e the tokens routed to e
//   over the whole step (every micro-batch and rank; Megatron's get_updated_expert_bias): update_expert_bias below,
//   called by the step once the counts are summed over the ranks.
// - Capacity (--moe-expert-capacity-factor f, Megatron's apply_router_token_dropping): each expert keeps at most
//   C = ceil((S k / E) f) of the chunk's S tokens (no drop when C >= S). Over C, --moe-token-drop-policy probs keeps
//   the C largest routing weights (ties: the earlier token), position the C earliest tokens (the global token order
//   t = position * b + sequence, Megatron's [s, b] flattening). A dropped choice gets weight 0 and no gradient; the
//   others keep their weights (not renormalised). The aux losses count the choices before dropping. With
//   --moe-pad-expert-input-to-capacity every expert runs min(C, S) rows (the padding zero, weight 0); the expert
//   bias then counts min(C, S) tokens per expert, as Megatron's padded routing map does.
// - --moe-router-load-balancing-type sinkhorn (S-BASE's balancing, Megatron's sinkhorn_load_balancing): in training
//   the choices are the top-k of Megatron's sinkhorn-normalised exp(logits) over the S tokens of this call
//   (sinkhorn_columns below; no gradient flows through it); in evaluation the top-k of the scores. The scores are
//   sigmoid(logits) when k = 1, else the full softmax; the weights are the chosen scores, not renormalised and not
//   scaled. use_sinkhorn_scores() expresses that as score_function sigmoid (k = 1) or pre_softmax softmax (k > 1)
//   with a scaling factor of 1, no groups and no bias: only the choice differs. No aux loss (Megatron
//   asserts its coefficient is 0); the z-loss and the capacity apply as with the other types. The normalisation runs
//   over one router call, so it is per AMPipe chunk (docs/layer.md §6.10).
enum class Router : uint8_t { deepspeed, megatron };
enum class DropPolicy : uint8_t { probs, position };  // --moe-token-drop-policy
constexpr const char* drop_policy_name(DropPolicy p) { return p == DropPolicy::position ? "position" : "probs"; }
enum class ScoreFunction : uint8_t { softmax, sigmoid };     // --moe-router-score-function
enum class Balancing : uint8_t { none, aux_loss, seq_aux_loss, sinkhorn };  // --moe-router-load-balancing-type
constexpr const char* score_function_name(ScoreFunction f) { return f == ScoreFunction::sigmoid ? "sigmoid" : "softmax"; }
constexpr const char* balancing_name(Balancing b) {
  return b == Balancing::aux_loss       ? "aux_loss"
         : b == Balancing::seq_aux_loss ? "seq_aux_loss"
         : b == Balancing::sinkhorn     ? "sinkhorn"
                                        : "none";
}

struct GateConfig {
  int64_t num_experts = 0;                 // E (--num-experts)
  int topk = 1;                            // k: 1 or 2 (--moe-router-topk)
  double capacity_factor = 1.0;            // --moe-train-capacity-factor (also used for eval)
  int64_t min_capacity = 4;                // --moe-min-capacity
  bool no_drop = false;                    // --moe-no-drop: capacity = the largest expert load (nothing dropped)
  bool use_rts = true;                     // random token selection (top-1 only)
  NoisyGatePolicy noisy_gate_policy = NoisyGatePolicy::none;
  bool training = true;                    // Jitter / RSample only apply in training (RTS always applies)
  uint64_t seed = 0;                       // global seed of the run
  uint32_t layer = 0;                      // layer index, part of every random key
  Router router = Router::deepspeed;       // --moe-model-type
  bool pre_softmax = false;                // megatron: --moe-router-pre-softmax
  double topk_scaling_factor = 1.0;        // megatron: --moe-router-topk-scaling-factor (1: none)
  Balancing balancing = Balancing::aux_loss;  // megatron: --moe-router-load-balancing-type
  ScoreFunction score_function = ScoreFunction::softmax;  // megatron: --moe-router-score-function
  int num_groups = 0, group_topk = 0;      // megatron: --moe-router-num-groups, --moe-router-group-topk (0: none)
  std::vector<float> expert_bias;          // megatron, sigmoid: [E] the routing bias (empty: none)
  double expert_capacity_factor = -1;      // megatron: --moe-expert-capacity-factor (< 0: none, dropless)
  bool pad_to_capacity = false;            // megatron: --moe-pad-expert-input-to-capacity
  DropPolicy drop_policy = DropPolicy::probs;  // megatron: --moe-token-drop-policy
  // seq_aux_loss: the micro-batch's sequences; token t's is (tokens.at(t) - token_base) % micro_batch
  int64_t micro_batch = 1;
  uint64_t token_base = 0;
  // megatron: --moe-z-loss-coeff (ST-MoE's router z-loss, Megatron's z_loss_func): z = coeff * sum_t lse_t^2 / N,
  // lse_t = logsumexp of token t's fp32 logits over the E experts, N the tokens of every chunk (as the aux loss).
  // Its gradient d z / d logits[t, e] = coeff * 2 lse_t softmax[t, e] / N is added by gate_backward (its upstream
  // gradient is the coefficient itself: the loss is z as it is, as Megatron adds it).
  double z_loss_coeff = 0.0;
};

// Sinkhorn balancing's scores and weights in `cfg` (see Router): sigmoid for k = 1, else the pre-softmax probabilities;
// no scaling factor, groups or bias (Megatron's sinkhorn_load_balancing ignores those options). Other types: no-op.
void use_sinkhorn_scores(GateConfig& cfg);

// Per-chunk statistics for the aux loss. Sum them over chunks (and over ranks, for a data-parallel mean) with
// accumulate(); the aux loss and its gradient need only the totals.
struct GateStats {
  std::vector<double> sum_probs;  // [E] Sp_e = sum_t probs[t, e]
  std::vector<double> sum_mask1;  // [E] Sm_e = number of tokens whose first choice is e (before dropping)
  double tokens = 0;              // N = number of tokens summed
  double sum_lse2 = 0;            // sum_t lse_t^2 (the z-loss; 0 without one)
  // seq_aux_loss: [B, E] per sequence b of the micro-batch the same sums (sum_probs, sum_mask1); empty otherwise
  std::vector<double> seq_probs, seq_mask;

  void reset(int64_t E, int64_t seqs = 0);  // zeros, sized E (and seqs x E per-sequence sums)
  void accumulate(const GateStats& o);
};

// Index form of the routing (no dense S x E x C tensor). Choice i of token t lives at [t * k + i]
// (i = 0: first choice). The per-slot table and the per-choice slots are filled by the same loop, so they agree:
// slot_token[e * C + slot[t*k+i]] == t for every kept choice, and every other slot is -1.
struct GateRouting {
  int64_t S = 0, E = 0, k = 0, C = 0;
  std::vector<int32_t> expert;      // [S, k] chosen expert (also for dropped choices)
  std::vector<int32_t> slot;        // [S, k] slot in [0, C), or -1 if dropped
  std::vector<float> weight;        // [S, k] combine weight; 0 if dropped
  std::vector<int32_t> slot_token;  // [E, C] source token (chunk-local) of each slot, or -1 if empty
  std::vector<int32_t> expert_count;  // [E] kept tokens per expert (filled slots are [0, count))
};

// Saved context of one gate call: routing (read by dispatch/combine) plus what gate_backward reads.
struct GateCtx {
  GateConfig cfg;
  TokenMap tokens;        // global indices of the chunk's tokens (token_map.h)
  Tensor x_gate;          // [S, h] fp32 gate input after jitter (a view of x when x is fp32 and there is no jitter)
  Tensor probs;           // [S, E] fp32 clean softmax
  GateStats stats;        // this chunk's aux-loss sums
  std::vector<int32_t> first_count;  // [E] first choices per expert before dropping (top-2 second-slot offset)
  std::vector<int32_t> second_count; // [E] second choices per expert before dropping (top-2)
  std::vector<int32_t> choice_count; // megatron: [k, E] i-th choices per expert
  std::vector<float> topk_weight;    // megatron: [S, k] the routing weights (scaled)
  std::vector<float> lse;            // megatron with a z-loss: [S] logsumexp of each token's logits
  std::vector<float> logits;         // megatron, sigmoid with a z-loss: [S, E] the logits (probs holds s)
  std::vector<int32_t> seq;          // seq_aux_loss: [S] each token's sequence in the micro-batch
  GateRouting routing;
};

// C = clamp(ceil(S / E * capacity_factor * k), min_capacity, S) (see the header comment for the arithmetic).
int64_t gate_capacity(int64_t S, int64_t E, int k, double capacity_factor, int64_t min_capacity);

// Megatron-Core's expert capacity of S tokens: min(S, ceil((S k / E) * factor)) (get_capacity, in double), or S
// when factor < 0 (no capacity).
int64_t megatron_expert_capacity(int64_t S, int64_t E, int k, double factor);

// Phase 1. x: [S, h] fp32 or bf16 (any row stride); Wg: [E, h] fp32. Fills ctx.x_gate, probs, stats, the chosen
// experts (ctx.routing.expert) and first/second counts. Throws ConfigError on a bad config (k, E,
// capacity factor); shapes are AMPIPE_CHECKed.
void gate_select_forward(const Tensor& x, const Tensor& Wg, const GateConfig& cfg, const TokenMap& tokens, GateCtx& ctx,
                         kernels::ComputeContext& kc = kernels::ComputeContext::host());

// The capacity this chunk needs so that nothing is dropped: the largest number of choices any expert receives
// (top-2: first plus second choices). Local: in a multi-rank --moe-no-drop run the caller all-reduces MAX over
// the group (MindSpeed: the whole world) and passes the agreed value to gate_assign_forward.
// (MindSpeed's top-2 no_drop uses max second-choice slot + 2, one slot more than needed; we use the exact load.)
int64_t gate_required_capacity(const GateCtx& ctx);

// Phase 2: slots, drops and weights for capacity C >= 1 (overwrites ctx.routing except `expert`).
void gate_assign_forward(int64_t C, GateCtx& ctx);

// Both phases; C from gate_capacity(S, ...) or, with cfg.no_drop, gate_required_capacity (local only).
// kc: the compute context of the router's GEMM (kernels/context.h).
void gate_forward(const Tensor& x, const Tensor& Wg, const GateConfig& cfg, const TokenMap& tokens, GateCtx& ctx,
                  kernels::ComputeContext& kc = kernels::ComputeContext::host());

// Megatron-Core's sinkhorn (moe_utils.sinkhorn, tolerance 1e-4) over S x E logits [S, E] (row stride E): with
// cost = exp(logits), iterate d0 = (1/S) / (cost d1 + 1e-8), d1 = (1/E) / (cost^T d0 + 1e-8) from d1 = 1 until the mean
// |change of d1| is at most 1e-4 (at most kSinkhornMaxIterations; Megatron has no bound). Returns d1 [E]: the
// normalised matrix is d0[t] cost[t, e] d1[e], so token t's choices are the top-k of cost[t, e] d1[e]. Double precision
// (Megatron: fp32).
constexpr int kSinkhornMaxIterations = 10000;
std::vector<double> sinkhorn_columns(const float* logits, int64_t S, int64_t E);

// l_aux = E * sum_e (Sp_e / N) * (Sm_e / N) from sums over all chunks (0 when N = 0). No coefficient.
// seq_aux_loss (per-sequence sums present): the mean over the B sequences of the same with S_b = N / B.
double aux_loss_from_sums(const GateStats& total);
// z = coeff * sum_lse2 / N from sums over all chunks (0 when N = 0), the coefficient included.
double z_loss_from_sums(const GateStats& total, double coeff);

// Backward of one chunk's gate.
//   d_weight: [S, k] fp32, d loss / d routing.weight (from combine_backward); dropped choices are ignored.
//   d_l_aux:  upstream gradient of l_aux (the aux-loss coefficient; 0 skips the aux term).
//   total:    GateStats summed over every chunk (the same totals used for the forward l_aux).
//   Wg:       [E, h] fp32, as in the forward.
// Outputs: dlogits [S, E] fp32 is overwritten (scratch, and handy for tests); dx_accum [S, h] fp32 and
// dWg_accum [E, h] fp32 are accumulated (+=): the residual path meets dx, and dWg sums over chunks.
// The expert bias's step (Megatron's get_updated_expert_bias, fp32): bias[e] += rate * sign(mean(counts) - counts[e]),
// counts [E] the tokens routed to each expert over the step (sign(0) = 0: a balanced expert keeps its bias).
void update_expert_bias(std::span<float> bias, std::span<const float> counts, double rate);

void gate_backward(const Tensor& d_weight, float d_l_aux, const GateStats& total, const GateCtx& ctx,
                   const Tensor& Wg, Tensor& dlogits, Tensor& dx_accum, Tensor& dWg_accum,
                   kernels::ComputeContext& kc = kernels::ComputeContext::host());

}  // namespace ampipe::model
