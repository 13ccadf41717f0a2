// With token dropping, AMPipe's capacity is per chunk (docs/design.md, "Numerics and determinism"): chunk c routes its S_c = s/M * b
// tokens with C_c = gate_capacity(S_c, ...), exactly as a gate call on those tokens alone would, so M > 1 may drop
// other tokens than M = 1. These tests pin that rule.
#include <gtest/gtest.h>

#include "layer_harness.h"

using namespace ampipe;

namespace {
model::LayerConfig dropping(int k) {
  model::LayerConfig c;
  c.seq_length = 24;
  c.micro_batch_size = 2;
  c.hidden_size = 16;
  c.ffn_hidden_size = 24;
  c.num_attention_heads = 2;
  c.num_experts = 4;
  c.moe_router_topk = k;
  c.moe_train_capacity_factor = 0.5;  // overflow: tokens are dropped
  c.moe_min_capacity = 1;
  c.init_method_std = 0.3;
  c.seed = 21;
  return c;
}
}  // namespace

TEST(ChunkCapacity, EachChunkRoutesItsOwnTokensWithItsOwnCapacity) {
  for (int k : {1, 2})
    for (int M : {1, 2, 3, 4}) {
      const model::LayerConfig cfg = dropping(k);
      const Shape act{cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size};
      schedule::LayerStack stack(cfg, 1, M, 0, nullptr);
      const model::LayerParams& p = std::as_const(stack).params(0);
      const model::Layer& step = stack.layer(0);
      const Tensor x = ampipe::testing::seeded_normal(act, 1, 0);
      stack.forward(x, /*token_base=*/96);
      const int64_t Sc = cfg.tokens() / M;
      int64_t dropped = 0;
      for (int c = 0; c < M; ++c) {
        const model::GateCtx& got = step.gate_ctx(c);
        EXPECT_EQ(step.capacity(c), model::gate_capacity(Sc, cfg.num_experts, k, cfg.moe_train_capacity_factor,
                                                         cfg.moe_min_capacity))
            << "k=" << k << " M=" << M << " c=" << c;
        // The same gate on the chunk's tokens alone (global token index 96 + c*S_c) routes identically.
        model::GateConfig gc;
        gc.num_experts = cfg.num_experts;
        gc.topk = k;
        gc.capacity_factor = cfg.moe_train_capacity_factor;
        gc.min_capacity = cfg.moe_min_capacity;
        gc.use_rts = cfg.use_rts;
        gc.seed = cfg.seed;
        model::GateCtx alone;
        model::gate_forward(got.x_gate, p.gate_w, gc, 96 + c * Sc, alone);
        EXPECT_EQ(alone.routing.slot, got.routing.slot) << "k=" << k << " M=" << M << " c=" << c;
        EXPECT_EQ(alone.routing.slot_token, got.routing.slot_token);
        for (int32_t s : got.routing.slot) dropped += s < 0;
      }
      EXPECT_GT(dropped, 0) << "the configuration must overflow for this test to mean anything";
    }
}
