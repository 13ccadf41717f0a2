// The distributed optimizer's layout (train/grad_layout.h) and its sharded AdamW update, by hand: which elements
// each data-parallel rank owns, where they sit in the shard buffer, and one AdamW step on a sharded vector against
// hand-computed values (only the owned elements move).
#include <gtest/gtest.h>

#include <cmath>

#include "ampipe/train/adamw.h"
#include "ampipe/train/grad_layout.h"

using namespace ampipe;
using namespace ampipe::train;

namespace {

std::vector<NamedParam> params_of(const std::vector<std::pair<int64_t, bool>>& sizes) {
  std::vector<NamedParam> ps;
  for (const auto& [n, expert] : sizes) {
    NamedParam p;
    p.name = std::string(1, char('a' + ps.size()));
    p.param = Tensor::zeros({n});
    p.grad = Tensor::zeros({n});
    p.expert = expert;
    ps.push_back(std::move(p));
  }
  return ps;
}

}  // namespace

// Parameters: a (3, outside the layers), b (2, layer 0), c (4, layer 0), e (3, expert, layer 0), d (1, outside).
// Dense runs: [a] (3 -> padded 4), [b c] (6), [d] (1 -> 2); D = 2. Expert: [e] (3), D = 1: not sharded.
TEST(GradLayout, ShardsEachRunPaddedToTheGroupByHand) {
  const std::vector<NamedParam> ps = params_of({{3, false}, {2, false}, {4, false}, {3, true}, {1, false}});
  const std::vector<int> layer = {-1, 0, 0, 0, -1};
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const GradLayout l(ps, layer, 2, r, 1, 0, true);
    EXPECT_TRUE(l.sharded(false));
    EXPECT_FALSE(l.sharded(true));
    ASSERT_EQ(l.runs().size(), 4u);
    // offsets: a 0, b 4, c 6, d 10 (after the padded runs); e 0 in the expert buffer
    EXPECT_EQ(l.offset(0), 0);
    EXPECT_EQ(l.offset(1), 4);
    EXPECT_EQ(l.offset(2), 6);
    EXPECT_EQ(l.offset(4), 10);
    EXPECT_EQ(l.offset(3), 0);
    EXPECT_EQ(l.buffer_size(false), 12);
    EXPECT_EQ(l.shard_buffer_size(false), 2 + 3 + 1);
    std::vector<std::tuple<size_t, int64_t, int64_t, int64_t>> got;
    for (const GradPiece& p : l.pieces()) got.emplace_back(p.seg.param, p.seg.begin, p.seg.end, p.shard_at);
    // rank 0 owns a[0,2), b[0,2) + c[0,1), d[0,1); rank 1 owns a[2,3) (and the padding), c[1,4), nothing of d
    const std::vector<std::tuple<size_t, int64_t, int64_t, int64_t>> want =
        r == 0 ? std::vector<std::tuple<size_t, int64_t, int64_t, int64_t>>{{0, 0, 2, 0}, {1, 0, 2, 2}, {2, 0, 1, 4},
                                                                            {3, 0, 3, -1}, {4, 0, 1, 5}}
               : std::vector<std::tuple<size_t, int64_t, int64_t, int64_t>>{{0, 2, 3, 0}, {2, 1, 4, 2}, {3, 0, 3, -1}};
    EXPECT_EQ(got, want);
    EXPECT_EQ(l.owned_elements(), r == 0 ? 2 + 3 + 1 + 3 : 1 + 3 + 3);
  }
  const GradLayout off(ps, layer, 2, 0, 1, 0, false);
  EXPECT_FALSE(off.sharded(false));
  EXPECT_EQ(off.buffer_size(false), 10);
  EXPECT_EQ(off.owned_elements(), 13);
}

// A dense parameter after the expert ones of its layer (a shared expert after the routed experts: b e f in layer 0)
// belongs to the layer's dense run, not to the expert run opened after it: its piece is dense, its elements follow b's.
TEST(GradLayout, ADenseParameterAfterTheExpertsStaysInTheDenseRun) {
  const std::vector<NamedParam> ps = params_of({{2, false}, {3, true}, {4, false}});
  const std::vector<int> layer = {0, 0, 0};
  for (bool shard : {false, true}) {
    SCOPED_TRACE(shard ? "sharded" : "unsharded");
    const GradLayout l(ps, layer, 2, 0, 2, 0, shard);
    ASSERT_EQ(l.runs().size(), 2u);
    EXPECT_EQ(l.offset(0), 0);
    EXPECT_EQ(l.offset(2), 2);
    EXPECT_EQ(l.offset(1), 0);
    EXPECT_EQ(l.buffer_size(false), 6);
    std::vector<std::pair<size_t, bool>> got;
    for (const GradPiece& p : l.pieces()) got.emplace_back(p.seg.param, p.expert);
    // sharded, rank 0 owns dense [0, 3) (b and f[0, 1)) and expert [0, 2) (e[0, 2))
    EXPECT_EQ(got, (std::vector<std::pair<size_t, bool>>{{0, false}, {1, true}, {2, false}}));
    if (shard) {
      EXPECT_EQ(l.pieces()[2].seg.end, 1);
      EXPECT_EQ(l.pieces()[2].shard_at, 2);
    }
  }
}

// One AdamW step (t = 1, lr 0.1, weight decay 0.5, betas 0.9 / 0.999, eps 1e-8) on the slice [1, 3) of a
// 4-vector: m = 0.1 g, v = 0.001 g^2, so m / (1 - 0.9) = g and sqrt(v / (1 - 0.999)) = |g|, and the owned elements
// become p (1 - lr wd) - lr g / (|g| + eps); the others do not move.
TEST(GradLayout, ShardedAdamWStepByHand) {
  std::vector<NamedParam> ps = params_of({{4, false}});
  ps[0].decay = true;
  ps[0].param = Tensor::from({1.0f, 2.0f, -3.0f, 4.0f}, {4});
  ps[0].grad = Tensor::from({0.5f, -2.0f, 0.25f, 8.0f}, {4});
  AdamW opt(ps, {{0, 1, 3}});
  opt.step(ps, 0.1, 0.5, 0.9, 0.999, 1e-8, 1.0f);
  const float p1 = 2.0f * 0.95f + 0.1f * 2.0f / (2.0f + 1e-8f), p2 = -3.0f * 0.95f - 0.1f * 0.25f / (0.25f + 1e-8f);
  EXPECT_FLOAT_EQ(ps[0].param.get(0), 1.0f);
  EXPECT_NEAR(ps[0].param.get(1), p1, 1e-6);
  EXPECT_NEAR(ps[0].param.get(2), p2, 1e-6);
  EXPECT_FLOAT_EQ(ps[0].param.get(3), 4.0f);
  EXPECT_NEAR(opt.exp_avg(0).get(0), 0.1f * -2.0f, 1e-7);
  EXPECT_NEAR(opt.exp_avg_sq(0).get(1), 0.001f * 0.0625f, 1e-9);
  EXPECT_EQ(opt.exp_avg(0).numel(), 2);
}
