#include "ampipe/comm/layout.h"

#include <fmt/format.h>

#include "ampipe/core/error.h"

namespace ampipe::comm {

std::string_view group_kind_name(GroupKind k) {
  switch (k) {
    case GroupKind::world: return "world";
    case GroupKind::tp: return "tp";
    case GroupKind::cp: return "cp";
    case GroupKind::dp: return "dp";
    case GroupKind::dp_cp: return "dp_cp";
    case GroupKind::ep: return "ep";
    case GroupKind::edp: return "edp";
  }
  return "?";
}

Layout Layout::make(int world, int tp, int cp, int ep) {
  if (world < 1) throw ConfigError(fmt::format("world size {} must be at least 1", world));
  if (tp < 1)
    throw ConfigError(fmt::format("--tensor-model-parallel-size {} must be at least 1", tp));
  if (cp < 1) throw ConfigError(fmt::format("--context-parallel-size {} must be at least 1", cp));
  if (ep < 1) throw ConfigError(fmt::format("--expert-model-parallel-size {} must be at least 1", ep));
  if (world % (tp * cp) != 0)
    throw ConfigError(fmt::format(
        "world size {} is not divisible by --tensor-model-parallel-size {} x --context-parallel-size {} (= {}); "
        "the world is laid out as tp x cp x dp", world, tp, cp, tp * cp));
  Layout l;
  l.world = world;
  l.tp = tp;
  l.cp = cp;
  l.dp = world / (tp * cp);
  l.ep = ep;
  if ((l.dp * cp) % ep != 0)
    throw ConfigError(fmt::format(
        "--expert-model-parallel-size {} does not divide data-parallel size {} x --context-parallel-size {} (= {}); "
        "expert-parallel groups are formed from the dp x cp ranks (world {} / --tensor-model-parallel-size {})",
        ep, l.dp, cp, l.dp * cp, world, tp));
  l.edp = l.dp * cp / ep;
  return l;
}

Layout::Coord Layout::coord(int rank) const {
  AMPIPE_CHECK(rank >= 0 && rank < world, "rank {} outside world {}", rank, world);
  Coord c;
  c.tp = rank % tp;
  c.cp = (rank / tp) % cp;
  c.dp = rank / (tp * cp);
  int j = rank / tp;  // index in the dp x cp order
  c.ep = j % ep;
  c.edp = j / ep;
  return c;
}

int Layout::group_size(GroupKind kind) const {
  switch (kind) {
    case GroupKind::world: return world;
    case GroupKind::tp: return tp;
    case GroupKind::cp: return cp;
    case GroupKind::dp: return dp;
    case GroupKind::dp_cp: return dp * cp;
    case GroupKind::ep: return ep;
    case GroupKind::edp: return edp;
  }
  return 0;
}

std::vector<int> Layout::members(GroupKind kind, int rank) const {
  Coord c = coord(rank);
  std::vector<int> m;
  auto at = [&](int t, int cc, int d) { return t + tp * (cc + cp * d); };
  switch (kind) {
    case GroupKind::world:
      for (int r = 0; r < world; ++r) m.push_back(r);
      break;
    case GroupKind::tp:
      for (int t = 0; t < tp; ++t) m.push_back(at(t, c.cp, c.dp));
      break;
    case GroupKind::cp:
      for (int x = 0; x < cp; ++x) m.push_back(at(c.tp, x, c.dp));
      break;
    case GroupKind::dp:
      for (int d = 0; d < dp; ++d) m.push_back(at(c.tp, c.cp, d));
      break;
    case GroupKind::dp_cp:
      for (int j = 0; j < dp * cp; ++j) m.push_back(c.tp + tp * j);
      break;
    case GroupKind::ep:
      for (int e = 0; e < ep; ++e) m.push_back(c.tp + tp * (c.edp * ep + e));
      break;
    case GroupKind::edp:
      for (int g = 0; g < edp; ++g) m.push_back(c.tp + tp * (g * ep + c.ep));
      break;
  }
  return m;
}

int Layout::group_index(GroupKind kind, int rank) const {
  Coord c = coord(rank);
  switch (kind) {
    case GroupKind::world: return 0;
    case GroupKind::tp: return c.cp + cp * c.dp;
    case GroupKind::cp: return c.tp + tp * c.dp;
    case GroupKind::dp: return c.tp + tp * c.cp;
    case GroupKind::dp_cp: return c.tp;
    case GroupKind::ep: return c.tp + tp * c.edp;
    case GroupKind::edp: return c.tp + tp * c.ep;
  }
  return 0;
}

int Layout::position(GroupKind kind, int rank) const {
  auto m = members(kind, rank);
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i] == rank) return int(i);
  AMPIPE_CHECK(false, "rank {} not in its own {} group", rank, group_kind_name(kind));
  return -1;
}

std::vector<std::vector<int>> Layout::all_groups(GroupKind kind) const {
  std::vector<std::vector<int>> out;
  std::vector<bool> seen(size_t(world), false);
  for (int r = 0; r < world; ++r) {
    if (seen[size_t(r)]) continue;
    auto m = members(kind, r);
    for (int x : m) seen[size_t(x)] = true;
    out.push_back(std::move(m));
  }
  return out;
}

std::string group_label(GroupKind kind, const std::vector<int>& members) {
  return fmt::format("{}[{}]", group_kind_name(kind), fmt::join(members, ","));
}

}  // namespace ampipe::comm
