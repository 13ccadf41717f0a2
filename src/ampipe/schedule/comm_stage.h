// The communication stages of a layer step: the collectives between the blocks' compute stages (model/stage.h),
// defined here once: their names, the lane each runs on, what each moves (kind, process group, the buffers at its
// seams: model::Seams) and its bytes. The blocks never see them: a block writes a seam's send buffer and reads its
// receive buffer, and the Plan's collective task moves the bytes between them (docs/plan.md, "Stages").
#pragma once

#include <cstdint>

#include "ampipe/comm/backend.h"
#include "ampipe/comm/lane.h"
#include "ampipe/comm/layout.h"
#include "ampipe/model/buffers.h"
#include "ampipe/model/layer_dims.h"
#include "ampipe/model/seams.h"
#include "ampipe/model/stage.h"

namespace ampipe::schedule {

enum class CommStage : uint8_t {
  capacity,     // --moe-no-drop with ep > 1: all-gather of each EP rank's required capacity
  tp_capacity,  // a dropless router with sequence parallelism (every tp rank routes its own rows): the all-gather
                // over tp of the EP ranks' required capacities (so the largest is agreed over EP x TP)
  dispatch,     // all-to-all of the capacity slots to the experts' owners (bwd: their gradient back)
  combine,      // all-to-all of the expert outputs back to the tokens' owners (bwd: their gradient to the experts)
  // tensor parallelism (tp > 1): the collectives of Megatron's column- and row-parallel linears (forward and
  // backward are adjoints: all-gather <-> reduce-scatter, all-reduce <-> nothing)
  tp_qkv_in,      // fwd, sequence parallel: all-gather of the chunk's LN1 rows; bwd: reduce-scatter (sequence
                  // parallel) or all-reduce of the QKV input gradient
  tp_proj_out,    // fwd: reduce-scatter (sequence parallel) or all-reduce of the out-projection's partial sums; bwd,
                  // sequence parallel: all-gather of its output gradient
  tp_aux_stats,   // sequence parallel: all-reduce of the gate statistics over the tp ranks' rows
  tp_expert_in,   // fwd, sequence parallel: all-gather of the received slots; bwd: reduce-scatter (sequence parallel)
                  // or all-reduce of the experts' input gradient
  tp_expert_out,  // fwd: reduce-scatter (sequence parallel) or all-reduce of the experts' partial outputs; bwd,
                  // sequence parallel: all-gather of their gradient
  tp_mlp_in,      // the dense MLP's input: as tp_qkv_in
  tp_mlp_out,     // the dense MLP's output: as tp_proj_out
  // context parallelism (cp > 1, model/context_parallel.h)
  cp_ring,       // one ring step (piece t): fwd: K, V of slot t-1 to the next cp rank, slot t from the previous;
                 // bwd: the dK, dV partial sums of slot t, one hop towards their owner
  cp_aux_stats,  // all-reduce of the gate statistics over the cp ranks' rows
};
inline constexpr int kNumCommStages = int(CommStage::cp_aux_stats) + 1;

const char* comm_stage_name(CommStage s);

// What a Plan task runs: one of the blocks' compute stages or one of the communication stages above. Compares
// equal to either kind of stage, so `task.stage == Stage::attention` and `task.stage == CommStage::dispatch` read
// as they say.
class TaskStage {
 public:
  constexpr TaskStage(model::Stage s) : comm_(false), v_(uint8_t(s)) {}  // NOLINT: implicit by design
  constexpr TaskStage(CommStage s) : comm_(true), v_(uint8_t(s)) {}      // NOLINT
  constexpr bool is_comm() const { return comm_; }
  model::Stage compute() const;  // stops (AMPIPE_CHECK) for a communication stage
  CommStage comm() const;        // stops for a compute stage
  const char* name() const;
  friend constexpr bool operator==(TaskStage a, TaskStage b) = default;

 private:
  bool comm_;
  uint8_t v_;
};

// The lane a stage runs on: compute stages on the compute lane, a collective on its group's lane.
comm::Lane lane_of(TaskStage s);

// What a communication stage does in direction `dir` for a layer of these dims: the collective kind, the process
// group, and the seam buffers it reads (send) and writes (recv) (model::Seams, chosen once per layout).
struct CommIO {
  comm::CollKind kind = comm::CollKind::all_to_all;
  comm::GroupKind group = comm::GroupKind::ep;
  model::Buf send{}, recv{};
};
CommIO comm_io(const model::LayerDims& d, const model::Seams& seams, CommStage s, model::Dir dir);

// Bytes one rank sends in a collective of chunk c at the planned capacity (all-to-all: all ep blocks, including the
// one it keeps; capacity all-gather: its one float; tensor-parallel all-gather: its block; reduce-scatter and
// all-reduce: the whole buffer it reduces). A pipe-experts piece's all-to-all sends ep*experts*slots*h elements;
// a ring step the K and V (or their gradients) of this rank's T rows.
double comm_bytes(const model::LayerDims& d, CommStage s, model::Dir dir, int piece = -1);

}  // namespace ampipe::schedule
