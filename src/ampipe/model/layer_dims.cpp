#include "ampipe/model/layer_dims.h"

#include <algorithm>

#include "ampipe/core/error.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/model/gate.h"

namespace ampipe::model {

LayerDims LayerDims::make(const LayerConfig& cfg, int M) {
  AMPIPE_CHECK(M >= 1 && cfg.seq_length % M == 0, "degree {} must divide the sequence {}", M, cfg.seq_length);
  LayerDims d;
  d.s = cfg.seq_length;
  d.b = cfg.micro_batch_size;
  d.h = cfg.hidden_size;
  d.F = cfg.ffn_hidden_size;
  d.F1 = cfg.expert == ExpertKind::swiglu ? 2 * d.F : d.F;
  d.n = cfg.num_attention_heads;
  d.d = cfg.head_dim();
  d.E = cfg.num_experts;
  d.k = cfg.moe_router_topk;
  d.ep = cfg.expert_model_parallel_size;
  d.L = cfg.local_experts();
  d.T = cfg.tokens();
  d.M = M;
  d.sq = d.s / M;
  d.Sc = d.sq * d.b;
  d.capacity_is_bound = cfg.moe_no_drop;
  d.agree_capacity = cfg.moe_no_drop && d.ep > 1;
  d.C = cfg.moe_no_drop ? d.Sc
                        : gate_capacity(d.Sc, d.E, int(d.k), cfg.moe_train_capacity_factor, cfg.moe_min_capacity);
  d.defer_expert_wgrad = !cfg.moe_no_drop;
  d.jitter = cfg.noisy_gate_policy == NoisyGatePolicy::jitter;
  d.cd = cfg.compute_dtype();
  if (cfg.use_pipe_experts) {  // cfg.check_pipe_experts(M) has accepted it
    AMPIPE_CHECK(!cfg.moe_no_drop && cfg.pipe_experts_multi_data % M == 0, "pipe-experts N {} M {}",
                 cfg.pipe_experts_multi_data, M);
    d.slices = cfg.pipe_experts_multi_data / M;
    const int64_t slice = (d.C + d.slices - 1) / d.slices;
    int64_t row = 0;
    for (int64_t l = 0; l < d.L; ++l)
      for (int64_t n = 0; n < d.slices; ++n) {
        const int64_t slots = std::min(slice, d.C - n * slice);
        if (slots <= 0) continue;  // ceil slicing: e.g. C = 5 in 4 slices is 2, 2, 1, 0
        d.pieces.push_back({l, 1, n * slice, slots, row});
        row += d.ep * slots;
      }
  }
  return d;
}

namespace {
kernels::AttentionShape chunk_attention(const LayerDims& d, int c) {
  return {d.sq, (c + 1) * d.sq, d.b, d.n, d.d, c * d.sq};
}
}  // namespace

double stage_flops(const LayerDims& d, Stage s, Dir dir, int c, int piece) {
  const double Sc = double(d.Sc), h = double(d.h), T = double(d.T);
  const double expert = 2 * double(d.L * d.R()) * h * double(d.F1 + d.F);  // one pass over a chunk's slots
  if (piece >= 0 && s == Stage::experts) {
    const ExpertPiece& p = d.pieces[size_t(piece)];
    const double one = 2 * double(p.experts * d.ep * p.slots) * h * double(d.F1 + d.F);
    return dir == Dir::fwd || d.defer_expert_wgrad ? one : 2 * one;
  }
  switch (s) {
    case Stage::ln1_qkv: return 2 * Sc * h * 3 * h;
    case Stage::attention: return kernels::causal_attention_flops(chunk_attention(d, c), dir == Dir::bwd);
    case Stage::out_proj: return 2 * Sc * h * h;
    case Stage::attention_wgrad: return dir == Dir::bwd ? 2 * T * h * 3 * h + 2 * T * h * h : 0;
    case Stage::gate: return (dir == Dir::fwd ? 1 : 2) * 2 * Sc * h * double(d.E);  // fp32; backward: dx and dWg
    case Stage::experts: return dir == Dir::fwd || d.defer_expert_wgrad ? expert : 2 * expert;
    case Stage::expert_wgrad: return dir == Dir::bwd && d.defer_expert_wgrad ? double(d.M) * expert : 0;
    default: return 0;  // element-wise stages and collectives
  }
}

double stage_bytes(const LayerDims& d, Stage s, Dir dir, int c, int piece) {
  if (piece >= 0 && s == Stage::experts) {  // the piece's share of the chunk's
    const ExpertPiece& p = d.pieces[size_t(piece)];
    return stage_bytes(d, s, dir, c) * double(p.experts * p.slots) / double(d.L * d.C);
  }
  const double f = 4, e = double(dtype_size(d.cd)), Sc = double(d.Sc), h = double(d.h), T = double(d.T);
  const double act = Sc * h;  // one [S_c, h] activation
  const double io = dir == Dir::fwd ? 1 : 2;
  switch (s) {
    case Stage::ln1_qkv: return io * (act * f + act * (f + e) + Sc * 3 * h * (f + e)) + 3 * h * h * e;
    case Stage::attention: {
      const double kv = double((c + 1) * d.sq * d.b) * 2 * h * e;  // K and V of the visible rows
      return io * (act * e + kv + act * f);
    }
    case Stage::out_proj: return io * (act * (f + e) + act * f) + h * h * e;
    case Stage::residual_ln2: return io * 4 * act * f;
    case Stage::gate: return io * (act * f + Sc * double(d.E) * f) + double(d.E * d.C) * h * e;
    case Stage::gate_assign: return double(d.E * d.C) * h * e + act * f;
    case Stage::experts: {
      const double rows = double(d.L * d.R());
      return io * (rows * h * e * 2 + rows * double(d.F1 + d.F) * (f + e)) +
             double(d.L) * h * double(d.F1 + d.F) * e;
    }
    case Stage::expert_wgrad: {  // reads every chunk's slots once, reads and writes the fp32 weight gradients
      const double rows = double(d.M * d.L * d.R());
      return rows * (h + double(d.F1 + d.F)) * e + 2 * double(d.L) * h * double(d.F1 + d.F) * f;
    }
    case Stage::attention_wgrad: return T * 4 * h * (e + e) + 2 * 4 * h * h * f;
    case Stage::weighted_sum: return io * (double(d.E * d.C) * h * f + 3 * act * f);
    case Stage::aux_loss: return 0;
    case Stage::capacity:
    case Stage::dispatch:
    case Stage::combine: return 0;
  }
  return 0;
}

double collective_bytes(const LayerDims& d, Stage s, Dir dir, int piece) {
  if (piece >= 0 && (s == Stage::dispatch || s == Stage::combine)) {
    const ExpertPiece& p = d.pieces[size_t(piece)];
    return double(d.ep * p.experts * p.slots * d.h) * double(dtype_size(d.cd));
  }
  switch (s) {
    case Stage::dispatch:
    case Stage::combine: return double(d.E * d.C * d.h) * double(dtype_size(d.cd));
    case Stage::capacity: return dir == Dir::fwd ? 4 : 0;
    default: return 0;
  }
}

}  // namespace ampipe::model
