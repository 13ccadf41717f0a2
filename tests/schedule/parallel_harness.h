// Multi-rank layer tests: a parallel run (expert, data, tensor, sequence, context parallelism) against the
// single-rank layer. Data-parallel rank d processes micro-batch d; every rank also runs every micro-batch alone
// (one rank, degree 1, fp32) as the reference. Compared: y and dx of its micro-batch (its rows, put back in the
// natural order), the aux loss, and every parameter gradient summed over the ranks that hold the same parameter,
// against the reference's cut to this rank's shard (its EP rows, its tp slice).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/layout.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/model/context_parallel.h"
#include "ampipe/model/sequence_shard.h"
#include "layer_harness.h"

namespace ampipe::testing {

// Sums `stack`'s gradients in place (sequence-parallel parameters over tp first: each tp rank saw its rows; then
// dense ones over dp x cp, expert ones over their edp group) and expects each within `tol` of `ref`'s.
inline void expect_grads_match(schedule::LayerStack& stack, schedule::LayerStack& ref, const model::LayerConfig& cfg,
                               const comm::Groups& groups, const comm::Layout::Coord& me, double tol,
                               const std::string& what) {
  for (auto& [name, g] : stack.grads(0).named()) {
    if (cfg.sp() && model::LayerParams::is_sequence_parallel(name))
      comm::all_reduce_sync(groups.tp, g, comm::Reduce::sum, "grad.tp." + name);
    const comm::Group& grp = model::LayerParams::is_expert(name) ? groups.edp : groups.dp_cp;
    if (grp.size() > 1) comm::all_reduce_sync(grp, g, comm::Reduce::sum, "grad." + name);
  }
  auto gn = stack.grads(0).named(), rn = ref.grads(0).named();
  ASSERT_EQ(gn.size(), rn.size());
  for (size_t i = 0; i < gn.size(); ++i) {
    const std::string& name = rn[i].first;
    Tensor w = rn[i].second;
    if (model::LayerParams::is_expert(name)) {
      const int64_t L = cfg.local_experts();
      w = w.rows(me.ep * L, (me.ep + 1) * L).clone();
    }
    if (cfg.tp() > 1 && model::tp_split(cfg, name).dim >= 0) w = model::tp_take(cfg, name, w, me.tp);
    ASSERT_EQ(gn[i].second.shape(), w.shape()) << name << " " << what;
    EXPECT_LE(rel_err(gn[i].second, w), tol) << "grad " << name << " " << what;
  }
}

struct ParallelResult {
  Tensor y, dx;  // natural order, every row
  double aux = 0;
};

// The natural order back from every rank's rows: all-gathered over tp (sequence parallel), then over cp.
inline Tensor natural_rows(const model::LayerConfig& cfg, int M, const comm::Groups& groups, Tensor v) {
  if (cfg.sp()) {
    Tensor all = Tensor::empty({v.size(0) * cfg.tp(), v.size(1), v.size(2)});
    comm::all_gather_sync(groups.tp, v, all, "test.sp_gather");
    v = model::sequence_unshard(all, M, cfg.tp());
  }
  if (cfg.cp() > 1) {
    Tensor all = Tensor::empty({v.size(0) * cfg.cp(), v.size(1), v.size(2)});
    comm::all_gather_sync(groups.cp, v, all, "test.cp_gather");
    v = model::context_unshard(all, M, cfg.cp());
  }
  return v;
}

// Micro-batch m through `stack`: this rank's rows in (model::layer_rows), all rows back out (groups: null for one
// rank).
inline ParallelResult run_micro_batch(schedule::LayerStack& stack, int64_t m, const comm::Groups* groups) {
  const model::LayerConfig& cfg = stack.layer(0).config();
  const Shape act{cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size};
  const int M = stack.degree();
  auto rows = [&](const Tensor& full) {
    return model::layer_rows(full, cfg.cp(), cfg.tp(), cfg.sp(), M, stack.cp_rank(), stack.tp_rank());
  };
  const Tensor x = rows(seeded_normal(act, cfg.seed, uint64_t(2 * m)));
  const Tensor dy = rows(seeded_normal(act, cfg.seed, uint64_t(2 * m + 1)));
  ParallelResult r;
  r.y = stack.forward(x, uint64_t(m * cfg.tokens())).clone();
  r.aux = stack.aux_loss();
  r.dx = stack.backward(dy, 0.05f).clone();
  if (groups) {
    r.y = natural_rows(cfg, M, *groups, r.y);
    r.dx = natural_rows(cfg, M, *groups, r.dx);
  }
  return r;
}

// cfg holds the parallel sizes of `groups`; degree M. Every comparison within `tol` (relative).
inline void expect_equals_single_rank(const model::LayerConfig& cfg, int M, const comm::Groups& groups, double tol,
                                      const std::string& what) {
  const comm::Layout::Coord me = groups.layout.coord(comm::Runtime::current().rank());
  model::LayerConfig ref_cfg = cfg;
  ref_cfg.expert_model_parallel_size = 1;
  ref_cfg.tensor_model_parallel_size = 1;
  ref_cfg.context_parallel_size = 1;
  ref_cfg.sequence_parallel = false;
  ref_cfg.ampipe_tp_sp_comm_overlap = false;
  ref_cfg.bf16 = false;
  schedule::LayerStack ref(ref_cfg, 1, 1, 0, nullptr);
  ParallelResult want;
  for (int m = 0; m < groups.layout.dp; ++m) {
    ParallelResult r = run_micro_batch(ref, m, nullptr);
    if (m == me.dp) want = r;
  }
  schedule::LayerStack stack(cfg, 1, M, me.ep, &groups);
  const ParallelResult got = run_micro_batch(stack, me.dp, &groups);
  EXPECT_LE(rel_err(got.y, want.y), tol) << "y " << what;
  EXPECT_LE(rel_err(got.dx, want.dx), tol) << "dx " << what;
  EXPECT_NEAR(got.aux, want.aux, std::max(1e-6, tol) * std::abs(want.aux)) << "aux " << what;
  expect_grads_match(stack, ref, cfg, groups, me, tol, what);
}

}  // namespace ampipe::testing
