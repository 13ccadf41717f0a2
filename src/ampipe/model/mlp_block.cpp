#include "ampipe/model/mlp_block.h"

#include <cmath>
#include <vector>

#include "ampipe/core/parallel.h"
#include "ampipe/kernels/activations.h"
#include "ampipe/model/linear.h"

namespace ampipe::model {

Tensor MlpBlock::input_all() const {
  // sequence parallel: all-gathered (the Plan's tp_mlp_in); bf16: converted by forward(); fp32: LN2's output itself
  return st_.mem.get(st_.dims.sp || st_.bf16() ? Buf::mlp_in : Buf::ln2_out);
}

Tensor MlpBlock::output_grad_all() const {
  return st_.mem.get(st_.dims.sp ? st_.mem.seams().d_mlp_out.recv : Buf::d_mlp);
}

Tensor mlp_output_rows(const LayerState& s, int c) {
  return s.dims.sp ? s.rows(s.mem.seams().mlp_out.recv, c) : s.full_rows(s.mem.seams().mlp_out.recv, c);
}

Tensor mlp_input_grad_rows(const LayerState& s, int c) {
  return s.dims.sp ? s.rows(s.mem.seams().d_mlp_in.recv, c) : s.full_rows(s.mem.seams().d_mlp_in.recv, c);
}

void add_rows(Tensor dst, const Tensor& src) {
  AMPIPE_CHECK(dst.shape() == src.shape() && dst.is_contiguous() && src.is_contiguous(), "add_rows {} += {}",
               shape_str(dst.shape()), shape_str(src.shape()));
  float* d = dst.data<float>();
  const float* x = src.data<float>();
  parallel_for(dst.numel(), kElementGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) d[i] += x[i];
  });
}

namespace {
// f(t, s_t) for each row t of chunk c on this rank: s_t = sigmoid(x2_t . g), the shared expert's gate. Rows spread
// over the threads: f may write row t's outputs only.
template <typename F>
void for_each_gated_row(const LayerState& s, int c, F&& f) {
  const Tensor x2 = s.rows(Buf::ln2_out, c);
  const int64_t h = s.dims.h;
  const float* g = s.p.mlp_gate_w.data<float>();
  parallel_for(x2.size(0), rows_grain(2 * h), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* x = x2.data<float>() + t * h;
      float logit = 0.0f;
      for (int64_t j = 0; j < h; ++j) logit += x[j] * g[j];
      f(t, 1.0f / (1.0f + std::exp(-logit)));
    }
  });
}
}  // namespace

void add_shared_expert_rows(const LayerState& s, int c, Tensor moe) {
  const Tensor mlp = mlp_output_rows(s, c);
  if (!s.dims.mlp_gate) return add_rows(moe, mlp);
  const int64_t h = s.dims.h;
  for_each_gated_row(s, c, [&](int64_t t, float st) {
    float* m = moe.data<float>() + t * h;
    const float* y = mlp.data<float>() + t * h;
    for (int64_t j = 0; j < h; ++j) m[j] += st * y[j];
  });
}

void shared_expert_output_grad(const LayerState& s, int c, const Tensor& d_moe, Tensor d_mlp) {
  d_mlp.copy_from(d_moe);
  if (!s.dims.mlp_gate) return;
  const int64_t h = s.dims.h;
  for_each_gated_row(s, c, [&](int64_t t, float st) {
    float* d = d_mlp.data<float>() + t * h;
    for (int64_t j = 0; j < h; ++j) d[j] *= st;
  });
}

void shared_expert_gate_backward(LayerState& s, int c) {
  if (!s.dims.mlp_gate) return;
  const Tensor x2 = s.rows(Buf::ln2_out, c), mlp = mlp_output_rows(s, c), d_mlp = s.rows(Buf::d_mlp, c);
  Tensor d_ln2 = s.rows(Buf::d_ln2, c);
  const int64_t h = s.dims.h;
  const float* g = s.p.mlp_gate_w.data<float>();
  float* dg = s.g.mlp_gate_w.data<float>();
  std::vector<float> z(size_t(x2.size(0)));  // dL/dlogit of every row
  for_each_gated_row(s, c, [&](int64_t t, float st) {
    const float* y = mlp.data<float>() + t * h;
    const float* dm = d_mlp.data<float>() + t * h;
    float dot = 0.0f;
    for (int64_t j = 0; j < h; ++j) dot += dm[j] * y[j];
    z[size_t(t)] = (1.0f - st) * dot;
    float* dx = d_ln2.data<float>() + t * h;
    for (int64_t j = 0; j < h; ++j) dx[j] += z[size_t(t)] * g[j];
  });
  // dg sums over the rows in row order, the columns spread over the threads
  parallel_for(h, kColumnGrain, [&](int64_t j0, int64_t j1) {
    for (int64_t t = 0; t < x2.size(0); ++t) {
      const float* x = x2.data<float>() + t * h;
      for (int64_t j = j0; j < j1; ++j) dg[j] += z[size_t(t)] * x[j];
    }
  });
}

void MlpBlock::forward(int c) {
  LayerState& s = st_;
  if (s.bf16() && !s.dims.sp) s.full_rows(Buf::mlp_in, c).copy_from(s.full_rows(Buf::ln2_out, c));
  const Tensor in = s.full_rows(input_all(), c);
  Tensor h1 = s.full_rows(Buf::mlp_fc1, c);
  linear_forward(in, s.w.mlp_fc1, h1, *s.ctx);  // [S_c, h] -> [S_c, F1_m/t]
  if (s.p.mlp_fc1_b.defined()) add_bias(h1, s.p.mlp_fc1_b);  // --add-bias-linear (fc2's: MoeBlock::weighted_sum)
  // the kept activation, in the compute dtype: bf16 written straight from fp32 values
  Tensor a = s.full_rows(s.bf16() ? Buf::mlp_act_bf16 : Buf::mlp_act, c);
  if (s.cfg.expert == ExpertKind::swiglu)
    kernels::swiglu_forward(h1, a);
  else
    kernels::gelu_forward(h1, a);
  Tensor out = s.full_rows(Buf::mlp_out, c);
  linear_forward(a, s.w.mlp_fc2, out, *s.ctx);  // [S_c, F_m/t] -> [S_c, h]
}

void MlpBlock::backward(int c) {
  LayerState& s = st_;
  Tensor d_out = s.full_rows(output_grad_all(), c);  // sequence parallel: all-gathered (the Plan's tp_mlp_out)
  if (s.bf16()) {
    Tensor copy = s.full_rows(Buf::d_mlp_bf16, c);
    copy.copy_from(d_out);
    d_out = copy;
  }
  Tensor d_act = s.mem.get(Buf::d_mlp_act);
  linear_input_grad(d_out, s.w.mlp_fc2, d_act, *s.ctx);
  // bf16: straight into the bf16 copy, unless a bias gradient sums it in fp32 first (then a chunk's fp32 staging)
  const bool staged = s.bf16() && s.g.mlp_fc1_b.defined();
  Tensor d_h1 = !s.bf16() ? s.full_rows(Buf::d_mlp_fc1, c)
                : staged  ? s.mem.get(Buf::d_mlp_fc1)
                          : s.full_rows(Buf::d_mlp_fc1_bf16, c);
  const Tensor h1 = s.full_rows(Buf::mlp_fc1, c);
  if (s.cfg.expert == ExpertKind::swiglu)
    kernels::swiglu_backward(d_act, h1, d_h1);
  else
    kernels::gelu_backward(d_act, h1, d_h1);
  if (s.g.mlp_fc1_b.defined()) add_column_sums(d_h1, s.g.mlp_fc1_b);
  Tensor d_h1_cd = d_h1;
  if (staged) {
    d_h1_cd = s.full_rows(Buf::d_mlp_fc1_bf16, c);
    d_h1_cd.copy_from(d_h1);
  }
  Tensor d_in = s.full_rows(Buf::d_mlp_in, c);  // tp: partial sums over the local F columns, reduced next
  linear_input_grad(d_h1_cd, s.w.mlp_fc1, d_in, *s.ctx);
}

void MlpBlock::weight_grads() {
  LayerState& s = st_;
  const bool bf16 = s.bf16();
  linear_weight_grad(bf16 ? s.mem.get(Buf::d_mlp_bf16) : output_grad_all(),
                     s.mem.get(bf16 ? Buf::mlp_act_bf16 : Buf::mlp_act), s.g.mlp_fc2_w, *s.ctx);
  linear_weight_grad(s.mem.get(bf16 ? Buf::d_mlp_fc1_bf16 : Buf::d_mlp_fc1), input_all(), s.g.mlp_fc1_w, *s.ctx);
}

}  // namespace ampipe::model
