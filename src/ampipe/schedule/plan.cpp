#include "ampipe/schedule/plan.h"

#include <fmt/format.h>

#include "ampipe/core/error.h"

namespace ampipe::schedule {

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::ln1_qkv: return "ln1_qkv";
    case Stage::attention: return "attention";
    case Stage::out_proj: return "out_proj";
    case Stage::bdal: return "bdal";
    case Stage::gate: return "gate";
    case Stage::capacity: return "capacity";
    case Stage::gate_assign: return "gate_assign";
    case Stage::dispatch: return "dispatch";
    case Stage::experts: return "experts";
    case Stage::combine_a2a: return "combine_a2a";
    case Stage::combine: return "combine";
    case Stage::aux_loss: return "aux_loss";
    case Stage::aux_loss_bwd: return "aux_loss";
    case Stage::combine_bwd: return "combine";
    case Stage::combine_a2a_bwd: return "combine_a2a";
    case Stage::experts_bwd: return "experts";
    case Stage::dispatch_bwd: return "dispatch";
    case Stage::gate_bwd: return "gate";
    case Stage::bdal_bwd: return "bdal";
    case Stage::out_proj_bwd: return "out_proj";
    case Stage::attention_bwd: return "attention";
    case Stage::ln1_qkv_bwd: return "ln1_qkv";
  }
  return "?";
}

bool is_collective(Stage s) {
  switch (s) {
    case Stage::dispatch:
    case Stage::capacity:
    case Stage::combine_a2a:
    case Stage::combine_a2a_bwd:
    case Stage::dispatch_bwd: return true;
    default: return false;
  }
}

Dir stage_dir(Stage s) { return s >= Stage::aux_loss_bwd ? Dir::bwd : Dir::fwd; }

std::string Task::name() const {
  std::string n = fmt::format("L{}.{}.{}", layer, stage_dir(stage) == Dir::fwd ? "fwd" : "bwd", stage_name(stage));
  if (chunk >= 0) n += fmt::format(".c{}", chunk);
  return n;
}

int Plan::index_of(Stage s, int chunk) const {
  for (size_t i = 0; i < tasks.size(); ++i)
    if (tasks[i].stage == s && tasks[i].chunk == chunk) return int(i);
  return -1;
}

const Task& Plan::find(Stage s, int chunk) const {
  const int i = index_of(s, chunk);
  AMPIPE_CHECK(i >= 0, "plan has no task {} chunk {}", stage_name(s), chunk);
  return tasks[size_t(i)];
}

namespace {
struct Builder {
  Plan plan;
  int layer;
  uint32_t add(Stage s, int chunk, std::vector<uint32_t> deps) {
    Task t;
    t.id = uint32_t(plan.tasks.size());
    t.stage = s;
    t.layer = layer;
    t.chunk = chunk;
    t.lane = is_collective(s) ? Lane::ep : Lane::compute;
    t.deps = std::move(deps);
    plan.tasks.push_back(std::move(t));
    return plan.tasks.back().id;
  }
};
}  // namespace

Plan build_layer_plan(int layer, int M, const PlanOptions& opts) {
  AMPIPE_CHECK(M >= 1, "degree {}", M);
  Builder b{{}, layer};
  b.plan.degree = M;
  const size_t nM = static_cast<size_t>(M);
  std::vector<uint32_t> dispatch(nM), combine_a2a(nM), combine(nM), gate(nM);
  // Forward.
  // LN1 + QKV per chunk: chunk c's attention needs K and V of rows [0, (c+1)*s/M) only (causality), so chunk
  // 0's dispatch is issued after one chunk's QKV, not the whole sequence's.
  std::vector<uint32_t> qkv;
  for (int c = 0; c < M; ++c) {
    qkv.push_back(b.add(Stage::ln1_qkv, c, {}));
    const uint32_t att = b.add(Stage::attention, c, qkv);
    const uint32_t proj = b.add(Stage::out_proj, c, {att});
    const uint32_t bdal = b.add(Stage::bdal, c, {proj});
    gate[size_t(c)] = b.add(Stage::gate, c, {bdal});
    if (opts.agree_capacity) {
      const uint32_t cap = b.add(Stage::capacity, c, {gate[size_t(c)]});
      gate[size_t(c)] = b.add(Stage::gate_assign, c, {cap});
    }
    dispatch[size_t(c)] = b.add(Stage::dispatch, c, {gate[size_t(c)]});
  }
  for (int c = 0; c < M; ++c) {
    const uint32_t ex = b.add(Stage::experts, c, {dispatch[size_t(c)]});
    combine_a2a[size_t(c)] = b.add(Stage::combine_a2a, c, {ex});
  }
  for (int c = 0; c < M; ++c) combine[size_t(c)] = b.add(Stage::combine, c, {combine_a2a[size_t(c)], gate[size_t(c)]});
  b.add(Stage::aux_loss, -1, gate);
  // Backward: chunks in reverse order, three phases.
  const uint32_t aux_bwd = b.add(Stage::aux_loss_bwd, -1, {});
  std::vector<uint32_t> ca_bwd(nM), d_bwd(nM), att_bwd;  // att_bwd: chunks M-1 .. c so far
  for (int c = M - 1; c >= 0; --c) {
    const uint32_t cb = b.add(Stage::combine_bwd, c, {combine[size_t(c)]});
    ca_bwd[size_t(c)] = b.add(Stage::combine_a2a_bwd, c, {cb});
  }
  for (int c = M - 1; c >= 0; --c) {
    const uint32_t eb = b.add(Stage::experts_bwd, c, {ca_bwd[size_t(c)]});
    d_bwd[size_t(c)] = b.add(Stage::dispatch_bwd, c, {eb});
  }
  for (int c = M - 1; c >= 0; --c) {
    const uint32_t gb = b.add(Stage::gate_bwd, c, {d_bwd[size_t(c)], aux_bwd});
    const uint32_t bb = b.add(Stage::bdal_bwd, c, {gb});
    const uint32_t pb = b.add(Stage::out_proj_bwd, c, {bb});
    att_bwd.push_back(b.add(Stage::attention_bwd, c, {pb}));
    // Rows of chunk c receive dK, dV from the attention backward of chunks c..M-1, all done by now.
    b.add(Stage::ln1_qkv_bwd, c, att_bwd);
  }
  return std::move(b.plan);
}

}  // namespace ampipe::schedule
