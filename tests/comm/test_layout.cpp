// Rank layout (no MPI): Megatron's tp-fastest order, EP groups from the dp x cp ranks, and the ConfigErrors.
#include <gtest/gtest.h>

#include <set>

#include "ampipe/comm/layout.h"
#include "ampipe/core/error.h"

using namespace ampipe;
using namespace ampipe::comm;
using V = std::vector<int>;

TEST(Layout, Trivial) {
  Layout l = Layout::make(1, 1, 1, 1);
  EXPECT_EQ(l.dp, 1);
  EXPECT_EQ(l.members(GroupKind::ep, 0), V{0});
  EXPECT_EQ(l.members(GroupKind::world, 0), V{0});
}

TEST(Layout, World4Ep2) {
  Layout l = Layout::make(4, 1, 1, 2);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.edp, 2);
  EXPECT_EQ(l.members(GroupKind::ep, 0), (V{0, 1}));
  EXPECT_EQ(l.members(GroupKind::ep, 3), (V{2, 3}));
  EXPECT_EQ(l.members(GroupKind::edp, 1), (V{1, 3}));
  EXPECT_EQ(l.members(GroupKind::dp, 2), (V{0, 1, 2, 3}));
  EXPECT_EQ(l.members(GroupKind::tp, 2), V{2});
  EXPECT_EQ(l.position(GroupKind::ep, 3), 1);
  EXPECT_EQ(l.position(GroupKind::edp, 3), 1);
}

TEST(Layout, Tp2Cp2Dp2Ep2) {
  // world 8: rank = tp + 2*(cp + 2*dp)
  Layout l = Layout::make(8, 2, 2, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.edp, 2);
  auto c = l.coord(5);  // tp 1, cp 0, dp 1
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(l.members(GroupKind::tp, 5), (V{4, 5}));
  EXPECT_EQ(l.members(GroupKind::cp, 5), (V{5, 7}));
  EXPECT_EQ(l.members(GroupKind::dp, 5), (V{1, 5}));
  EXPECT_EQ(l.members(GroupKind::dp_cp, 5), (V{1, 3, 5, 7}));
  // dp x cp index j = rank / tp: 5 -> 2; ep groups are consecutive j's: {0,1}, {2,3} -> ranks {1,3}, {5,7}
  EXPECT_EQ(l.members(GroupKind::ep, 5), (V{5, 7}));
  EXPECT_EQ(l.members(GroupKind::ep, 0), (V{0, 2}));
  EXPECT_EQ(l.members(GroupKind::edp, 5), (V{1, 5}));
  EXPECT_EQ(l.members(GroupKind::edp, 2), (V{2, 6}));
}

TEST(Layout, Tp2Ep4World16) {
  Layout l = Layout::make(16, 2, 1, 4);
  EXPECT_EQ(l.dp, 8);
  EXPECT_EQ(l.edp, 2);
  EXPECT_EQ(l.members(GroupKind::ep, 0), (V{0, 2, 4, 6}));
  EXPECT_EQ(l.members(GroupKind::ep, 9), (V{9, 11, 13, 15}));
  EXPECT_EQ(l.members(GroupKind::edp, 11), (V{3, 11}));
  EXPECT_EQ(l.coord(11).ep, 1);
  EXPECT_EQ(l.coord(11).edp, 1);
}

TEST(Layout, GroupsPartitionTheWorld) {
  for (auto [w, tp, cp, ep] : std::vector<std::array<int, 4>>{{8, 2, 2, 2}, {12, 2, 3, 3}, {16, 2, 2, 4},
                                                                {6, 1, 3, 6}, {24, 2, 2, 6}}) {
    Layout l = Layout::make(w, tp, cp, ep);
    for (GroupKind k : {GroupKind::world, GroupKind::tp, GroupKind::cp, GroupKind::dp, GroupKind::dp_cp,
                        GroupKind::ep, GroupKind::edp}) {
      auto groups = l.all_groups(k);
      std::set<int> seen, colours;
      for (const auto& g : groups) {
        EXPECT_EQ(int(g.size()), l.group_size(k)) << group_kind_name(k);
        colours.insert(l.group_index(k, g[0]));
        for (size_t i = 0; i < g.size(); ++i) {
          EXPECT_TRUE(seen.insert(g[i]).second) << "rank in two groups";
          EXPECT_EQ(l.members(k, g[i]), g) << "membership is symmetric";
          EXPECT_EQ(l.position(k, g[i]), int(i));
          EXPECT_EQ(l.group_index(k, g[i]), l.group_index(k, g[0]));
          if (k != GroupKind::tp && k != GroupKind::world) {
            EXPECT_EQ(g[i] % tp, g[0] % tp) << "same tp coordinate in " << group_kind_name(k);
          }
        }
      }
      EXPECT_EQ(int(colours.size()), int(groups.size())) << "distinct split colours";
      EXPECT_EQ(int(seen.size()), w) << "the groups of a kind partition the world";
    }
    // ep x edp covers the dp x cp group of each tp rank.
    EXPECT_EQ(l.ep * l.edp, l.dp * l.cp);
  }
}

TEST(Layout, ErrorsNameFlagValueAndRule) {
  auto msg = [](int w, int tp, int cp, int ep) {
    try {
      Layout::make(w, tp, cp, ep);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = msg(6, 4, 1, 1);
  EXPECT_NE(m.find("--tensor-model-parallel-size 4"), std::string::npos) << m;
  EXPECT_NE(m.find("--context-parallel-size 1"), std::string::npos) << m;
  EXPECT_NE(m.find("world size 6 is not divisible"), std::string::npos) << m;
  m = msg(8, 2, 1, 3);
  EXPECT_NE(m.find("--expert-model-parallel-size 3 does not divide"), std::string::npos) << m;
  EXPECT_NE(m.find("(= 4)"), std::string::npos) << m;
  m = msg(4, 0, 1, 1);
  EXPECT_NE(m.find("--tensor-model-parallel-size 0 must be at least 1"), std::string::npos) << m;
  m = msg(4, 1, -1, 1);
  EXPECT_NE(m.find("--context-parallel-size -1"), std::string::npos) << m;
  m = msg(4, 1, 1, 0);
  EXPECT_NE(m.find("--expert-model-parallel-size 0"), std::string::npos) << m;
  EXPECT_EQ(msg(4, 1, 1, 4), "no error");
}
