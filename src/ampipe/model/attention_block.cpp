#include "ampipe/model/attention_block.h"

#include <vector>

#include "ampipe/core/philox.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/kernels/dropout.h"
#include "ampipe/kernels/rope.h"
#include "ampipe/model/norm.h"
#include "ampipe/model/linear.h"
#include "ampipe/model/mlp_block.h"

namespace ampipe::model {

namespace {
core::PhiloxKey dropout_key(const LayerConfig& cfg) {
  return {cfg.seed, uint32_t(cfg.layer_index), core::RngPurpose::attn_dropout};
}
// The attention-probability dropout of this rank's heads in the micro-batch (kernels::AttentionDropout).
kernels::AttentionDropout prob_dropout(const LayerState& s) {
  kernels::AttentionDropout dr;
  dr.p = s.cfg.attention_dropout_p();
  dr.key = {s.cfg.seed, uint32_t(s.cfg.layer_index), core::RngPurpose::attn_prob_dropout};
  dr.token_base = s.token_base;
  dr.head0 = int64_t(s.tp_rank) * s.dims.nl;
  dr.seq = s.cfg.seq_length;
  return dr;
}
// Chunk c's attention on the local heads (its sq query rows see the keys of rows [0, (c+1)*sq)), with the dropout.
kernels::AttentionShape chunk_shape(const LayerState& s, int c) {
  kernels::AttentionShape sh = chunk_attention(s.dims, c);
  sh.dropout = prob_dropout(s);
  return sh;
}
}  // namespace

// ------------------------------------------------------------------------------------------------ forward

void AttentionBlock::ln1(int c) {
  LayerState& s = st_;
  // Sequence parallel: the chunk's local rows, all-gathered next (the Plan's tp_qkv_in) from ln1_local (fp32) or
  // ln1_send (bf16) into ln1_out / ln1_out_bf16. Otherwise every row of the chunk, written where QKV reads it
  // (bf16: the fp32 output is one chunk's staging, only its bf16 copy is kept).
  Tensor xn = s.dims.sp ? s.mem.get(Buf::ln1_local) : s.bf16() ? s.mem.get(Buf::ln1_out) : s.full_rows(Buf::ln1_out, c);
  Tensor mean = s.rows(Buf::ln1_mean, c), rstd = s.rows(Buf::ln1_rstd, c);
  norm_forward(s.cfg, s.rows(s.x, c), s.p.ln1_w, s.p.ln1_b, xn, mean, rstd);
  if (s.bf16()) {
    Tensor copy = s.dims.sp ? s.mem.get(s.mem.seams().qkv_in.send) : s.full_rows(Buf::ln1_out_bf16, c);
    copy.copy_from(xn);
  }
}

void AttentionBlock::qkv(int c) {
  LayerState& s = st_;
  const Tensor xn = s.full_rows(s.bf16() ? Buf::ln1_out_bf16 : Buf::ln1_out, c);  // every row of the chunk
  Tensor qkv = s.bf16() ? s.mem.get(Buf::qkv) : s.full_rows(Buf::qkv, c);
  linear_forward(xn, s.w.qkv, qkv, *s.ctx);  // [S_c, h] -> [S_c, qkvl]: [q | k | v] of the local heads
  // --add-qkv-bias, in fp32 (before the q/k norms and RoPE, as Megatron's)
  if (s.p.qkv_b.defined()) add_bias(qkv, s.p.qkv_b);
  qk_norm(c, qkv);
  rotate_qk(c, qkv, /*inverse=*/false);
  if (s.bf16()) s.full_rows(Buf::qkv_bf16, c).copy_from(qkv);
  if (s.dims.cp > 1) {  // this rank's K, V into ring slot 0, packed [A ; B]
    cp_pack(c, s.full_rows(s.bf16() ? Buf::qkv_bf16 : Buf::qkv, c).cols(s.dims.hl, s.dims.qkvl),
            s.mem.get(Buf::cp_kv, 0), /*to_packed=*/true);
  }
}

void AttentionBlock::rotate_qk(int c, Tensor qkv, bool inverse) const {
  const LayerState& s = st_;
  const kernels::RopeSpec spec = s.cfg.rope_spec();
  if (!spec.on()) return;
  const LayerDims& d = s.dims;
  std::vector<int64_t> pos(size_t(d.sq));  // global positions of the chunk's sq rows (cp: its two sub-blocks)
  for (int64_t i = 0; i < d.sq; ++i) pos[size_t(i)] = c * d.sq + i;
  if (d.cp > 1) {
    const CpLayout cp = s.cp_layout();
    for (int64_t& p : pos) p = cp.position(p);
  }
  Tensor q = qkv.cols(0, d.hl), k = qkv.cols(d.hl, d.hl + d.kvl);
  kernels::rope_apply(spec, q, d.nl, d.d, d.b, pos, inverse);
  kernels::rope_apply(spec, k, d.gl, d.d, d.b, pos, inverse);
}

namespace {
// One of q, k of chunk c for the per-head norm: its columns of qkv, its raw values and statistics, its weights.
struct QkPart {
  Tensor cols;        // [S_c, heads*d] view of qkv (or dqkv)
  Tensor raw;         // [S_c*heads, d] the values before the norm
  Tensor mean, rstd;  // [S_c*heads]
  Tensor scratch_a, scratch_b;  // [S_c*heads, d] each
  Tensor w, b, dw, db;
};
QkPart qk_part(LayerState& s, int c, Tensor qkv, bool k) {
  const LayerDims& d = s.dims;
  const int64_t heads = k ? d.gl : d.nl, col0 = k ? d.hl : 0, width = heads * d.d;
  const int64_t rows0 = k ? d.T * d.nl : 0, stats0 = k ? d.T * d.nl : 0, stats = d.T * (d.nl + d.gl);
  const int64_t n = d.Sc * heads, first = int64_t(c) * n;  // the chunk's (row, head) pairs
  const Tensor raw = s.mem.get(Buf::qk_raw), st = s.mem.get(Buf::qk_stats), scr = s.mem.get(Buf::qk_scratch);
  const int64_t scr0 = k ? 2 * d.Sc * d.hl : 0;
  QkPart p;
  p.cols = qkv.cols(col0, col0 + width);
  p.raw = raw.rows(rows0 * d.d + first * d.d, rows0 * d.d + (first + n) * d.d).view({n, d.d});
  p.mean = st.rows(stats0 + first, stats0 + first + n);
  p.rstd = st.rows(stats + stats0 + first, stats + stats0 + first + n);
  p.scratch_a = scr.rows(scr0, scr0 + n * d.d).view({n, d.d});
  p.scratch_b = scr.rows(scr0 + n * d.d, scr0 + 2 * n * d.d).view({n, d.d});
  p.w = k ? s.p.kn_w : s.p.qn_w;
  p.b = k ? s.p.kn_b : s.p.qn_b;
  p.dw = k ? s.g.kn_w : s.g.qn_w;
  p.db = k ? s.g.kn_b : s.g.qn_b;
  return p;
}
}  // namespace

void AttentionBlock::qk_norm(int c, Tensor qkv) {
  if (!st_.dims.qk_norm) return;
  const int64_t Sc = st_.dims.Sc;
  for (const bool k : {false, true}) {  // [S_c, heads*d] -> [S_c*heads, d]: one norm per (row, head)
    QkPart p = qk_part(st_, c, qkv, k);
    p.raw.view({Sc, p.cols.size(1)}).copy_from(p.cols);
    norm_forward(st_.cfg, p.raw, p.w, p.b, p.scratch_a, p.mean, p.rstd);
    p.cols.copy_from(p.scratch_a.view({Sc, p.cols.size(1)}));
  }
}

void AttentionBlock::qk_norm_backward(int c, Tensor dqkv) {
  if (!st_.dims.qk_norm) return;
  const int64_t Sc = st_.dims.Sc;
  for (const bool k : {false, true}) {
    QkPart p = qk_part(st_, c, dqkv, k);
    p.scratch_a.view({Sc, p.cols.size(1)}).copy_from(p.cols);  // the gradient of the normalised q (or k)
    norm_backward(st_.cfg, p.scratch_a, p.raw, p.w, p.mean, p.rstd, p.scratch_b, p.dw, p.db, /*accumulate_dx=*/false);
    p.cols.copy_from(p.scratch_b.view({Sc, p.cols.size(1)}));
  }
}

void AttentionBlock::cp_pack(int c, Tensor rows, Tensor packed, bool to_packed) const {
  const LayerState& s = st_;
  const CpLayout cp = s.cp_layout();
  const int64_t n = cp.len * s.dims.b, half = cp.sb * s.dims.b;  // tokens of a sub-block, of a half
  for (int part = 0; part < 2; ++part) {
    Tensor local = rows.rows(part * n, (part + 1) * n);
    Tensor ring = packed.rows(part * half + c * n, part * half + (c + 1) * n);
    if (to_packed)
      ring.copy_from(local);
    else
      local.copy_from(ring);
  }
}

void AttentionBlock::cp_attention(int c, int t, bool backward) {
  LayerState& s = st_;
  const LayerDims& d = s.dims;
  const int64_t hl = d.hl, kvl = d.kvl, half = s.cp_layout().sb * d.b;
  const Tensor qkv = s.full_rows(s.bf16() ? Buf::qkv_bf16 : Buf::qkv, c);
  const Tensor kv = s.mem.get(Buf::cp_kv, t);
  const Tensor attn = s.full_rows(Buf::attn, c), lse = s.mem.get(Buf::lse).rows(c, c + 1).view({2, -1});
  for (CpAttentionCall call : cp_attention_calls(s.cp_layout(), c, t, d.b, d.nl, d.d, d.gl)) {
    call.shape.dropout = prob_dropout(s);
    const int64_t q0 = call.q_half * call.shape.sq * d.b, q1 = q0 + call.shape.sq * d.b;
    const int64_t k0 = call.k_half * half, k1 = k0 + call.k_rows * d.b;
    const Tensor q = qkv.rows(q0, q1).cols(0, hl), k = kv.rows(k0, k1).cols(0, kvl),
                 v = kv.rows(k0, k1).cols(kvl, 2 * kvl);
    Tensor out = attn.rows(q0, q1), l = lse.rows(call.q_half, call.q_half + 1);
    if (!backward) {
      kernels::attention_forward(call.shape, q, k, v, out, l, {}, *s.ctx);
      continue;
    }
    kernels::AttentionShape sh = call.shape;
    sh.merge = false;
    sh.accumulate_dq = true;  // every call adds its keys' share to the chunk's dq
    const Tensor dkv = s.mem.get(Buf::cp_dkv, t);
    Tensor dq = s.full_rows(Buf::dqkv, c).rows(q0, q1).cols(0, hl);
    Tensor dk = dkv.rows(k0, k1).cols(0, kvl), dv = dkv.rows(k0, k1).cols(kvl, 2 * kvl);
    kernels::attention_backward(sh, s.full_rows(Buf::d_attn, c).rows(q0, q1), q, k, v, out, l, dq, dk, dv, {}, *s.ctx);
  }
}

void AttentionBlock::cp_dkv_reduce(int piece) {
  LayerState& s = st_;
  const int C = int(s.dims.cp);
  Tensor dst = s.mem.get(Buf::cp_dkv, piece);
  if (piece != 1) {  // the sums received at the step before (the last step for piece 0), added in fp32
    const Tensor src = s.mem.get(s.mem.seams().dkv.recv, piece == 0 ? C - 1 : piece - 1);
    float* a = dst.data<float>();
    const int64_t n = dst.numel();
    if (src.dtype() == DType::f32) {
      const float* b = src.data<float>();
      for (int64_t i = 0; i < n; ++i) a[i] += b[i];
    } else {
      const bf16* b = src.data<bf16>();
      for (int64_t i = 0; i < n; ++i) a[i] += bf16_to_f32(b[i]);
    }
  }
  if (piece != 0) {  // bf16: what this step sends, rounded once
    if (s.bf16()) s.mem.get(s.mem.seams().dkv.send, piece).copy_from(dst);
    return;
  }
  // every rank's contribution to this rank's own dK, dV is in slot 0: into the K, V columns of dqkv, per chunk
  for (int c = 0; c < s.dims.M; ++c)
    cp_pack(c, s.full_rows(Buf::dqkv, c).cols(s.dims.hl, s.dims.qkvl), dst, /*to_packed=*/false);
}

void AttentionBlock::ln1_qkv(int c) {
  ln1(c);
  qkv(c);
}

void AttentionBlock::attention(int c, int piece) {
  LayerState& s = st_;
  if (s.dims.cp > 1) return cp_attention(c, piece, /*backward=*/false);
  const int64_t hl = s.dims.hl, kv1 = hl + s.dims.kvl, kv2 = s.dims.qkvl;  // k = [hl, kv1), v = [kv1, kv2)
  const Tensor qkv = s.mem.get(s.bf16() ? Buf::qkv_bf16 : Buf::qkv);
  const Tensor kv = qkv.rows(0, int64_t(c + 1) * s.dims.Sc);  // the rows chunk c can see
  const Tensor q = s.full_rows(qkv, c).cols(0, hl);
  Tensor out = s.full_rows(Buf::attn, c), lse = s.mem.get(Buf::lse).rows(c, c + 1);
  kernels::attention_forward(chunk_shape(s, c), q, kv.cols(hl, kv1), kv.cols(kv1, kv2), out, lse, {}, *s.ctx);
}

void AttentionBlock::out_proj(int c) {
  LayerState& s = st_;
  // tp > 1: partial sums over the local heads, reduced next (the Plan's tp_proj_out): reduce-scattered from
  // proj_partial into the local rows of proj (sequence parallel), or all-reduced in place.
  Tensor proj = s.dims.sp ? s.mem.get(Buf::proj_partial) : s.full_rows(Buf::proj, c);
  const Tensor attn = s.full_rows(Buf::attn, c);
  Tensor in = attn;
  if (s.bf16()) {
    in = s.full_rows(Buf::attn_bf16, c);
    in.copy_from(attn);
  }
  linear_forward(in, s.w.proj, proj, *s.ctx);
  if (s.dims.sp && s.bf16()) s.mem.get(s.mem.seams().proj_out.send).copy_from(proj);  // bf16 payload, as Megatron's
}

void AttentionBlock::residual_ln2(int c) {
  LayerState& s = st_;
  if (s.dims.sp && s.bf16()) s.rows(Buf::proj, c).copy_from(s.rows(s.mem.seams().proj_out.recv, c));  // reduced
  Tensor ln_in = s.rows(Buf::ln_in, c), ln2 = s.rows(Buf::ln2_out, c);
  const Tensor proj = s.rows(Buf::proj, c), x = s.rows(s.x, c);
  if (s.p.proj_b.defined()) add_bias(proj, s.p.proj_b);  // --add-bias-linear: after the reduce, before the dropout
  s.chunk_tokens(c).for_each_run(x.size(0), [&](int64_t first, int64_t n, uint64_t token0) {
    Tensor out = ln_in.rows(first, first + n);
    kernels::dropout_add_forward(proj.rows(first, first + n), x.rows(first, first + n), s.cfg.dropout_p(),
                                 dropout_key(s.cfg), token0, out);
  });
  Tensor mean = s.rows(Buf::ln2_mean, c), rstd = s.rows(Buf::ln2_rstd, c);
  norm_forward(s.cfg, ln_in, s.p.ln2_w, s.p.ln2_b, ln2, mean, rstd);
  // the dense MLP's input, all-gathered next with sequence parallelism (the Plan's tp_mlp_in): bf16 payload
  if (s.dims.mlp && s.dims.sp && s.bf16()) s.rows(s.mem.seams().mlp_in.send, c).copy_from(ln2);
}

// ----------------------------------------------------------------------------------------------- backward

void AttentionBlock::begin_backward() {
  st_.mem.get(Buf::dqkv).zero();
  for (int t = 0; t < int(st_.dims.cp); ++t)
    if (st_.dims.cp > 1) st_.mem.get(Buf::cp_dkv, t).zero();
}

Tensor AttentionBlock::d_proj_all() const {
  const LayerState& s = st_;
  // all-gathered (sequence parallel), converted to bf16 by residual_ln2_backward, or every fp32 row already
  return s.mem.get(s.dims.sp ? s.mem.seams().d_proj_out.recv : s.bf16() ? Buf::d_proj_bf16 : Buf::d_proj);
}

void AttentionBlock::residual_ln2_backward(int c) {
  // d ln_in = dy (residual) + LN2'(d ln2); the layer input x receives d ln_in; proj receives dropout'(d ln_in).
  LayerState& s = st_;
  Tensor d_ln_in = s.rows(Buf::d_ln_in, c);
  d_ln_in.copy_from(s.rows(s.dy, c));
  if (s.dims.mlp) add_rows(s.rows(Buf::d_ln2, c), mlp_input_grad_rows(s, c));  // the dense MLP's share of d ln2
  shared_expert_gate_backward(s, c);  // --moe-shared-expert-gate: the gate's share of d ln2 and its gradient
  norm_backward(s.cfg, s.rows(Buf::d_ln2, c), s.rows(Buf::ln_in, c), s.p.ln2_w, s.rows(Buf::ln2_mean, c),
                s.rows(Buf::ln2_rstd, c), d_ln_in, s.g.ln2_w, s.g.ln2_b, /*accumulate_dx=*/true);
  s.rows(s.mem.get(Buf::dx).view({s.dims.Tl, s.dims.h}), c).copy_from(d_ln_in);
  Tensor d_proj = s.rows(Buf::d_proj, c);
  s.chunk_tokens(c).for_each_run(d_ln_in.size(0), [&](int64_t first, int64_t n, uint64_t token0) {
    Tensor out = d_proj.rows(first, first + n);
    kernels::dropout_backward(d_ln_in.rows(first, first + n), s.cfg.dropout_p(), dropout_key(s.cfg), token0, out);
  });
  if (s.g.proj_b.defined()) add_column_sums(d_proj, s.g.proj_b);  // this rank's rows (sequence parallel: summed over tp)
  // The out-projection's backward reads every row of the chunk in the compute dtype: all-gathered next (sequence
  // parallel, from d_proj or its bf16 copy d_proj_send), or converted here.
  if (s.bf16())
    (s.dims.sp ? s.mem.get(s.mem.seams().d_proj_out.send) : s.full_rows(Buf::d_proj_bf16, c)).copy_from(d_proj);
}

void AttentionBlock::out_proj_backward(int c) {
  LayerState& s = st_;
  Tensor d_attn = s.full_rows(Buf::d_attn, c);
  linear_input_grad(s.full_rows(d_proj_all(), c), s.w.proj, d_attn, *s.ctx);  // the weight gradient: weight_grads()
}

void AttentionBlock::attention_backward(int c, int piece) {
  LayerState& s = st_;
  if (s.dims.cp > 1) return cp_attention(c, piece, /*backward=*/true);
  const int64_t hl = s.dims.hl, kv1 = hl + s.dims.kvl, kv2 = s.dims.qkvl, visible = int64_t(c + 1) * s.dims.Sc;
  const Tensor qkv = s.mem.get(s.bf16() ? Buf::qkv_bf16 : Buf::qkv);
  const Tensor kv = qkv.rows(0, visible);
  const Tensor dqkv = s.mem.get(Buf::dqkv);
  Tensor dq = s.full_rows(dqkv, c).cols(0, hl);
  Tensor dk = dqkv.rows(0, visible).cols(hl, kv1), dv = dqkv.rows(0, visible).cols(kv1, kv2);
  kernels::attention_backward(chunk_shape(s, c), s.full_rows(Buf::d_attn, c), s.full_rows(qkv, c).cols(0, hl),
                              kv.cols(hl, kv1), kv.cols(kv1, kv2), s.full_rows(Buf::attn, c),
                              s.mem.get(Buf::lse).rows(c, c + 1), dq, dk, dv, {}, *s.ctx);
}

void AttentionBlock::attention_recompute(int c) {
  LayerState& s = st_;
  if (s.dims.cp > 1) {
    for (int t = 0; t < int(s.dims.cp); ++t) cp_attention(c, t, /*backward=*/false);  // own keys first, as forward
  } else {
    attention(c);
  }
  if (s.bf16()) s.full_rows(Buf::attn_bf16, c).copy_from(s.full_rows(Buf::attn, c));
}

void AttentionBlock::qkv_backward(int c) {
  // The chunk's rows of dqkv are complete: dq from attention_backward(c), dK and dV from chunks c..M-1. tp > 1:
  // d_ln1_out holds partial sums over the local heads, reduced next (the Plan's tp_qkv_in).
  LayerState& s = st_;
  Tensor d_xn = s.mem.get(Buf::d_ln1_out, c);
  Tensor dqkv = s.full_rows(Buf::dqkv, c);
  rotate_qk(c, dqkv, /*inverse=*/true);  // RoPE: the gradient of the unrotated q, k (the rotation's transpose)
  qk_norm_backward(c, dqkv);             // --qk-layernorm: the gradient of q, k before the norm
  Tensor in = dqkv;
  if (s.bf16()) {
    in = s.full_rows(Buf::dqkv_bf16, c);
    in.copy_from(dqkv);
  }
  linear_input_grad(in, s.w.qkv, d_xn, *s.ctx);  // the weight gradient: weight_grads()
  if (s.dims.sp && s.bf16()) s.mem.get(s.mem.seams().d_qkv_in.send, c).copy_from(d_xn);  // bf16 payload
}

void AttentionBlock::ln1_backward(int c) {
  LayerState& s = st_;
  if (s.dims.sp && s.bf16()) s.mem.get(Buf::d_ln1_local, c).copy_from(s.mem.get(s.mem.seams().d_qkv_in.recv, c));
  const Tensor d_xn = s.mem.get(s.dims.sp ? Buf::d_ln1_local : Buf::d_ln1_out, c);  // this rank's rows, reduced
  Tensor dx = s.rows(s.mem.get(Buf::dx).view({s.dims.Tl, s.dims.h}), c);
  norm_backward(s.cfg, d_xn, s.rows(s.x, c), s.p.ln1_w, s.rows(Buf::ln1_mean, c), s.rows(Buf::ln1_rstd, c), dx,
                s.g.ln1_w, s.g.ln1_b, /*accumulate_dx=*/true);
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
                     s.g.qkv_w, *s.ctx);
  // --add-qkv-bias: db += the column sums of dqkv (fp32, every row of the layer)
  if (s.g.qkv_b.defined()) add_column_sums(s.mem.get(Buf::dqkv), s.g.qkv_b);
  linear_weight_grad(d_proj_all(), s.mem.get(bf16 ? Buf::attn_bf16 : Buf::attn), s.g.proj_w, *s.ctx);
}

}  // namespace ampipe::model
