// model::Layer::run(stage, dir, chunk, piece) reaches the code meant for each stage: a communication stage (a Plan
// collective, run by the executor through comm/) or a direction a stage does not have never reaches a block, it
// stops with "is not a compute stage of the layer" (a backward communication stage once fell through into the
// context-parallel dK/dV reduction). The compute stages themselves are exercised by every layer test.
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

TEST(LayerRunDeathTest, CommunicationStagesAndMissingDirectionsNeverReachABlock) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  schedule::LayerStack stack(config(), 1, 1, 0, nullptr);
  model::Layer& layer = stack.layer(0);
  int checked = 0;
  for (int i = 0; i < model::kNumStages; ++i) {
    const Stage s = Stage(i);
    for (Dir d : {Dir::fwd, Dir::bwd}) {
      const bool comm = schedule::lane_of(s) != comm::Lane::compute;
      const bool missing = (d == Dir::bwd && forward_only(s)) || (d == Dir::fwd && backward_only(s));
      if (!comm && !missing) continue;
      EXPECT_DEATH(layer.run(s, d, 0, 0), "is not a compute stage of the layer")
          << model::stage_name(s) << "." << model::dir_name(d);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 13 + 2 + 5);  // thirteen communication stages in both directions, seven one-way stages
}
