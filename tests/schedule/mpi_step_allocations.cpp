// Memory is planned once (docs/plan.md, "Memory"): after the first step, a steady-state layer step (forward and
// backward of a stack through the executor, the all-to-alls over a real EP group) allocates no tensor storage.
// Counted with core::tensor_alloc_stats(), which every Tensor storage allocation increments.
#include <gtest/gtest.h>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "layer_harness.h"

using namespace ampipe;

namespace {
model::LayerConfig config(bool bf16, bool no_drop) {
  model::LayerConfig c;
  c.seq_length = 32;
  c.micro_batch_size = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 4;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_train_capacity_factor = 1.0;
  c.moe_min_capacity = 1;
  c.moe_no_drop = no_drop;
  c.hidden_dropout = 0.1;
  c.noisy_gate_policy = model::NoisyGatePolicy::jitter;  // the gate's noisy input copy is planned too
  c.bf16 = bf16;
  c.expert_model_parallel_size = 2;
  return c;
}
}  // namespace

TEST(StepAllocations, SteadyStateStepAllocatesNoTensorStorage) {
  comm::Runtime& rt = comm::Runtime::current();
  static comm::Groups groups = rt.make_groups(comm::Layout::make(rt.size(), 1, 1, 2));
  const int ep_rank = groups.layout.coord(rt.rank()).ep;
  for (bool bf16 : {false, true})
    for (bool no_drop : {false, true})
      for (int M : {1, 2, 4}) {
        const model::LayerConfig cfg = config(bf16, no_drop);
        schedule::LayerStack stack(cfg, 2, M, ep_rank, &groups);
        const Shape act{cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size};
        const Tensor x = ampipe::testing::seeded_normal(act, 7, uint64_t(rt.rank()));
        const Tensor dy = ampipe::testing::seeded_normal(act, 8, uint64_t(rt.rank()));
        auto step = [&](uint64_t micro_batch) {
          stack.forward(x, micro_batch * uint64_t(cfg.tokens()));
          stack.backward(dy, 0.01f);
        };
        step(0);  // first step: pages touched, oneDNN primitives created, gate vectors sized
        const TensorAllocStats before = tensor_alloc_stats();
        for (uint64_t mb = 1; mb <= 3; ++mb) {  // micro-batches of one step, then the next step
          step(mb);
          if (mb == 2) {
            stack.zero_grads();
            stack.weights_changed();  // an optimizer step: bf16 copies are refreshed in place
          }
        }
        const TensorAllocStats after = tensor_alloc_stats();
        EXPECT_EQ(after.count - before.count, 0u)
            << (after.bytes - before.bytes) << " bytes; bf16=" << bf16 << " no_drop=" << no_drop << " M=" << M;
        EXPECT_GT(stack.planned_bytes(), 0u);
      }
}
