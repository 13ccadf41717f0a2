#include "ampipe/model/moe_block.h"

#include <algorithm>
#include <cstring>

#include "ampipe/core/philox.h"
#include "ampipe/kernels/activations.h"
#include "ampipe/kernels/dropout.h"
#include "ampipe/model/dispatch.h"
#include "ampipe/model/linear.h"
#include "ampipe/model/mlp_block.h"

namespace ampipe::model {

namespace {
core::PhiloxKey dropout_key(const LayerConfig& cfg) {
  return {cfg.seed, uint32_t(cfg.layer_index), core::RngPurpose::mlp_dropout};
}
// Rows [l*R, (l+1)*R) of a per-chunk [L, R, *] buffer (expert_out, d_expert_in): local expert l's slots of this
// chunk. (The expert-major buffers that hold every chunk are LayerMemory::expert_rows.)
Tensor chunk_expert_rows(const Tensor& t, int64_t l) {
  const int64_t R = t.size(1);
  return t.view({t.size(0) * R, t.size(2)}).rows(l * R, (l + 1) * R);
}
}  // namespace

MoeBlock::MoeBlock(LayerState& st) : st_(st), gctx_(size_t(st.dims.M)) {}

GateConfig MoeBlock::gate_config() const {
  const LayerConfig& cfg = st_.cfg;
  GateConfig gc;
  gc.num_experts = cfg.num_experts;
  gc.topk = cfg.moe_router_topk;
  gc.capacity_factor = cfg.moe_train_capacity_factor;
  gc.min_capacity = cfg.moe_min_capacity;
  gc.no_drop = cfg.dropless();
  gc.use_rts = cfg.use_rts;
  gc.noisy_gate_policy = cfg.noisy_gate_policy;
  gc.seed = cfg.seed;
  gc.training = cfg.training;
  gc.layer = uint32_t(cfg.layer_index);
  gc.router = cfg.moe_router;
  gc.pre_softmax = cfg.moe_router_pre_softmax;
  gc.topk_scaling_factor = cfg.moe_router_topk_scaling_factor > 0 ? cfg.moe_router_topk_scaling_factor : 1.0;
  gc.balancing = cfg.megatron_router() ? cfg.moe_router_load_balancing : Balancing::aux_loss;
  gc.score_function = cfg.moe_router_score_function;
  gc.num_groups = cfg.moe_router_num_groups;
  gc.group_topk = cfg.moe_router_group_topk;
  if (st_.p.expert_bias.defined()) {
    const float* b = st_.p.expert_bias.data<float>();
    gc.expert_bias.assign(b, b + cfg.num_experts);
  }
  gc.micro_batch = st_.dims.b;
  gc.token_base = st_.token_base;
  gc.z_loss_coeff = cfg.megatron_router() ? cfg.moe_z_loss_coeff : 0.0;
  gc.expert_capacity_factor = cfg.megatron_capacity() ? cfg.moe_expert_capacity_factor : -1;
  gc.pad_to_capacity = cfg.moe_pad_expert_input_to_capacity;
  gc.drop_policy = cfg.moe_token_drop_policy;
  use_sinkhorn_scores(gc);
  return gc;
}

// ------------------------------------------------------------------------------------------------ forward

void MoeBlock::begin_forward() { total_.reset(st_.dims.E, st_.dims.seq_aux ? st_.dims.b : 0); }

void MoeBlock::set_routing(int c) {
  GateCtx& g = gctx_[size_t(c)];
  AMPIPE_CHECK(g.routing.C >= 1 && g.routing.C <= st_.dims.C, "chunk {} capacity {} outside the planned [1, {}]", c,
               g.routing.C, st_.dims.C);
  st_.mem.set_capacity(c, g.routing.C);
  Tensor send = st_.mem.get(Buf::dispatch_send, c);
  if (!st_.dims.pieced()) {  // one piece: the gate's [E, C, h] layout is the all-to-all's
    dispatch_forward(st_.rows(Buf::ln2_out, c), g.routing, send);
    return;
  }
  Tensor rows = st_.mem.get(Buf::dispatch_rows, c);
  dispatch_forward(st_.rows(Buf::ln2_out, c), g.routing, rows);
  copy_slots_pieces(rows, send, c, /*to_pieces=*/true);
}

void MoeBlock::gate(int c) {
  LayerState& s = st_;
  GateCtx& g = gctx_[size_t(c)];
  g.probs = s.mem.get(Buf::gate_probs, c);  // the gate writes its planned buffers
  if (s.dims.jitter) g.x_gate = s.mem.get(Buf::gate_input, c);
  const Tensor x = s.rows(Buf::ln2_out, c);
  const TokenMap token0 = s.chunk_tokens(c);
  if (!s.dims.agree_capacity) {
    gate_forward(x, s.p.gate_w, gate_config(), token0, g, *s.ctx);
    accumulate_stats(g.stats);
    set_routing(c);
    return;
  }
  gate_select_forward(x, s.p.gate_w, gate_config(), token0, g);
  accumulate_stats(g.stats);
  s.mem.get(Buf::capacity_need, c).fill(float(gate_required_capacity(g)));  // exact in fp32 (C <= 2^24)
}

void MoeBlock::accumulate_stats(const GateStats& chunk) {
  total_.accumulate(chunk);
  if (!st_.dims.sp && st_.dims.cp == 1) return;
  // Sequence or context parallel: this rank's running totals, all-reduced over tp (the Plan's tp_aux_stats) and cp
  // (the Plan's cp_aux_stats) after the last chunk
  const int64_t E = st_.dims.E;
  float* v = st_.mem.get(Buf::gate_stats).data<float>();
  for (int64_t e = 0; e < E; ++e) {
    v[e] = float(total_.sum_probs[size_t(e)]);
    v[E + e] = float(total_.sum_mask1[size_t(e)]);
  }
  v[2 * E] = float(total_.tokens);
  v[2 * E + 1] = float(total_.sum_lse2);
  const size_t n = total_.seq_probs.size();
  for (size_t i = 0; i < n; ++i) {
    v[2 * E + 2 + int64_t(i)] = float(total_.seq_probs[i]);
    v[2 * E + 2 + int64_t(n + i)] = float(total_.seq_mask[i]);
  }
}

void MoeBlock::gate_assign(int c) {
  const Seams& m = st_.mem.seams();
  const Tensor all = st_.mem.get(st_.dims.agree_capacity_tp ? m.capacity_tp.recv : m.capacity.recv, c);
  const float* v = all.data<float>();
  const float C = std::max(1.0f, *std::max_element(v, v + all.numel()));
  gate_assign_forward(int64_t(C), gctx_[size_t(c)]);
  set_routing(c);
}

ExpertPiece MoeBlock::piece(int c, int p) const {
  if (!st_.dims.pieced()) return {0, st_.dims.L, 0, st_.mem.capacity(c), 0};
  return st_.dims.piece(p, st_.mem.capacity(c));
}

void MoeBlock::copy_slots_pieces(const Tensor& from, Tensor& to, int c, bool to_pieces) const {
  // [E, C, h] slots (expert e = j*L + l) <-> a chunk's piece-major buffer; dtypes converted
  const int64_t L = st_.dims.L, ep = st_.dims.ep, C = st_.mem.capacity(c), h = st_.dims.h;
  const Tensor src = from.view({st_.dims.E * C, h});
  Tensor dst = to.view({st_.dims.E * C, h});
  std::vector<kernels::RowBlock> blocks;
  for (size_t p = 0; p < st_.dims.pieces.size(); ++p) {
    const ExpertPiece pc = piece(c, int(p));
    for (int64_t j = 0; j < ep; ++j)
      for (int64_t i = 0; i < pc.experts; ++i) {
        const int64_t slot = (j * L + pc.expert0 + i) * C + pc.slot0, at = pc.row0 + (j * pc.experts + i) * pc.slots;
        blocks.push_back({to_pieces ? slot : at, to_pieces ? at : slot, pc.slots});
      }
  }
  kernels::copy_row_blocks(src, dst, blocks);
}

void MoeBlock::piece_to_experts(const Tensor& region, Buf dst, int c, const ExpertPiece& pc) const {
  // a piece's block [srcs][experts][slots][h] (the all-to-all's ep source ranks, times tp when all-gathered) ->
  // expert l's rows srcs*slot0 + j*slots + [0, slots) of chunk c (LayerMemory::expert_rows: expert l's rows of
  // chunk c start at row (l*M + c)*R of the expert-major buffer [L, M*R, h], R the planned srcs*C)
  const int64_t srcs = st_.dims.srcs, h = st_.dims.h;
  const Tensor src = region.view({region.numel() / h, h});
  AMPIPE_CHECK(src.size(0) == srcs * pc.experts * pc.slots, "piece block of {} rows, expected {}", src.size(0),
               srcs * pc.experts * pc.slots);
  const Tensor all = st_.mem.get(dst);
  Tensor rows = all.view({all.size(0) * all.size(1), all.size(2)});
  std::vector<kernels::RowBlock> blocks;
  for (int64_t j = 0; j < srcs; ++j)
    for (int64_t i = 0; i < pc.experts; ++i) {
      const int64_t at = (j * pc.experts + i) * pc.slots, r0 = srcs * pc.slot0 + j * pc.slots;
      blocks.push_back({at, ((pc.expert0 + i) * st_.dims.M + c) * st_.dims.R() + r0, pc.slots});
    }
  kernels::copy_row_blocks(src, rows, blocks);
}

void MoeBlock::experts_to_piece(const Tensor& rows, Tensor& region, const ExpertPiece& pc) const {
  // rows [L, R, h] (this chunk, R = srcs*C) -> the piece's block [srcs][experts][slots][h]; dtypes converted
  const int64_t srcs = st_.dims.srcs, R = rows.size(1);
  const Tensor all = rows.view({rows.size(0) * R, rows.size(2)});
  Tensor dst = region.view({region.numel() / st_.dims.h, st_.dims.h});
  std::vector<kernels::RowBlock> blocks;
  for (int64_t j = 0; j < srcs; ++j)
    for (int64_t i = 0; i < pc.experts; ++i)
      blocks.push_back({(pc.expert0 + i) * R + srcs * pc.slot0 + j * pc.slots, (j * pc.experts + i) * pc.slots,
                        pc.slots});
  kernels::copy_row_blocks(all, dst, blocks);
}

// Elements between local expert l's and expert l+1's rows of an expert-major buffer [L, M*R, X] (planned capacity,
// LayerMemory::expert_rows).
int64_t MoeBlock::expert_stride(Buf b) const {
  const Tensor t = st_.mem.get(b);
  return t.size(1) * t.size(2);
}

void MoeBlock::experts(int c, int p) {
  LayerState& s = st_;
  const ExpertPiece pc = piece(c, p);
  const int64_t F1 = s.dims.F1l, h = s.dims.h, r0 = s.dims.srcs * pc.slot0, n = s.dims.srcs * pc.slots;
  const int64_t l0 = pc.expert0, l1 = pc.expert0 + pc.experts;
  // sequence parallel: the slots all-gathered over tp (the Plan's tp_expert_in)
  const Seams& m = s.mem.seams();
  piece_to_experts(s.mem.get(s.dims.sp ? m.expert_in.recv : m.dispatch.recv, c, p), Buf::expert_in, c, pc);
  const Tensor out = s.mem.get(Buf::expert_out, c);
  const bool grouped = s.cfg.moe_grouped_gemm && pc.experts > 1;
  const Buf kept_act = s.bf16() ? Buf::act_bf16 : Buf::act;  // what fc2 reads (and its weight gradient)
  auto fc1_rows = [&](int64_t l) { return s.mem.expert_rows(Buf::fc1_out, l, c).rows(r0, r0 + n); };
  auto act_rows = [&](int64_t l) { return s.mem.expert_rows(kept_act, l, c).rows(r0, r0 + n); };
  auto out_rows = [&](int64_t l) { return chunk_expert_rows(out, l).rows(r0, r0 + n); };
  if (grouped) {  // fc1 of every expert of the piece in one call: [n, h] -> [n, F1] each
    Tensor h1 = fc1_rows(l0);
    grouped_linear_forward(s.mem.expert_rows(Buf::expert_in, l0, c).rows(r0, r0 + n), expert_stride(Buf::expert_in),
                           s.w.fc1.rows(l0 * F1, (l0 + 1) * F1), F1 * h, h1, expert_stride(Buf::fc1_out), pc.experts,
                           *s.ctx);
  }
  for (int64_t l = l0; l < l1; ++l) {
    Tensor h1 = fc1_rows(l), o = out_rows(l);
    Tensor a = act_rows(l);  // the kept activation, in the compute dtype: bf16 written straight from fp32 values
    if (!grouped)
      linear_forward(s.mem.expert_rows(Buf::expert_in, l, c).rows(r0, r0 + n), s.w.fc1.rows(l * F1, (l + 1) * F1), h1,
                     *s.ctx);
    if (s.p.fc1_b.defined()) add_bias(h1, s.p.fc1_b.rows(l, l + 1));  // --add-bias-linear (tp: this shard's rows)
    if (s.cfg.expert == ExpertKind::swiglu)
      kernels::swiglu_forward(h1, a);
    else
      kernels::gelu_forward(h1, a);
    if (!grouped) linear_forward(a, s.w.fc2.rows(l * h, (l + 1) * h), o, *s.ctx);  // [n, F] -> [n, h]
  }
  if (grouped) {
    Tensor o = out_rows(l0);
    grouped_linear_forward(act_rows(l0), expert_stride(kept_act), s.w.fc2.rows(l0 * h, (l0 + 1) * h), h * s.dims.Fl,
                           o, out.size(1) * out.size(2), pc.experts, *s.ctx);  // [L, R_c, h]: this chunk's capacity
  }
  // --add-bias-linear: fc2's bias once in the sum over tp's partial outputs (on tp rank 0, before the reduce)
  if (s.p.fc2_b.defined() && s.tp_rank == 0)
    for (int64_t l = l0; l < l1; ++l) add_bias(out_rows(l), s.p.fc2_b.rows(l, l + 1));
  // tp > 1: partial sums over the local F columns, reduced next (the Plan's tp_expert_out): reduce-scattered from
  // combine_partial into combine_send (sequence parallel), or all-reduced in place
  Tensor send = s.mem.get(s.dims.tp > 1 ? s.mem.seams().expert_out.send : s.mem.seams().combine.send, c, p);
  experts_to_piece(out, send, pc);
}

void MoeBlock::weighted_sum(int c) {
  LayerState& s = st_;
  Tensor moe = s.rows(Buf::moe_out, c);
  if (s.dims.moe) {
    Tensor Y = s.mem.get(Buf::expert_y, c);  // fp32 without pipe-experts: the combine all-to-all received into it
    const Buf recv = s.mem.seams().combine.recv;
    if (s.dims.pieced())
      copy_slots_pieces(s.mem.get(recv, c), Y, c, /*to_pieces=*/false);
    else if (recv != Buf::expert_y)
      Y.copy_from(s.mem.get(recv, c));
    // Recomputing: the backward reads expert_y (above) but not the weighted sum or the output, which is kept.
    if (s.recomputing) return;
    combine_forward(Y, gctx_[size_t(c)].routing, moe);
    if (s.dims.mlp) add_shared_expert_rows(s, c, moe);  // the shared expert's output (gated or not) joins the experts'
  } else {
    if (s.recomputing) return;
    moe.copy_from(mlp_output_rows(s, c));  // a dense layer: the MLP's output alone
    if (s.p.mlp_fc2_b.defined()) add_bias(moe, s.p.mlp_fc2_b);  // --add-bias-linear: after the tp reduction
  }
  Tensor y = s.rows(s.mem.get(Buf::y).view({s.dims.Tl, s.dims.h}), c);
  const Tensor ln_in = s.rows(Buf::ln_in, c);
  s.chunk_tokens(c).for_each_run(moe.size(0), [&](int64_t first, int64_t n, uint64_t token0) {
    Tensor out = y.rows(first, first + n);
    kernels::dropout_add_forward(moe.rows(first, first + n), ln_in.rows(first, first + n), s.cfg.dropout_p(),
                                 dropout_key(s.cfg), token0, out);
  });
}

void MoeBlock::aux_loss() {
  if (!st_.dims.moe) return;  // a dense layer: no router, aux_ stays 0
  if (st_.dims.sp || st_.dims.cp > 1) {  // the totals over every tp and cp rank's rows: all tokens of the sequence
    const int64_t E = st_.dims.E;
    const float* v = st_.mem.get(Buf::gate_stats).data<float>();
    for (int64_t e = 0; e < E; ++e) {
      total_.sum_probs[size_t(e)] = v[e];
      total_.sum_mask1[size_t(e)] = v[E + e];
    }
    total_.tokens = v[2 * E];
    total_.sum_lse2 = v[2 * E + 1];
    const size_t n = total_.seq_probs.size();
    for (size_t i = 0; i < n; ++i) {
      total_.seq_probs[i] = v[2 * E + 2 + int64_t(i)];
      total_.seq_mask[i] = v[2 * E + 2 + int64_t(n + i)];
    }
  }
  aux_ = aux_loss_from_sums(total_);
  z_ = z_loss_from_sums(total_, gate_config().z_loss_coeff);
}

// ----------------------------------------------------------------------------------------------- backward

void MoeBlock::weighted_sum_backward(int c) {
  LayerState& s = st_;
  Tensor d_moe = s.mem.get(Buf::d_moe);
  const Tensor dy = s.rows(s.dy, c);
  s.chunk_tokens(c).for_each_run(dy.size(0), [&](int64_t first, int64_t n, uint64_t token0) {
    Tensor out = d_moe.rows(first, first + n);
    kernels::dropout_backward(dy.rows(first, first + n), s.cfg.dropout_p(), dropout_key(s.cfg), token0, out);
  });
  if (s.dims.mlp) shared_expert_output_grad(s, c, d_moe, s.rows(Buf::d_mlp, c));  // the dense MLP's output gradient
  if (s.g.mlp_fc2_b.defined()) add_column_sums(s.rows(Buf::d_mlp, c), s.g.mlp_fc2_b);  // this rank's rows
  if (!s.dims.moe) return;
  Tensor send = s.mem.get(Buf::combine_bwd_send, c);  // EP rank j gets the grads of its experts
  const bool staged = s.bf16() || s.dims.pieced();
  Tensor dY = staged ? s.mem.get(Buf::d_expert_y, c) : send;
  Tensor d_weight = s.mem.get(Buf::d_weight, c);
  combine_backward(d_moe, s.mem.get(Buf::expert_y, c), gctx_[size_t(c)].routing, dY, d_weight);
  if (s.dims.pieced())
    copy_slots_pieces(dY, send, c, /*to_pieces=*/true);
  else if (s.bf16())
    send.copy_from(dY);
}

void MoeBlock::experts_backward(int c, int p) {
  LayerState& s = st_;
  const ExpertPiece pc = piece(c, p);
  const int64_t L = s.dims.L, F1 = s.dims.F1l, h = s.dims.h, r0 = s.dims.srcs * pc.slot0, n = s.dims.srcs * pc.slots;
  const bool wgrad_now = !s.dims.defer_expert_wgrad;  // --moe-no-drop: chunks' slots are not packed
  const Seams& m = s.mem.seams();
  piece_to_experts(s.mem.get(s.dims.sp ? m.d_expert_out.recv : m.d_combine.recv, c, p), Buf::d_expert_out, c, pc);
  const Tensor d_in = s.mem.get(Buf::d_expert_in, c);
  Tensor d_act = s.mem.get(Buf::d_act, c).rows(0, n);
  Tensor gw1 = s.g.fc1_w.view({L * F1, h}), gw2 = s.g.fc2_w.view({L * h, s.dims.Fl});
  for (int64_t l = pc.expert0; l < pc.expert0 + pc.experts; ++l) {
    const Tensor d_out = s.mem.expert_rows(Buf::d_expert_out, l, c).rows(r0, r0 + n);
    linear_input_grad(d_out, s.w.fc2.rows(l * h, (l + 1) * h), d_act, *s.ctx);  // fc2
    if (s.g.fc2_b.defined()) {  // --add-bias-linear: every tp rank the same (the slots' whole output gradient)
      Tensor db = s.g.fc2_b.rows(l, l + 1);
      add_column_sums(d_out, db);
    }
    if (wgrad_now) {
      Tensor gw2_l = gw2.rows(l * h, (l + 1) * h);
      linear_weight_grad(d_out, s.mem.expert_rows(s.bf16() ? Buf::act_bf16 : Buf::act, l, c).rows(r0, r0 + n),
                         gw2_l, *s.ctx);
    }
    // bf16: the gradient is written straight into its bf16 copy (kept for the weight gradient), unless fc1 has a bias,
    // whose gradient sums it in fp32: then the fp32 gradient is one expert's staging and the copy is made from it
    const bool staged = s.bf16() && s.g.fc1_b.defined();
    Tensor d_h1 = !s.bf16() ? s.mem.expert_rows(Buf::d_fc1, l, c).rows(r0, r0 + n)
                  : staged  ? s.mem.get(Buf::d_fc1, c).rows(0, n)
                            : s.mem.expert_rows(Buf::d_fc1_bf16, l, c).rows(r0, r0 + n);
    const Tensor h1 = s.mem.expert_rows(Buf::fc1_out, l, c).rows(r0, r0 + n);
    if (s.cfg.expert == ExpertKind::swiglu)
      kernels::swiglu_backward(d_act, h1, d_h1);
    else
      kernels::gelu_backward(d_act, h1, d_h1);
    if (s.g.fc1_b.defined()) {  // (empty slots have a zero output gradient, so they add nothing)
      Tensor db = s.g.fc1_b.rows(l, l + 1);
      add_column_sums(d_h1, db);
    }
    Tensor d_h1_bf16 = d_h1;
    if (staged) {
      d_h1_bf16 = s.mem.expert_rows(Buf::d_fc1_bf16, l, c).rows(r0, r0 + n);
      d_h1_bf16.copy_from(d_h1);
    }
    Tensor d_in_l = chunk_expert_rows(d_in, l).rows(r0, r0 + n);
    linear_input_grad(d_h1_bf16, s.w.fc1.rows(l * F1, (l + 1) * F1), d_in_l, *s.ctx);  // fc1
    if (wgrad_now) {
      Tensor gw1_l = gw1.rows(l * F1, (l + 1) * F1);
      linear_weight_grad(d_h1_bf16, s.mem.expert_rows(Buf::expert_in, l, c).rows(r0, r0 + n), gw1_l, *s.ctx);
    }
  }
  Tensor send = s.mem.get(s.dims.tp > 1 ? s.mem.seams().d_expert_in.send : s.mem.seams().d_dispatch.send, c, p);
  experts_to_piece(d_in, send, pc);
}

void MoeBlock::weight_grads() {
  // Per local expert, over every chunk's slots at once (K = M*ep*C): dW2 += dY^T act, dW1 += d_fc1^T x; with
  // --moe-grouped-gemm every expert's in one call each.
  LayerState& s = st_;
  const int64_t L = s.dims.L, F1 = s.dims.F1l, h = s.dims.h, F = s.dims.Fl;
  Tensor gw1 = s.g.fc1_w.view({L * F1, h}), gw2 = s.g.fc2_w.view({L * h, F});
  const Buf act = s.bf16() ? Buf::act_bf16 : Buf::act, d_fc1 = s.bf16() ? Buf::d_fc1_bf16 : Buf::d_fc1;
  if (s.cfg.moe_grouped_gemm && L > 1) {
    Tensor gw2_0 = gw2.rows(0, h), gw1_0 = gw1.rows(0, F1);
    grouped_linear_weight_grad(s.mem.expert_rows_all(Buf::d_expert_out, 0), expert_stride(Buf::d_expert_out),
                               s.mem.expert_rows_all(act, 0), expert_stride(act), gw2_0, h * F, L, *s.ctx);
    grouped_linear_weight_grad(s.mem.expert_rows_all(d_fc1, 0), expert_stride(d_fc1),
                               s.mem.expert_rows_all(Buf::expert_in, 0), expert_stride(Buf::expert_in), gw1_0, F1 * h, L,
                               *s.ctx);
    return;
  }
  for (int64_t l = 0; l < L; ++l) {
    Tensor gw2_l = gw2.rows(l * h, (l + 1) * h), gw1_l = gw1.rows(l * F1, (l + 1) * F1);
    linear_weight_grad(s.mem.expert_rows_all(Buf::d_expert_out, l), s.mem.expert_rows_all(act, l), gw2_l, *s.ctx);
    linear_weight_grad(s.mem.expert_rows_all(d_fc1, l), s.mem.expert_rows_all(Buf::expert_in, l), gw1_l, *s.ctx);
  }
}

void MoeBlock::gate_backward(int c) {
  LayerState& s = st_;
  GateCtx& g = gctx_[size_t(c)];
  Tensor d_ln2 = s.rows(Buf::d_ln2, c);
  Tensor recv = s.mem.get(Buf::dispatch_bwd_recv, c);
  if (s.dims.pieced()) {
    Tensor d = s.mem.get(Buf::d_dispatch, c);
    copy_slots_pieces(recv, d, c, /*to_pieces=*/false);
    recv = d;
  } else if (s.bf16()) {
    recv = converted(s, recv, Buf::d_dispatch, c);
  }
  dispatch_backward(recv, g.routing, d_ln2);
  Tensor d_logits = s.mem.get(Buf::d_logits);
  model::gate_backward(s.mem.get(Buf::d_weight, c), s.d_aux, total_, g, s.p.gate_w, d_logits, d_ln2, s.g.gate_w,
                       *s.ctx);
  if (s.g.expert_bias.defined()) {  // the expert bias's load statistics: counted once per trained token (here, in
    float* n = s.g.expert_bias.data<float>();  // the backward, so a recomputed forward does not count twice)
    const GateRouting& r = g.routing;            // the kept choices (Megatron's routing map after its drops;
    if (g.cfg.expert_capacity_factor >= 0 && g.cfg.pad_to_capacity)  // padded, each expert's whole capacity)
      for (int64_t e = 0; e < r.E; ++e) n[e] += float(r.C);
    else
      for (size_t ci = 0; ci < r.slot.size(); ++ci)
        if (r.slot[ci] >= 0) n[r.expert[ci]] += 1.0f;
  }
}

}  // namespace ampipe::model
