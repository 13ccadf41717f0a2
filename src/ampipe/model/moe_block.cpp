#include "ampipe/model/moe_block.h"

#include <algorithm>
#include <cstring>

#include "ampipe/core/philox.h"
#include "ampipe/kernels/activations.h"
#include "ampipe/kernels/dropout.h"
#include "ampipe/model/dispatch.h"
#include "ampipe/model/linear.h"

namespace ampipe::model {

namespace {
core::PhiloxKey dropout_key(const LayerConfig& cfg) {
  return {cfg.seed, uint32_t(cfg.layer_index), core::RngPurpose::mlp_dropout};
}
// Rows [l*R, (l+1)*R) of a per-chunk [L, R, *] buffer: local expert l's slots.
Tensor expert_rows(const Tensor& t, int64_t l) {
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
  gc.no_drop = cfg.moe_no_drop;
  gc.use_rts = cfg.use_rts;
  gc.noisy_gate_policy = cfg.noisy_gate_policy;
  gc.seed = cfg.seed;
  gc.training = cfg.training;
  gc.layer = uint32_t(cfg.layer_index);
  return gc;
}

// ------------------------------------------------------------------------------------------------ forward

void MoeBlock::begin_forward() { total_.reset(st_.dims.E); }

void MoeBlock::set_routing(int c) {
  GateCtx& g = gctx_[size_t(c)];
  AMPIPE_CHECK(g.routing.C >= 1 && g.routing.C <= st_.dims.C, "chunk {} capacity {} outside the planned [1, {}]", c,
               g.routing.C, st_.dims.C);
  st_.mem.set_capacity(c, g.routing.C);
  Tensor send = st_.mem.get(Buf::dispatch_send, c);
  dispatch_forward(st_.rows(Buf::ln2_out, c), g.routing, send);
}

void MoeBlock::gate(int c) {
  LayerState& s = st_;
  GateCtx& g = gctx_[size_t(c)];
  g.probs = s.mem.get(Buf::gate_probs, c);  // the gate writes its planned buffers
  if (s.dims.jitter) g.x_gate = s.mem.get(Buf::gate_input, c);
  const Tensor x = s.rows(Buf::ln2_out, c);
  const int64_t token0 = int64_t(s.chunk_token0(c));
  if (!s.dims.agree_capacity) {
    gate_forward(x, s.p.gate_w, gate_config(), token0, g);
    total_.accumulate(g.stats);
    set_routing(c);
    return;
  }
  gate_select_forward(x, s.p.gate_w, gate_config(), token0, g);
  total_.accumulate(g.stats);
  s.mem.get(Buf::capacity_need, c).fill(float(gate_required_capacity(g)));  // exact in fp32 (C <= 2^24)
}

void MoeBlock::gate_assign(int c) {
  const Tensor all = st_.mem.get(Buf::capacity_all, c);
  const float* v = all.data<float>();
  const float C = std::max(1.0f, *std::max_element(v, v + all.numel()));
  gate_assign_forward(int64_t(C), gctx_[size_t(c)]);
  set_routing(c);
}

void MoeBlock::to_expert_major(const Tensor& src, Buf dst, int c) const {
  // src [ep, L, C, h] -> chunk c's rows of local expert l in dst, [ep, C, h] each
  const int64_t ep = st_.dims.ep, L = st_.dims.L, C = st_.mem.capacity(c);
  const size_t blk = size_t(C * st_.dims.h) * dtype_size(src.dtype());
  const auto* s = static_cast<const char*>(src.raw());
  for (int64_t l = 0; l < L; ++l) {
    auto* d = static_cast<char*>(st_.mem.expert_rows(dst, l, c).raw());
    for (int64_t j = 0; j < ep; ++j) std::memcpy(d + size_t(j) * blk, s + size_t(j * L + l) * blk, blk);
  }
}

void MoeBlock::from_expert_major(const Tensor& src, Tensor& dst, int64_t C) const {
  // src [L, ep, C, h] -> dst [ep, L, C, h]
  const int64_t ep = st_.dims.ep, L = st_.dims.L;
  const size_t blk = size_t(C * st_.dims.h) * dtype_size(src.dtype());
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
  for (int64_t j = 0; j < ep; ++j)
    for (int64_t l = 0; l < L; ++l) std::memcpy(d + size_t(j * L + l) * blk, s + size_t(l * ep + j) * blk, blk);
}

void MoeBlock::experts(int c) {
  LayerState& s = st_;
  const int64_t C = s.mem.capacity(c), L = s.dims.L, F1 = s.dims.F1, h = s.dims.h;
  to_expert_major(s.mem.get(Buf::dispatch_recv, c), Buf::expert_in, c);
  const Tensor out = s.mem.get(Buf::expert_out, c);
  for (int64_t l = 0; l < L; ++l) {
    Tensor h1 = s.mem.expert_rows(Buf::fc1_out, l, c), o = expert_rows(out, l);
    // bf16: the fp32 activation is one expert's staging, the bf16 copy is kept; fp32: the activation is kept
    Tensor a = s.bf16() ? s.mem.get(Buf::act, c) : s.mem.expert_rows(Buf::act, l, c);
    linear_forward(s.mem.expert_rows(Buf::expert_in, l, c), s.w.fc1.rows(l * F1, (l + 1) * F1), h1);  // -> [R, F1]
    if (s.cfg.expert == ExpertKind::swiglu)
      kernels::swiglu_forward(h1, a);
    else
      kernels::gelu_forward(h1, a);
    Tensor a_bf16 = s.bf16() ? s.mem.expert_rows(Buf::act_bf16, l, c) : a;
    if (s.bf16()) a_bf16.copy_from(a);
    linear_forward(a_bf16, s.w.fc2.rows(l * h, (l + 1) * h), o);  // [R, F] -> [R, h]
  }
  Tensor send = s.mem.get(Buf::combine_send, c);
  from_expert_major(converted(s, out, Buf::expert_out_bf16, c), send, C);
}

void MoeBlock::weighted_sum(int c) {
  LayerState& s = st_;
  Tensor Y = s.mem.get(Buf::expert_y, c);  // fp32: the combine all-to-all received into it directly
  if (s.bf16()) Y.copy_from(s.mem.get(Buf::combine_recv, c));
  Tensor moe = s.rows(Buf::moe_out, c);
  combine_forward(Y, gctx_[size_t(c)].routing, moe);
  Tensor y = s.rows(s.mem.get(Buf::y).view({s.dims.T, s.dims.h}), c);
  kernels::dropout_add_forward(moe, s.rows(Buf::ln_in, c), s.cfg.dropout_p(), dropout_key(s.cfg), s.chunk_token0(c),
                               y);
}

void MoeBlock::aux_loss() { aux_ = aux_loss_from_sums(total_); }

// ----------------------------------------------------------------------------------------------- backward

void MoeBlock::weighted_sum_backward(int c) {
  LayerState& s = st_;
  Tensor d_moe = s.mem.get(Buf::d_moe);
  kernels::dropout_backward(s.rows(s.dy, c), s.cfg.dropout_p(), dropout_key(s.cfg), s.chunk_token0(c), d_moe);
  Tensor send = s.mem.get(Buf::combine_bwd_send, c);  // [E, C, h]: EP rank j gets the grads of its experts
  Tensor dY = s.bf16() ? s.mem.get(Buf::d_expert_y, c) : send;
  Tensor d_weight = s.mem.get(Buf::d_weight, c);
  combine_backward(d_moe, s.mem.get(Buf::expert_y, c), gctx_[size_t(c)].routing, dY, d_weight);
  if (s.bf16()) send.copy_from(dY);
}

void MoeBlock::experts_backward(int c) {
  LayerState& s = st_;
  const int64_t C = s.mem.capacity(c), L = s.dims.L, F1 = s.dims.F1, h = s.dims.h;
  const bool wgrad_now = !s.dims.defer_expert_wgrad;  // --moe-no-drop: chunks' slots are not packed
  to_expert_major(s.mem.get(Buf::combine_bwd_recv, c), Buf::d_expert_out, c);
  Tensor d_in = s.mem.get(Buf::d_expert_in, c), d_act = s.mem.get(Buf::d_act, c);
  Tensor gw1 = s.g.fc1_w.view({L * F1, h}), gw2 = s.g.fc2_w.view({L * h, s.dims.F});
  for (int64_t l = 0; l < L; ++l) {
    const Tensor d_out = s.mem.expert_rows(Buf::d_expert_out, l, c);
    linear_input_grad(d_out, s.w.fc2.rows(l * h, (l + 1) * h), d_act);  // fc2
    if (wgrad_now) {
      Tensor gw2_l = gw2.rows(l * h, (l + 1) * h);
      linear_weight_grad(d_out, s.mem.expert_rows(s.bf16() ? Buf::act_bf16 : Buf::act, l, c), gw2_l);
    }
    // bf16: the fp32 gradient is one expert's staging, the bf16 copy is kept for the weight gradient
    Tensor d_h1 = s.bf16() ? s.mem.get(Buf::d_fc1, c) : s.mem.expert_rows(Buf::d_fc1, l, c);
    const Tensor h1 = s.mem.expert_rows(Buf::fc1_out, l, c);
    if (s.cfg.expert == ExpertKind::swiglu)
      kernels::swiglu_backward(d_act, h1, d_h1);
    else
      kernels::gelu_backward(d_act, h1, d_h1);
    Tensor d_h1_bf16 = d_h1;
    if (s.bf16()) {
      d_h1_bf16 = s.mem.expert_rows(Buf::d_fc1_bf16, l, c);
      d_h1_bf16.copy_from(d_h1);
    }
    Tensor d_in_l = expert_rows(d_in, l);
    linear_input_grad(d_h1_bf16, s.w.fc1.rows(l * F1, (l + 1) * F1), d_in_l);  // fc1
    if (wgrad_now) {
      Tensor gw1_l = gw1.rows(l * F1, (l + 1) * F1);
      linear_weight_grad(d_h1_bf16, s.mem.expert_rows(Buf::expert_in, l, c), gw1_l);
    }
  }
  Tensor send = s.mem.get(Buf::dispatch_bwd_send, c);
  from_expert_major(converted(s, d_in, Buf::d_expert_in_bf16, c), send, C);
}

void MoeBlock::weight_grads() {
  // Per local expert, over every chunk's slots at once (K = M*ep*C): dW2 += dY^T act, dW1 += d_fc1^T x.
  LayerState& s = st_;
  const int64_t L = s.dims.L, F1 = s.dims.F1, h = s.dims.h;
  Tensor gw1 = s.g.fc1_w.view({L * F1, h}), gw2 = s.g.fc2_w.view({L * h, s.dims.F});
  for (int64_t l = 0; l < L; ++l) {
    Tensor gw2_l = gw2.rows(l * h, (l + 1) * h), gw1_l = gw1.rows(l * F1, (l + 1) * F1);
    linear_weight_grad(s.mem.expert_rows_all(Buf::d_expert_out, l),
                       s.mem.expert_rows_all(s.bf16() ? Buf::act_bf16 : Buf::act, l), gw2_l);
    linear_weight_grad(s.mem.expert_rows_all(s.bf16() ? Buf::d_fc1_bf16 : Buf::d_fc1, l),
                       s.mem.expert_rows_all(Buf::expert_in, l), gw1_l);
  }
}

void MoeBlock::gate_backward(int c) {
  LayerState& s = st_;
  GateCtx& g = gctx_[size_t(c)];
  Tensor d_ln2 = s.rows(Buf::d_ln2, c);
  const Tensor recv = s.mem.get(Buf::dispatch_bwd_recv, c);
  dispatch_backward(converted(s, recv, Buf::d_dispatch, c), g.routing, d_ln2);
  Tensor d_logits = s.mem.get(Buf::d_logits);
  model::gate_backward(s.mem.get(Buf::d_weight, c), s.d_aux, total_, g, s.p.gate_w, d_logits, d_ln2, s.g.gate_w);
}

}  // namespace ampipe::model
