// Expert and data parallelism, with and without AMPipe, equal the single-rank layer: every rank processes its own
// micro-batch (m = world rank) with the experts sharded over EP; each rank also computes every micro-batch alone
// (ep = 1, all experts local, degree 1) as the reference. Output, aux loss and dx of its micro-batch, and every
// gradient averaged over the micro-batches (expert gradients compared on the local shard), must agree.
#include <gtest/gtest.h>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "layer_harness.h"

using namespace ampipe;
using ampipe::testing::rel_err;
using ampipe::testing::seeded_normal;

namespace {

model::LayerConfig base(int k, double capacity_factor, double dropout) {
  model::LayerConfig c;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.hidden_size = 16;
  c.ffn_hidden_size = 24;
  c.num_attention_heads = 2;
  c.num_experts = 4;
  c.moe_router_topk = k;
  c.moe_train_capacity_factor = capacity_factor;
  c.moe_min_capacity = 1;
  c.hidden_dropout = dropout;
  c.init_method_std = 0.2;
  c.seed = 17;
  return c;
}

struct Result {
  Tensor y, dx;
  double aux = 0;
  std::map<std::string, Tensor> grads;
};

// Micro-batch m of a run: x and dy drawn with ids (2m, 2m+1); token_base m * s * b.
// Gradients accumulate in the stack's grads(0).
Result run_micro_batch(schedule::LayerStack& stack, int64_t m) {
  const model::LayerConfig& cfg = stack.layer(0).config();
  const Shape act{cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size};
  const Tensor x = seeded_normal(act, cfg.seed, uint64_t(2 * m)), dy = seeded_normal(act, cfg.seed, uint64_t(2 * m + 1));
  Result r;
  r.y = stack.forward(x, uint64_t(m * cfg.tokens())).clone();
  r.aux = stack.aux_loss();
  r.dx = stack.backward(dy, 0.05f).clone();
  return r;
}

// Groups for every EP size are created together, before the first operation starts the engine.
const comm::Groups& groups_for(int ep) {
  static std::map<int, comm::Groups> all;
  if (all.empty()) {
    comm::Runtime& rt = comm::Runtime::current();
    for (int e = 1; e <= rt.size(); e *= 2) all.emplace(e, rt.make_groups(comm::Layout::make(rt.size(), 1, 1, e)));
  }
  return all.at(ep);
}

void check_parallel(model::LayerConfig cfg, int M, int ep) {
  comm::Runtime& rt = comm::Runtime::current();
  const int world = rt.size(), rank = rt.rank();
  // Reference: every micro-batch on this rank alone, experts all local, degree 1.
  model::LayerConfig ref_cfg = cfg;
  ref_cfg.expert_model_parallel_size = 1;
  ref_cfg.use_pipe_experts = false;  // the reference is the plain layer
  ref_cfg.pipe_experts_multi_data = 1;
  schedule::LayerStack ref(ref_cfg, 1, 1, 0, nullptr);
  model::LayerParams& ref_g = ref.grads(0);
  Result mine_ref;
  for (int m = 0; m < world; ++m) {
    Result r = run_micro_batch(ref, m);
    if (m == rank) mine_ref = r;
  }
  // Parallel run.
  cfg.expert_model_parallel_size = ep;
  const comm::Layout layout = comm::Layout::make(world, 1, 1, ep);
  const comm::Groups& groups = groups_for(ep);
  const int ep_rank = layout.coord(rank).ep;
  schedule::LayerStack stack(cfg, 1, M, ep_rank, &groups);
  model::LayerParams& g = stack.grads(0);
  Result got = run_micro_batch(stack, rank);
  for (auto& [name, t] : g.named()) {
    const comm::Group& grp = model::LayerParams::is_expert(name) ? groups.edp : groups.dp_cp;
    if (grp.size() > 1) comm::all_reduce_sync(grp, t, comm::Reduce::sum, "grad." + name);
  }
  const std::string what = fmt::format("k={} cf={} p={} M={} ep={} world={} pipe-experts={} N={}", cfg.moe_router_topk,
                                       cfg.moe_train_capacity_factor, cfg.hidden_dropout, M, ep, world,
                                       cfg.use_pipe_experts, cfg.pipe_experts_multi_data);
  // fp32: only summation orders differ (chunks, the all-reduce), so 1e-5 relative (docs/design.md, "Numerics and determinism").
  EXPECT_LE(rel_err(got.y, mine_ref.y), 1e-5) << "y " << what;
  EXPECT_LE(rel_err(got.dx, mine_ref.dx), 1e-5) << "dx " << what;
  EXPECT_NEAR(got.aux, mine_ref.aux, 1e-6 * std::abs(mine_ref.aux)) << "aux " << what;
  auto gn = g.named(), rn = ref_g.named();
  for (size_t i = 0; i < gn.size(); ++i) {
    Tensor want = rn[i].second;
    if (model::LayerParams::is_expert(rn[i].first)) {
      const int64_t L = cfg.local_experts();
      want = want.rows(ep_rank * L, (ep_rank + 1) * L);
    }
    EXPECT_LE(rel_err(gn[i].second, want), 1e-5) << "grad " << gn[i].first << " " << what;
  }
}

}  // namespace

TEST(LayerParallel, ExpertAndDataParallelEqualSingleRank) {
  const int world = comm::Runtime::current().size();
  groups_for(1);
  for (int k : {1, 2})
    for (int ep = 1; ep <= world; ep *= 2) {
      check_parallel(base(k, 4.0, 0.0), 1, ep);  // nothing dropped
      check_parallel(base(k, 0.5, 0.1), 1, ep);  // tokens dropped: the same drops per micro-batch
      model::LayerConfig no_drop = base(k, 0.5, 0.1);
      no_drop.moe_no_drop = true;  // the EP ranks agree on the largest capacity; nothing is dropped
      check_parallel(no_drop, ep > 1 ? 2 : 1, ep);
    }
}

TEST(LayerParallel, AmpipeDegreesWithExpertParallelEqualSingleRank) {
  const int world = comm::Runtime::current().size();
  groups_for(1);
  for (int ep = 1; ep <= world; ep *= 2)
    for (int k : {1, 2})
      for (double p : {0.0, 0.1})
        for (int M : {2, 4, 8}) check_parallel(base(k, 8.0, p), M, ep);  // capacity >= chunk tokens
}

TEST(LayerParallel, PipeExpertsWithExpertParallelEqualSingleRank) {
  // Every piece's dispatch and combine all-to-all over the EP group: the layer without pipe-experts on one rank.
  // L = 2 and 1 local experts (ep 2 and 4 with E = 4), N = 1, 2, 3 (uneven slices) at degree 1, and N = 4 at
  // degree 2; with and without token drops.
  const int world = comm::Runtime::current().size();
  groups_for(1);
  for (int ep = 1; ep <= world; ep *= 2)
    for (int k : {1, 2})
      for (double cf : {0.5, 4.0})
        for (auto [M, N] : {std::pair{1, 1}, {1, 2}, {1, 3}, {2, 4}}) {
          if (M > 1 && cf < 1) continue;  // the reference is degree 1, which drops other tokens than degree 2
          model::LayerConfig cfg = base(k, cf, 0.1);
          cfg.expert_model_parallel_size = ep;
          cfg.use_pipe_experts = true;
          cfg.pipe_experts_multi_data = N;
          if (!cfg.check_pipe_experts(M).empty()) cfg.use_pipe_experts = false;  // L = 1 and N = 1: nothing to pipe
          cfg.expert_model_parallel_size = 1;  // check_parallel sets it
          check_parallel(cfg, M, ep);
        }
}
