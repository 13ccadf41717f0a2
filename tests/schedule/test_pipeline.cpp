// Pipeline parallelism's schedule (schedule/pipeline.h) without MPI: Megatron's 1F1B order by hand, and the
// timeline of the stages running it against hand-placed slots and the bubble's closed form.
#include <gtest/gtest.h>

#include <vector>

#include "ampipe/schedule/pipeline.h"

using namespace ampipe::schedule;

// Megatron's 1F1B order, by hand: stage p of P runs min(P - 1 - p, K) warm-up forwards, then forward / backward
// pairs, then the remaining backwards.
TEST(Pipeline, OneForwardOneBackwardOrderByHand) {
  using Order = std::vector<std::pair<int, bool>>;
  const bool F = true, B = false;
  EXPECT_EQ(one_f_one_b(3, 1, 0), (Order{{0, F}, {0, B}, {1, F}, {1, B}, {2, F}, {2, B}}));
  // P = 2, K = 4: stage 0 warms up with one forward, stage 1 (the last) alternates from the start
  EXPECT_EQ(one_f_one_b(4, 2, 0), (Order{{0, F}, {1, F}, {0, B}, {2, F}, {1, B}, {3, F}, {2, B}, {3, B}}));
  EXPECT_EQ(one_f_one_b(4, 2, 1), (Order{{0, F}, {0, B}, {1, F}, {1, B}, {2, F}, {2, B}, {3, F}, {3, B}}));
  // P = 4, K = 5: stage 0 three warm-up forwards, stage 2 one
  EXPECT_EQ(one_f_one_b(5, 4, 0),
            (Order{{0, F}, {1, F}, {2, F}, {3, F}, {0, B}, {4, F}, {1, B}, {2, B}, {3, B}, {4, B}}));
  EXPECT_EQ(one_f_one_b(5, 4, 2),
            (Order{{0, F}, {1, F}, {0, B}, {2, F}, {1, B}, {3, F}, {2, B}, {4, F}, {3, B}, {4, B}}));
  // fewer micro-batches than warm-up forwards: every forward, then every backward
  EXPECT_EQ(one_f_one_b(2, 4, 0), (Order{{0, F}, {1, F}, {0, B}, {1, B}}));
}

// P = 2, K = 3, forward 1 and backward 2 on both stages, by hand:
//   stage 0: F0 [0,1) F1 [1,2) B0 [4,6) F2 [6,7) B1 [7,9) B2 [10,12)
//   stage 1: F0 [1,2) B0 [2,4) F1 [4,5) B1 [5,7) F2 [7,8) B2 [8,10)   (F1 waits for B0: 1F1B, not for stage 0)
// busy 3 + 6 per stage = 18 of 2 x 12: the bubble is 6/24 = (P - 1) / (K + P - 1). With a send time of 1: stage 1's
// F0 [2,3) B0 [3,5), stage 0's B0 [6,8), stage 1's F1 [5,6) B1 [6,8), stage 0's F2 [8,9) B1 [9,11), stage 1's F2
// [10,11) B2 [11,13), stage 0's B2 [14,16).
TEST(Pipeline, TimelineByHand) {
  const std::vector<PipelineSlot> t = pipeline_timeline(3, {1, 1}, {2, 2});
  auto at = [&](int stage, int m, bool f) {
    for (const PipelineSlot& s : t)
      if (s.stage == stage && s.micro_batch == m && s.forward == f) return std::pair{s.start, s.end};
    ADD_FAILURE() << "no slot";
    return std::pair{0.0, 0.0};
  };
  EXPECT_EQ(at(0, 0, true), (std::pair{0.0, 1.0}));
  EXPECT_EQ(at(0, 1, true), (std::pair{1.0, 2.0}));
  EXPECT_EQ(at(1, 0, true), (std::pair{1.0, 2.0}));
  EXPECT_EQ(at(1, 0, false), (std::pair{2.0, 4.0}));
  EXPECT_EQ(at(0, 0, false), (std::pair{4.0, 6.0}));
  EXPECT_EQ(at(1, 1, true), (std::pair{4.0, 5.0}));
  EXPECT_EQ(at(1, 1, false), (std::pair{5.0, 7.0}));
  EXPECT_EQ(at(0, 2, true), (std::pair{6.0, 7.0}));
  EXPECT_EQ(at(0, 1, false), (std::pair{7.0, 9.0}));
  EXPECT_EQ(at(1, 2, true), (std::pair{7.0, 8.0}));
  EXPECT_EQ(at(1, 2, false), (std::pair{8.0, 10.0}));
  EXPECT_EQ(at(0, 2, false), (std::pair{10.0, 12.0}));
  EXPECT_DOUBLE_EQ(pipeline_bubble(t, 2), 1.0 - 18.0 / 24.0);
  EXPECT_EQ(draw_pipeline(t, 2, 1.0),
            "  stage  0 |F0F1 . .B0B0F2B1B1 .B2B2\n"
            "  stage  1 | .F0B0B0F1B1B1F2B2B2 . .\n");
  const std::vector<PipelineSlot> sent = pipeline_timeline(3, {1, 1}, {2, 2}, 1.0);
  double end = 0;
  for (const PipelineSlot& s : sent) end = std::max(end, s.end);
  EXPECT_EQ(end, 16.0);
}

// Equal stages without send time: the bubble is (P - 1) / (K + P - 1) (forward f, backward b, any ratio).
TEST(Pipeline, BubbleIsTheClosedFormForEqualStages) {
  for (int P : {2, 4})
    for (int K : {1, 4, 8}) {
      const std::vector<PipelineSlot> t =
          pipeline_timeline(K, std::vector<double>(size_t(P), 1.5), std::vector<double>(size_t(P), 3.0));
      EXPECT_NEAR(pipeline_bubble(t, P), double(P - 1) / double(K + P - 1), 1e-12) << "P " << P << " K " << K;
    }
}

// Megatron's interleaved order (forward_backward_pipelining_with_interleaving), by hand from its schedule table. Its
// own example, P = 2, v = 2, group 2, K = 4: the forwards run micro-batches 0 1 0 1 2 3 2 3 with chunks
// 0 0 1 1 0 0 1 1 on every rank; rank 0 warms up with 2 (P - 1 - 0) + (v - 1) 2 = 4 forwards, rank 1 with 2; the
// backwards take the same table with the chunks reversed.
TEST(Pipeline, InterleavedOrderByHand) {
  using S = PipelineStep;
  const bool F = true, B = false;
  EXPECT_EQ(pipeline_order(4, 2, 0, 2),
            (std::vector<S>{{0, 0, F}, {1, 0, F}, {0, 1, F}, {1, 1, F}, {2, 0, F}, {0, 1, B}, {3, 0, F}, {1, 1, B},
                            {2, 1, F}, {0, 0, B}, {3, 1, F}, {1, 0, B}, {2, 1, B}, {3, 1, B}, {2, 0, B}, {3, 0, B}}));
  EXPECT_EQ(pipeline_order(4, 2, 1, 2),
            (std::vector<S>{{0, 0, F}, {1, 0, F}, {0, 1, F}, {0, 1, B}, {1, 1, F}, {1, 1, B}, {2, 0, F}, {0, 0, B},
                            {3, 0, F}, {1, 0, B}, {2, 1, F}, {2, 1, B}, {3, 1, F}, {3, 1, B}, {2, 0, B}, {3, 0, B}}));
  // Megatron's second example, group 3, K = 5: forwards 0 1 2 0 1 2 3 4 3 4 (chunks 0 0 0 1 1 1 0 0 1 1); the last
  // rank warms up with (v - 1) 3 = 3 forwards
  std::vector<std::pair<int, int>> fwd, bwd;
  for (const S& s : pipeline_order(5, 2, 1, 2, 3)) (s.forward ? fwd : bwd).push_back({s.micro_batch, s.chunk});
  EXPECT_EQ(fwd, (std::vector<std::pair<int, int>>{{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 0}, {4, 0},
                                                   {3, 1}, {4, 1}}));
  EXPECT_EQ(bwd, (std::vector<std::pair<int, int>>{{0, 1}, {1, 1}, {2, 1}, {0, 0}, {1, 0}, {2, 0}, {3, 1}, {4, 1},
                                                   {3, 0}, {4, 0}}));
  EXPECT_EQ(pipeline_order(5, 2, 1, 2, 3)[3], (S{0, 1, F}));  // the first step after the warm-up is a forward
  // one chunk is 1F1B
  std::vector<S> plain;
  for (const auto& [m, f] : one_f_one_b(5, 4, 1)) plain.push_back({m, 0, f});
  EXPECT_EQ(pipeline_order(5, 4, 1), plain);
  // in flight: 1F1B's min(P - p, K); rank 0 of the first example holds all 4 micro-batches of chunk 0 at once,
  // rank 1 three
  EXPECT_EQ(max_in_flight(pipeline_order(5, 4, 1)), 3);
  EXPECT_EQ(max_in_flight(pipeline_order(2, 4, 0)), 2);
  EXPECT_EQ(max_in_flight(pipeline_order(4, 2, 0, 2)), 4);
  EXPECT_EQ(max_in_flight(pipeline_order(4, 2, 1, 2)), 3);  // chunk 0's micro-batches 0, 1, 2 after F(2, 0)
}

// Equal stages, K a multiple of P, no send time: the interleaved schedule's bubble is (P - 1) / v of a micro-batch's
// forward and backward (Narayanan et al. 2021, section 2.2.2): busy K (f + b) of a makespan K (f + b) +
// (P - 1) (f + b) / v per stage. The chunks' letters mark the drawing; P = 2, K = 2, v = 2, a chunk's forward 1 and
// backward 2, by hand: rank 1's B0b waits for its own F0b only, rank 0's B0b for rank 1's (done at 8), rank 1's B0a
// for rank 0's B0b (at 8) and its own B1b (at 9): 15 in all, the bubble 1 - 24 / 30.
TEST(Pipeline, InterleavedBubbleIsTheClosedForm) {
  for (int P : {2, 4})
    for (int v : {2, 3})
      for (int K : {P, 2 * P, 4 * P}) {
        const std::vector<PipelineSlot> t = pipeline_timeline(K, std::vector<double>(size_t(P), 1.0),
                                                              std::vector<double>(size_t(P), 2.0), 0, v);
        const double idle = double(P - 1) / v;
        EXPECT_NEAR(pipeline_bubble(t, P), idle / (K + idle), 1e-12) << "P " << P << " v " << v << " K " << K;
      }
  const std::vector<PipelineSlot> t = pipeline_timeline(2, {2, 2}, {4, 4}, 0, 2);
  EXPECT_DOUBLE_EQ(pipeline_bubble(t, 2), 1.0 - 24.0 / 30.0);
  EXPECT_EQ(draw_pipeline(t, 2, 1.0),
            "  stage  0 |F0aF1aF0bF1b  .  .B0bB0b  .B1bB1bB0aB0aB1aB1a\n"
            "  stage  1 |  .F0aF1aF0bB0bB0bF1bB1bB1bB0aB0aB1aB1a  .  .\n");
}
