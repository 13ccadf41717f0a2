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
    case GroupKind::pp: return "pp";
    case GroupKind::stage: return "stage";
  }
  return "?";
}

Layout Layout::make(int world, int tp, int cp, int ep, int pp) {
  if (world < 1) throw ConfigError(fmt::format("world size {} must be at least 1", world));
  if (tp < 1)
    throw ConfigError(fmt::format("--tensor-model-parallel-size {} must be at least 1", tp));
  if (cp < 1) throw ConfigError(fmt::format("--context-parallel-size {} must be at least 1", cp));
  if (ep < 1) throw ConfigError(fmt::format("--expert-model-parallel-size {} must be at least 1", ep));
  if (pp < 1) throw ConfigError(fmt::format("--pipeline-model-parallel-size {} must be at least 1", pp));
  if (pp > 1 && world % (tp * cp * pp) != 0)
    throw ConfigError(fmt::format(
        "world size {} is not divisible by --tensor-model-parallel-size {} x --context-parallel-size {} x "
        "--pipeline-model-parallel-size {} (= {}); the world is laid out as tp x cp x dp x pp",
        world, tp, cp, pp, tp * cp * pp));
  if (world % (tp * cp) != 0)
    throw ConfigError(fmt::format(
        "world size {} is not divisible by --tensor-model-parallel-size {} x --context-parallel-size {} (= {}); "
        "the world is laid out as tp x cp x dp", world, tp, cp, tp * cp));
  Layout l;
  l.world = world;
  l.tp = tp;
  l.cp = cp;
  l.pp = pp;
  l.dp = world / (tp * cp * pp);
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
  c.pp = rank / stage_size();
  const int local = rank % stage_size();  // the rank within its stage
  c.tp = local % tp;
  c.cp = (local / tp) % cp;
  c.dp = local / (tp * cp);
  int j = local / tp;  // index in the dp x cp order
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
    case GroupKind::pp: return pp;
    case GroupKind::stage: return stage_size();
  }
  return 0;
}

std::vector<int> Layout::members(GroupKind kind, int rank) const {
  Coord c = coord(rank);
  std::vector<int> m;
  const int base = c.pp * stage_size();  // the stage's first rank
  auto at = [&](int t, int cc, int d) { return base + t + tp * (cc + cp * d); };
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
      for (int j = 0; j < dp * cp; ++j) m.push_back(base + c.tp + tp * j);
      break;
    case GroupKind::ep:
      for (int e = 0; e < ep; ++e) m.push_back(base + c.tp + tp * (c.edp * ep + e));
      break;
    case GroupKind::edp:
      for (int g = 0; g < edp; ++g) m.push_back(base + c.tp + tp * (g * ep + c.ep));
      break;
    case GroupKind::pp:
      for (int q = 0; q < pp; ++q) m.push_back(rank % stage_size() + q * stage_size());
      break;
    case GroupKind::stage:
      for (int r = 0; r < stage_size(); ++r) m.push_back(base + r);
      break;
  }
  return m;
}

int Layout::group_index(GroupKind kind, int rank) const {
  Coord c = coord(rank);
  // a stage's groups of one kind, numbered after those of the stages before it
  const int per_stage = kind == GroupKind::world || kind == GroupKind::pp || kind == GroupKind::stage
                            ? 0
                            : stage_size() / group_size(kind);
  const int offset = c.pp * per_stage;
  switch (kind) {
    case GroupKind::world: return 0;
    case GroupKind::tp: return offset + c.cp + cp * c.dp;
    case GroupKind::cp: return offset + c.tp + tp * c.dp;
    case GroupKind::dp: return offset + c.tp + tp * c.cp;
    case GroupKind::dp_cp: return offset + c.tp;
    case GroupKind::ep: return offset + c.tp + tp * c.edp;
    case GroupKind::edp: return offset + c.tp + tp * c.ep;
    case GroupKind::pp: return rank % stage_size();
    case GroupKind::stage: return c.pp;
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
