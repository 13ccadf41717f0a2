#include "ampipe/model/buffers.h"

#include "ampipe/core/error.h"

namespace ampipe::model {

namespace {
constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct BufInfo {
  const char* name;
  bool per_chunk;
};
// Names and whether a buffer has one slot per chunk, in Buf order.
constexpr BufInfo kInfo[kNumBufs] = {
    {"ln1_mean", false},        {"ln1_rstd", false},        {"ln1_out", false},         {"ln1_out_bf16", false},
    {"qkv", false},             {"qkv_bf16", false},          {"attn", false},            {"attn_bf16", false},
    {"lse", false},             {"proj", false},            {"ln_in", false},           {"ln2_mean", false},
    {"ln2_rstd", false},        {"ln2_out", false},         {"gate_probs", true},       {"gate_input", true},
    {"capacity_need", true},    {"capacity_all", true},     {"dispatch_rows", false},   {"dispatch_send", true},
    {"dispatch_recv", true},
    {"expert_in", false},       {"fc1_out", false},         {"act", false},             {"act_bf16", false},
    {"expert_out", false},      {"combine_send", true},     {"combine_recv", true},
    {"expert_y", true},         {"moe_out", false},         {"y", false},               {"d_moe", false},
    {"d_expert_y", false},      {"d_weight", true},         {"combine_bwd_send", true}, {"combine_bwd_recv", true},
    {"d_expert_out", false},    {"d_expert_in", false},     {"d_act", false},
    {"d_fc1", false},           {"d_fc1_bf16", false},        {"dispatch_bwd_send", true}, {"dispatch_bwd_recv", true},
    {"d_dispatch", false},      {"d_logits", false},        {"d_ln_in", false},         {"d_ln2", false},
    {"d_proj", false},          {"d_attn", false},          {"d_proj_bf16", false},       {"dqkv", false},
    {"dqkv_bf16", false},         {"d_ln1_out", true},        {"dx", false},
    {"ln1_local", false},       {"ln1_send", false},        {"proj_partial", false},    {"d_proj_full", false},
    {"d_proj_send", false},     {"d_ln1_local", true},      {"expert_gather", true},    {"combine_partial", true},
    {"d_gather", true},         {"dispatch_bwd_partial", true}, {"gate_stats", false},
    {"proj_send", false},       {"proj_recv", false},       {"d_ln1_send", true},       {"d_ln1_recv", true},
    {"cp_kv", false},           {"cp_dkv", false},          {"cp_dkv_recv", false},     {"cp_dkv_send", false},
    {"mlp_send", false},        {"mlp_in", false},          {"mlp_fc1", false},         {"mlp_act", false},
    {"mlp_act_bf16", false},    {"mlp_out", false},         {"mlp_y", false},           {"d_mlp", false},
    {"d_mlp_full", false},      {"d_mlp_bf16", false},      {"d_mlp_act", false},       {"d_mlp_fc1", false},
    {"d_mlp_fc1_bf16", false},  {"d_mlp_in", false},        {"d_mlp_in_local", false},
    {"qk_raw", false},          {"qk_stats", false},        {"qk_scratch", false},      {"capacity_tp", true},
};
// Buffers with one slot per context-parallel ring step.
bool per_ring_step(Buf b) {
  return b == Buf::cp_kv || b == Buf::cp_dkv || b == Buf::cp_dkv_recv || b == Buf::cp_dkv_send;
}
static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == kNumBufs);

// The router's and the experts' buffers (a dense layer has none of them).
bool moe_only(Buf b) {
  switch (b) {
    case Buf::gate_probs:
    case Buf::gate_input:
    case Buf::capacity_need:
    case Buf::capacity_all:
    case Buf::capacity_tp:
    case Buf::dispatch_rows:
    case Buf::dispatch_send:
    case Buf::dispatch_recv:
    case Buf::expert_in:
    case Buf::fc1_out:
    case Buf::act:
    case Buf::act_bf16:
    case Buf::expert_out:
    case Buf::combine_send:
    case Buf::combine_recv:
    case Buf::expert_y:
    case Buf::d_expert_y:
    case Buf::d_weight:
    case Buf::combine_bwd_send:
    case Buf::combine_bwd_recv:
    case Buf::d_expert_out:
    case Buf::d_expert_in:
    case Buf::d_act:
    case Buf::d_fc1:
    case Buf::d_fc1_bf16:
    case Buf::dispatch_bwd_send:
    case Buf::dispatch_bwd_recv:
    case Buf::d_dispatch:
    case Buf::d_logits:
    case Buf::expert_gather:
    case Buf::combine_partial:
    case Buf::d_gather:
    case Buf::dispatch_bwd_partial:
    case Buf::gate_stats: return true;
    default: return false;
  }
}

// The dense MLP's buffers, for a block that has one.
bool mlp_needed(const LayerDims& d, Buf b) {
  const bool bf16 = d.cd != DType::f32;
  switch (b) {
    case Buf::mlp_send: return d.sp && bf16;
    case Buf::mlp_in: return d.sp || bf16;
    case Buf::mlp_act: return !bf16;  // bf16: the activation is written straight into mlp_act_bf16
    case Buf::d_mlp_fc1: return !bf16 || d.fc1_bias;  // bf16 without a bias: straight into d_mlp_fc1_bf16
    case Buf::mlp_act_bf16:
    case Buf::d_mlp_bf16:
    case Buf::d_mlp_fc1_bf16: return bf16;
    case Buf::mlp_y:
    case Buf::d_mlp_full:
    case Buf::d_mlp_in_local: return d.sp;
    default: return true;
  }
}

// Buffers that only some configurations use.
bool needed(const LayerDims& d, Buf b) {
  const bool bf16 = d.cd != DType::f32;
  if (!d.moe && moe_only(b)) return false;
  if (b >= Buf::mlp_send && b <= Buf::d_mlp_in_local) return d.mlp && mlp_needed(d, b);
  switch (b) {
    case Buf::ln1_out: return !(d.sp && bf16);  // sequence parallel bf16: gathered straight into ln1_out_bf16
    case Buf::act: return !bf16;  // bf16: the experts' activation is written straight into act_bf16
    case Buf::d_fc1: return !bf16 || d.fc1_bias;  // bf16 without a bias: its gradient straight into d_fc1_bf16
    case Buf::ln1_local:
    case Buf::proj_partial:
    case Buf::d_ln1_local:
    case Buf::expert_gather:
    case Buf::combine_partial:
    case Buf::d_gather:
    case Buf::dispatch_bwd_partial:
    case Buf::gate_stats: return d.sp || d.cp > 1;
    case Buf::cp_kv:
    case Buf::cp_dkv:
    case Buf::cp_dkv_recv: return d.cp > 1;
    case Buf::cp_dkv_send: return d.cp > 1 && bf16;
    case Buf::ln1_send:
    case Buf::d_proj_send:
    case Buf::proj_send:
    case Buf::proj_recv:
    case Buf::d_ln1_send:
    case Buf::d_ln1_recv: return d.sp && bf16;
    case Buf::d_proj_full: return d.sp && !bf16;
    case Buf::ln1_out_bf16:
    case Buf::qkv_bf16:
    case Buf::attn_bf16:
    case Buf::act_bf16:
    case Buf::d_fc1_bf16:
    case Buf::d_proj_bf16:
    case Buf::dqkv_bf16: return bf16;
    case Buf::combine_recv:  // staging between the all-to-all layout and expert_y
    case Buf::d_expert_y:
    case Buf::d_dispatch: return bf16 || d.pieced();
    case Buf::dispatch_rows: return d.pieced();
    case Buf::gate_input: return d.jitter;
    case Buf::qk_raw:
    case Buf::qk_stats:
    case Buf::qk_scratch: return d.qk_norm;
    case Buf::capacity_need: return d.agree_capacity;
    case Buf::capacity_all: return d.agree_capacity && d.ep > 1;
    case Buf::capacity_tp: return d.agree_capacity_tp;
    default: return true;
  }
}

// Buffers in the compute dtype (bf16 copies and all-to-all payloads); everything else is fp32.
bool in_compute_dtype(Buf b) {
  switch (b) {
    case Buf::ln1_out_bf16:
    case Buf::qkv_bf16:
    case Buf::attn_bf16:
    case Buf::act_bf16:
    case Buf::combine_recv:
    case Buf::d_fc1_bf16:
    case Buf::dispatch_rows:
    case Buf::d_proj_bf16:
    case Buf::dqkv_bf16:
    case Buf::dispatch_send:
    case Buf::dispatch_recv:
    case Buf::expert_in:
    case Buf::combine_send:
    case Buf::combine_bwd_send:
    case Buf::combine_bwd_recv:
    case Buf::d_expert_out:
    case Buf::dispatch_bwd_send:
    case Buf::dispatch_bwd_recv:
    case Buf::ln1_send:
    case Buf::d_proj_send:
    case Buf::expert_gather:
    case Buf::combine_partial:
    case Buf::d_gather:
    case Buf::dispatch_bwd_partial:
    case Buf::proj_send:
    case Buf::proj_recv:
    case Buf::d_ln1_send:
    case Buf::d_ln1_recv:
    case Buf::cp_kv:
    case Buf::cp_dkv_recv:
    case Buf::cp_dkv_send:
    case Buf::mlp_send:
    case Buf::mlp_in:
    case Buf::mlp_act_bf16:
    case Buf::d_mlp_bf16:
    case Buf::d_mlp_fc1_bf16: return true;
    default: return false;
  }
}

Scope scope_of(const LayerDims& d, Buf b) {
  const bool f32 = d.cd == DType::f32;
  // A recomputed layer keeps its output (the next layer's input) and its input gradient (the previous layer's
  // output gradient); what its backward reads is refilled by re-running its forward, in the shared region.
  if (d.recompute && b != Buf::y && b != Buf::dx) return Scope::shared;
  // selective: the attention output and its lse are recomputed in the backward (Stage::attention_recompute)
  if (d.recompute_attention && (b == Buf::attn || b == Buf::attn_bf16 || b == Buf::lse)) return Scope::shared;
  switch (b) {
    // read by the backward (the fp32 originals only where they are not also the compute-dtype copy)
    case Buf::ln1_mean:
    case Buf::ln1_rstd:
    case Buf::ln1_out_bf16:
    case Buf::qkv_bf16:
    case Buf::cp_kv:
    case Buf::attn:
    case Buf::attn_bf16:
    case Buf::lse:
    case Buf::ln_in:
    case Buf::ln2_mean:
    case Buf::ln2_rstd:
    case Buf::ln2_out:
    case Buf::gate_probs:
    case Buf::gate_input:
    case Buf::expert_in:
    case Buf::fc1_out:
    case Buf::act_bf16:
    case Buf::expert_y:
    case Buf::mlp_in:
    case Buf::mlp_fc1:
    case Buf::mlp_act_bf16:
    case Buf::qk_raw:
    case Buf::qk_stats:
    case Buf::y:
    case Buf::dx: return Scope::saved;
    case Buf::ln1_out:
    case Buf::qkv:
    case Buf::act:
    case Buf::mlp_act: return f32 ? Scope::saved : Scope::shared;
    // --moe-shared-expert-gate: the gate's backward reads the shared expert's output rows (the reduced ones)
    case Buf::mlp_out: return d.mlp_gate && !d.sp ? Scope::saved : Scope::shared;
    case Buf::mlp_y: return d.mlp_gate ? Scope::saved : Scope::shared;
    default: return Scope::shared;
  }
}
}  // namespace

const char* buf_name(Buf b) { return kInfo[int(b)].name; }

bool gathered_over_tp(Buf b) {
  return b == Buf::expert_gather || b == Buf::combine_partial || b == Buf::d_gather || b == Buf::dispatch_bwd_partial;
}

bool chunked_by_rows(Buf b) {
  switch (b) {
    case Buf::ln1_out:
    case Buf::ln1_out_bf16:
    case Buf::proj:
    case Buf::proj_recv:
    case Buf::d_proj:
    case Buf::d_proj_full:
    case Buf::d_proj_bf16:
    case Buf::ln2_out:
    case Buf::mlp_send:
    case Buf::mlp_in:
    case Buf::mlp_out:
    case Buf::mlp_y:
    case Buf::d_mlp:
    case Buf::d_mlp_full:
    case Buf::d_mlp_in:
    case Buf::d_mlp_in_local: return true;
    default: return false;
  }
}

size_t BufferSpec::slot_bytes() const { return size_t(shape_numel(shape)) * dtype_size(dtype); }

Shape buffer_shape(const LayerDims& d, Buf b, int64_t C) {
  // T, S_c: every row (the attention core); Tl, Scl: the residual stream's rows on this rank (docs/plan.md)
  const int64_t T = d.T, Tl = d.Tl, h = d.h, hl = d.hl, Sc = d.Sc, Scl = d.Scl, E = d.E, L = d.L, R = d.srcs * C,
                MR = d.M * R;
  const bool f32 = d.cd == DType::f32;
  switch (b) {
    case Buf::ln1_mean:
    case Buf::ln1_rstd:
    case Buf::ln2_mean:
    case Buf::ln2_rstd: return {Tl};
    case Buf::ln1_out: return f32 ? Shape{T, h} : Shape{Sc, h};  // bf16: a one-chunk staging buffer
    case Buf::qkv: return f32 ? Shape{T, d.qkvl} : Shape{Sc, d.qkvl};
    case Buf::ln1_out_bf16:
    case Buf::d_proj_full:
    case Buf::d_proj_bf16: return {T, h};
    case Buf::attn:
    case Buf::attn_bf16:
    case Buf::d_attn: return {T, hl};
    case Buf::proj:
    case Buf::proj_recv:
    case Buf::ln_in:
    case Buf::ln2_out:
    case Buf::moe_out:
    case Buf::d_ln_in:
    case Buf::d_ln2:
    case Buf::d_proj: return {Tl, h};
    case Buf::qkv_bf16:
    case Buf::dqkv:
    case Buf::dqkv_bf16: return {T, d.qkvl};
    case Buf::lse: return {d.M, d.b * d.nl * d.sq};
    case Buf::gate_probs: return {Scl, E};
    case Buf::gate_input: return {Scl, h};
    case Buf::capacity_need: return {1};
    case Buf::capacity_all: return {d.ep};
    case Buf::capacity_tp: return {d.tp * d.ep};
    case Buf::dispatch_rows:
    case Buf::dispatch_send:
    case Buf::combine_recv:
    case Buf::expert_y:
    case Buf::d_expert_y:
    case Buf::combine_bwd_send:
    case Buf::dispatch_bwd_recv:
    case Buf::d_dispatch: return {E, C, h};
    case Buf::dispatch_recv:
    case Buf::combine_send:
    case Buf::combine_bwd_recv:
    case Buf::dispatch_bwd_send: return {d.ep, L, C, h};
    case Buf::expert_gather:
    case Buf::combine_partial:
    case Buf::d_gather:
    case Buf::dispatch_bwd_partial: return {d.tp * d.ep, L, C, h};
    // Every chunk's slots of local expert l are consecutive rows [l*M*R, (l+1)*M*R), chunk c at row l*M*R + c*R,
    // so the weight gradients can take all chunks in one GEMM (LayerMemory::expert_rows).
    case Buf::expert_in:
    case Buf::d_expert_out: return {L, MR, h};
    case Buf::fc1_out: return {L, MR, d.F1l};
    case Buf::act_bf16: return {L, MR, d.Fl};
    case Buf::act: return {L, MR, d.Fl};  // fp32 only: bf16 writes act_bf16
    case Buf::d_fc1: return f32 ? Shape{L, MR, d.F1l} : Shape{R, d.F1l};
    case Buf::d_fc1_bf16: return {L, MR, d.F1l};
    case Buf::expert_out:
    case Buf::d_expert_in: return {L, R, h};
    case Buf::y:
    case Buf::dx: return {Tl / d.b, d.b, h};
    case Buf::d_moe:
    case Buf::ln1_local:
    case Buf::ln1_send:
    case Buf::d_proj_send:
    case Buf::d_ln1_local:
    case Buf::d_ln1_recv: return {Scl, h};
    case Buf::d_ln1_out:
    case Buf::proj_partial:
    case Buf::proj_send:
    case Buf::d_ln1_send: return {Sc, h};
    case Buf::d_weight: return {Scl, d.k};
    case Buf::d_act: return {R, d.Fl};
    case Buf::d_logits: return {Scl, E};
    case Buf::gate_stats: return {2 * E + 2 + (d.seq_aux ? 2 * d.b * E : 0)};
    case Buf::cp_kv:
    case Buf::cp_dkv:
    case Buf::cp_dkv_recv:
    case Buf::cp_dkv_send: return {T, 2 * d.kvl};
    case Buf::mlp_send:
    case Buf::mlp_y:
    case Buf::d_mlp:
    case Buf::d_mlp_in_local: return {Tl, h};
    case Buf::mlp_in:
    case Buf::mlp_out:
    case Buf::d_mlp_full:
    case Buf::d_mlp_bf16:
    case Buf::d_mlp_in: return {T, h};
    case Buf::mlp_fc1:
    case Buf::d_mlp_fc1_bf16: return {T, d.F1ml};
    case Buf::d_mlp_fc1: return f32 ? Shape{T, d.F1ml} : Shape{Sc, d.F1ml};
    case Buf::mlp_act: return {T, d.Fml};  // fp32 only: bf16 writes mlp_act_bf16
    case Buf::mlp_act_bf16: return {T, d.Fml};
    case Buf::d_mlp_act: return {Sc, d.Fml};
    case Buf::qk_raw: return {T * (hl + d.kvl)};
    case Buf::qk_stats: return {2 * T * (d.nl + d.gl)};
    case Buf::qk_scratch: return {2 * Sc * (hl + d.kvl)};
  }
  return {};
}

std::vector<BufferSpec> layer_buffers(const LayerDims& d) {
  std::vector<BufferSpec> out;
  for (int i = 0; i < kNumBufs; ++i) {
    const Buf b = Buf(i);
    if (!needed(d, b)) continue;
    BufferSpec s;
    s.id = b;
    s.name = buf_name(b);
    s.dtype = in_compute_dtype(b) ? d.cd : DType::f32;
    s.shape = buffer_shape(d, b, d.C);
    s.chunks = per_ring_step(b) ? int(d.cp) : kInfo[i].per_chunk ? d.M : 1;
    s.scope = scope_of(d, b);
    out.push_back(std::move(s));
  }
  return out;
}

BufferLayout BufferLayout::make(const LayerDims& d) {
  BufferLayout l;
  l.specs = layer_buffers(d);
  l.offset.assign(size_t(kNumBufs), {});
  l.spec_index.assign(size_t(kNumBufs), -1);
  for (const BufferSpec& s : l.specs) {
    l.spec_index[size_t(s.id)] = int(&s - l.specs.data());
    size_t& end = s.scope == Scope::saved ? l.saved_bytes : l.shared_bytes;
    std::vector<size_t>& off = l.offset[size_t(s.id)];
    for (int c = 0; c < s.chunks; ++c) {
      off.push_back(end);
      end += align_up(s.slot_bytes());
    }
  }
  return l;
}

const BufferSpec* BufferLayout::spec(Buf b) const {
  const int i = spec_index[size_t(b)];
  return i < 0 ? nullptr : &specs[size_t(i)];
}

void Arena::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  capacity_ = align_up(bytes);
  storage_ = Tensor();  // reallocated on the next view()
}

void Arena::resize(size_t bytes) {
  if (align_up(bytes) == capacity_) return;
  capacity_ = align_up(bytes);
  storage_ = Tensor();
}

Tensor Arena::view(size_t offset, const Shape& shape, DType dtype) {
  const size_t n = size_t(shape_numel(shape)) * dtype_size(dtype);
  AMPIPE_CHECK(offset + n <= capacity_, "arena view [{}, {}) beyond its {} bytes", offset, offset + n, capacity_);
  if (!storage_.defined()) storage_ = Tensor::empty({int64_t(capacity_ / 4)});
  return storage_.view_bytes(offset, shape, dtype);
}

}  // namespace ampipe::model
