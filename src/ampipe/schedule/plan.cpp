#include "ampipe/schedule/plan.h"

#include <fmt/format.h>

#include <array>

#include "ampipe/core/error.h"

namespace ampipe::schedule {

const char* coll_kind_name(CollKind k) {
  switch (k) {
    case CollKind::all_to_all: return "all_to_all";
    case CollKind::all_gather: return "all_gather";
    case CollKind::reduce_scatter: return "reduce_scatter";
    case CollKind::all_reduce: return "all_reduce";
    case CollKind::send_recv: return "send_recv";
  }
  return "?";
}

namespace {
// The stage-to-lane table, in Stage order.
constexpr std::array<Lane, model::kNumStages> kLane = {
    Lane::compute,  // ln1_qkv
    Lane::compute,  // attention
    Lane::compute,  // out_proj
    Lane::compute,  // residual_ln2
    Lane::compute,  // attention_wgrad
    Lane::compute,  // gate
    Lane::ep,       // capacity
    Lane::compute,  // gate_assign
    Lane::ep,       // dispatch
    Lane::compute,  // experts
    Lane::compute,  // expert_wgrad
    Lane::ep,       // combine
    Lane::compute,  // weighted_sum
    Lane::compute,  // aux_loss
};
}  // namespace

Lane lane_of(Stage s) { return kLane[size_t(s)]; }

std::string Task::name() const {
  std::string n = fmt::format("L{}.{}.{}", layer, model::dir_name(dir), model::stage_name(stage));
  if (chunk >= 0) n += fmt::format(".c{}", chunk);
  if (piece >= 0) n += fmt::format(".p{}", piece);
  return n;
}

int Plan::index_of(Dir d, Stage s, int chunk) const {
  for (size_t i = 0; i < tasks.size(); ++i)
    if (tasks[i].dir == d && tasks[i].stage == s && tasks[i].chunk == chunk) return int(i);
  return -1;
}

const Task& Plan::find(Dir d, Stage s, int chunk) const {
  const int i = index_of(d, s, chunk);
  AMPIPE_CHECK(i >= 0, "plan has no task {}.{} chunk {}", model::dir_name(d), model::stage_name(s), chunk);
  return tasks[size_t(i)];
}

double Plan::flops() const {
  double f = 0;
  for (const Task& t : tasks) f += t.flops;
  return f;
}

double Plan::collective_bytes(CollKind k) const {
  double b = 0;
  for (const Task& t : tasks)
    if (t.is_collective() && t.collective->kind == k) b += t.bytes;
  return b;
}

namespace {
struct Builder {
  Plan plan;
  int layer;
  uint32_t add(Dir d, Stage s, int chunk, std::vector<uint32_t> deps, int piece = -1) {
    Task t;
    t.id = uint32_t(plan.tasks.size());
    t.dir = d;
    t.stage = s;
    t.layer = layer;
    t.chunk = chunk;
    t.piece = piece;
    t.lane = lane_of(s);
    t.deps = std::move(deps);
    t.flops = model::stage_flops(plan.dims, s, d, chunk, piece);
    t.bytes = model::stage_bytes(plan.dims, s, d, chunk, piece);
    plan.tasks.push_back(std::move(t));
    return plan.tasks.back().id;
  }
  uint32_t collective(Dir d, Stage s, int chunk, std::vector<uint32_t> deps, CollKind kind, Buf send, Buf recv,
                      int piece = -1) {
    const uint32_t id = add(d, s, chunk, std::move(deps), piece);
    Task& t = plan.tasks.back();
    t.collective =
        CollectiveSpec{kind, comm::GroupKind::ep, send, recv, model::collective_bytes(plan.dims, s, d, piece)};
    t.bytes = t.collective->bytes;
    return id;
  }
};
}  // namespace

Plan build_layer_plan(const model::LayerConfig& cfg, int M) {
  Builder b{{}, cfg.layer_index};
  b.plan.dims = model::LayerDims::make(cfg, M);
  b.plan.memory = model::BufferLayout::make(b.plan.dims);
  const model::LayerDims& d = b.plan.dims;
  const size_t nM = static_cast<size_t>(M);
  // In fp32 the combine all-to-all receives straight into the weighted sum's input; bf16 (and pipe-experts' piece
  // layout) lands in a staging buffer.
  const Buf combine_recv = d.cd == DType::f32 && !d.pipe_experts() ? Buf::expert_y : Buf::combine_recv;
  // The pieces of a chunk: pipe-experts' (local expert, slice) pieces, or the whole chunk as piece -1.
  std::vector<int> pieces;
  for (size_t p = 0; p < d.pieces.size(); ++p) pieces.push_back(int(p));
  if (pieces.empty()) pieces.push_back(-1);
  const size_t nP = pieces.size();
  std::vector<std::vector<uint32_t>> dispatch(nM, std::vector<uint32_t>(nP)), combine = dispatch,
                                                                            combine_bwd = dispatch,
                                                                            dispatch_bwd = dispatch;
  std::vector<uint32_t> weighted(nM), gate(nM);
  // Forward. LN1 + QKV per chunk: chunk c's attention needs K and V of rows [0, (c+1)*s/M) only (causality), so
  // chunk 0's dispatch is issued after one chunk's QKV, not the whole sequence's.
  std::vector<uint32_t> qkv;
  for (int c = 0; c < M; ++c) {
    const size_t i = size_t(c);
    qkv.push_back(b.add(Dir::fwd, Stage::ln1_qkv, c, {}));
    const uint32_t att = b.add(Dir::fwd, Stage::attention, c, qkv);
    const uint32_t proj = b.add(Dir::fwd, Stage::out_proj, c, {att});
    const uint32_t res = b.add(Dir::fwd, Stage::residual_ln2, c, {proj});
    gate[i] = b.add(Dir::fwd, Stage::gate, c, {res});
    if (d.agree_capacity) {
      const uint32_t cap = b.collective(Dir::fwd, Stage::capacity, c, {gate[i]}, CollKind::all_gather,
                                        Buf::capacity_need, Buf::capacity_all);
      gate[i] = b.add(Dir::fwd, Stage::gate_assign, c, {cap});
    }
    for (size_t q = 0; q < nP; ++q)  // pipe-experts: every piece's dispatch issued at once, in piece order
      dispatch[i][q] = b.collective(Dir::fwd, Stage::dispatch, c, {gate[i]}, CollKind::all_to_all,
                                    Buf::dispatch_send, Buf::dispatch_recv, pieces[q]);
  }
  for (int c = 0; c < M; ++c)
    for (size_t q = 0; q < nP; ++q) {  // piece q's experts wait for its own dispatch only
      const uint32_t ex = b.add(Dir::fwd, Stage::experts, c, {dispatch[size_t(c)][q]}, pieces[q]);
      combine[size_t(c)][q] = b.collective(Dir::fwd, Stage::combine, c, {ex}, CollKind::all_to_all,
                                           Buf::combine_send, combine_recv, pieces[q]);
    }
  for (int c = 0; c < M; ++c) {
    std::vector<uint32_t> deps = combine[size_t(c)];
    deps.push_back(gate[size_t(c)]);
    weighted[size_t(c)] = b.add(Dir::fwd, Stage::weighted_sum, c, deps);
  }
  const uint32_t aux = b.add(Dir::fwd, Stage::aux_loss, -1, gate);
  // Backward: chunks in reverse order, three phases. (The aux loss has no backward task: each chunk's gate
  // backward adds its gradient from the forward's totals, so it depends on aux_loss.)
  std::vector<uint32_t> experts_bwd, attention_bwd;  // attention_bwd: chunks M-1 .. c so far
  std::vector<uint32_t> input_grads;  // the tasks whose rows the attention weight gradients read
  for (int c = M - 1; c >= 0; --c) {
    const uint32_t ws = b.add(Dir::bwd, Stage::weighted_sum, c, {weighted[size_t(c)]});
    for (size_t q = 0; q < nP; ++q)
      combine_bwd[size_t(c)][q] = b.collective(Dir::bwd, Stage::combine, c, {ws}, CollKind::all_to_all,
                                               Buf::combine_bwd_send, Buf::combine_bwd_recv, pieces[q]);
  }
  for (int c = M - 1; c >= 0; --c)
    for (size_t q = 0; q < nP; ++q) {
      experts_bwd.push_back(b.add(Dir::bwd, Stage::experts, c, {combine_bwd[size_t(c)][q]}, pieces[q]));
      dispatch_bwd[size_t(c)][q] = b.collective(Dir::bwd, Stage::dispatch, c, {experts_bwd.back()},
                                                CollKind::all_to_all, Buf::dispatch_bwd_send,
                                                Buf::dispatch_bwd_recv, pieces[q]);
    }
  // The expert weight gradients of all chunks in one pass: issued while the reverse dispatches are in flight.
  if (d.defer_expert_wgrad) b.add(Dir::bwd, Stage::expert_wgrad, -1, experts_bwd);
  for (int c = M - 1; c >= 0; --c) {
    std::vector<uint32_t> deps = dispatch_bwd[size_t(c)];
    deps.push_back(aux);
    const uint32_t gb = b.add(Dir::bwd, Stage::gate, c, deps);
    const uint32_t rb = b.add(Dir::bwd, Stage::residual_ln2, c, {gb});
    const uint32_t pb = b.add(Dir::bwd, Stage::out_proj, c, {rb});
    attention_bwd.push_back(b.add(Dir::bwd, Stage::attention, c, {pb}));
    // Rows of chunk c receive dK, dV from the attention backward of chunks c..M-1, all done by now.
    input_grads.push_back(pb);
    input_grads.push_back(b.add(Dir::bwd, Stage::ln1_qkv, c, attention_bwd));
  }
  // The QKV and out-projection weight gradients over all rows at once.
  b.add(Dir::bwd, Stage::attention_wgrad, -1, input_grads);
  return std::move(b.plan);
}

}  // namespace ampipe::schedule
