// Multi-rank layer tests: the parameter gradients of a parallel run, summed over the ranks that hold the same
// parameter, against the single-rank reference's, cut to this rank's shard (its EP rows, its tp slice).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/layout.h"
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

}  // namespace ampipe::testing
