// The compute threads change nothing: a two-layer stack's output, input gradient and every parameter gradient are
// the same bits at 1, 2 and 3 OpenMP threads (kernels/parallel.h: pieces that do not depend on the thread count,
// reductions in a fixed order), over two micro-batches, at AMPipe degrees 1 and 2, for the layer kinds users run:
// GPT (LayerNorm, learned positions, GeLU, DeepSpeed's gate, dropout everywhere), Llama/Qwen style (RMSNorm, RoPE,
// grouped-query attention, SwiGLU, QKV bias, Megatron-Core's router, a shared expert) and bf16. The shapes are
// large enough that every threaded loop splits into several pieces (rows, columns, attention's (batch, K/V head)
// units), so a race or a thread-count-dependent sum shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "ampipe/core/parallel.h"
#include "layer_harness.h"

using namespace ampipe;

namespace {

model::LayerConfig gpt() {
  model::LayerConfig c;
  c.seq_length = 128;
  c.micro_batch_size = 2;
  c.hidden_size = 256;  // rows_grain(256) = 64 rows: 4 pieces of 256 rows; 2 column pieces of 128
  c.ffn_hidden_size = 384;
  c.num_attention_heads = 4;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_train_capacity_factor = 1.0;
  c.moe_min_capacity = 1;
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0.1;
  c.noisy_gate_policy = model::NoisyGatePolicy::jitter;
  c.add_bias_linear = true;
  c.init_method_std = 0.05;
  c.seed = 7;
  return c;
}

model::LayerConfig llama() {
  model::LayerConfig c = gpt();
  c.normalization = model::Normalization::rmsnorm;
  c.position_embedding = model::PositionEmbedding::rope;
  c.num_query_groups = 2;
  c.expert = model::ExpertKind::swiglu;
  c.add_bias_linear = false;
  c.add_qkv_bias = true;
  c.moe_router = model::Router::megatron;
  c.mlp_ffn_hidden_size = 256;
  c.noisy_gate_policy = model::NoisyGatePolicy::none;
  c.attention_dropout = 0.0;
  return c;
}

using ampipe::testing::StackRun;

StackRun run(const model::LayerConfig& cfg, int M, int threads) {
  set_num_threads(threads);
  schedule::LayerStack stack(cfg, 2, M, 0, nullptr);
  StackRun r = ampipe::testing::run_two_micro_batches(stack, cfg);
  set_num_threads(1);
  return r;
}

void expect_identical(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(std::memcmp(a.raw(), b.raw(), size_t(a.numel()) * dtype_size(a.dtype())), 0) << what;
}

void expect_same_at_any_thread_count(const model::LayerConfig& cfg, const std::string& name) {
  for (int M : {1, 2}) {
    const StackRun one = run(cfg, M, 1);
    for (int threads : {2, 3}) {
      const StackRun got = run(cfg, M, threads);
      const std::string what = fmt::format("{} degree {} threads {}", name, M, threads);
      for (size_t m = 0; m < 2; ++m) {
        expect_identical(got.ys[m], one.ys[m], what + " y");
        expect_identical(got.dxs[m], one.dxs[m], what + " dx");
      }
      size_t compared = 0;
      for (size_t i = 0; i < one.grads.size(); ++i)
        for (const auto& [g, t] : one.grads[i]) {
          expect_identical(got.grads[i].at(g), t, what + " layer " + std::to_string(i) + " " + g);
          ++compared;
        }
      EXPECT_GT(compared, 10u) << what;
    }
  }
}

}  // namespace

TEST(ThreadCount, GptLayersAreTheSameBitsAtAnyThreadCount) { expect_same_at_any_thread_count(gpt(), "gpt"); }

TEST(ThreadCount, LlamaStyleLayersAreTheSameBitsAtAnyThreadCount) {
  expect_same_at_any_thread_count(llama(), "llama");
}

TEST(ThreadCount, Bf16LayersAreTheSameBitsAtAnyThreadCount) {
  model::LayerConfig c = gpt();
  c.bf16 = true;
  expect_same_at_any_thread_count(c, "bf16");
}

// The loops really split: the shapes above give several pieces, and a parallel_for over them runs on more than one
// thread when asked to (guards the test above against passing only because nothing ran in parallel).
TEST(ThreadCount, ParallelForSpreadsPiecesOverTheThreads) {
  set_num_threads(2);
  std::vector<std::thread::id> owner(8);
  parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) owner[size_t(i)] = std::this_thread::get_id();
  });
  set_num_threads(1);
  EXPECT_EQ(std::count(owner.begin(), owner.end(), std::thread::id()), 0) << "a piece did not run";
  EXPECT_NE(std::count(owner.begin(), owner.end(), owner[0]), 8) << "every piece ran on one thread";
}
