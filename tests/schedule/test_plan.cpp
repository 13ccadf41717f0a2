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
      const int d = p.index_of(Dir::fwd, CommStage::dispatch, c), a = p.index_of(Dir::fwd, Stage::attention, c + 1);
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
      EXPECT_EQ(ex.deps[0], p.find(Dir::fwd, CommStage::dispatch, c).id);
      // exactly one expert consumer per dispatch
      int consumers = 0;
      for (const Task& t : p.tasks)
        for (uint32_t d : t.deps) consumers += d == p.find(Dir::fwd, CommStage::dispatch, c).id;
      EXPECT_EQ(consumers, 1);
      if (c + 1 < M) {
        const Task& ca = p.find(Dir::fwd, CommStage::combine, c);
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
      const uint32_t rd = p.find(Dir::bwd, CommStage::dispatch, c - 1).id;
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
    EXPECT_LT(p.find(Dir::fwd, CommStage::dispatch, 0).id, p.find(Dir::fwd, Stage::ln1_qkv, 1).id);
  }
}

namespace {
Plan cp_plan(int C, int M) {
  ampipe::model::LayerConfig cfg;
  cfg.seq_length = 96;  // divisible by 2 x C x M for C = 2, 3 and M = 1, 2, 4
  cfg.context_parallel_size = C;
  cfg.num_attention_heads = 4;
  cfg.hidden_size = 32;
  return build_layer_plan(cfg, M);
}
const Task* find_piece(const Plan& p, Dir d, TaskStage s, int chunk, int piece) {
  for (const Task& t : p.tasks)
    if (t.dir == d && t.stage == s && t.chunk == chunk && t.piece == piece) return &t;
  return nullptr;
}
}  // namespace

// Context parallelism: every chunk's K, V first (a chunk's queries see whole halves of other ranks' keys), each
// chunk's rows sent on as soon as its QKV is done; ring step t brings slot t (sent from slot t-1: each row of a slot
// travels once per step, never twice); chunk c's attention over slot t waits for step t only, and every chunk's
// attention over its own keys (piece 0) runs before any remote one, hiding the ring. Backward: the remote slots'
// attention first, then the ring carries their dK, dV sums while the own-key backward runs, and the QKV backward
// waits for the last sum.
TEST(Plan, ContextParallelRingHidesBehindOwnKeyAttention) {
  for (int C : {2, 3})
    for (int M : {1, 2, 4}) {
      SCOPED_TRACE(testing::Message() << "C=" << C << " M=" << M);
      const Plan p = cp_plan(C, M);
      std::vector<const Task*> steps, bsteps;
      for (const Task& t : p.tasks)
        if (t.stage == CommStage::cp_ring) (t.dir == Dir::fwd ? steps : bsteps).push_back(&t);
      ASSERT_EQ(int(steps.size()), 2 * M * (C - 1));  // per chunk and step: its rows of each half
      ASSERT_EQ(int(bsteps.size()), C - 1);
      const int last_qkv = p.index_of(Dir::fwd, Stage::ln1_qkv, M - 1);
      const int first_att = p.index_of(Dir::fwd, Stage::attention, 0);
      EXPECT_LT(last_qkv, first_att);
      // chunk 0's rows leave before chunk 1's QKV
      if (M > 1) {
        EXPECT_LT(int(steps.front()->id), p.index_of(Dir::fwd, Stage::ln1_qkv, 1));
      }
      const int64_t sub = p.dims.s_global / (2 * C) / M * p.dims.b, half = p.dims.s_global / (2 * C) * p.dims.b;
      std::set<std::tuple<int, int64_t>> sent;  // (step, first row): every row of a slot once per step
      for (const Task* s : steps) {
        const int t = s->piece / 2 + 1, h = s->piece % 2;
        EXPECT_EQ(s->lane, Lane::cp);
        EXPECT_EQ(s->collective->kind, CollKind::send_recv);
        EXPECT_EQ(s->collective->send_slot, t - 1);  // what arrived at the previous step travels on
        EXPECT_EQ(s->collective->recv_slot, t);
        EXPECT_EQ(s->collective->slot_row0, h * half + s->chunk * sub);
        EXPECT_EQ(s->collective->slot_rows, sub);
        EXPECT_TRUE(sent.insert({t, s->collective->slot_row0}).second) << s->name() << " sent twice";
        EXPECT_LT(int(s->id), first_att);  // issued before the first attention
        EXPECT_DOUBLE_EQ(s->bytes, double(sub * 2 * p.dims.hl * 4));  // fp32 K, V of the rows
        for (int c = 0; c < M; ++c) {
          const Task* remote = find_piece(p, Dir::fwd, Stage::attention, c, t);
          ASSERT_NE(remote, nullptr);
          EXPECT_TRUE(depends_on(p, remote->id, s->id));  // whole halves: every chunk's rows
          const Task* own = find_piece(p, Dir::fwd, Stage::attention, c, 0);
          ASSERT_NE(own, nullptr);
          EXPECT_FALSE(depends_on(p, own->id, s->id));
        }
      }
      EXPECT_EQ(int(sent.size()), 2 * M * (C - 1));  // together one K, V set per step
      EXPECT_LT(find_piece(p, Dir::fwd, Stage::attention, M - 1, 0)->id, find_piece(p, Dir::fwd, Stage::attention, 0, 1)->id);
      // backward: the QKV backward of every chunk after the final reduction, which waits for the last step
      const Task* done = find_piece(p, Dir::bwd, Stage::cp_dkv_reduce, -1, 0);
      ASSERT_NE(done, nullptr);
      EXPECT_TRUE(depends_on(p, done->id, bsteps.back()->id));
      for (int c = 0; c < M; ++c) {
        EXPECT_TRUE(depends_on(p, p.find(Dir::bwd, Stage::ln1_qkv, c).id, done->id));
        const Task* own = find_piece(p, Dir::bwd, Stage::attention, c, 0);
        EXPECT_FALSE(depends_on(p, own->id, bsteps.front()->id)) << "own-key backward waits for the ring";
      }
      EXPECT_LT(bsteps.front()->id, find_piece(p, Dir::bwd, Stage::attention, M - 1, 0)->id);
      // the aux-loss statistics are summed over the cp ranks
      EXPECT_GE(p.index_of(Dir::fwd, CommStage::cp_aux_stats, -1), 0);
    }
}

// The Plan's attention FLOPs are rank 0's; every rank does the same work, so C times them is the causal attention of
// the whole sequence, at every degree.
TEST(Plan, ContextParallelAttentionFlopsAddUpToTheWholeSequence) {
  for (int C : {2, 3})
    for (int M : {1, 2, 4}) {
      const Plan p = cp_plan(C, M);
      const Plan whole = cp_plan(1, 1);
      for (Dir d : {Dir::fwd, Dir::bwd}) {
        double cp = 0, one = 0;
        for (const Task& t : p.tasks)
          if (t.dir == d && t.stage == Stage::attention) cp += t.flops;
        for (const Task& t : whole.tasks)
          if (t.dir == d && t.stage == Stage::attention) one += t.flops;
        EXPECT_DOUBLE_EQ(cp * C, one) << "C=" << C << " M=" << M;
      }
    }
}

// Without --ampipe-tp-sp-comm-overlap the tp collectives are synchronous, except the two backward reductions that
// Megatron's column-parallel linears overlap with their weight-gradient GEMM: the last expert piece's input-gradient
// reduce-scatter runs under the expert weight gradients, and the last chunk's (chunk 0's) QKV input-gradient
// reduce-scatter under the attention weight gradients. So degree 1 is Megatron's baseline, not a weaker one.
TEST(Plan, WithoutTheTpOverlapTheLastReductionsHideBehindTheWeightGradients) {
  for (int M : {1, 2, 4}) {
    SCOPED_TRACE(testing::Message() << "M=" << M);
    ampipe::model::LayerConfig cfg;
    cfg.seq_length = 64;
    cfg.tensor_model_parallel_size = 2;
    cfg.sequence_parallel = true;
    const Plan p = build_layer_plan(cfg, M);
    auto find = [&](Dir d, TaskStage s, int chunk) {
      const Task* t = find_piece(p, d, s, chunk, -1);
      EXPECT_NE(t, nullptr) << s.name() << " chunk " << chunk;
      return t ? t->id : 0u;
    };
    const uint32_t awg = find(Dir::bwd, Stage::attention_wgrad, -1), ewg = find(Dir::bwd, Stage::expert_wgrad, -1);
    // experts: the reduction of the last piece (chunk 0, done last) is issued before the weight gradients, which
    // do not wait for it; every earlier piece's is waited for by the next piece (synchronous)
    const uint32_t last_red = find(Dir::bwd, CommStage::tp_expert_in, 0);
    EXPECT_LT(last_red, ewg);
    EXPECT_FALSE(depends_on(p, ewg, last_red));
    for (int c = M - 1; c > 0; --c)
      EXPECT_TRUE(depends_on(p, find(Dir::bwd, Stage::experts, c - 1), find(Dir::bwd, CommStage::tp_expert_in, c)));
    // attention: chunk 0's LN1 backward comes after the weight gradients, which do not wait for its reduction
    const uint32_t qkv_red = find(Dir::bwd, CommStage::tp_qkv_in, 0), ln1 = find(Dir::bwd, Stage::ln1, 0);
    EXPECT_LT(qkv_red, awg);
    EXPECT_LT(awg, ln1);
    EXPECT_FALSE(depends_on(p, awg, qkv_red));
    EXPECT_TRUE(depends_on(p, ln1, qkv_red));
    // later chunks (done first) wait for their reduction at once: LN1 backward before the next chunk's QKV backward
    for (int c = M - 1; c > 0; --c) EXPECT_LT(find(Dir::bwd, Stage::ln1, c), find(Dir::bwd, Stage::qkv, c - 1));
  }
}
