#include "ampipe/schedule/comm_stage.h"

#include <array>

#include "ampipe/core/error.h"

namespace ampipe::schedule {

using comm::CollKind;
using comm::GroupKind;
using comm::Lane;
using model::Dir;

namespace {
struct CommStageInfo {
  const char* name;
  Lane lane;
};
// In CommStage order.
constexpr std::array<CommStageInfo, kNumCommStages> kInfo = {{
    {"capacity", Lane::ep},
    {"tp_capacity", Lane::tp},
    {"dispatch", Lane::ep},
    {"combine", Lane::ep},
    {"tp_qkv_in", Lane::tp},
    {"tp_proj_out", Lane::tp},
    {"tp_aux_stats", Lane::tp},
    {"tp_expert_in", Lane::etp},
    {"tp_expert_out", Lane::etp},
    {"tp_mlp_in", Lane::tp},
    {"tp_mlp_out", Lane::tp},
    {"cp_ring", Lane::cp},
    {"cp_aux_stats", Lane::cp},
}};
}  // namespace

const char* comm_stage_name(CommStage s) { return kInfo[size_t(s)].name; }

model::Stage TaskStage::compute() const {
  AMPIPE_CHECK(!comm_, "stage {} is a communication stage, not a compute stage", name());
  return model::Stage(v_);
}

CommStage TaskStage::comm() const {
  AMPIPE_CHECK(comm_, "stage {} is a compute stage, not a communication stage", name());
  return CommStage(v_);
}

const char* TaskStage::name() const {
  return comm_ ? comm_stage_name(CommStage(v_)) : model::stage_name(model::Stage(v_));
}

Lane lane_of(TaskStage s) { return s.is_comm() ? kInfo[size_t(s.comm())].lane : Lane::compute; }

CommIO comm_io(const model::LayerDims& d, const model::Seams& m, CommStage s, Dir dir) {
  const bool fwd = dir == Dir::fwd;
  // Megatron's linears: all-gather and reduce-scatter with sequence parallelism, else an all-reduce where a sum
  // is needed (the other direction has no collective without it)
  const CollKind reduce = d.sp ? CollKind::reduce_scatter : CollKind::all_reduce;
  auto io = [](CollKind k, GroupKind g, model::Seam seam) { return CommIO{k, g, seam.send, seam.recv}; };
  switch (s) {
    case CommStage::capacity: return io(CollKind::all_gather, GroupKind::ep, m.capacity);
    case CommStage::tp_capacity: return io(CollKind::all_gather, GroupKind::tp, m.capacity_tp);
    case CommStage::dispatch: return io(CollKind::all_to_all, GroupKind::ep, fwd ? m.dispatch : m.d_dispatch);
    case CommStage::combine: return io(CollKind::all_to_all, GroupKind::ep, fwd ? m.combine : m.d_combine);
    case CommStage::tp_qkv_in:
      return fwd ? io(CollKind::all_gather, GroupKind::tp, m.qkv_in) : io(reduce, GroupKind::tp, m.d_qkv_in);
    case CommStage::tp_proj_out:
      return fwd ? io(reduce, GroupKind::tp, m.proj_out) : io(CollKind::all_gather, GroupKind::tp, m.d_proj_out);
    case CommStage::tp_aux_stats: return io(CollKind::all_reduce, GroupKind::tp, m.gate_stats);
    case CommStage::tp_expert_in:
      return fwd ? io(CollKind::all_gather, GroupKind::tp, m.expert_in) : io(reduce, GroupKind::tp, m.d_expert_in);
    case CommStage::tp_expert_out:
      return fwd ? io(reduce, GroupKind::tp, m.expert_out) : io(CollKind::all_gather, GroupKind::tp, m.d_expert_out);
    case CommStage::tp_mlp_in:
      return fwd ? io(CollKind::all_gather, GroupKind::tp, m.mlp_in) : io(reduce, GroupKind::tp, m.d_mlp_in);
    case CommStage::tp_mlp_out:
      return fwd ? io(reduce, GroupKind::tp, m.mlp_out) : io(CollKind::all_gather, GroupKind::tp, m.d_mlp_out);
    case CommStage::cp_ring: return io(CollKind::send_recv, GroupKind::cp, fwd ? m.kv : m.dkv);
    case CommStage::cp_aux_stats: return io(CollKind::all_reduce, GroupKind::cp, m.gate_stats);
  }
  AMPIPE_CHECK(false, "unknown communication stage {}", int(s));
}

double comm_bytes(const model::LayerDims& d, CommStage s, Dir dir, int piece) {
  const double e = double(dtype_size(d.cd)), f = 4, h = double(d.h);
  // one ring step (piece = step): the K and V of this rank's rows, or their gradient sums (compute dtype)
  if (s == CommStage::cp_ring) return double(d.T) * 2 * double(d.kvl) * e;
  // slots of one a2a block set: all L experts and C slots of a chunk, or one piece's
  const double slots =
      piece >= 0 ? double(d.ep * d.pieces[size_t(piece)].experts * d.pieces[size_t(piece)].slots) : double(d.E * d.C);
  const bool fwd = dir == Dir::fwd;
  switch (s) {
    case CommStage::dispatch:
    case CommStage::combine: return slots * h * e;
    case CommStage::capacity: return fwd ? 4 : 0;
    case CommStage::tp_capacity: return fwd ? 4.0 * double(d.ep) : 0;
    // all-gather: this rank's block; reduce-scatter: the t blocks it reduces; all-reduce: the whole buffer
    // the attention side's reductions: fp32, or bf16 with sequence parallelism in bf16 (the all-reduce stays fp32)
    case CommStage::tp_qkv_in:  // fwd: gather the LN1 rows (compute dtype); bwd: reduce the input gradient
      return fwd ? (d.sp ? double(d.Scl) * h * e : 0) : double(d.Sc) * h * (d.sp ? e : f);
    case CommStage::tp_proj_out:  // fwd: reduce the partial sums; bwd: gather the output gradient (compute dtype)
      return fwd ? double(d.Sc) * h * (d.sp ? e : f) : (d.sp ? double(d.Scl) * h * e : 0);
    case CommStage::tp_expert_in:  // fwd: gather the received slots; bwd: reduce the input gradient
      return fwd ? (d.sp ? slots * h * e : 0) : (d.sp ? double(d.tp) : 1.0) * slots * h * e;
    case CommStage::tp_expert_out:  // fwd: reduce the partial outputs; bwd: gather their gradient
      return fwd ? (d.sp ? double(d.tp) : 1.0) * slots * h * e : (d.sp ? slots * h * e : 0);
    case CommStage::tp_aux_stats:
    case CommStage::cp_aux_stats: return fwd ? double(2 * d.E + 2) * f : 0;
    // the dense MLP's: the input rows gathered in the compute dtype, the reductions and the gradient's gather fp32
    case CommStage::tp_mlp_in: return fwd ? (d.sp ? double(d.Scl) * h * e : 0) : double(d.Sc) * h * f;
    case CommStage::tp_mlp_out: return fwd ? double(d.Sc) * h * f : (d.sp ? double(d.Scl) * h * f : 0);
    case CommStage::cp_ring: break;
  }
  return 0;
}

}  // namespace ampipe::schedule
