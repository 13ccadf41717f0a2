// The schedule as it actually ran, read back from the op trace (docs/design.md, "How we measure"): in the forward, dispatch(c)
// is in flight while attention(c+1) computes and combine(c) while experts(c+1) compute; in the backward, the
// reverse dispatch of chunk c-1 is in flight during the attention-side backward of chunk c; and every rank of the
// EP group issued the identical collective sequence (also fingerprint-checked with --check-collectives on).
#include <gtest/gtest.h>

#include <map>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/comm/trace.h"
#include "layer_harness.h"

using namespace ampipe;

namespace {

struct Span {
  int64_t issued = -1, start = -1, end = -1;
};

// "in flight during": the collective was issued before the compute task started, and compute did not wait for it
// until that task had ended. (When the engine thread posts it depends on the OS: on 2 busy cores it can be
// later; the Plan's promise is the issue order and the absence of a wait.)
void expect_in_flight_during(const std::map<std::string, Span>& rec, const std::string& coll,
                             const std::string& task) {
  ASSERT_TRUE(rec.count(coll)) << coll;
  ASSERT_TRUE(rec.count(task)) << task;
  EXPECT_LE(rec.at(coll).issued, rec.at(task).start) << coll << " issued after " << task << " started";
  const auto w = rec.find("wait:" + coll);
  if (w != rec.end()) {
    EXPECT_GE(w->second.start, rec.at(task).end) << "compute waited for " << coll << " before " << task;
  }
}

// The layer the tests trace: s positions, h 64, 4 heads, E 4, top-2, FFN F, EP over ep ranks.
model::LayerConfig trace_config(int64_t s, int64_t F, int ep) {
  model::LayerConfig cfg;
  cfg.seq_length = s;
  cfg.micro_batch_size = 1;
  cfg.hidden_size = 64;
  cfg.ffn_hidden_size = F;
  cfg.num_attention_heads = 4;
  cfg.num_experts = 4;
  cfg.moe_router_topk = 2;
  cfg.expert_model_parallel_size = ep;
  return cfg;
}

// One forward and backward of `stack` with the op trace on, between barriers of the world (tag names them).
std::vector<comm::TraceRecord> traced_step(schedule::LayerStack& stack, const Tensor& x, const Tensor& dy,
                                           uint64_t token_base, const comm::Groups& groups, const std::string& tag) {
  comm::barrier_sync(groups.world, tag + ".start");
  comm::Trace::clear();
  comm::Trace::set_enabled(true);
  stack.forward(x, token_base);
  stack.backward(dy, 0.01f);
  comm::barrier_sync(groups.world, tag + ".end");
  comm::Trace::set_enabled(false);
  return comm::Trace::snapshot();
}

// The binary's groups, all created before the first operation: EP over the world, and tp 2 x EP (world / 2).
struct AllGroups {
  comm::Groups ep_world, tp2, cp_world;
};
const AllGroups& all_groups() {
  comm::Runtime& rt = comm::Runtime::current();
  static AllGroups g{rt.make_groups(comm::Layout::make(rt.size(), 1, 1, rt.size())),
                     rt.make_groups(comm::Layout::make(rt.size(), 2, 1, rt.size() / 2)),
                     rt.make_groups(comm::Layout::make(rt.size(), 1, rt.size(), rt.size()))};
  return g;
}
const comm::Groups& ep_world_groups() { return all_groups().ep_world; }

}  // namespace

TEST(ScheduleTrace, CollectivesOverlapTheComputeThePlanSays) {
  comm::Runtime& rt = comm::Runtime::current();
  const int world = rt.size();
  const comm::Groups& groups = ep_world_groups();
  rt.set_check_collectives(true);
  for (int M : {2, 4}) {
    model::LayerConfig cfg = trace_config(256, 128, world);
    schedule::LayerStack stack(cfg, 1, M, groups.layout.coord(rt.rank()).ep, &groups);
    const Shape act{cfg.seq_length, 1, cfg.hidden_size};
    const Tensor x = ampipe::testing::seeded_normal(act, 3, uint64_t(2 * rt.rank()));
    const Tensor dy = ampipe::testing::seeded_normal(act, 3, uint64_t(2 * rt.rank() + 1));
    const std::vector<comm::TraceRecord> records =
        traced_step(stack, x, dy, uint64_t(rt.rank() * cfg.tokens()), groups, "trace_test");
    std::map<std::string, Span> rec;
    std::string sequence;
    for (const comm::TraceRecord& r : records) {
      rec[r.name] = {r.issued_us, r.start_us, r.end_us};
      if (r.cat == "all_to_all") sequence += fmt::format("{}#{};", r.seq, r.name);
    }
    for (int c = 0; c + 1 < M; ++c) {
      expect_in_flight_during(rec, fmt::format("L0.fwd.dispatch.c{}", c), fmt::format("L0.fwd.attention.c{}", c + 1));
      expect_in_flight_during(rec, fmt::format("L0.fwd.combine.c{}", c), fmt::format("L0.fwd.experts.c{}", c + 1));
      expect_in_flight_during(rec, fmt::format("L0.bwd.dispatch.c{}", c), fmt::format("L0.bwd.attention.c{}", c + 1));
    }
    // Identical collective sequences on every rank of the EP group.
    const auto all = comm::all_gather_strings(groups.ep, sequence, "trace_test.sequences");
    for (const std::string& s : all) EXPECT_EQ(s, sequence);
    EXPECT_NE(sequence.find("L0.bwd.dispatch.c0"), std::string::npos);
  }
  rt.set_check_collectives(false);
}

TEST(ScheduleTrace, PipeExpertsPiecesOverlapEachOther) {
  // pipe-experts at degree 1 (E = 4 over the world's EP group, N = 2 slices per local expert): the dispatch of piece
  // q+1 is in flight while piece q's expert GEMMs run, and the combine of piece q while piece q+1's run; in the
  // backward the reverse combine of piece q+1 while piece q's expert backward runs.
  comm::Runtime& rt = comm::Runtime::current();
  const int world = rt.size();
  const comm::Groups& groups = ep_world_groups();
  model::LayerConfig cfg = trace_config(256, 256, world);
  cfg.use_pipe_experts = true;
  cfg.pipe_experts_multi_data = 2;
  ASSERT_EQ(cfg.check_pipe_experts(1), "");
  schedule::LayerStack stack(cfg, 1, 1, groups.layout.coord(rt.rank()).ep, &groups);
  const int pieces = int(stack.plan(0).dims.pieces.size());
  ASSERT_EQ(pieces, int(cfg.local_experts()) * 2);
  const Shape act{cfg.seq_length, 1, cfg.hidden_size};
  const Tensor x = ampipe::testing::seeded_normal(act, 4, uint64_t(2 * rt.rank()));
  const Tensor dy = ampipe::testing::seeded_normal(act, 4, uint64_t(2 * rt.rank() + 1));
  const std::vector<comm::TraceRecord> records =
      traced_step(stack, x, dy, uint64_t(rt.rank() * cfg.tokens()), groups, "trace_pipe");
  std::map<std::string, Span> rec;
  for (const comm::TraceRecord& r : records) rec[r.name] = {r.issued_us, r.start_us, r.end_us};
  for (int q = 0; q + 1 < pieces; ++q) {
    expect_in_flight_during(rec, fmt::format("L0.fwd.dispatch.c0.p{}", q + 1), fmt::format("L0.fwd.experts.c0.p{}", q));
    expect_in_flight_during(rec, fmt::format("L0.fwd.combine.c0.p{}", q), fmt::format("L0.fwd.experts.c0.p{}", q + 1));
    expect_in_flight_during(rec, fmt::format("L0.bwd.combine.c0.p{}", q + 1), fmt::format("L0.bwd.experts.c0.p{}", q));
  }
}

TEST(ScheduleTrace, TensorParallelCollectivesOverlapExpertPieces) {
  // --ampipe-tp-sp-comm-overlap (tp 2, sequence parallel, degree 2, E = 4: pieces per (chunk, local expert), in
  // chunk-major order): the tp all-gather of piece p+1 is issued before piece p's expert GEMMs start, and the
  // reduce-scatter of piece p is not waited for before piece p+1's expert GEMMs end; in the backward the same for
  // the all-gather of the output gradient and the reduce-scatter of the input gradient (pieces in reverse chunk
  // order). The collective sequence on the tp group is identical on both tp ranks (fingerprints checked too).
  comm::Runtime& rt = comm::Runtime::current();
  const comm::Groups& groups = all_groups().tp2;
  rt.set_check_collectives(true);
  model::LayerConfig cfg = trace_config(256, 256, rt.size() / 2);
  cfg.tensor_model_parallel_size = 2;
  cfg.sequence_parallel = true;
  cfg.ampipe_tp_sp_comm_overlap = true;
  const int M = 2;
  const comm::Layout::Coord me = groups.layout.coord(rt.rank());
  schedule::LayerStack stack(cfg, 1, M, me.ep, &groups);
  const int pieces = int(stack.plan(0).dims.pieces.size());
  ASSERT_EQ(pieces, int(cfg.local_experts()));
  const Shape act{cfg.seq_length / 2, 1, cfg.hidden_size};
  const Tensor x = ampipe::testing::seeded_normal(act, 5, uint64_t(2 * rt.rank()));
  const Tensor dy = ampipe::testing::seeded_normal(act, 5, uint64_t(2 * rt.rank() + 1));
  const std::vector<comm::TraceRecord> records =
      traced_step(stack, x, dy, uint64_t(me.dp * cfg.tokens()), groups, "trace_tp");
  std::map<std::string, Span> rec;
  std::map<int64_t, std::string> by_seq;  // the tp group's collectives by their number (two lanes: tp, etp)
  for (const comm::TraceRecord& r : records) {
    rec[r.name] = {r.issued_us, r.start_us, r.end_us};
    if (r.name.find(".tp_") != std::string::npos && r.name.rfind("wait:", 0) != 0) by_seq[r.seq] = r.name;
  }
  std::string sequence;
  for (const auto& [seq, name] : by_seq) sequence += fmt::format("{}#{};", seq, name);
  std::vector<std::string> fwd, bwd;  // piece suffixes in each direction's order
  for (int c = 0; c < M; ++c)
    for (int q = 0; q < pieces; ++q) fwd.push_back(fmt::format("c{}.p{}", c, q));
  for (int c = M - 1; c >= 0; --c)
    for (int q = 0; q < pieces; ++q) bwd.push_back(fmt::format("c{}.p{}", c, q));
  auto issued_before_start = [&](const std::string& coll, const std::string& task) {
    ASSERT_TRUE(rec.count(coll)) << coll;
    ASSERT_TRUE(rec.count(task)) << task;
    EXPECT_LE(rec.at(coll).issued, rec.at(task).start) << coll << " issued after " << task << " started";
  };
  for (size_t i = 0; i + 1 < fwd.size(); ++i) {
    issued_before_start("L0.fwd.tp_expert_in." + fwd[i + 1], "L0.fwd.experts." + fwd[i]);
    expect_in_flight_during(rec, "L0.fwd.tp_expert_out." + fwd[i], "L0.fwd.experts." + fwd[i + 1]);
    issued_before_start("L0.bwd.tp_expert_out." + bwd[i + 1], "L0.bwd.experts." + bwd[i]);
    expect_in_flight_during(rec, "L0.bwd.tp_expert_in." + bwd[i], "L0.bwd.experts." + bwd[i + 1]);
  }
  // The attention side: chunk 1's LN1 all-gather in flight during chunk 0's attention.
  expect_in_flight_during(rec, "L0.fwd.tp_qkv_in.c1", "L0.fwd.attention.c0");
  const auto all = comm::all_gather_strings(groups.tp, sequence, "trace_tp.sequences");
  for (const std::string& q : all) EXPECT_EQ(q, sequence);
  rt.set_check_collectives(false);
}

TEST(ScheduleTrace, ContextParallelRingStepsHideBehindOwnKeyAttention) {
  // cp = world (EP over the same ranks), degree 2: every forward ring step is issued before the first chunk's
  // attention over this rank's own keys starts and is not waited for before the last one ends; every backward ring
  // step (the dK, dV sums) is in flight during an own-key attention backward; one K, V set per ring step and
  // direction crosses the cp lane (nothing is sent twice); every cp rank issued the same cp sequence.
  comm::Runtime& rt = comm::Runtime::current();
  const comm::Groups& groups = all_groups().cp_world;
  rt.set_check_collectives(true);
  const int C = rt.size(), M = 2;
  model::LayerConfig cfg = trace_config(64 * C, 128, C);
  cfg.moe_train_capacity_factor = 4.0;
  cfg.context_parallel_size = C;
  const comm::Layout::Coord me = groups.layout.coord(rt.rank());
  schedule::LayerStack stack(cfg, 1, M, me.ep, &groups);
  const Shape act{cfg.seq_length / C, 1, cfg.hidden_size};
  const Tensor x = ampipe::testing::seeded_normal(act, 6, uint64_t(2 * rt.rank()));
  const Tensor dy = ampipe::testing::seeded_normal(act, 6, uint64_t(2 * rt.rank() + 1));
  const std::vector<comm::TraceRecord> records = traced_step(stack, x, dy, 0, groups, "trace_cp");
  std::map<std::string, Span> rec;
  std::map<std::string, size_t> bytes;
  std::string sequence;
  for (const comm::TraceRecord& r : records) {
    rec[r.name] = {r.issued_us, r.start_us, r.end_us};
    if (r.name.find(".cp_") != std::string::npos && r.name.rfind("wait:", 0) != 0) {
      bytes[r.name] = r.bytes;
      sequence += fmt::format("{}#{};", r.seq, r.name);
    }
  }
  const size_t kv = size_t(stack.plan(0).dims.T * 2 * stack.plan(0).dims.hl) * sizeof(float);
  for (int t = 1; t < C; ++t) {
    const std::string bwd = fmt::format("L0.bwd.cp_ring.p{}", t);
    size_t fwd_bytes = 0;
    for (int c = 0; c < M; ++c)
      for (int h = 0; h < 2; ++h) {  // chunk c's rows of each half, sent as soon as its QKV was done
        const std::string fwd = fmt::format("L0.fwd.cp_ring.c{}.p{}", c, 2 * (t - 1) + h);
        ASSERT_TRUE(bytes.count(fwd)) << fwd;
        fwd_bytes += bytes[fwd];
        if (c == 0) {  // issued before chunk 1's QKV ran
          ASSERT_TRUE(rec.count("L0.fwd.ln1_qkv.c1"));
          EXPECT_LE(rec.at(fwd).issued, rec.at("L0.fwd.ln1_qkv.c1").start) << fwd;
        }
        expect_in_flight_during(rec, fwd, "L0.fwd.attention.c0.p0");
      }
    EXPECT_EQ(fwd_bytes, kv);  // together one K, V set of this rank's rows per step
    if (M - t >= 0) expect_in_flight_during(rec, bwd, fmt::format("L0.bwd.attention.c{}.p0", M - t));
    EXPECT_EQ(bytes[bwd], kv) << bwd;  // one dK, dV set (fp32)
  }
  size_t ring_ops = 0;
  for (const auto& [name, b] : bytes) ring_ops += name.find("cp_ring") != std::string::npos;
  EXPECT_EQ(ring_ops, size_t((2 * M + 1) * (C - 1)));
  const auto all = comm::all_gather_strings(groups.cp, sequence, "trace_cp.sequences");
  for (const std::string& q : all) EXPECT_EQ(q, sequence);
  rt.set_check_collectives(false);
}
