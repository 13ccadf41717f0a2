#include "ampipe/schedule/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <optional>

#include "ampipe/core/error.h"
#include "ampipe/model/seams.h"

namespace ampipe::schedule {

std::string Task::name() const {
  std::string n = fmt::format("L{}.{}.{}", layer, model::dir_name(dir), stage.name());
  if (chunk >= 0) n += fmt::format(".c{}", chunk);
  if (piece >= 0) n += fmt::format(".p{}", piece);
  return n;
}

int Plan::index_of(Dir d, TaskStage s, int chunk) const {
  for (size_t i = 0; i < tasks.size(); ++i)
    if (tasks[i].dir == d && tasks[i].stage == s && tasks[i].chunk == chunk) return int(i);
  return -1;
}

const Task& Plan::find(Dir d, TaskStage s, int chunk) const {
  const int i = index_of(d, s, chunk);
  AMPIPE_CHECK(i >= 0, "plan has no task {}.{} chunk {}", model::dir_name(d), s.name(), chunk);
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
  model::Seams seams;
  uint32_t add(Dir d, TaskStage s, int chunk, std::vector<uint32_t> deps, int piece = -1) {
    Task t;
    t.id = uint32_t(plan.tasks.size());
    t.dir = d;
    t.stage = s;
    t.layer = layer;
    t.chunk = chunk;
    t.piece = piece;
    t.lane = lane_of(s);
    t.deps = std::move(deps);
    if (!s.is_comm()) {
      t.flops = model::stage_flops(plan.dims, s.compute(), d, chunk, piece);
      t.bytes = model::stage_bytes(plan.dims, s.compute(), d, chunk, piece);
    }
    plan.tasks.push_back(std::move(t));
    return plan.tasks.back().id;
  }
  // A collective: what it moves (kind, group, buffers) is the stage's (comm_io), never chosen here.
  uint32_t collective(Dir d, CommStage s, int chunk, std::vector<uint32_t> deps, int piece = -1) {
    const uint32_t id = add(d, s, chunk, std::move(deps), piece);
    Task& t = plan.tasks.back();
    const CommIO io = comm_io(plan.dims, seams, s, d);
    t.collective = CollectiveSpec{io.kind, io.group, io.send, io.recv, comm_bytes(plan.dims, s, d, piece)};
    t.bytes = t.collective->bytes;
    return id;
  }
  // One context-parallel ring step (piece `step`): slot send_slot of the seam's send buffer to the next cp rank,
  // slot recv_slot of its receive buffer from the previous one.
  // rows >= 0: only rows [row0, row0 + rows) of the slots (chunk c's task, piece `step` names it then).
  uint32_t ring(Dir d, int step, std::vector<uint32_t> deps, int send_slot, int recv_slot, int chunk = -1,
                int64_t row0 = 0, int64_t rows = -1) {
    const uint32_t id = collective(d, CommStage::cp_ring, chunk, std::move(deps), step);
    CollectiveSpec& c = *plan.tasks.back().collective;
    c.send_slot = send_slot;
    c.recv_slot = recv_slot;
    if (rows >= 0) {
      c.slot_row0 = row0;
      c.slot_rows = rows;
      c.bytes *= double(rows) / double(plan.dims.T);  // a slot holds T rows
      plan.tasks.back().bytes = c.bytes;
    }
    return id;
  }
};

// The layer Plan, built in straight-line parts over shared state. Chunk c = sequence rows [c*s/M, (c+1)*s/M);
// pieces of a chunk: pipe-experts' (local expert, slice) pieces, --ampipe-tp-sp-comm-overlap's local experts, or the
// whole chunk as piece -1, in chunk-major order (idx = c*nP + q).
class LayerPlanBuilder {
 public:
  LayerPlanBuilder(const model::LayerConfig& cfg, int M);
  Plan build() &&;

 private:
  // forward
  uint32_t qkv_input(int c, std::vector<uint32_t> deps = {});
  void cp_qkv_forward();
  uint32_t attention_forward(int c);
  void gate_forward(int c, uint32_t proj);
  std::vector<uint32_t> aux_stats();
  void experts_forward();
  void weighted_sum_forward(const std::vector<uint32_t>& aux_deps);
  void dense_forward(int c, uint32_t proj);
  uint32_t mlp_forward(int c);
  // backward
  uint32_t mlp_backward(int c, uint32_t weighted_bwd);
  void moe_backward();
  uint32_t gate_backward(int c);
  void qkv_backward(int c, const std::vector<uint32_t>& deps);
  void flush_ln1();
  void attention_backward();
  void cp_dkv_backward();
  std::optional<uint32_t> expert_gather(Dir dir, size_t idx);

  Builder b;
  const model::LayerDims& d;
  const int M;
  const size_t nM;
  const bool bf16, tp, sp, ring_attn, ahead;
  const int ncp;  // the context-parallel size cp (C is the capacity)
  std::vector<int> pieces;
  size_t nP = 0;
  std::vector<std::vector<uint32_t>> dispatch, combine, combine_bwd, dispatch_bwd;
  std::vector<uint32_t> weighted, gate;
  // the dense MLP: chunk c's LN2 (or, sequence parallel, its all-gather), its forward's last task, its backward's
  std::vector<uint32_t> mlp_input, mlp_done, mlp_bwd_done, mlp_bwd;
  std::vector<std::optional<uint32_t>> gathered;  // the experts' input all-gather of piece idx, issued at most once
  std::vector<uint32_t> qkv;
  std::optional<uint32_t> next_input;  // ahead: chunk c+1's QKV input
  std::vector<std::vector<uint32_t>> ring;  // context parallel, [step - 1]: every chunk's pieces
  std::vector<uint32_t> own;                // each chunk's attention over its own keys
  int64_t sub_rows = 0, half_rows = 0;      // tokens of one sub-block (A_c or B_c), of one half of a packed slot
  std::optional<uint32_t> sync_reduce;      // without the tp overlap: the experts' reduction waited for
  uint32_t aux = 0;
  std::vector<uint32_t> experts_bwd, attention_bwd, input_grads, remote_bwd;
  std::optional<uint32_t> next_head;
  int pending_c = -1;  // the chunk whose LN1 backward waits, and its reduction
  uint32_t pending_red = 0;
};

LayerPlanBuilder::LayerPlanBuilder(const model::LayerConfig& cfg, int M_)
    : b{{}, cfg.layer_index, {}},
      d((b.plan.dims = model::LayerDims::make(cfg, M_), b.plan.dims)),
      M(M_),
      nM(size_t(M_)),
      bf16(d.cd != DType::f32),
      tp(d.tp > 1),
      sp(d.sp),
      ring_attn(d.cp > 1),
      ahead(tp && d.overlap_tp),
      ncp(int(d.cp)) {
  b.plan.memory = model::BufferLayout::make(b.plan.dims);
  b.seams = model::Seams::make(d);
  for (size_t p = 0; p < d.pieces.size(); ++p) pieces.push_back(int(p));
  if (pieces.empty()) pieces.push_back(-1);
  nP = pieces.size();
  dispatch.assign(nM, std::vector<uint32_t>(nP));
  combine = combine_bwd = dispatch_bwd = dispatch;
  weighted.assign(nM, 0);
  gate.assign(nM, 0);
  mlp_input = mlp_done = mlp_bwd_done = gate;
  gathered.assign(nM * nP, std::nullopt);
  ring.resize(size_t(std::max(ncp - 1, 0)));
  if (ring_attn) {
    sub_rows = d.s_global / (2 * d.cp) / M * d.b;
    half_rows = d.s_global / (2 * d.cp) * d.b;
  }
}

// Sequence parallel: the experts' input all-gather of piece idx (forward: of the received slots; backward: of the
// combine gradient), issued at most once.
std::optional<uint32_t> LayerPlanBuilder::expert_gather(Dir dir, size_t idx) {
  if (!sp) return std::nullopt;
  if (!gathered[idx]) {
    const int c = int(idx / nP);
    const size_t q = idx % nP;
    gathered[idx] = dir == Dir::fwd
                        ? b.collective(dir, CommStage::tp_expert_in, c, {dispatch[size_t(c)][q]}, pieces[q])
                        : b.collective(dir, CommStage::tp_expert_out, c, {combine_bwd[size_t(c)][q]}, pieces[q]);
  }
  return gathered[idx];
}

// tp > 1: LN1 on this rank's rows, with sequence parallelism all-gathered to every row of the chunk.
uint32_t LayerPlanBuilder::qkv_input(int c, std::vector<uint32_t> deps) {
  const uint32_t l1 = b.add(Dir::fwd, Stage::ln1, c, std::move(deps));
  if (!sp) return l1;
  return b.collective(Dir::fwd, CommStage::tp_qkv_in, c, {l1});
}

// Context parallelism (docs/ampipe.md §6): a chunk's queries see keys of every cp rank, in full halves, so every
// chunk's K, V is computed first. Each chunk's K, V rows travel the ring as soon as its QKV is done (slot t from cp
// rank r - t; chunk c's rows of each half, pieces 2(t-1) and 2(t-1)+1 of chunk c), under the next chunks' QKV and
// every chunk's attention over this rank's own keys (piece 0); the slots are kept for the later chunks and the
// backward, never sent twice. tp: chunk c+1's LN1 and all-gather are issued before chunk c's QKV projection (the
// LN1 rows' one staging slot is free once chunk c's all-gather has read it).
//   qkv(0) ring(0, t=1..cp-1) qkv(1) ring(1, ...) ... qkv(M-1) ring(M-1, ...) attention(0..M-1, piece 0)
void LayerPlanBuilder::cp_qkv_forward() {
  std::optional<uint32_t> input;
  if (tp) input = qkv_input(0);
  for (int c = 0; c < M; ++c) {
    if (!tp) {
      qkv.push_back(b.add(Dir::fwd, Stage::ln1_qkv, c, {}));
    } else {
      const uint32_t in = *input;
      if (c + 1 < M) input = qkv_input(c + 1, {in});
      qkv.push_back(b.add(Dir::fwd, Stage::qkv, c, {in}));
    }
    for (int h = 0; h < 2; ++h) {  // chunk c's rows of both halves, every step
      uint32_t prev = qkv.back();
      for (int t = 1; t < ncp; ++t) {
        prev = b.ring(Dir::fwd, 2 * (t - 1) + h, {prev}, t - 1, t, c, h * half_rows + c * sub_rows, sub_rows);
        ring[size_t(t - 1)].push_back(prev);
      }
    }
  }
  for (int c = 0; c < M; ++c) own.push_back(b.add(Dir::fwd, Stage::attention, c, qkv, 0));
}

// The attention side of chunk c up to the out-projection (and its tp reduction); returns that task.
//   plain: ln1_qkv(c) attention(c) out_proj(c)          (chunk c's queries against K, V of chunks 0..c)
//   tp:    ln1(c) [tp_qkv_in(c)] qkv(c) attention(c) out_proj(c) tp_proj_out(c)
//   tp overlap: ln1(c+1) [tp_qkv_in(c+1)] issued before attention(c); qkv(c+1) runs under tp_proj_out(c)
//   cp:    attention(c, piece t) for ring steps t = 1..cp-1 after the own-key piece, then out_proj(c)
uint32_t LayerPlanBuilder::attention_forward(int c) {
  if (ring_attn) {
    // K, V of every chunk are done (cp_qkv_forward)
  } else if (!tp) {
    qkv.push_back(b.add(Dir::fwd, Stage::ln1_qkv, c, {}));
  } else if (!ahead || c == 0) {
    qkv.push_back(b.add(Dir::fwd, Stage::qkv, c, {qkv_input(c)}));
  }  // else: qkv(c) was issued under chunk c-1's out-projection reduction
  if (!ring_attn && ahead && c + 1 < M) next_input = qkv_input(c + 1);
  uint32_t att = 0;
  if (!ring_attn) {
    att = b.add(Dir::fwd, Stage::attention, c, qkv);
  } else {
    att = own[size_t(c)];
    for (int t = 1; t < ncp; ++t) {
      std::vector<uint32_t> deps = ring[size_t(t - 1)];
      deps.push_back(att);
      att = b.add(Dir::fwd, Stage::attention, c, deps, t);
    }
  }
  uint32_t proj = b.add(Dir::fwd, Stage::out_proj, c, {att});
  if (tp)  // the local heads' partial sums: reduce-scattered to this rank's rows (bf16: a bf16 payload), or all-reduced
    proj = b.collective(Dir::fwd, CommStage::tp_proj_out, c, {proj});
  if (!ring_attn && ahead && c + 1 < M) qkv.push_back(b.add(Dir::fwd, Stage::qkv, c + 1, {*next_input}));
  return proj;
}

// Chunk c's residual, LN2 and gate, then its dispatch all-to-all issued without waiting (every pipe-experts piece
// at once, in piece order): residual_ln2(c) gate(c) [capacity(c) gate_assign(c)] dispatch(c, pieces). So
// dispatch(c) runs under the attention side of chunk c+1.
void LayerPlanBuilder::gate_forward(int c, uint32_t proj) {
  const size_t i = size_t(c);
  const uint32_t res = b.add(Dir::fwd, Stage::residual_ln2, c, {proj});
  gate[i] = b.add(Dir::fwd, Stage::gate, c, {res});
  // the shared expert's input rows: all-gathered now (sequence parallel), under the attention of the next chunks
  if (d.mlp)
    mlp_input[i] = !sp ? res
                       : b.collective(Dir::fwd, CommStage::tp_mlp_in, c, {res});
  if (d.agree_capacity) {  // dropless: every EP rank's required capacity (and every tp rank's, sequence parallel)
    uint32_t cap = gate[i];
    if (d.ep > 1)
      cap = b.collective(Dir::fwd, CommStage::capacity, c, {cap});
    if (d.agree_capacity_tp)
      cap = b.collective(Dir::fwd, CommStage::tp_capacity, c, {cap});
    gate[i] = b.add(Dir::fwd, Stage::gate_assign, c, {cap});  // the largest of them
  }
  for (size_t q = 0; q < nP; ++q)
    dispatch[i][q] = b.collective(Dir::fwd, CommStage::dispatch, c, {gate[i]}, pieces[q]);
  // --ampipe-tp-sp-comm-overlap: the experts' all-gathers of every chunk but the last are issued as soon as its
  // dispatch is, so that they run under the next chunk's attention (on the etp lane: waiting for a dispatch they
  // hold up no attention-side collective); the last chunk's follow the pieces one ahead.
  if (d.overlap_tp && c + 1 < M)
    for (size_t q = 0; q < nP; ++q) expert_gather(Dir::fwd, i * nP + q);
}

// The aux loss's inputs: the gate statistics of every chunk, summed over the tp ranks' rows (sequence parallel)
// and the cp ranks' (context parallel).
std::vector<uint32_t> LayerPlanBuilder::aux_stats() {
  std::vector<uint32_t> deps = gate;
  if (sp)
    deps = {b.collective(Dir::fwd, CommStage::tp_aux_stats, -1, gate)};
  if (ring_attn)
    deps = {b.collective(Dir::fwd, CommStage::cp_aux_stats, -1, deps)};
  return deps;
}

// The expert phase, pieces in chunk-major order: experts(idx) (waits for its own dispatch only) [tp_expert_out]
// combine(idx) issued; so combine(c) runs under experts(c+1). With the tp overlap the all-gather of piece idx+1 is
// issued before piece idx's experts, and piece idx's reduce is waited for only by its combine. Without it (MindSpeed's
// Mode A) the experts' tp collectives are synchronous: the all-gather is issued just before the experts that read
// it, and the next compute task waits for the reduce.
void LayerPlanBuilder::experts_forward() {
  for (size_t idx = 0; idx < nM * nP; ++idx) {
    const int c = int(idx / nP);
    const size_t q = idx % nP;
    if (d.overlap_tp && idx + 1 < nM * nP) expert_gather(Dir::fwd, idx + 1);
    std::vector<uint32_t> deps = {dispatch[size_t(c)][q]};
    if (const auto g = expert_gather(Dir::fwd, idx)) deps = {*g};
    if (sync_reduce) deps.push_back(*sync_reduce);
    uint32_t out = b.add(Dir::fwd, Stage::experts, c, deps, pieces[q]);
    if (tp) {
      out = b.collective(Dir::fwd, CommStage::tp_expert_out, c, {out}, pieces[q]);
      if (!d.overlap_tp) sync_reduce = out;
    }
    combine[size_t(c)][q] = b.collective(Dir::fwd, CommStage::combine, c, {out}, pieces[q]);
    // the shared expert of chunk c once its last combine is in flight: its GEMMs hide that all-to-all (the last
    // chunk's, which no later expert compute hides)
    if (d.mlp && q + 1 == nP) mlp_done[size_t(c)] = mlp_forward(c);
  }
}

// The dense MLP of chunk c after its input (mlp_input): mlp(c) [tp_mlp_out(c)]; returns the last task.
uint32_t LayerPlanBuilder::mlp_forward(int c) {
  const uint32_t m = b.add(Dir::fwd, Stage::mlp, c, {mlp_input[size_t(c)]});
  if (!tp) return m;  // the local F columns' partial sums: reduce-scattered to this rank's rows, or all-reduced
  return b.collective(Dir::fwd, CommStage::tp_mlp_out, c, {m});
}

// A dense layer's chunk c after the attention side: residual_ln2(c) [tp_mlp_in(c)] mlp(c) [tp_mlp_out(c)]
// weighted_sum(c) (the dropout and residual of the MLP's output).
void LayerPlanBuilder::dense_forward(int c, uint32_t proj) {
  const size_t i = size_t(c);
  const uint32_t res = b.add(Dir::fwd, Stage::residual_ln2, c, {proj});
  mlp_input[i] = !sp ? res
                     : b.collective(Dir::fwd, CommStage::tp_mlp_in, c, {res});
  mlp_done[i] = mlp_forward(c);
  weighted[i] = b.add(Dir::fwd, Stage::weighted_sum, c, {mlp_done[i]});
}

// The dense MLP's backward of chunk c after the weighted sum's: [tp_mlp_out.bwd(c)] mlp.bwd(c) [tp_mlp_in.bwd(c)];
// returns the last task (the LN2 backward of the chunk waits for it).
uint32_t LayerPlanBuilder::mlp_backward(int c, uint32_t weighted_bwd) {
  std::vector<uint32_t> deps = {weighted_bwd};
  if (sp) deps = {b.collective(Dir::bwd, CommStage::tp_mlp_out, c, deps)};
  const uint32_t m = b.add(Dir::bwd, Stage::mlp, c, deps);
  mlp_bwd.push_back(m);
  if (!tp) return m;
  return b.collective(Dir::bwd, CommStage::tp_mlp_in, c, {m});
}

// weighted_sum(c) for each chunk (waits for its own combine only), then the aux loss once.
void LayerPlanBuilder::weighted_sum_forward(const std::vector<uint32_t>& aux_deps) {
  for (int c = 0; c < M; ++c) {
    std::vector<uint32_t> deps = combine[size_t(c)];
    deps.push_back(gate[size_t(c)]);
    if (d.mlp) deps.push_back(mlp_done[size_t(c)]);
    if (sync_reduce && c == 0) deps.push_back(*sync_reduce);
    weighted[size_t(c)] = b.add(Dir::fwd, Stage::weighted_sum, c, deps);
  }
  aux = b.add(Dir::fwd, Stage::aux_loss, -1, aux_deps);
}

// The MoE side backward, chunks in reverse: weighted_sum.bwd(c) combine.bwd(c) for c = M-1..0, then per piece
// (chunks M-1..0) experts.bwd [tp_expert_in] dispatch.bwd issued, then expert_wgrad over every chunk's slots while
// the reverse dispatches are in flight (and, even in the synchronous mode, while the last piece's input-gradient
// reduction is: Megatron's column-parallel backward overlaps that reduce-scatter with its weight-gradient GEMM).
void LayerPlanBuilder::moe_backward() {
  std::fill(gathered.begin(), gathered.end(), std::nullopt);
  std::vector<size_t> order;  // backward piece order: chunks M-1 .. 0, pieces in order
  for (int c = M - 1; c >= 0; --c)
    for (size_t q = 0; q < nP; ++q) order.push_back(size_t(c) * nP + q);
  for (int c = M - 1; c >= 0; --c) {
    const uint32_t ws = b.add(Dir::bwd, Stage::weighted_sum, c, {weighted[size_t(c)]});
    for (size_t q = 0; q < nP; ++q)
      combine_bwd[size_t(c)][q] = b.collective(Dir::bwd, CommStage::combine, c, {ws}, pieces[q]);
    if (d.mlp) mlp_bwd_done[size_t(c)] = mlp_backward(c, ws);  // hides the reverse combine just issued
    if (d.overlap_tp && c == M - 1) expert_gather(Dir::bwd, order[0]);  // no attention-side tp work is queued yet
  }
  std::vector<uint32_t> prev_reduce;  // without the overlap: the previous piece's reduction, waited for (at most one)
  for (size_t n = 0; n < order.size(); ++n) {
    const size_t idx = order[n];
    const int c = int(idx / nP);
    const size_t q = idx % nP;
    if (d.overlap_tp && n + 1 < order.size()) expert_gather(Dir::bwd, order[n + 1]);
    std::vector<uint32_t> deps = {combine_bwd[size_t(c)][q]};
    if (const auto g = expert_gather(Dir::bwd, idx)) deps = {*g};
    deps.insert(deps.end(), prev_reduce.begin(), prev_reduce.end());
    experts_bwd.push_back(b.add(Dir::bwd, Stage::experts, c, deps, pieces[q]));
    uint32_t out = experts_bwd.back();
    if (tp) {  // the input gradient's partial sums over the local F columns
      out = b.collective(Dir::bwd, CommStage::tp_expert_in, c, {out}, pieces[q]);
      if (!d.overlap_tp) prev_reduce = {out};
    }
    dispatch_bwd[size_t(c)][q] = b.collective(Dir::bwd, CommStage::dispatch, c, {out}, pieces[q]);
  }
  if (d.defer_expert_wgrad) b.add(Dir::bwd, Stage::expert_wgrad, -1, experts_bwd);
  if (d.mlp) b.add(Dir::bwd, Stage::mlp_wgrad, -1, mlp_bwd);  // also while the last reverse dispatch is in flight
}

// Gate and residual backward of chunk c (after its reverse dispatches and the aux loss), and with sequence
// parallelism the all-gather of the out-projection's output gradient: gate.bwd(c) residual_ln2.bwd(c)
// [tp_proj_out.bwd(c)].
uint32_t LayerPlanBuilder::gate_backward(int c) {
  uint32_t rb = 0;
  if (d.moe) {
    std::vector<uint32_t> deps = dispatch_bwd[size_t(c)];
    deps.push_back(aux);
    const uint32_t gb = b.add(Dir::bwd, Stage::gate, c, deps);
    std::vector<uint32_t> ln2_deps = {gb};
    if (d.mlp) ln2_deps.push_back(mlp_bwd_done[size_t(c)]);
    rb = b.add(Dir::bwd, Stage::residual_ln2, c, ln2_deps);
  } else {  // a dense layer: weighted_sum.bwd(c) and the MLP's backward first
    const uint32_t ws = b.add(Dir::bwd, Stage::weighted_sum, c, {weighted[size_t(c)]});
    rb = b.add(Dir::bwd, Stage::residual_ln2, c, {mlp_backward(c, ws)});
  }
  if (sp)
    rb = b.collective(Dir::bwd, CommStage::tp_proj_out, c, {rb});
  return rb;
}

void LayerPlanBuilder::flush_ln1() {
  if (pending_c >= 0) b.add(Dir::bwd, Stage::ln1, pending_c, {pending_red});
  pending_c = -1;
}

// The QKV backward of chunk c, once the dK, dV of its rows are complete (deps): ln1_qkv.bwd(c), or with tp
// qkv.bwd(c) tp_qkv_in.bwd(c) and ln1.bwd(c) after the reduction. With the tp overlap chunk c's LN1 backward waits
// until the next chunk's backward (or the weight gradients) has run, so the reduction hides behind them; without
// it only the last chunk's (c = 0) does, under the attention weight gradients, as Megatron's QKV backward overlaps
// its reduce-scatter with its weight-gradient GEMM.
void LayerPlanBuilder::qkv_backward(int c, const std::vector<uint32_t>& deps) {
  if (!tp) {
    input_grads.push_back(b.add(Dir::bwd, Stage::ln1_qkv, c, deps));
    return;
  }
  input_grads.push_back(b.add(Dir::bwd, Stage::qkv, c, deps));
  const uint32_t red = b.collective(Dir::bwd, CommStage::tp_qkv_in, c, {input_grads.back()});
  flush_ln1();
  pending_c = c;
  pending_red = red;
  if (!d.overlap_tp && c != 0) flush_ln1();
}

// The attention side backward, chunks M-1..0: gate_backward(c) out_proj.bwd(c) [attention_recompute(c)]
// attention.bwd(c) (summing dK, dV into the rows of chunks 0..c) qkv_backward(c) (rows of chunk c have every
// contribution: chunks c..M-1 are done). With the tp overlap, chunk c-1's gate_backward runs before chunk c's QKV
// backward, so its all-gather is not queued behind chunk c's reduction. Context parallel: the attention backward
// over the remote slots here, the own keys and the dK, dV ring in cp_dkv_backward.
void LayerPlanBuilder::attention_backward() {
  if (ahead) next_head = gate_backward(M - 1);
  for (int c = M - 1; c >= 0; --c) {
    const uint32_t rb = ahead ? *next_head : gate_backward(c);
    uint32_t pb = b.add(Dir::bwd, Stage::out_proj, c, {rb});
    input_grads.push_back(pb);
    // selective recomputation: the chunk's attention output and lse again, before its attention backward reads them
    // (and the attention weight gradients, which depend on every chunk's attention backward)
    if (d.recompute_attention) pb = b.add(Dir::bwd, Stage::attention_recompute, c, {pb});
    if (ring_attn) {  // the remote slots now, this rank's own keys later (while the ring carries the dK, dV sums)
      uint32_t prev = pb;
      for (int t = 1; t < ncp; ++t) remote_bwd.push_back(prev = b.add(Dir::bwd, Stage::attention, c, {prev}, t));
      if (ahead && c > 0) next_head = gate_backward(c - 1);
      continue;
    }
    attention_bwd.push_back(b.add(Dir::bwd, Stage::attention, c, {pb}));
    if (ahead && c > 0) next_head = gate_backward(c - 1);
    qkv_backward(c, attention_bwd);
  }
}

// Context parallel: the dK, dV partial sums of slot t (cp rank r - t's keys) travel one hop per ring step towards
// their owner, each rank adding its own share (cp_dkv_reduce, piece t) before passing them on; each step hides behind
// a chunk's attention backward over this rank's own keys (piece 0). After step cp-1 this rank holds every rank's share
// of its own keys (cp_dkv_reduce piece 0), and every chunk's QKV backward follows.
void LayerPlanBuilder::cp_dkv_backward() {
  std::vector<uint32_t> own_bwd, steps;
  int next_own = M - 1;
  for (int t = 1; t < ncp; ++t) {
    std::vector<uint32_t> deps = remote_bwd;
    if (t > 1)
      deps = {b.add(Dir::bwd, Stage::cp_dkv_reduce, -1, {steps.back()}, t)};
    else if (bf16)
      deps = {b.add(Dir::bwd, Stage::cp_dkv_reduce, -1, remote_bwd, t)};  // rounded to bf16
    steps.push_back(b.ring(Dir::bwd, t, deps, t, t));
    if (next_own >= 0) own_bwd.push_back(b.add(Dir::bwd, Stage::attention, next_own--, remote_bwd, 0));
  }
  for (; next_own >= 0; --next_own) own_bwd.push_back(b.add(Dir::bwd, Stage::attention, next_own, remote_bwd, 0));
  std::vector<uint32_t> deps = own_bwd;
  deps.push_back(steps.back());
  const uint32_t done = b.add(Dir::bwd, Stage::cp_dkv_reduce, -1, deps, 0);
  for (int c = M - 1; c >= 0; --c) qkv_backward(c, {done});
}

// Forward: [cp: every chunk's QKV and K, V ring first] for c: attention side(c), gate(c), dispatch(c); aux stats;
// experts and combines (with a shared expert, chunk c's after its combine); weighted sums; aux loss. A dense
// layer: for c: attention side(c), LN2(c), MLP(c), weighted sum(c). Backward: the MoE side (chunks in reverse), the attention side
// (chunks in reverse) [cp: own keys and the dK, dV ring], then the QKV and out-projection weight gradients over
// all rows at once. (The aux loss has no backward task: each chunk's gate backward adds its gradient from the
// forward's totals, so it depends on aux_loss.)
Plan LayerPlanBuilder::build() && {
  if (ring_attn) cp_qkv_forward();
  for (int c = 0; c < M; ++c) {
    const uint32_t proj = attention_forward(c);
    if (d.moe)
      gate_forward(c, proj);
    else
      dense_forward(c, proj);
  }
  if (d.moe) {
    const std::vector<uint32_t> aux_deps = aux_stats();
    experts_forward();
    weighted_sum_forward(aux_deps);
    moe_backward();
  }
  attention_backward();
  if (ring_attn) cp_dkv_backward();
  if (!d.moe) b.add(Dir::bwd, Stage::mlp_wgrad, -1, mlp_bwd);
  b.add(Dir::bwd, Stage::attention_wgrad, -1, input_grads);
  flush_ln1();
  return std::move(b.plan);
}

}  // namespace

Plan build_layer_plan(const model::LayerConfig& cfg, int M) { return LayerPlanBuilder(cfg, M).build(); }

}  // namespace ampipe::schedule
