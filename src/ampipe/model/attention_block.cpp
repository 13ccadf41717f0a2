#include "ampipe/model/attention_block.h"

#include "ampipe/core/philox.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/kernels/dropout.h"
#include "ampipe/kernels/layernorm.h"
#include "ampipe/model/linear.h"

namespace ampipe::model {

namespace {
// Chunk c's attention on the local heads: its sq query rows see the keys of rows [0, (c+1)*sq).
kernels::AttentionShape chunk_shape(const LayerDims& d, int c) {
  return {d.sq, (c + 1) * d.sq, d.b, d.nl, d.d, c * d.sq};
}
core::PhiloxKey dropout_key(const LayerConfig& cfg) {
  return {cfg.seed, uint32_t(cfg.layer_index), core::RngPurpose::attn_dropout};
}
}  // namespace

// ------------------------------------------------------------------------------------------------ forward

void AttentionBlock::ln1(int c) {
  LayerState& s = st_;
  // Sequence parallel: the chunk's local rows, all-gathered next (Stage::tp_qkv_in) from ln1_local (fp32) or
  // ln1_send (bf16) into ln1_out / ln1_out_bf16. Otherwise every row of the chunk, written where QKV reads it
  // (bf16: the fp32 output is one chunk's staging, only its bf16 copy is kept).
  Tensor xn = s.dims.sp ? s.mem.get(Buf::ln1_local) : s.bf16() ? s.mem.get(Buf::ln1_out) : s.full_rows(Buf::ln1_out, c);
  Tensor mean = s.rows(Buf::ln1_mean, c), rstd = s.rows(Buf::ln1_rstd, c);
  kernels::layernorm_forward(s.rows(s.x, c), s.p.ln1_w, s.p.ln1_b, s.cfg.layernorm_epsilon, xn, mean, rstd);
  if (s.bf16()) {
    Tensor copy = s.dims.sp ? s.mem.get(Buf::ln1_send) : s.full_rows(Buf::ln1_out_bf16, c);
    copy.copy_from(xn);
  }
}

void AttentionBlock::qkv(int c) {
  LayerState& s = st_;
  const Tensor xn = s.full_rows(s.bf16() ? Buf::ln1_out_bf16 : Buf::ln1_out, c);  // every row of the chunk
  Tensor qkv = s.bf16() ? s.mem.get(Buf::qkv) : s.full_rows(Buf::qkv, c);
  linear_forward(xn, s.w.qkv, qkv);  // [S_c, h] -> [S_c, 3h/t]: [q | k | v] of the local heads
  if (s.bf16()) s.full_rows(Buf::qkv_bf16, c).copy_from(qkv);
}

void AttentionBlock::ln1_qkv(int c) {
  ln1(c);
  qkv(c);
}

void AttentionBlock::attention(int c) {
  LayerState& s = st_;
  const int64_t hl = s.dims.hl;
  const Tensor qkv = s.mem.get(s.bf16() ? Buf::qkv_bf16 : Buf::qkv);
  const Tensor kv = qkv.rows(0, int64_t(c + 1) * s.dims.Sc);  // the rows chunk c can see
  const Tensor q = s.full_rows(qkv, c).cols(0, hl);
  Tensor out = s.full_rows(Buf::attn, c), lse = s.mem.get(Buf::lse).rows(c, c + 1);
  kernels::attention_forward(chunk_shape(s.dims, c), q, kv.cols(hl, 2 * hl), kv.cols(2 * hl, 3 * hl), out, lse);
}

void AttentionBlock::out_proj(int c) {
  LayerState& s = st_;
  // tp > 1: partial sums over the local heads, reduced next (Stage::tp_proj_out): reduce-scattered from
  // proj_partial into the local rows of proj (sequence parallel), or all-reduced in place.
  Tensor proj = s.dims.sp ? s.mem.get(Buf::proj_partial) : s.full_rows(Buf::proj, c);
  const Tensor attn = s.full_rows(Buf::attn, c);
  Tensor in = attn;
  if (s.bf16()) {
    in = s.full_rows(Buf::attn_bf16, c);
    in.copy_from(attn);
  }
  linear_forward(in, s.w.proj, proj);
}

void AttentionBlock::residual_ln2(int c) {
  LayerState& s = st_;
  Tensor ln_in = s.rows(Buf::ln_in, c), ln2 = s.rows(Buf::ln2_out, c);
  kernels::dropout_add_forward(s.rows(Buf::proj, c), s.rows(s.x, c), s.cfg.dropout_p(), dropout_key(s.cfg),
                               s.chunk_token0(c), ln_in);
  Tensor mean = s.rows(Buf::ln2_mean, c), rstd = s.rows(Buf::ln2_rstd, c);
  kernels::layernorm_forward(ln_in, s.p.ln2_w, s.p.ln2_b, s.cfg.layernorm_epsilon, ln2, mean, rstd);
}

// ----------------------------------------------------------------------------------------------- backward

void AttentionBlock::begin_backward() { st_.mem.get(Buf::dqkv).zero(); }

Tensor AttentionBlock::d_proj_all() const {
  const LayerState& s = st_;
  if (s.bf16()) return s.mem.get(Buf::d_proj_bf16);               // converted or all-gathered
  return s.mem.get(s.dims.sp ? Buf::d_proj_full : Buf::d_proj);  // all-gathered, or every row already
}

void AttentionBlock::residual_ln2_backward(int c) {
  // d ln_in = dy (residual) + LN2'(d ln2); the layer input x receives d ln_in; proj receives dropout'(d ln_in).
  LayerState& s = st_;
  Tensor d_ln_in = s.rows(Buf::d_ln_in, c);
  d_ln_in.copy_from(s.rows(s.dy, c));
  kernels::layernorm_backward(s.rows(Buf::d_ln2, c), s.rows(Buf::ln_in, c), s.p.ln2_w, s.rows(Buf::ln2_mean, c),
                              s.rows(Buf::ln2_rstd, c), d_ln_in, s.g.ln2_w, s.g.ln2_b, /*accumulate_dx=*/true);
  s.rows(s.mem.get(Buf::dx).view({s.dims.Tl, s.dims.h}), c).copy_from(d_ln_in);
  Tensor d_proj = s.rows(Buf::d_proj, c);
  kernels::dropout_backward(d_ln_in, s.cfg.dropout_p(), dropout_key(s.cfg), s.chunk_token0(c), d_proj);
  // The out-projection's backward reads every row of the chunk in the compute dtype: all-gathered next (sequence
  // parallel, from d_proj or its bf16 copy d_proj_send), or converted here.
  if (s.bf16()) (s.dims.sp ? s.mem.get(Buf::d_proj_send) : s.full_rows(Buf::d_proj_bf16, c)).copy_from(d_proj);
}

void AttentionBlock::out_proj_backward(int c) {
  LayerState& s = st_;
  Tensor d_attn = s.full_rows(Buf::d_attn, c);
  linear_input_grad(s.full_rows(d_proj_all(), c), s.w.proj, d_attn);  // the weight gradient: weight_grads()
}

void AttentionBlock::attention_backward(int c) {
  LayerState& s = st_;
  const int64_t hl = s.dims.hl, visible = int64_t(c + 1) * s.dims.Sc;
  const Tensor qkv = s.mem.get(s.bf16() ? Buf::qkv_bf16 : Buf::qkv);
  const Tensor kv = qkv.rows(0, visible);
  const Tensor dqkv = s.mem.get(Buf::dqkv);
  Tensor dq = s.full_rows(dqkv, c).cols(0, hl);
  Tensor dk = dqkv.rows(0, visible).cols(hl, 2 * hl), dv = dqkv.rows(0, visible).cols(2 * hl, 3 * hl);
  kernels::attention_backward(chunk_shape(s.dims, c), s.full_rows(Buf::d_attn, c), s.full_rows(qkv, c).cols(0, hl),
                              kv.cols(hl, 2 * hl), kv.cols(2 * hl, 3 * hl), s.full_rows(Buf::attn, c),
                              s.mem.get(Buf::lse).rows(c, c + 1), dq, dk, dv);
}

void AttentionBlock::qkv_backward(int c) {
  // The chunk's rows of dqkv are complete: dq from attention_backward(c), dK and dV from chunks c..M-1. tp > 1:
  // d_ln1_out holds partial sums over the local heads, reduced next (Stage::tp_qkv_in).
  LayerState& s = st_;
  Tensor d_xn = s.mem.get(Buf::d_ln1_out, c);
  const Tensor dqkv = s.full_rows(Buf::dqkv, c);
  Tensor in = dqkv;
  if (s.bf16()) {
    in = s.full_rows(Buf::dqkv_bf16, c);
    in.copy_from(dqkv);
  }
  linear_input_grad(in, s.w.qkv, d_xn);  // the weight gradient: weight_grads()
}

void AttentionBlock::ln1_backward(int c) {
  LayerState& s = st_;
  const Tensor d_xn = s.mem.get(s.dims.sp ? Buf::d_ln1_local : Buf::d_ln1_out, c);  // this rank's rows, reduced
  Tensor dx = s.rows(s.mem.get(Buf::dx).view({s.dims.Tl, s.dims.h}), c);
  kernels::layernorm_backward(d_xn, s.rows(s.x, c), s.p.ln1_w, s.rows(Buf::ln1_mean, c), s.rows(Buf::ln1_rstd, c),
                              dx, s.g.ln1_w, s.g.ln1_b, /*accumulate_dx=*/true);
}

void AttentionBlock::ln1_qkv_backward(int c) {
  qkv_backward(c);
  ln1_backward(c);
}

void AttentionBlock::weight_grads() {
  // dWqkv += dqkv^T xn and dWproj += d_proj^T attn over all T rows at once: one GEMM each with K = T instead of one
  // per chunk with K = S_c (each of which would read and write the whole fp32 weight gradient).
  LayerState& s = st_;
  const bool bf16 = s.bf16();
  linear_weight_grad(s.mem.get(bf16 ? Buf::dqkv_bf16 : Buf::dqkv), s.mem.get(bf16 ? Buf::ln1_out_bf16 : Buf::ln1_out),
                     s.g.qkv_w);
  linear_weight_grad(d_proj_all(), s.mem.get(bf16 ? Buf::attn_bf16 : Buf::attn), s.g.proj_w);
}

}  // namespace ampipe::model
