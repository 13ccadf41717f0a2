// model::Layer::run(stage, dir, chunk, piece) reaches the code meant for each stage: a direction a stage does not
// have never reaches a block, it stops with "is not a compute stage of the layer"; a communication stage (a Plan
// collective, run by the executor through comm/) is another type and cannot be passed at all (a backward
// communication stage once fell through into the context-parallel dK/dV reduction). The compute stages themselves
// are exercised by every layer test.
#include <gtest/gtest.h>

#include "ampipe/model/stage.h"
#include "ampipe/schedule/layer_stack.h"
#include "ampipe/schedule/plan.h"

using namespace ampipe;
using model::Dir;
using model::Stage;

namespace {

model::LayerConfig config() {
  model::LayerConfig c;
  c.seq_length = 16;
  c.micro_batch_size = 1;
  c.hidden_size = 16;
  c.ffn_hidden_size = 32;
  c.num_attention_heads = 2;
  c.num_experts = 2;
  c.moe_router_topk = 1;
  return c;
}

// Stages that have one direction only.
bool forward_only(Stage s) { return s == Stage::gate_assign || s == Stage::aux_loss; }
bool backward_only(Stage s) {
  return s == Stage::attention_wgrad || s == Stage::expert_wgrad || s == Stage::cp_dkv_reduce ||
         s == Stage::attention_recompute || s == Stage::mlp_wgrad;
}

}  // namespace

TEST(LayerRunDeathTest, MissingDirectionsNeverReachABlock) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  schedule::LayerStack stack(config(), 1, 1, 0, nullptr);
  model::Layer& layer = stack.layer(0);
  int checked = 0;
  for (int i = 0; i < model::kNumStages; ++i) {
    const Stage s = Stage(i);
    for (Dir d : {Dir::fwd, Dir::bwd}) {
      const bool missing = (d == Dir::bwd && forward_only(s)) || (d == Dir::fwd && backward_only(s));
      if (!missing) continue;
      EXPECT_DEATH(layer.run(s, d, 0, 0), "is not a compute stage of the layer")
          << model::stage_name(s) << "." << model::dir_name(d);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 + 5);  // seven one-way stages
}

// Communication stages are another type (schedule/comm_stage.h): a Plan task names one or the other, and asking a
// task's stage for the wrong kind stops, so a collective can never be run as a block's stage (or the reverse).
TEST(LayerRunDeathTest, ATaskStageIsEitherComputeOrCommunication) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int i = 0; i < schedule::kNumCommStages; ++i) {
    const schedule::TaskStage s = schedule::CommStage(i);
    EXPECT_TRUE(s.is_comm());
    EXPECT_EQ(s.comm(), schedule::CommStage(i));
    EXPECT_DEATH((void)s.compute(), "is a communication stage, not a compute stage") << s.name();
    EXPECT_NE(schedule::lane_of(s), comm::Lane::compute) << s.name();
    EXPECT_NE(s, schedule::TaskStage(Stage(i % model::kNumStages))) << s.name();  // same value, other kind
  }
  for (int i = 0; i < model::kNumStages; ++i) {
    const schedule::TaskStage s = Stage(i);
    EXPECT_EQ(s.compute(), Stage(i));
    EXPECT_DEATH((void)s.comm(), "is a compute stage, not a communication stage") << s.name();
    EXPECT_EQ(schedule::lane_of(s), comm::Lane::compute) << s.name();
    EXPECT_STREQ(s.name(), model::stage_name(Stage(i)));
  }
  EXPECT_STREQ(schedule::TaskStage(schedule::CommStage::tp_expert_out).name(), "tp_expert_out");
}
