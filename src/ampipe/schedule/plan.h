// The Plan: one layer step as data (docs/plan.md). A list of tasks in issue order. Every task names its stage,
// direction, chunk (and piece), lane and the tasks it depends on; a compute task carries its FLOPs and the bytes it
// moves in memory, a communication task its collective (kind, process group, the buffers it reads and writes,
// bytes). The memory the step uses is planned with it (Plan::memory). The same Plan is run by the executor, printed
// by `ampipe plan`, drawn in the trace and checked by tests ("dispatch(0) is issued before attention(1) starts").
// Builders are pure functions of the layer config and the degree: no MPI, no parameters, no clocks.
//
// Forward, degree M (chunk c = sequence rows [c*s/M, (c+1)*s/M)):
//   for c: ln1_qkv(c) -> attention(c) (q rows of c against K, V of rows [0, (c+1)*s/M): all a causal chunk sees,
//          produced by ln1_qkv(0..c)) -> out_proj(c) -> residual_ln2(c) -> gate(c) -> dispatch(c) issued on the
//          ep lane
//   for c: experts(c) (waits for dispatch(c) only) -> combine(c) issued
//   for c: weighted_sum(c) (waits for combine(c) only)
//   aux_loss (the load-balancing loss from the chunks' summed gate statistics)
// So dispatch(c) hides behind attention(c+1).., and combine(c) behind experts(c+1).
// Backward runs the chunks in reverse order in the same three phases; attention.bwd(c) sums dK and dV into the
// rows of chunks 0..c, and ln1_qkv.bwd(c) runs as soon as chunk c's rows have every contribution. The per-chunk
// backward tasks of the GEMM stages compute input gradients; the weight gradients run once over all chunks:
// expert_wgrad after the last experts.bwd (hiding the reverse dispatches; not with --moe-no-drop, whose chunks'
// slots are not packed), attention_wgrad at the end.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ampipe/comm/backend.h"
#include "ampipe/comm/lane.h"
#include "ampipe/comm/layout.h"
#include "ampipe/model/buffers.h"
#include "ampipe/model/layer_config.h"
#include "ampipe/model/layer_dims.h"
#include "ampipe/model/stage.h"
#include "ampipe/schedule/comm_stage.h"

namespace ampipe::schedule {

using comm::Lane;  // lanes belong to comm/
using model::Buf;
using model::Dir;
using model::Stage;

using comm::CollKind;  // what a collective does: comm/backend.h
using comm::coll_kind_name;

// What a communication task moves: `send` of this rank to `recv`, over `group` (comm_io: the seam buffers).
struct CollectiveSpec {
  CollKind kind = CollKind::all_to_all;
  comm::GroupKind group = comm::GroupKind::ep;
  Buf send{}, recv{};
  double bytes = 0;  // bytes this rank sends, at the planned capacity
  // Slots of ring-step buffers (context parallelism's cp_kv, cp_dkv, cp_dkv_recv); -1: the task's chunk and piece
  // select the view (Layer::buffer)
  int send_slot = -1, recv_slot = -1;
  // With slots: rows [slot_row0, slot_row0 + slot_rows) of both slots (-1: the whole slot), e.g. one chunk's K, V
  // rows of a ring slot
  int64_t slot_row0 = 0, slot_rows = -1;
};

struct Task {
  uint32_t id = 0;
  Dir dir = Dir::fwd;
  TaskStage stage = Stage::ln1_qkv;  // a compute stage (model/stage.h) or a communication stage (comm_stage.h)
  int layer = 0;
  int chunk = -1;  // -1: the whole sequence
  // -1: the whole chunk. Otherwise, by stage:
  //   experts, dispatch, combine, tp_expert_*: the chunk's piece, an index into LayerDims::pieces (pipe-experts'
  //     (local expert, slice) pieces, or --ampipe-tp-sp-comm-overlap's local experts)
  //   attention (context parallel): the ring slot t whose keys it reads (0: this rank's own)
  //   cp_ring: forward 2(t-1) + h, step t of half h of the chunk's K, V rows; backward the step t of the dK, dV sums
  //   cp_dkv_reduce: the step t whose received sum it adds (0: the last one, into this rank's own dK, dV)
  int piece = -1;
  Lane lane = Lane::compute;
  std::vector<uint32_t> deps;               // tasks that must finish before this one starts; never a whole lane
  std::optional<CollectiveSpec> collective;  // communication tasks only
  double flops = 0;  // compute: FLOPs (closed form, docs/plan.md)
  double bytes = 0;  // compute: bytes read and written in memory (estimate); communication: bytes sent
  bool is_collective() const { return collective.has_value(); }
  // "L3.fwd.dispatch.c1" (".p2" appended for a piece): the one name the executor, the trace and the tests use.
  std::string name() const;
};

struct Plan {
  model::LayerDims dims;
  std::vector<Task> tasks;     // in issue order
  model::BufferLayout memory;  // every buffer of the step, sized once

  // Index of the first task with this direction, stage and chunk; -1 if absent.
  int index_of(Dir d, TaskStage s, int chunk) const;
  const Task& find(Dir d, TaskStage s, int chunk) const;  // throws if absent
  double flops() const;                                 // all compute tasks
  double collective_bytes(CollKind k) const;            // bytes this rank sends in collectives of kind k
  // Planned bytes of a stack of `num_layers` such layers: each its saved region, plus one shared region.
  size_t planned_bytes(int num_layers = 1) const {
    return size_t(num_layers) * memory.saved_bytes + memory.shared_bytes;
  }
};

// The forward and backward Plan of one layer (cfg.layer_index names its tasks) with AMPipe degree M (M = 1 is the
// baseline, no split). The all-to-all tasks are emitted for ep = 1 too (the executor runs them as local copies), so
// every layout runs the same Plan.
Plan build_layer_plan(const model::LayerConfig& cfg, int M);

}  // namespace ampipe::schedule
