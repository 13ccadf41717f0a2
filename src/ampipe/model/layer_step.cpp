#include "ampipe/model/layer_step.h"

#include <cmath>
#include <algorithm>
#include <cstring>

#include "ampipe/core/philox.h"
#include "ampipe/kernels/activations.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/kernels/dropout.h"
#include "ampipe/kernels/gemm.h"
#include "ampipe/kernels/layernorm.h"
#include "ampipe/model/dispatch.h"

namespace ampipe::model {

using kernels::gemm;
using kernels::Trans;

namespace {
// t in dtype `dt`: t itself when it already is, else a converted copy.
Tensor as_dtype(const Tensor& t, DType dt) { return t.dtype() == dt ? t : t.to(dt); }

// y = x W^T for x [rows, in] and W [out, in].
void linear_forward(const Tensor& x, const Tensor& w, Tensor& y) { gemm(x, Trans::n, w, Trans::t, y); }
// dx = dy W (overwritten); dW += dy^T x.
void linear_backward(const Tensor& dy_c, const Tensor& x_c, const Tensor& w_c, Tensor* dx, Tensor& dw_accum) {
  if (dx) gemm(dy_c, Trans::n, w_c, Trans::n, *dx);
  gemm(dy_c, Trans::t, x_c, Trans::n, dw_accum, /*accumulate=*/true);
}
}  // namespace

LayerStep::LayerStep(const LayerConfig& cfg, int M, int ep_rank, LayerParams& params, LayerParams& grads,
                     uint64_t token_base)
    : cfg_(cfg),
      M_(M),
      ep_(cfg.expert_model_parallel_size),
      ep_rank_(ep_rank),
      s_(cfg.seq_length),
      b_(cfg.micro_batch_size),
      h_(cfg.hidden_size),
      F_(cfg.ffn_hidden_size),
      F1_(cfg.expert == ExpertKind::swiglu ? 2 * cfg.ffn_hidden_size : cfg.ffn_hidden_size),
      E_(cfg.num_experts),
      L_(cfg.local_experts()),
      T_(cfg.tokens()),
      Sc_(cfg.tokens() / M),
      p_(params),
      g_(grads),
      token_base_(token_base),
      cd_(cfg.compute_dtype()) {
  AMPIPE_CHECK(M >= 1 && s_ % M == 0, "degree {} must divide the sequence {}", M, s_);
  gctx_.resize(size_t(M));
  cap_need_.resize(size_t(M));
  cap_all_.resize(size_t(M));
  C_.assign(size_t(M), 0);
  for (auto* v : {&disp_send_, &disp_recv_, &ex_in_, &h1_, &act_, &act_c_, &ex_out_send_, &comb_recv_, &comb_f32_,
                  &dcomb_send_, &dcomb_recv_, &dweight_, &ddisp_send_, &ddisp_recv_})
    v->resize(size_t(M));
  xn_ = Tensor::empty({T_, h_});
  ln1_mean_ = Tensor::empty({T_});
  ln1_rstd_ = Tensor::empty({T_});
  qkv_ = Tensor::empty({T_, 3 * h_});
  xn_c_ = cd_ == DType::f32 ? xn_ : Tensor::empty({T_, h_}, cd_);
  qkv_c_ = cd_ == DType::f32 ? qkv_ : Tensor::empty({T_, 3 * h_}, cd_);
  attn_ = Tensor::empty({T_, h_});
  attn_c_ = cd_ == DType::f32 ? attn_ : Tensor::empty({T_, h_}, cd_);
  lse_ = Tensor::empty({M, b_ * cfg.num_attention_heads * (s_ / M)});
  proj_ = Tensor::empty({T_, h_});
  ln_in_ = Tensor::empty({T_, h_});
  ln2_ = Tensor::empty({T_, h_});
  ln2_mean_ = Tensor::empty({T_});
  ln2_rstd_ = Tensor::empty({T_});
  moe_ = Tensor::empty({T_, h_});
  y_ = Tensor::empty({s_, b_, h_});
}

// ------------------------------------------------------------------------------------------------ forward

void LayerStep::begin_forward(const Tensor& x) {
  AMPIPE_CHECK(x.shape() == (Shape{s_, b_, h_}) && x.dtype() == DType::f32, "layer input {} expected [{}, {}, {}]",
               shape_str(x.shape()), s_, b_, h_);
  x_ = x.view({T_, h_});
  wqkv_ = as_dtype(p_.qkv_w, cd_);
  wproj_ = as_dtype(p_.proj_w, cd_);
  w1_ = as_dtype(p_.fc1_w, cd_).view({L_ * F1_, h_});
  w2_ = as_dtype(p_.fc2_w, cd_).view({L_ * h_, F_});
  total_.reset(E_);
}

void LayerStep::ln1_qkv(int c) {
  Tensor xn = chunk_rows(xn_, c), mean = ln1_mean_.rows(c * Sc_, (c + 1) * Sc_),
         rstd = ln1_rstd_.rows(c * Sc_, (c + 1) * Sc_);
  kernels::layernorm_forward(chunk_rows(x_, c), p_.ln1_w, p_.ln1_b, cfg_.layernorm_epsilon, xn, mean, rstd);
  Tensor xn_c = chunk_rows(xn_c_, c), qkv = chunk_rows(qkv_, c), qkv_c = chunk_rows(qkv_c_, c);
  if (cd_ != DType::f32) xn_c.copy_from(xn);
  linear_forward(xn_c, wqkv_, qkv);  // [S_c, h] -> [S_c, 3h], columns [q | k | v]
  if (cd_ != DType::f32) qkv_c.copy_from(qkv);
}

void LayerStep::attention(int c) {
  const int64_t n = cfg_.num_attention_heads, d = cfg_.head_dim(), sc = s_ / M_;
  const kernels::AttentionShape sh{sc, (c + 1) * sc, b_, n, d, c * sc};  // keys of rows [0, (c+1)*s/M)
  const size_t es = dtype_size(cd_);
  const auto* base = static_cast<const char*>(qkv_c_.raw());
  const char* q = base + size_t(c * Sc_ * 3 * h_) * es;  // the chunk's q rows
  kernels::attention_forward(sh, cd_, q, 3 * h_, base + size_t(h_) * es, 3 * h_, base + size_t(2 * h_) * es,
                             3 * h_, chunk_rows(attn_, c).data<float>(), h_, lse_.rows(c, c + 1).data<float>());
}

void LayerStep::out_proj(int c) {
  Tensor a = chunk_rows(attn_, c);
  Tensor p = chunk_rows(proj_, c);
  if (cd_ != DType::f32) {
    Tensor ac = chunk_rows(attn_c_, c);
    ac.copy_from(a);
    linear_forward(ac, wproj_, p);
  } else {
    linear_forward(a, wproj_, p);
  }
}

void LayerStep::bdal(int c) {
  const core::PhiloxKey key{cfg_.seed, uint32_t(cfg_.layer_index), core::RngPurpose::attn_dropout};
  Tensor li = chunk_rows(ln_in_, c), l2 = chunk_rows(ln2_, c);
  kernels::dropout_add_forward(chunk_rows(proj_, c), chunk_rows(x_, c), cfg_.dropout_p(), key,
                               token_base_ + uint64_t(c * Sc_), li);
  Tensor mean = ln2_mean_.rows(c * Sc_, (c + 1) * Sc_), rstd = ln2_rstd_.rows(c * Sc_, (c + 1) * Sc_);
  kernels::layernorm_forward(li, p_.ln2_w, p_.ln2_b, cfg_.layernorm_epsilon, l2, mean, rstd);
}

void LayerStep::alloc_chunk_buffers(int c) {
  const int64_t C = C_[size_t(c)];
  const size_t i = size_t(c);
  disp_send_[i] = Tensor::empty({E_, C, h_}, cd_);
  disp_recv_[i] = Tensor::empty({ep_, L_, C, h_}, cd_);
  ex_in_[i] = Tensor::empty({L_, ep_ * C, h_}, cd_);
  h1_[i] = Tensor::empty({L_, ep_ * C, F1_});
  act_[i] = Tensor::empty({L_, ep_ * C, F_});
  ex_out_send_[i] = Tensor::empty({ep_, L_, C, h_}, cd_);
  comb_recv_[i] = Tensor::empty({E_, C, h_}, cd_);
}

void LayerStep::gate(int c) {
  GateConfig gc;
  gc.num_experts = E_;
  gc.topk = cfg_.moe_router_topk;
  gc.capacity_factor = cfg_.moe_train_capacity_factor;
  gc.min_capacity = cfg_.moe_min_capacity;
  gc.no_drop = cfg_.moe_no_drop;
  gc.use_rts = cfg_.use_rts;
  gc.noisy_gate_policy = cfg_.noisy_gate_policy;
  gc.seed = cfg_.seed;
  gc.training = cfg_.training;
  gc.layer = uint32_t(cfg_.layer_index);
  GateCtx& g = gctx_[size_t(c)];
  if (!needs_capacity_agreement()) {
    gate_forward(chunk_rows(ln2_, c), p_.gate_w, gc, int64_t(token_base_) + c * Sc_, g);
    C_[size_t(c)] = g.routing.C;
    total_.accumulate(g.stats);
    alloc_chunk_buffers(c);
    dispatch_forward(chunk_rows(ln2_, c), g.routing, disp_send_[size_t(c)]);
    return;
  }
  gate_select_forward(chunk_rows(ln2_, c), p_.gate_w, gc, int64_t(token_base_) + c * Sc_, g);
  total_.accumulate(g.stats);
  cap_need_[size_t(c)] = Tensor::from({float(gate_required_capacity(g))}, {1});
  cap_all_[size_t(c)] = Tensor::zeros({ep_});
}

void LayerStep::gate_assign(int c) {
  GateCtx& g = gctx_[size_t(c)];
  float C = 1;
  for (float v : cap_all_[size_t(c)].to_vector()) C = std::max(C, v);
  gate_assign_forward(int64_t(C), g);
  C_[size_t(c)] = g.routing.C;
  alloc_chunk_buffers(c);
  dispatch_forward(chunk_rows(ln2_, c), g.routing, disp_send_[size_t(c)]);
}

void LayerStep::to_expert_major(const Tensor& src, Tensor& dst, int64_t C) const {
  // src [ep, L, C, h] -> dst [L, ep, C, h]
  const size_t blk = size_t(C * h_) * dtype_size(src.dtype());
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
  for (int64_t j = 0; j < ep_; ++j)
    for (int64_t l = 0; l < L_; ++l) std::memcpy(d + size_t(l * ep_ + j) * blk, s + size_t(j * L_ + l) * blk, blk);
}

void LayerStep::from_expert_major(const Tensor& src, Tensor& dst, int64_t C) const {
  // src [L, ep, C, h] -> dst [ep, L, C, h]
  const size_t blk = size_t(C * h_) * dtype_size(src.dtype());
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
  for (int64_t j = 0; j < ep_; ++j)
    for (int64_t l = 0; l < L_; ++l) std::memcpy(d + size_t(j * L_ + l) * blk, s + size_t(l * ep_ + j) * blk, blk);
}

void LayerStep::experts(int c) {
  const size_t i = size_t(c);
  const int64_t C = C_[i], R = ep_ * C;  // rows per local expert
  to_expert_major(disp_recv_[i], ex_in_[i], C);
  Tensor out = Tensor::empty({L_, R, h_});
  act_c_[i] = cd_ == DType::f32 ? act_[i] : Tensor::empty({L_, R, F_}, cd_);
  for (int64_t l = 0; l < L_; ++l) {
    Tensor xin = ex_in_[i].view({L_ * R, h_}).rows(l * R, (l + 1) * R);
    Tensor h1 = h1_[i].view({L_ * R, F1_}).rows(l * R, (l + 1) * R);
    Tensor a = act_[i].view({L_ * R, F_}).rows(l * R, (l + 1) * R);
    linear_forward(xin, w1_.rows(l * F1_, (l + 1) * F1_), h1);  // [R, h] -> [R, F1]
    if (cfg_.expert == ExpertKind::swiglu)
      kernels::swiglu_forward(h1, a);
    else
      kernels::gelu_forward(h1, a);
    Tensor ac = act_c_[i].view({L_ * R, F_}).rows(l * R, (l + 1) * R);
    if (cd_ != DType::f32) ac.copy_from(a);
    Tensor o = out.view({L_ * R, h_}).rows(l * R, (l + 1) * R);
    linear_forward(ac, w2_.rows(l * h_, (l + 1) * h_), o);  // [R, F] -> [R, h]
  }
  const Tensor out_c = as_dtype(out, cd_);
  from_expert_major(out_c, ex_out_send_[i], C);
}

void LayerStep::combine(int c) {
  const size_t i = size_t(c);
  comb_f32_[i] = as_dtype(comb_recv_[i], DType::f32);
  Tensor m = chunk_rows(moe_, c);
  combine_forward(comb_f32_[i], gctx_[i].routing, m);
  const core::PhiloxKey key{cfg_.seed, uint32_t(cfg_.layer_index), core::RngPurpose::mlp_dropout};
  Tensor y = chunk_rows(y_.view({T_, h_}), c);
  kernels::dropout_add_forward(m, chunk_rows(ln_in_, c), cfg_.dropout_p(), key,
                               token_base_ + uint64_t(c * Sc_), y);
}

void LayerStep::aux_loss() { aux_ = aux_loss_from_sums(total_); }

A2aBuffers LayerStep::a2a_buffers(A2a which, int c) {
  const size_t i = size_t(c);
  const int64_t per_peer = L_ * C_[i] * h_;
  switch (which) {
    case A2a::dispatch: return {disp_send_[i], disp_recv_[i], per_peer};
    case A2a::combine: return {ex_out_send_[i], comb_recv_[i], per_peer};
    case A2a::combine_bwd: return {dcomb_send_[i], dcomb_recv_[i], per_peer};
    case A2a::dispatch_bwd: return {ddisp_send_[i], ddisp_recv_[i], per_peer};
  }
  return {};
}

// ----------------------------------------------------------------------------------------------- backward

void LayerStep::begin_backward(const Tensor& dy, float d_aux) {
  AMPIPE_CHECK(dy.shape() == (Shape{s_, b_, h_}) && dy.dtype() == DType::f32, "dy {}", shape_str(dy.shape()));
  dy_ = dy.view({T_, h_});
  d_aux_ = d_aux;
  dx_ = Tensor::empty({s_, b_, h_});
  d_ln_in_ = Tensor::empty({T_, h_});
  d_ln2_ = Tensor::zeros({T_, h_});
  d_proj_ = Tensor::empty({T_, h_});
  d_attn_ = Tensor::empty({T_, h_});
  dqkv_ = Tensor::zeros({T_, 3 * h_});  // the K, V columns accumulate over chunks
}

void LayerStep::aux_loss_backward() {
  // Nothing to do until the gates' backward: each chunk's gate_backward adds d_aux * d l_aux / d probs
  // using the totals of the forward (so M chunks give the M = 1 gradient).
}

void LayerStep::combine_backward(int c) {
  const size_t i = size_t(c);
  const int64_t C = C_[i];
  const core::PhiloxKey key{cfg_.seed, uint32_t(cfg_.layer_index), core::RngPurpose::mlp_dropout};
  Tensor dm = Tensor::empty({Sc_, h_});
  kernels::dropout_backward(chunk_rows(dy_, c), cfg_.dropout_p(), key, token_base_ + uint64_t(c * Sc_), dm);
  Tensor dY = Tensor::empty({E_, C, h_});
  dweight_[i] = Tensor::empty({Sc_, int64_t(cfg_.moe_router_topk)});
  model::combine_backward(dm, comb_f32_[i], gctx_[i].routing, dY, dweight_[i]);
  dcomb_send_[i] = as_dtype(dY, cd_);  // [E, C, h]: peer j gets the grads of its experts
  dcomb_recv_[i] = Tensor::empty({ep_, L_, C, h_}, cd_);
  comb_f32_[i] = Tensor();
}

void LayerStep::experts_backward(int c) {
  const size_t i = size_t(c);
  const int64_t C = C_[i], R = ep_ * C;
  Tensor dout = Tensor::empty({L_, R, h_}, cd_);
  to_expert_major(dcomb_recv_[i], dout, C);
  Tensor dxin = Tensor::empty({L_, R, h_});
  Tensor dact = Tensor::empty({R, F_});
  Tensor dh1 = Tensor::empty({R, F1_});
  Tensor gw1 = g_.fc1_w.view({L_ * F1_, h_}), gw2 = g_.fc2_w.view({L_ * h_, F_});
  for (int64_t l = 0; l < L_; ++l) {
    Tensor dy = dout.view({L_ * R, h_}).rows(l * R, (l + 1) * R);
    Tensor ac = act_c_[i].view({L_ * R, F_}).rows(l * R, (l + 1) * R);
    Tensor gw2l = gw2.rows(l * h_, (l + 1) * h_);
    linear_backward(dy, ac, w2_.rows(l * h_, (l + 1) * h_), &dact, gw2l);  // fc2
    Tensor h1 = h1_[i].view({L_ * R, F1_}).rows(l * R, (l + 1) * R);
    if (cfg_.expert == ExpertKind::swiglu)
      kernels::swiglu_backward(dact, h1, dh1);
    else
      kernels::gelu_backward(dact, h1, dh1);
    const Tensor dh1_c = as_dtype(dh1, cd_);
    Tensor xin = ex_in_[i].view({L_ * R, h_}).rows(l * R, (l + 1) * R);
    Tensor dx = dxin.view({L_ * R, h_}).rows(l * R, (l + 1) * R);
    Tensor gw1l = gw1.rows(l * F1_, (l + 1) * F1_);
    linear_backward(dh1_c, xin, w1_.rows(l * F1_, (l + 1) * F1_), &dx, gw1l);  // fc1
  }
  ddisp_send_[i] = Tensor::empty({ep_, L_, C, h_}, cd_);
  from_expert_major(as_dtype(dxin, cd_), ddisp_send_[i], C);
  ddisp_recv_[i] = Tensor::empty({E_, C, h_}, cd_);
  // The forward activations of this chunk are no longer needed.
  h1_[i] = act_[i] = act_c_[i] = ex_in_[i] = Tensor();
}

void LayerStep::gate_backward(int c) {
  const size_t i = size_t(c);
  Tensor dl2 = chunk_rows(d_ln2_, c);
  dispatch_backward(as_dtype(ddisp_recv_[i], DType::f32), gctx_[i].routing, dl2);
  Tensor dlogits = Tensor::empty({Sc_, E_});
  model::gate_backward(dweight_[i], d_aux_, total_, gctx_[i], p_.gate_w, dlogits, dl2, g_.gate_w);
}

void LayerStep::bdal_backward(int c) {
  // d ln_in = dy (residual) + LN2'(d ln2); the residual x receives d ln_in; proj receives dropout'(d ln_in).
  Tensor dli = chunk_rows(d_ln_in_, c);
  dli.copy_from(chunk_rows(dy_, c));
  Tensor mean = ln2_mean_.rows(c * Sc_, (c + 1) * Sc_), rstd = ln2_rstd_.rows(c * Sc_, (c + 1) * Sc_);
  kernels::layernorm_backward(chunk_rows(d_ln2_, c), chunk_rows(ln_in_, c), p_.ln2_w, mean, rstd, dli, g_.ln2_w,
                              g_.ln2_b, /*accumulate_dx=*/true);
  Tensor dxc = chunk_rows(dx_.view({T_, h_}), c);
  dxc.copy_from(dli);
  const core::PhiloxKey key{cfg_.seed, uint32_t(cfg_.layer_index), core::RngPurpose::attn_dropout};
  Tensor dp = chunk_rows(d_proj_, c);
  kernels::dropout_backward(dli, cfg_.dropout_p(), key, token_base_ + uint64_t(c * Sc_), dp);
}

void LayerStep::out_proj_backward(int c) {
  Tensor da = chunk_rows(d_attn_, c);
  const Tensor dp = as_dtype(chunk_rows(d_proj_, c), cd_);
  linear_backward(dp, chunk_rows(attn_c_, c), wproj_, &da, g_.proj_w);
}

void LayerStep::attention_backward(int c) {
  const int64_t n = cfg_.num_attention_heads, d = cfg_.head_dim(), sc = s_ / M_;
  const kernels::AttentionShape sh{sc, (c + 1) * sc, b_, n, d, c * sc};
  const size_t es = dtype_size(cd_);
  const auto* base = static_cast<const char*>(qkv_c_.raw());
  const char* q = base + size_t(c * Sc_ * 3 * h_) * es;
  float* dq = dqkv_.data<float>() + c * Sc_ * 3 * h_;
  float* dk = dqkv_.data<float>() + h_;
  float* dv = dqkv_.data<float>() + 2 * h_;
  kernels::attention_backward(sh, cd_, chunk_rows(d_attn_, c).data<float>(), h_, q, 3 * h_,
                              base + size_t(h_) * es, 3 * h_, base + size_t(2 * h_) * es, 3 * h_,
                              chunk_rows(attn_, c).data<float>(), h_, lse_.rows(c, c + 1).data<float>(), dq,
                              3 * h_, dk, 3 * h_, dv, 3 * h_);
}

void LayerStep::ln1_qkv_backward(int c) {
  // The chunk's rows of dqkv are complete: dq from attention_backward(c), dK and dV from chunks c..M-1.
  Tensor dxn = Tensor::empty({Sc_, h_});
  linear_backward(as_dtype(chunk_rows(dqkv_, c), cd_), chunk_rows(xn_c_, c), wqkv_, &dxn, g_.qkv_w);
  Tensor dx = chunk_rows(dx_.view({T_, h_}), c);
  kernels::layernorm_backward(dxn, chunk_rows(x_, c), p_.ln1_w, ln1_mean_.rows(c * Sc_, (c + 1) * Sc_),
                              ln1_rstd_.rows(c * Sc_, (c + 1) * Sc_), dx, g_.ln1_w, g_.ln1_b,
                              /*accumulate_dx=*/true);
}

double LayerStep::flops() const {
  double f = 0;
  const double T = double(T_), h = double(h_);
  f += 3 * 2 * T * h * 3 * h;  // qkv: forward + two backward GEMMs
  f += 3 * 2 * T * h * h;      // out-proj
  const int64_t sc = s_ / M_;
  for (int c = 0; c < M_; ++c) {
    const kernels::AttentionShape sh{sc, s_, b_, cfg_.num_attention_heads, cfg_.head_dim(), c * sc};
    f += kernels::causal_attention_flops(sh, false) + kernels::causal_attention_flops(sh, true);
    const double rows = double(ep_ * C_[size_t(c)] * L_);  // slots this rank's experts process
    f += 3 * 2 * rows * h * double(F1_ + F_);
  }
  f += 3 * 2 * T * h * double(E_);  // gate (fp32)
  return f;
}

}  // namespace ampipe::model
