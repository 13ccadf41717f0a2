#include "ampipe/model/attention_block.h"

#include "ampipe/core/philox.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/kernels/dropout.h"
#include "ampipe/kernels/layernorm.h"
#include "ampipe/model/linear.h"

namespace ampipe::model {

namespace {
// Chunk c's attention: its sq query rows see the keys of rows [0, (c+1)*sq).
kernels::AttentionShape chunk_shape(const LayerDims& d, int c) {
  return {d.sq, (c + 1) * d.sq, d.b, d.n, d.d, c * d.sq};
}
core::PhiloxKey dropout_key(const LayerConfig& cfg) {
  return {cfg.seed, uint32_t(cfg.layer_index), core::RngPurpose::attn_dropout};
}
}  // namespace

// ------------------------------------------------------------------------------------------------ forward

void AttentionBlock::ln1_qkv(int c) {
  LayerState& s = st_;
  // bf16: the fp32 LN1 output and QKV are one chunk's staging, only their bf16 copies are kept
  Tensor xn = s.bf16() ? s.mem.get(Buf::ln1_out) : s.rows(Buf::ln1_out, c);
  Tensor mean = s.rows(Buf::ln1_mean, c), rstd = s.rows(Buf::ln1_rstd, c);
  kernels::layernorm_forward(s.rows(s.x, c), s.p.ln1_w, s.p.ln1_b, s.cfg.layernorm_epsilon, xn, mean, rstd);
  Tensor qkv = s.bf16() ? s.mem.get(Buf::qkv) : s.rows(Buf::qkv, c);
  linear_forward(converted_rows(s, xn, Buf::ln1_out_bf16, c), s.w.qkv, qkv);  // [S_c, h] -> [S_c, 3h]: [q | k | v]
  if (s.bf16()) s.rows(Buf::qkv_bf16, c).copy_from(qkv);
}

void AttentionBlock::attention(int c) {
  LayerState& s = st_;
  const int64_t h = s.dims.h;
  const Tensor qkv = s.mem.get(s.bf16() ? Buf::qkv_bf16 : Buf::qkv);
  const Tensor kv = qkv.rows(0, int64_t(c + 1) * s.dims.Sc);  // the rows chunk c can see
  const Tensor q = s.rows(qkv, c).cols(0, h);
  Tensor out = s.rows(Buf::attn, c), lse = s.mem.get(Buf::lse).rows(c, c + 1);
  kernels::attention_forward(chunk_shape(s.dims, c), q, kv.cols(h, 2 * h), kv.cols(2 * h, 3 * h), out, lse);
}

void AttentionBlock::out_proj(int c) {
  LayerState& s = st_;
  Tensor proj = s.rows(Buf::proj, c);
  linear_forward(converted_rows(s, s.rows(Buf::attn, c), Buf::attn_bf16, c), s.w.proj, proj);
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

void AttentionBlock::residual_ln2_backward(int c) {
  // d ln_in = dy (residual) + LN2'(d ln2); the layer input x receives d ln_in; proj receives dropout'(d ln_in).
  LayerState& s = st_;
  Tensor d_ln_in = s.rows(Buf::d_ln_in, c);
  d_ln_in.copy_from(s.rows(s.dy, c));
  kernels::layernorm_backward(s.rows(Buf::d_ln2, c), s.rows(Buf::ln_in, c), s.p.ln2_w, s.rows(Buf::ln2_mean, c),
                              s.rows(Buf::ln2_rstd, c), d_ln_in, s.g.ln2_w, s.g.ln2_b, /*accumulate_dx=*/true);
  s.rows(s.mem.get(Buf::dx).view({s.dims.T, s.dims.h}), c).copy_from(d_ln_in);
  Tensor d_proj = s.rows(Buf::d_proj, c);
  kernels::dropout_backward(d_ln_in, s.cfg.dropout_p(), dropout_key(s.cfg), s.chunk_token0(c), d_proj);
}

void AttentionBlock::out_proj_backward(int c) {
  LayerState& s = st_;
  Tensor d_attn = s.rows(Buf::d_attn, c);
  const Tensor d_proj = converted_rows(s, s.rows(Buf::d_proj, c), Buf::d_proj_bf16, c);
  linear_input_grad(d_proj, s.w.proj, d_attn);  // the weight gradient: weight_grads()
}

void AttentionBlock::attention_backward(int c) {
  LayerState& s = st_;
  const int64_t h = s.dims.h, visible = int64_t(c + 1) * s.dims.Sc;
  const Tensor qkv = s.mem.get(s.bf16() ? Buf::qkv_bf16 : Buf::qkv);
  const Tensor kv = qkv.rows(0, visible);
  const Tensor dqkv = s.mem.get(Buf::dqkv);
  Tensor dq = s.rows(dqkv, c).cols(0, h);
  Tensor dk = dqkv.rows(0, visible).cols(h, 2 * h), dv = dqkv.rows(0, visible).cols(2 * h, 3 * h);
  kernels::attention_backward(chunk_shape(s.dims, c), s.rows(Buf::d_attn, c), s.rows(qkv, c).cols(0, h),
                              kv.cols(h, 2 * h), kv.cols(2 * h, 3 * h), s.rows(Buf::attn, c),
                              s.mem.get(Buf::lse).rows(c, c + 1), dq, dk, dv);
}

void AttentionBlock::ln1_qkv_backward(int c) {
  // The chunk's rows of dqkv are complete: dq from attention_backward(c), dK and dV from chunks c..M-1.
  LayerState& s = st_;
  Tensor d_xn = s.mem.get(Buf::d_ln1_out);
  const Tensor dqkv = converted_rows(s, s.rows(Buf::dqkv, c), Buf::dqkv_bf16, c);
  linear_input_grad(dqkv, s.w.qkv, d_xn);  // the weight gradient: weight_grads()
  Tensor dx = s.rows(s.mem.get(Buf::dx).view({s.dims.T, s.dims.h}), c);
  kernels::layernorm_backward(d_xn, s.rows(s.x, c), s.p.ln1_w, s.rows(Buf::ln1_mean, c), s.rows(Buf::ln1_rstd, c),
                              dx, s.g.ln1_w, s.g.ln1_b, /*accumulate_dx=*/true);
}

void AttentionBlock::weight_grads() {
  // dWqkv += dqkv^T xn and dWproj += d_proj^T attn over all T rows at once: one GEMM each with K = T instead of one
  // per chunk with K = S_c (each of which would read and write the whole fp32 weight gradient).
  LayerState& s = st_;
  const bool bf16 = s.bf16();
  linear_weight_grad(s.mem.get(bf16 ? Buf::dqkv_bf16 : Buf::dqkv), s.mem.get(bf16 ? Buf::ln1_out_bf16 : Buf::ln1_out),
                     s.g.qkv_w);
  linear_weight_grad(s.mem.get(bf16 ? Buf::d_proj_bf16 : Buf::d_proj), s.mem.get(bf16 ? Buf::attn_bf16 : Buf::attn),
                     s.g.proj_w);
}

}  // namespace ampipe::model
