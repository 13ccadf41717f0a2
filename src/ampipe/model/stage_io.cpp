#include "ampipe/model/stage_io.h"

#include <cstdlib>
#include <cstring>

#include "ampipe/model/seams.h"

namespace ampipe::model {

namespace {
// The table is written as one function per block; each adds the buffers of one stage in one direction. A buffer
// that exists only in some layouts is added under the layout's condition (a bf16 staging copy, sequence
// parallelism's local rows, ...), seam buffers from the seams table.
struct Io {
  const LayerDims& d;
  const Seams m;
  const bool bf16, sp, tp;
  StageIO io;
  explicit Io(const LayerDims& dims)
      : d(dims), m(Seams::make(dims)), bf16(dims.cd != DType::f32), sp(dims.sp), tp(dims.tp > 1) {}
  Io& r(std::initializer_list<Buf> b) { return io.reads.insert(io.reads.end(), b), *this; }
  Io& w(std::initializer_list<Buf> b) { return io.writes.insert(io.writes.end(), b), *this; }
  Io& r_if(bool on, std::initializer_list<Buf> b) { return on ? r(b) : *this; }
  Io& w_if(bool on, std::initializer_list<Buf> b) { return on ? w(b) : *this; }
  // the fp32 buffer and, in bf16, its compute-dtype copy
  Io& r_cd(Buf f32, Buf b16) { return bf16 ? r({f32, b16}) : r({f32}); }
  Io& w_cd(Buf f32, Buf b16) { return bf16 ? w({f32, b16}) : w({f32}); }
  // --qk-layernorm's per-head norm inside the QKV stage
  Io& qk_norm() {
    return d.qk_norm ? r({Buf::qk_raw, Buf::qk_stats}).w({Buf::qk_raw, Buf::qk_stats, Buf::qk_scratch}) : *this;
  }
};

void attention_side(Io& x, Stage s, bool fwd) {
  const LayerDims& d = x.d;
  const bool cp = d.cp > 1;
  switch (s) {
    case Stage::ln1:  // LN1 of the local rows, into the all-gather's send buffer (sequence parallel)
      if (fwd)
        return void(x.w({Buf::ln1_mean, Buf::ln1_rstd})
                        .w_if(x.sp, {Buf::ln1_local, x.m.qkv_in.send})
                        .w_if(!x.sp, {Buf::ln1_out})
                        .w_if(!x.sp && x.bf16, {Buf::ln1_out_bf16}));
      return void(x.r({Buf::ln1_mean, Buf::ln1_rstd, x.m.d_qkv_in.recv}).w({Buf::dx}).w_if(x.sp, {Buf::d_ln1_local}));
    case Stage::ln1_qkv:
    case Stage::qkv: {
      const bool ln = s == Stage::ln1_qkv;
      if (fwd) {
        if (ln)
          x.w({Buf::ln1_mean, Buf::ln1_rstd}).w_cd(Buf::ln1_out, Buf::ln1_out_bf16);
        else
          x.r_cd(Buf::ln1_out, Buf::ln1_out_bf16);
        return void(x.w_cd(Buf::qkv, Buf::qkv_bf16).w_if(cp, {Buf::cp_kv}).qk_norm());
      }
      x.r({Buf::dqkv}).w_if(x.bf16, {Buf::dqkv_bf16}).w({Buf::d_ln1_out}).w_if(x.sp && x.bf16, {x.m.d_qkv_in.send});
      if (ln) x.r({Buf::ln1_mean, Buf::ln1_rstd}).w({Buf::dx});
      return void(x.qk_norm());
    }
    case Stage::attention:
      x.r_cd(Buf::qkv, Buf::qkv_bf16).r_if(cp, {Buf::cp_kv});
      if (fwd) return void(x.w({Buf::attn, Buf::lse}));
      return void(x.r({Buf::attn, Buf::lse, Buf::d_attn}).w({Buf::dqkv}).w_if(cp, {Buf::cp_dkv}));
    case Stage::attention_recompute:  // the attention forward again
      return void(x.r_cd(Buf::qkv, Buf::qkv_bf16).r_if(cp, {Buf::cp_kv}).w_cd(Buf::attn, Buf::attn_bf16).w({Buf::lse}));
    case Stage::out_proj:
      if (fwd)
        return void(
            x.r({Buf::attn}).w_if(x.bf16, {Buf::attn_bf16}).w_if(x.sp, {Buf::proj_partial}).w({x.m.proj_out.send}));
      return void(
          x.r({Buf::d_proj, Buf::d_proj_full, x.m.d_proj_out.recv}).r_if(x.bf16, {Buf::d_proj_bf16}).w({Buf::d_attn}));
    case Stage::residual_ln2:
      if (fwd)
        return void(x.r({Buf::proj, x.m.proj_out.recv})
                        .w({Buf::proj, Buf::ln_in, Buf::ln2_mean, Buf::ln2_rstd, Buf::ln2_out})
                        .w_if(d.mlp && x.sp && x.bf16, {x.m.mlp_in.send}));
      x.r({Buf::d_ln2, Buf::ln_in, Buf::ln2_mean, Buf::ln2_rstd}).w({Buf::d_ln_in, Buf::d_ln2, Buf::dx, Buf::d_proj});
      x.w_if(x.bf16, {x.sp ? x.m.d_proj_out.send : Buf::d_proj_bf16});
      // the dense MLP's input gradient (and the shared expert gate's share of d ln2)
      return void(x.r_if(d.mlp, {x.m.d_mlp_in.recv, Buf::d_mlp, Buf::ln2_out, Buf::mlp_out, x.m.mlp_out.recv}));
    case Stage::attention_wgrad:
      return void(x.r_cd(Buf::dqkv, Buf::dqkv_bf16)
                      .r_cd(Buf::ln1_out, Buf::ln1_out_bf16)
                      .r_cd(Buf::attn, Buf::attn_bf16)
                      .r({Buf::d_proj, Buf::d_proj_full})
                      .r_if(x.bf16, {Buf::d_proj_bf16}));
    case Stage::cp_dkv_reduce:
      return void(x.r({Buf::cp_dkv, x.m.dkv.recv}).w({Buf::cp_dkv, Buf::dqkv}).w_if(x.bf16, {x.m.dkv.send}));
    default: return;
  }
}

void moe_side(Io& x, Stage s, bool fwd) {
  const LayerDims& d = x.d;
  // the experts' input and output at the seams: all-gathered over tp (sequence parallel), or straight from the
  // all-to-all
  const Buf in = x.sp ? x.m.expert_in.recv : x.m.dispatch.recv,
            d_out = x.sp ? x.m.d_expert_out.recv : x.m.d_combine.recv;
  const Buf out = x.tp ? x.m.expert_out.send : x.m.combine.send,
            d_in = x.tp ? x.m.d_expert_in.send : x.m.d_dispatch.send;
  switch (s) {
    case Stage::gate:
      if (fwd)
        return void(x.r({Buf::ln2_out})
                        .w({Buf::gate_probs, Buf::gate_stats})
                        .w_if(d.jitter, {Buf::gate_input})
                        .w_if(d.agree_capacity, {x.m.capacity.send})
                        .w_if(!d.agree_capacity, {x.m.dispatch.send})
                        .w_if(!d.agree_capacity && d.pieced(), {Buf::dispatch_rows}));
      return void(x.r({x.m.d_dispatch.recv, Buf::d_weight, Buf::gate_probs, Buf::gate_stats, Buf::ln2_out})
                      .r_if(d.jitter, {Buf::gate_input})
                      .w({Buf::d_dispatch, Buf::d_logits, Buf::d_ln2}));
    case Stage::gate_assign:
      return void(x.r({Buf::ln2_out, d.agree_capacity_tp ? x.m.capacity_tp.recv : x.m.capacity.recv})
                      .w({x.m.dispatch.send})
                      .w_if(d.pieced(), {Buf::dispatch_rows}));
    case Stage::experts:
      if (fwd)
        return void(x.r({in}).w({Buf::expert_in, Buf::fc1_out, Buf::expert_out, out}).w_cd(Buf::act, Buf::act_bf16));
      return void(x.r({d_out, Buf::expert_in, Buf::fc1_out})
                      .r_cd(Buf::act, Buf::act_bf16)
                      .w({Buf::d_expert_out, Buf::d_act, Buf::d_expert_in, d_in})
                      .w_cd(Buf::d_fc1, Buf::d_fc1_bf16));
    case Stage::expert_wgrad:
      return void(
          x.r({Buf::d_expert_out, Buf::expert_in}).r_cd(Buf::act, Buf::act_bf16).r_cd(Buf::d_fc1, Buf::d_fc1_bf16));
    case Stage::weighted_sum:
      if (fwd) {
        x.r({Buf::ln_in}).w({Buf::moe_out, Buf::y});
        if (d.moe) x.r({x.m.combine.recv, Buf::gate_probs}).w({Buf::expert_y});
        return void(x.r_if(d.mlp, {x.m.mlp_out.recv, Buf::ln2_out}));
      }
      x.w({Buf::d_moe});
      if (d.moe) x.r({Buf::expert_y}).w({x.m.d_combine.send, Buf::d_expert_y, Buf::d_weight});
      return void(x.r_if(d.mlp, {x.m.mlp_out.recv, Buf::ln2_out}).w_if(d.mlp, {Buf::d_mlp}));
    case Stage::aux_loss: return void(x.r({Buf::gate_stats}));
    default: return;
  }
}

void mlp_side(Io& x, Stage s, bool fwd) {
  const Buf input = x.sp || x.bf16 ? Buf::mlp_in : Buf::ln2_out;
  const Buf d_output = x.sp ? x.m.d_mlp_out.recv : Buf::d_mlp;
  switch (s) {
    case Stage::mlp:
      if (fwd)
        return void(x.r({Buf::ln2_out, input})
                        .w_if(x.bf16 && !x.sp, {Buf::mlp_in})
                        .w({Buf::mlp_fc1, Buf::mlp_out})
                        .w_cd(Buf::mlp_act, Buf::mlp_act_bf16));
      return void(x.r({d_output, Buf::mlp_fc1})
                      .w_if(x.bf16, {Buf::d_mlp_bf16})
                      .w({Buf::d_mlp_act, Buf::d_mlp_in})
                      .w_cd(Buf::d_mlp_fc1, Buf::d_mlp_fc1_bf16));
    case Stage::mlp_wgrad:
      return void(x.r({d_output, input})
                      .r_if(x.bf16, {Buf::d_mlp_bf16})
                      .r_cd(Buf::mlp_act, Buf::mlp_act_bf16)
                      .r_cd(Buf::d_mlp_fc1, Buf::d_mlp_fc1_bf16));
    default: return;
  }
}
}  // namespace

StageIO stage_io(const LayerDims& d, Stage s, Dir dir) {
  Io x(d);
  const bool fwd = dir == Dir::fwd;
  attention_side(x, s, fwd);
  moe_side(x, s, fwd);
  mlp_side(x, s, fwd);
  return std::move(x.io);
}

bool stage_io_checking() {
  static const bool on = [] {
    const char* v = std::getenv("AMPIPE_CHECK_STAGE_IO");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

}  // namespace ampipe::model
