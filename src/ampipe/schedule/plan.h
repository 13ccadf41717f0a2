// The Plan: one layer step as data (DESIGN.md section 3). A list of tasks in issue order, each with a stage, a
// chunk, a lane and the tasks it depends on. The same Plan is run by the executor, drawn in the trace and
// checked by tests ("dispatch(0) is issued before attention(1) starts"). Builders are pure functions of the
// shape and flags: no MPI, no clocks.
//
// Forward, degree M (DESIGN.md section 2; chunk c = sequence rows [c*s/M, (c+1)*s/M)):
//   for c: ln1_qkv(c) -> attention(c) (q rows of c, K and V of rows [0, (c+1)*s/M): all a causal chunk sees)
//          -> out_proj(c) -> bdal(c) -> gate(c) -> dispatch(c) issued on the ep lane
//   for c: experts(c) (waits for dispatch(c) only) -> combine_a2a(c) issued
//   for c: combine(c) (waits for combine_a2a(c) only)
//   aux_loss (the load-balancing loss from the chunks' summed gate statistics)
// So dispatch(c) hides behind attention(c+1).., and combine_a2a(c) behind experts(c+1).
// Backward runs the chunks in reverse order in the same three phases; attention_bwd(c) sums dK and dV, and
// ln1_qkv_bwd(c) runs as soon as chunk c's rows have every contribution (after attention_bwd(c)).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampipe/comm/lane.h"

namespace ampipe::schedule {

using comm::Lane;  // lanes belong to comm/
enum class Dir : uint8_t { fwd, bwd };

enum class Stage : uint8_t {
  // forward
  ln1_qkv,      // LN1 and the QKV projection of the chunk's rows
  attention,    // chunk's q rows against the full K, V
  out_proj,     // attention output projection
  bdal,         // dropout + residual add + LN2
  gate,         // router, capacity for the chunk's tokens, dispatch buffer [E, C_c, h]
  capacity,     // --moe-no-drop with ep > 1: all-gather of the chunk's required capacities (ep lane)
  gate_assign,  // --moe-no-drop with ep > 1: slots for the agreed (largest) capacity, dispatch buffer
  dispatch,     // all-to-all: capacity slots to the experts' owners (ep lane)
  experts,      // local experts on the received slots
  combine_a2a,  // all-to-all: expert outputs back to the tokens' owners (ep lane)
  combine,      // weighted combine + dropout + residual: the chunk's rows of y
  aux_loss,     // load-balancing loss from the summed per-chunk statistics
  // backward (mirror images)
  aux_loss_bwd,
  combine_bwd,      // dropout and combine backward: expert-output grads [E, C_c, h], gate-weight grads
  combine_a2a_bwd,  // all-to-all: expert-output grads to the experts' owners (reverse of combine_a2a)
  experts_bwd,      // expert backward, expert weight grads
  dispatch_bwd,     // all-to-all: expert-input grads back to the tokens' owners (reverse of dispatch)
  gate_bwd,         // dispatch and router backward -> grad of LN2's output
  bdal_bwd,         // LN2, residual and dropout backward
  out_proj_bwd,
  attention_bwd,  // dq of the chunk; dK, dV accumulated over chunks
  ln1_qkv_bwd,
};

const char* stage_name(Stage s);
bool is_collective(Stage s);
Dir stage_dir(Stage s);

struct Task {
  uint32_t id = 0;
  Stage stage = Stage::ln1_qkv;
  int layer = 0;
  int chunk = -1;  // -1: the whole sequence
  Lane lane = Lane::compute;
  std::vector<uint32_t> deps;  // tasks that must finish before this one starts; never a whole lane
  // "L3.fwd.dispatch.c1": the one name the executor, the trace and the tests use.
  std::string name() const;
};

struct Plan {
  int degree = 1;  // M
  std::vector<Task> tasks;  // in issue order
  // First task with this stage and chunk (and direction implied by the stage); throws if absent.
  const Task& find(Stage s, int chunk) const;
  int index_of(Stage s, int chunk) const;
};

struct PlanOptions {
  // --moe-no-drop with ep > 1: the EP ranks agree on each chunk's capacity (the largest need) before dispatch,
  // so the gate is split into gate -> capacity (collective) -> gate_assign. This serialises the chunk's gate
  // with its EP group, which is why --moe-no-drop costs overlap.
  bool agree_capacity = false;
};

// Builds the forward and backward Plan of one layer with AMPipe degree M (M = 1 is the baseline, no split).
// The all-to-all tasks are emitted for ep = 1 too (the executor runs them as local copies), so every layout
// runs the same Plan.
Plan build_layer_plan(int layer, int M, const PlanOptions& opts = {});

// The options a layer configuration needs (agree_capacity for --moe-no-drop with expert parallelism).
struct LayerPlanFlags {
  bool moe_no_drop = false;
  int expert_model_parallel_size = 1;
};
inline PlanOptions plan_options(const LayerPlanFlags& f) {
  return {.agree_capacity = f.moe_no_drop && f.expert_model_parallel_size > 1};
}

}  // namespace ampipe::schedule
