// Layout: which world ranks form which process group, computed from (world, tp, cp, ep, pp) alone (no MPI).
//
// Megatron's order: world = tp x cp x dp x pp with tp varying fastest, then cp, then dp, then the pipeline stage:
//   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
// The ranks of one pipeline stage (tp x cp x dp of them, consecutive) form every group below but pp; with pp = 1 the
// stage is the world.
// Groups of rank r (all members share the coordinates not named, the stage included):
//   tp     : the tp ranks with r's (cp, dp)
//   cp     : the cp ranks with r's (tp, dp)
//   dp     : the dp ranks with r's (tp, cp)
//   dp_cp  : the dp*cp ranks with r's tp (non-expert gradient averaging); index j = rank / tp = cp_rank + cp*dp_rank
//   ep     : ep consecutive entries of the dp_cp index order, same tp: j / ep picks the group, j % ep the position
//   edp    : expert-data-parallel, the dp*cp/ep ranks with r's tp and r's position in its ep group
//   pp     : the pp ranks with r's (tp, cp, dp): one per pipeline stage, in stage order
//   stage  : every rank of r's pipeline stage (tp x cp x dp)
// Members are listed in ascending world rank, which is also their rank in the group's communicator.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ampipe::comm {

enum class GroupKind { world, tp, cp, dp, dp_cp, ep, edp, pp, stage };
std::string_view group_kind_name(GroupKind k);

struct Layout {
  int world = 1, tp = 1, cp = 1, dp = 1, ep = 1, pp = 1;
  int edp = 1;  // dp * cp / ep

  // Throws ConfigError naming --tensor-model-parallel-size, --context-parallel-size,
  // --expert-model-parallel-size or --pipeline-model-parallel-size, the values and the rule when the sizes do not
  // fit the world.
  static Layout make(int world, int tp, int cp, int ep, int pp = 1);

  int stage_size() const { return tp * cp * dp; }
  struct Coord {
    int tp, cp, dp;  // Megatron coordinates
    int ep, edp;     // position in the ep group, and the index of the ep group (= position in the edp group)
    int pp = 0;      // pipeline stage
  };
  Coord coord(int rank) const;

  // World ranks of the group of `kind` that contains `rank`, ascending.
  std::vector<int> members(GroupKind kind, int rank) const;
  // Which group of that kind `rank` belongs to (0-based; the colour of the communicator split).
  int group_index(GroupKind kind, int rank) const;
  // Position of `rank` inside its group (its rank in the group communicator).
  int position(GroupKind kind, int rank) const;
  int group_size(GroupKind kind) const;
  // All groups of one kind, each listed as by members().
  std::vector<std::vector<int>> all_groups(GroupKind kind) const;
};

// "ep[0,2]": the kind and the world ranks; used in every message about a group.
std::string group_label(GroupKind kind, const std::vector<int>& members);

}  // namespace ampipe::comm
