#include "ampipe/model/layer.h"

#include "ampipe/model/stage_io.h"

namespace ampipe::model {

// ---------------------------------------------------------------------------------------------- LayerMemory

LayerMemory::LayerMemory(const LayerDims& dims, const BufferLayout& layout, Arena& arena, size_t saved_base,
                         size_t shared_base)
    : dims_(&dims), layout_(&layout), arena_(&arena), saved_base_(saved_base), shared_base_(shared_base),
      C_(size_t(dims.M), dims.C), seams_(Seams::make(dims)), check_io_(stage_io_checking()) {}

void LayerMemory::enter_stage(Stage s, Dir d) {
  if (!check_io_) return;
  in_stage_ = true;
  stage_ = s;
  dir_ = d;
  const StageIO io = stage_io(*dims_, s, d);
  allowed_.assign(size_t(kNumBufs), false);
  for (Buf b : io.reads) allowed_[size_t(b)] = true;
  for (Buf b : io.writes) allowed_[size_t(b)] = true;
}

void LayerMemory::check_access(Buf b) const {
  if (!in_stage_) return;
  AMPIPE_CHECK(allowed_[size_t(b)], "stage {}.{} took buffer {}, which is not in its input/output table (stage_io)",
               stage_name(stage_), dir_name(dir_), buf_name(b));
}

Tensor LayerMemory::get(Buf b, int c) const {
  if (check_io_) check_access(b);
  const BufferSpec* spec = layout_->spec(b);
  AMPIPE_CHECK(spec != nullptr, "buffer {} is not planned for this layer", buf_name(b));
  const size_t slot = spec->chunks > 1 ? size_t(c) : 0;
  AMPIPE_CHECK(spec->chunks == 1 || (c >= 0 && c < spec->chunks), "buffer {} has no chunk {}", buf_name(b), c);
  // chunk c's run-time capacity (slots of the cp ring buffers are ring steps, not chunks: no capacity)
  const int64_t C = c >= 0 && c < dims_->M ? C_[size_t(c)] : dims_->C;
  const size_t base = spec->scope == Scope::saved ? saved_base_ : shared_base_;
  return arena_->view(base + layout_->offset[size_t(b)][slot], buffer_shape(*dims_, b, C), spec->dtype);
}

Tensor LayerMemory::get(Buf b, int c, int p) const {
  if (p < 0) return get(b, c);
  const ExpertPiece pc = dims_->piece(p, c >= 0 && c < dims_->M ? C_[size_t(c)] : dims_->C);
  const Tensor slot = get(b, c);
  const int64_t h = dims_->h, t = gathered_over_tp(b) ? dims_->tp : 1;  // gathered: t blocks per a2a block
  return slot.view({slot.numel() / h, h}).rows(t * pc.row0, t * (pc.row0 + dims_->ep * pc.experts * pc.slots));
}

Tensor LayerMemory::collective_view(Buf b, int c, int p) const {
  const BufferSpec* spec = layout_->spec(b);
  AMPIPE_CHECK(spec != nullptr, "buffer {} is not planned for this layer", buf_name(b));
  if (spec->chunks > 1 || !chunked_by_rows(b) || c < 0) return get(b, c, p);
  const Tensor all = get(b);
  const int64_t n = all.size(0) / dims_->M;
  return all.rows(int64_t(c) * n, int64_t(c + 1) * n);
}

Tensor LayerMemory::expert_rows(Buf b, int64_t l, int c) const {
  const Tensor all = get(b);  // [L, M*R, X] at the planned capacity
  const int64_t R = dims_->R(), X = all.size(2), first = (l * dims_->M + c) * R;
  return all.view({all.size(0) * all.size(1), X}).rows(first, first + dims_->srcs * C_[size_t(c)]);
}

Tensor LayerMemory::expert_rows_all(Buf b, int64_t l) const {
  const Tensor all = get(b);
  const int64_t MR = all.size(1);
  return all.view({all.size(0) * MR, all.size(2)}).rows(l * MR, (l + 1) * MR);
}

void LayerMemory::set_capacity(int c, int64_t C) {
  AMPIPE_CHECK(C >= 1 && C <= dims_->C, "chunk {} capacity {} outside the planned [1, {}]", c, C, dims_->C);
  C_[size_t(c)] = C;
}

// ---------------------------------------------------------------------------------------------------- Layer

Layer::Layer(const LayerConfig& cfg, int M, int ep_rank, int tp_rank, int cp_rank, LayerParams& params, LayerParams& grads,
             ComputeWeights& weights, const BufferLayout& layout, Arena& arena, size_t saved_base, size_t shared_base,
             kernels::ComputeContext& ctx)
    : st_{cfg,   LayerDims::make(cfg, M), params, grads, weights,
          LayerMemory(st_.dims, layout, arena, saved_base, shared_base),
          ep_rank, tp_rank, cp_rank, 0, Tensor(), Tensor(), 0.0f, &ctx},
      attn_(st_),
      moe_(st_),
      mlp_(st_) {}

void Layer::set_training(bool on) { st_.cfg.training = on; }

void Layer::refresh_weights() {
  LayerState& s = st_;
  const bool moe = s.dims.moe, mlp = s.dims.mlp;
  const Tensor fc1 = moe ? s.p.fc1_w.view({s.dims.L * s.dims.F1l, s.dims.h}) : Tensor();
  const Tensor fc2 = moe ? s.p.fc2_w.view({s.dims.L * s.dims.h, s.dims.Fl}) : Tensor();
  if (!s.bf16()) {  // views: nothing to copy, and a replaced parameter tensor is picked up
    s.w = {s.p.qkv_w, s.p.proj_w, fc1, fc2, s.p.mlp_fc1_w, s.p.mlp_fc2_w};
    return;
  }
  if (!s.w.stale) return;
  // bf16 copies, allocated once (on the first forward) and refreshed from the fp32 parameters
  auto refresh = [](Tensor& copy, const Tensor& from) {
    if (!from.defined()) return;
    if (!copy.defined() || copy.dtype() != DType::bf16) copy = Tensor::empty(from.shape(), DType::bf16);
    copy.copy_from(from);
  };
  refresh(s.w.qkv, s.p.qkv_w);
  refresh(s.w.proj, s.p.proj_w);
  if (moe) {
    refresh(s.w.fc1, fc1);
    refresh(s.w.fc2, fc2);
  }
  if (mlp) {
    refresh(s.w.mlp_fc1, s.p.mlp_fc1_w);
    refresh(s.w.mlp_fc2, s.p.mlp_fc2_w);
  }
  s.w.stale = false;
}

void Layer::begin_forward(const Tensor& x, uint64_t token_base, bool recompute) {
  const LayerDims& d = st_.dims;
  AMPIPE_CHECK(x.shape() == (Shape{d.Tl / d.b, d.b, d.h}) && x.dtype() == DType::f32 && x.is_contiguous(),
               "layer input {} expected [{}, {}, {}] fp32", shape_str(x.shape()), d.Tl / d.b, d.b, d.h);
  refresh_weights();
  st_.x = x.view({d.Tl, d.h});
  st_.token_base = token_base;
  st_.recomputing = recompute;
  moe_.begin_forward();
}

void Layer::begin_backward(const Tensor& dy, float d_aux) {
  const LayerDims& d = st_.dims;
  AMPIPE_CHECK(dy.shape() == (Shape{d.Tl / d.b, d.b, d.h}) && dy.dtype() == DType::f32 && dy.is_contiguous(),
               "output gradient {} expected [{}, {}, {}] fp32", shape_str(dy.shape()), d.Tl / d.b, d.b, d.h);
  st_.dy = dy.view({d.Tl, d.h});
  st_.d_aux = d_aux;
  st_.mem.get(Buf::d_ln2).zero();  // the dispatch and router backward accumulate into it
  attn_.begin_backward();
}

void Layer::run(Stage s, Dir d, int c, int p) {
  struct InStage {  // the stage input/output check's scope, left on an exception too
    LayerMemory& mem;
    ~InStage() { mem.leave_stage(); }
  } in{st_.mem};
  st_.mem.enter_stage(s, d);
  run_stage(s, d, c, p);
}

void Layer::run_stage(Stage s, Dir d, int c, int p) {
  const bool fwd = d == Dir::fwd;
  switch (s) {
    case Stage::ln1_qkv: return fwd ? attn_.ln1_qkv(c) : attn_.ln1_qkv_backward(c);
    case Stage::ln1: return fwd ? attn_.ln1(c) : attn_.ln1_backward(c);
    case Stage::qkv: return fwd ? attn_.qkv(c) : attn_.qkv_backward(c);
    case Stage::attention: return fwd ? attn_.attention(c, p) : attn_.attention_backward(c, p);
    case Stage::out_proj: return fwd ? attn_.out_proj(c) : attn_.out_proj_backward(c);
    case Stage::residual_ln2: return fwd ? attn_.residual_ln2(c) : attn_.residual_ln2_backward(c);
    case Stage::gate: return fwd ? moe_.gate(c) : moe_.gate_backward(c);
    case Stage::gate_assign:
      if (fwd) return moe_.gate_assign(c);
      break;
    case Stage::experts: return fwd ? moe_.experts(c, p) : moe_.experts_backward(c, p);
    case Stage::attention_wgrad:
      if (!fwd) return attn_.weight_grads();
      break;
    case Stage::expert_wgrad:
      if (!fwd) return moe_.weight_grads();
      break;
    case Stage::weighted_sum: return fwd ? moe_.weighted_sum(c) : moe_.weighted_sum_backward(c);
    case Stage::aux_loss:
      if (fwd) return moe_.aux_loss();
      break;
    case Stage::cp_dkv_reduce:
      if (!fwd) return attn_.cp_dkv_reduce(p);
      break;
    case Stage::attention_recompute:
      if (!fwd) return attn_.attention_recompute(c);
      break;
    case Stage::mlp: return fwd ? mlp_.forward(c) : mlp_.backward(c);
    case Stage::mlp_wgrad:
      if (!fwd) return mlp_.weight_grads();
      break;
  }
  AMPIPE_CHECK(false, "stage {}.{} is not a compute stage of the layer", stage_name(s), dir_name(d));
}

double Layer::flops() const {
  double f = 0;
  for (Stage s : {Stage::ln1_qkv, Stage::attention, Stage::out_proj, Stage::gate, Stage::experts, Stage::mlp})
    for (int c = 0; c < st_.dims.M; ++c) {
      LayerDims d = st_.dims;
      d.C = st_.mem.capacity(c);
      f += stage_flops(d, s, Dir::fwd, c) + stage_flops(d, s, Dir::bwd, c);
    }
  // the weight gradients over all chunks (the deferred expert ones only with a fixed capacity: C is the planned one)
  return f + stage_flops(st_.dims, Stage::attention_wgrad, Dir::bwd, -1) +
         stage_flops(st_.dims, Stage::expert_wgrad, Dir::bwd, -1) + stage_flops(st_.dims, Stage::mlp_wgrad, Dir::bwd, -1);
}

}  // namespace ampipe::model
