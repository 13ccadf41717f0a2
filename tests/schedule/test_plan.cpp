#include <gtest/gtest.h>

#include <set>

#include "ampipe/schedule/plan.h"

using namespace ampipe::schedule;

namespace {
// A small layer; only the degree and the layer index matter to the task graph.
Plan plan_for(int layer, int M) {
  ampipe::model::LayerConfig cfg;
  cfg.seq_length = 48;  // divisible by every degree below
  cfg.layer_index = layer;
  return build_layer_plan(cfg, M);
}

// True when task `a` (transitively) depends on task `b`.
bool depends_on(const Plan& p, uint32_t a, uint32_t b) {
  std::vector<uint32_t> stack{a};
  std::set<uint32_t> seen;
  while (!stack.empty()) {
    const uint32_t t = stack.back();
    stack.pop_back();
    for (uint32_t d : p.tasks[t].deps) {
      if (d == b) return true;
      if (seen.insert(d).second) stack.push_back(d);
    }
  }
  return false;
}
}  // namespace

TEST(Plan, DepsPointBackwardsAndIdsAreIndices) {
  for (int M : {1, 2, 3, 4, 8}) {
    const Plan p = plan_for(3, M);
    for (size_t i = 0; i < p.tasks.size(); ++i) {
      EXPECT_EQ(p.tasks[i].id, i);
      for (uint32_t d : p.tasks[i].deps) EXPECT_LT(d, i) << p.tasks[i].name();
    }
  }
}

TEST(Plan, ForwardDispatchOfChunkIsIssuedBeforeNextAttentionAndOverlapsIt) {
  for (int M : {2, 3, 4, 8}) {
    const Plan p = plan_for(0, M);
    for (int c = 0; c + 1 < M; ++c) {
      const int d = p.index_of(Dir::fwd, Stage::dispatch, c), a = p.index_of(Dir::fwd, Stage::attention, c + 1);
      EXPECT_LT(d, a) << "M=" << M << " c=" << c;
      EXPECT_EQ(p.tasks[size_t(d)].lane, Lane::ep);
      // attention(c+1) and the stages up to its own gate never wait for dispatch(c): they overlap it.
      for (Stage s : {Stage::attention, Stage::out_proj, Stage::residual_ln2, Stage::gate})
        EXPECT_FALSE(depends_on(p, uint32_t(p.index_of(Dir::fwd, s, c + 1)), uint32_t(d)));
    }
  }
}

TEST(Plan, EachExpertWaitsOnlyForItsOwnDispatchAndCombineOverlapsNextExperts) {
  for (int M : {1, 2, 4}) {
    const Plan p = plan_for(0, M);
    for (int c = 0; c < M; ++c) {
      const Task& ex = p.find(Dir::fwd, Stage::experts, c);
      ASSERT_EQ(ex.deps.size(), 1u);
      EXPECT_EQ(ex.deps[0], p.find(Dir::fwd, Stage::dispatch, c).id);
      // exactly one expert consumer per dispatch
      int consumers = 0;
      for (const Task& t : p.tasks)
        for (uint32_t d : t.deps) consumers += d == p.find(Dir::fwd, Stage::dispatch, c).id;
      EXPECT_EQ(consumers, 1);
      if (c + 1 < M) {
        const Task& ca = p.find(Dir::fwd, Stage::combine, c);
        EXPECT_LT(ca.id, p.find(Dir::fwd, Stage::experts, c + 1).id);
        EXPECT_FALSE(depends_on(p, p.find(Dir::fwd, Stage::experts, c + 1).id, ca.id));
      }
    }
  }
}

TEST(Plan, BackwardRunsChunksInReverseAndReverseDispatchOverlapsAttentionSide) {
  for (int M : {2, 4}) {
    const Plan p = plan_for(0, M);
    EXPECT_LT(p.index_of(Dir::bwd, Stage::weighted_sum, M - 1), p.index_of(Dir::bwd, Stage::weighted_sum, 0));
    for (int c = 1; c < M; ++c) {
      // rev-dispatch(c-1) is issued before the attention-side backward of chunk c starts and is not needed by it.
      const uint32_t rd = p.find(Dir::bwd, Stage::dispatch, c - 1).id;
      EXPECT_LT(rd, p.find(Dir::bwd, Stage::gate, c).id);
      for (Stage s : {Stage::gate, Stage::residual_ln2, Stage::out_proj, Stage::attention})
        EXPECT_FALSE(depends_on(p, p.find(Dir::bwd, s, c).id, rd));
    }
    // dK/dV: the QKV backward of chunk c waits for the attention backward of every chunk c' >= c (each adds to
    // the K, V rows of chunk c); chunks before c do not see c's keys, so it need not wait for them.
    for (int c = 0; c < M; ++c) {
      const Task& qb = p.find(Dir::bwd, Stage::ln1_qkv, c);
      for (int c2 = 0; c2 < M; ++c2)
        EXPECT_EQ(depends_on(p, qb.id, p.find(Dir::bwd, Stage::attention, c2).id), c2 >= c) << "c=" << c << " c2=" << c2;
    }
  }
}

TEST(Plan, CollectiveSequenceIsTheSameForEveryRank) {
  // Builders are pure functions of (layer, M): the ep-lane sequence is a function of them alone.
  const Plan a = plan_for(2, 4), b = plan_for(2, 4);
  std::vector<std::string> sa, sb;
  for (const Task& t : a.tasks)
    if (t.lane == Lane::ep) sa.push_back(t.name());
  for (const Task& t : b.tasks)
    if (t.lane == Lane::ep) sb.push_back(t.name());
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(sa.size(), 16u);
  EXPECT_EQ(sa.front(), "L2.fwd.dispatch.c0");
}

TEST(Plan, QkvIsComputedPerChunkSoTheFirstDispatchStartsEarly) {
  for (int M : {2, 4}) {
    const Plan p = plan_for(0, M);
    // Causality: chunk c's attention reads the K, V rows of chunks 0..c only.
    for (int c = 0; c < M; ++c)
      for (int c2 = 0; c2 < M; ++c2)
        EXPECT_EQ(depends_on(p, p.find(Dir::fwd, Stage::attention, c).id, p.find(Dir::fwd, Stage::ln1_qkv, c2).id), c2 <= c);
    EXPECT_LT(p.find(Dir::fwd, Stage::dispatch, 0).id, p.find(Dir::fwd, Stage::ln1_qkv, 1).id);
  }
}
