// Layout: which world ranks form which process group, computed from (world, tp, cp, ep) alone (no MPI).
//
// Megatron's order: world = tp x cp x dp with tp varying fastest, then cp, then dp:
//   rank = tp_rank + tp * (cp_rank + cp * dp_rank)
// Groups of rank r (all members share the coordinates not named):
//   tp     : the tp ranks with r's (cp, dp)
//   cp     : the cp ranks with r's (tp, dp)
//   dp     : the dp ranks with r's (tp, cp)
//   dp_cp  : the dp*cp ranks with r's tp (non-expert gradient averaging); index j = rank / tp = cp_rank + cp*dp_rank
//   ep     : ep consecutive entries of the dp_cp index order, same tp: j / ep picks the group, j % ep the position
//   edp    : expert-data-parallel, the dp*cp/ep ranks with r's tp and r's position in its ep group
// Members are listed in ascending world rank, which is also their rank in the group's communicator.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ampipe::comm {

enum class GroupKind { world, tp, cp, dp, dp_cp, ep, edp };
std::string_view group_kind_name(GroupKind k);

struct Layout {
  int world = 1, tp = 1, cp = 1, dp = 1, ep = 1;
  int edp = 1;  // dp * cp / ep

  // Throws ConfigError naming --tensor-model-parallel-size, --context-parallel-size or
  // --expert-model-parallel-size, the values and the rule when the sizes do not fit the world.
  static Layout make(int world, int tp, int cp, int ep);

  struct Coord {
    int tp, cp, dp;  // Megatron coordinates
    int ep, edp;     // position in the ep group, and the index of the ep group (= position in the edp group)
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
