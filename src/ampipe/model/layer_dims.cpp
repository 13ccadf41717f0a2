#include "ampipe/model/layer_dims.h"

#include <algorithm>

#include "ampipe/core/error.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/model/context_parallel.h"
#include "ampipe/model/gate.h"

namespace ampipe::model {

LayerDims LayerDims::make(const LayerConfig& cfg, int M) {
  AMPIPE_CHECK(M >= 1 && cfg.seq_length % M == 0, "degree {} must divide the sequence {}", M, cfg.seq_length);
  LayerDims d;
  d.cp = cfg.cp();
  d.s_global = cfg.seq_length;
  AMPIPE_CHECK(d.cp == 1 || cfg.seq_length % (2 * d.cp * M) == 0, "cp {} degree {} do not divide the sequence {}", d.cp,
               M, cfg.seq_length);
  d.s = cfg.seq_length / d.cp;
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
  d.T = d.s * d.b;
  d.M = M;
  d.sq = d.s / M;
  d.Sc = d.sq * d.b;
  d.tp = cfg.tp();
  d.sp = cfg.sp();
  AMPIPE_CHECK(d.h % d.tp == 0 && d.n % d.tp == 0 && d.F % d.tp == 0 && (!d.sp || d.s % (d.tp * M) == 0),
               "tp {} does not divide the layer (h {} n {} F {} s {} M {})", d.tp, d.h, d.n, d.F, d.s, M);
  d.Tl = d.sp ? d.T / d.tp : d.T;
  d.Scl = d.Tl / M;
  d.hl = d.h / d.tp;
  d.nl = d.n / d.tp;
  d.g = cfg.query_groups();
  AMPIPE_CHECK(d.n % d.g == 0 && d.g % d.tp == 0, "query groups {} for {} heads on tp {}", d.g, d.n, d.tp);
  d.gl = d.g / d.tp;
  d.kvl = d.gl * d.d;
  d.qkvl = d.hl + 2 * d.kvl;
  d.rope = cfg.rope();
  d.qk_norm = cfg.qk_layernorm;
  d.Fl = d.F / d.tp;
  d.F1l = d.F1 / d.tp;
  d.moe = !cfg.dense();
  d.mlp = cfg.has_mlp();
  d.mlp_gate = d.mlp && !cfg.dense() && cfg.moe_shared_expert_gate;
  d.fc1_bias = cfg.add_bias_linear;
  d.Fm = cfg.mlp_ffn_hidden_size;
  d.F1m = cfg.expert == ExpertKind::swiglu ? 2 * d.Fm : d.Fm;
  AMPIPE_CHECK(d.Fm % d.tp == 0, "tp {} does not divide the dense MLP's F {}", d.tp, d.Fm);
  d.Fml = d.Fm / d.tp;
  d.F1ml = d.F1m / d.tp;
  if (!d.moe) {  // a dense layer: no router, no experts, no all-to-all
    d.E = d.k = d.L = 0;
    d.ep = 1;
  }
  d.srcs = d.sp ? d.tp * d.ep : d.ep;
  d.overlap_tp = d.tp > 1 && (cfg.ampipe_tp_sp_comm_overlap || (cfg.pipe_experts_multi_stream && d.sp));
  d.capacity_is_bound = !cfg.fixed_capacity();
  d.seq_aux = d.moe && cfg.megatron_router() && cfg.moe_router_load_balancing == Balancing::seq_aux_loss;
  d.agree_capacity_tp = d.capacity_is_bound && d.moe && d.sp && d.tp > 1;
  d.agree_capacity = (d.capacity_is_bound && d.ep > 1 && d.moe) || d.agree_capacity_tp;
  d.C = !d.moe ? 0
        : cfg.megatron_router()
            ? megatron_expert_capacity(d.Scl, d.E, int(d.k), cfg.megatron_capacity() ? cfg.moe_expert_capacity_factor : -1)
        : cfg.moe_no_drop ? d.Scl
                          : gate_capacity(d.Scl, d.E, int(d.k), cfg.moe_train_capacity_factor, cfg.moe_min_capacity);
  d.defer_expert_wgrad = cfg.fixed_capacity();
  d.jitter = cfg.noisy_gate_policy == NoisyGatePolicy::jitter;
  d.recompute = cfg.recompute;
  d.recompute_attention = cfg.recompute_attention;
  d.cd = cfg.compute_dtype();
  if (cfg.use_pipe_experts) {  // cfg.check_pipe_experts(M) has accepted it
    AMPIPE_CHECK(cfg.fixed_capacity() && cfg.pipe_experts_multi_data % M == 0, "pipe-experts N {} M {}",
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
  } else if (d.overlap_tp && d.moe) {  // --ampipe-tp-sp-comm-overlap: one piece per (chunk, local expert), all its slots
    for (int64_t l = 0; l < d.L; ++l) d.pieces.push_back({l, 1, 0, d.C, l * d.ep * d.C});
  }
  return d;
}

kernels::AttentionShape chunk_attention(const LayerDims& d, int c) {
  kernels::AttentionShape sh{d.sq, (c + 1) * d.sq, d.b, d.nl, d.d, c * d.sq};  // the local heads
  sh.n_kv = d.gl;
  return sh;
}

namespace {
// Context parallelism: the calls of chunk c against ring slot t (every slot for t = -1). The work is the same on
// every cp rank (context_parallel.h), so rank 0's calls stand for all.
std::vector<kernels::AttentionShape> cp_attention(const LayerDims& d, int c, int t) {
  const CpLayout cp = CpLayout::make(d.s_global, int(d.cp), 0, d.M);
  std::vector<kernels::AttentionShape> shapes;
  for (int slot = 0; slot < int(d.cp); ++slot)
    if (t < 0 || slot == t)
      for (const CpAttentionCall& call : cp_attention_calls(cp, c, slot, d.b, d.nl, d.d, d.gl)) shapes.push_back(call.shape);
  return shapes;
}
}  // namespace

double stage_flops(const LayerDims& d, Stage s, Dir dir, int c, int piece) {
  // GEMMs of one tp rank: the attention core on every row of the chunk and hl = h/t columns of q, k, v; the
  // experts on F1/t and F/t columns of the R = srcs*C slots of each local expert.
  const double Sc = double(d.Sc), Scl = double(d.Scl), h = double(d.h), hl = double(d.hl), T = double(d.T);
  const double qkv = double(d.qkvl), FF = double(d.F1l + d.Fl);  // q, k, v columns (3*hl without grouping)
  const double expert = 2 * double(d.L * d.R()) * h * FF;  // one pass over a chunk's slots
  if (piece >= 0 && s == Stage::experts) {
    const ExpertPiece& p = d.pieces[size_t(piece)];
    const double one = 2 * double(p.experts * d.srcs * p.slots) * h * FF;
    return dir == Dir::fwd || d.defer_expert_wgrad ? one : 2 * one;
  }
  if (s == Stage::attention_recompute) return dir == Dir::bwd ? stage_flops(d, Stage::attention, Dir::fwd, c) : 0;
  switch (s) {
    case Stage::ln1_qkv:
    case Stage::qkv: return 2 * Sc * h * qkv;
    case Stage::attention: {
      if (d.cp == 1) return kernels::causal_attention_flops(chunk_attention(d, c), dir == Dir::bwd);
      double f = 0;
      for (const kernels::AttentionShape& sh : cp_attention(d, c, piece)) f += kernels::causal_attention_flops(sh, dir == Dir::bwd);
      return f;
    }
    case Stage::out_proj: return 2 * Sc * hl * h;
    case Stage::attention_wgrad: return dir == Dir::bwd ? 2 * T * h * qkv + 2 * T * hl * h : 0;
    case Stage::gate: return (dir == Dir::fwd ? 1 : 2) * 2 * Scl * h * double(d.E);  // fp32; backward: dx and dWg
    case Stage::experts: return dir == Dir::fwd || d.defer_expert_wgrad ? expert : 2 * expert;
    case Stage::expert_wgrad: return dir == Dir::bwd && d.defer_expert_wgrad ? double(d.M) * expert : 0;
    case Stage::mlp: return 2 * Sc * h * double(d.F1ml + d.Fml);  // backward: the input-gradient GEMMs
    case Stage::mlp_wgrad: return dir == Dir::bwd ? 2 * T * h * double(d.F1ml + d.Fml) : 0;
    default: return 0;  // element-wise stages
  }
}

double stage_bytes(const LayerDims& d, Stage s, Dir dir, int c, int piece) {
  if (piece >= 0 && s == Stage::experts) {  // the piece's share of the chunk's
    const ExpertPiece& p = d.pieces[size_t(piece)];
    return stage_bytes(d, s, dir, c) * double(p.experts * p.slots) / double(d.L * d.C);
  }
  const double f = 4, e = double(dtype_size(d.cd)), Sc = double(d.Sc), Scl = double(d.Scl), h = double(d.h),
               hl = double(d.hl), T = double(d.T), FF = double(d.F1l + d.Fl), qkv = double(d.qkvl), kv2 = 2.0 * double(d.kvl);
  if (s == Stage::attention_recompute) return dir == Dir::bwd ? stage_bytes(d, Stage::attention, Dir::fwd, c) : 0;
  const double act = Scl * h;  // one [Scl, h] residual-stream activation
  // RoPE: q, k read and written again (fp32); --qk-layernorm: copied out, normalised, copied back (3 more passes)
  const double rope = (d.rope ? 2 : 0) * Sc * double(d.hl + d.kvl) * f + (d.qk_norm ? 6 : 0) * Sc * double(d.hl + d.kvl) * f;
  const double io = dir == Dir::fwd ? 1 : 2;
  switch (s) {
    case Stage::ln1_qkv: return io * (act * f + Sc * h * (f + e) + Sc * qkv * (f + e) + rope) + qkv * h * e;
    case Stage::ln1: return io * 2 * act * f;
    case Stage::qkv: return io * (Sc * h * e + Sc * qkv * (f + e) + rope) + qkv * h * e;
    case Stage::attention: {
      double kv = double((c + 1) * d.sq * d.b) * kv2 * e;  // K and V of the visible rows
      if (d.cp > 1) {  // every call reads its keys; the queries and output once per call
        kv = 0;
        double q = 0;
        for (const kernels::AttentionShape& sh : cp_attention(d, c, piece)) {
          kv += double(sh.skv * d.b) * kv2 * e;
          q += double(sh.sq * d.b) * hl * (e + f);
        }
        return io * (kv + q);
      }
      return io * (Sc * hl * e + kv + Sc * hl * f);
    }
    case Stage::out_proj: return io * (Sc * hl * (f + e) + Sc * h * f) + h * hl * e;
    case Stage::residual_ln2: return io * 4 * act * f;
    case Stage::gate: return io * (act * f + Scl * double(d.E) * f) + double(d.E * d.C) * h * e;
    case Stage::gate_assign: return double(d.E * d.C) * h * e + act * f;
    case Stage::experts: {
      const double rows = double(d.L * d.R());
      return io * (rows * h * e * 2 + rows * FF * (f + e)) + double(d.L) * h * FF * e;
    }
    case Stage::expert_wgrad: {  // reads every chunk's slots once, reads and writes the fp32 weight gradients
      const double rows = double(d.M * d.L * d.R());
      return rows * (h + FF) * e + 2 * double(d.L) * h * FF * f;
    }
    case Stage::attention_wgrad: return T * (qkv + hl + 4 * h) * e + 2 * (qkv + hl) * h * f;
    case Stage::weighted_sum: return io * (double(d.E * d.C) * h * f + 3 * act * f);
    case Stage::cp_dkv_reduce: return double(d.T) * kv2 * f * 4;  // add a received slot, unpack into dqkv
    case Stage::mlp: {
      const double Fm = double(d.F1ml + d.Fml);
      return io * (Sc * h * (e + f) + Sc * Fm * (f + e)) + Fm * h * e;
    }
    case Stage::mlp_wgrad: {  // every row's input, output gradient and activations once; the fp32 gradients
      const double Fm = double(d.F1ml + d.Fml);
      return T * (2 * h + Fm) * e + 2 * Fm * h * f;
    }
    default: return 0;  // the aux loss
  }
}

}  // namespace ampipe::model
