// The memory estimate (schedule/memory_estimate.h, train/memory_estimate.h) against hand-computed bytes. Absolute
// checks: every expected number below is written out
// from the shapes, not taken from the code under test (except the Plan's planned bytes, which the estimate must
// equal, and which tests/schedule check buffer by buffer).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ampipe/core/error.h"
#include "ampipe/schedule/layer_stack.h"
#include "ampipe/schedule/memory_estimate.h"
#include "ampipe/schedule/plan.h"
#include "ampipe/train/memory_estimate.h"

using namespace ampipe;
using ::testing::HasSubstr;

namespace {

// docs/layer.md section 12's layer: s 16, b 2, h 32, F 24, 4 heads, 4 experts, top-2.
model::LayerConfig small_layer() {
  model::LayerConfig c;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 24;
  c.num_attention_heads = 4;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_train_capacity_factor = 0.75;
  c.moe_min_capacity = 1;
  return c;
}

}  // namespace

TEST(MemoryEstimate, LayerStackByHand) {
  model::LayerConfig c = small_layer();
  c.expert_model_parallel_size = 2;  // L = 2 local experts
  // Per layer, this EP rank: ln1, ln2 4 x 32; qkv 3*32*32 = 3072; proj 32*32 = 1024; gate 4*32 = 128;
  // fc1 [2, 24, 32] = 1536; fc2 [2, 32, 24] = 1536. Total 7424 elements = 29696 bytes.
  EXPECT_EQ(schedule::layer_param_counts(c).params, 7424);
  EXPECT_EQ(schedule::layer_param_counts(c).bf16_copies, 3072 + 1024 + 1536 + 1536);
  const int N = 3, M = 2;
  const schedule::MemoryEstimate e = schedule::estimate_layer_stack(c, N, M);
  const schedule::Plan p = schedule::build_layer_plan(c, M);
  EXPECT_EQ(e.bytes("parameters"), 3 * 29696);
  EXPECT_EQ(e.bytes("gradients"), 3 * 29696);
  EXPECT_EQ(e.bytes("bf16 weight copies"), 0);  // fp32: the GEMMs read the parameters
  EXPECT_EQ(e.bytes("activations + communication (planned)"), int64_t(p.planned_bytes(N)));
  EXPECT_EQ(e.total(), 2 * 3 * 29696 + int64_t(p.planned_bytes(N)));

  // Recomputation (the first two of three layers): those keep only y and dx as their own, the rest is shared.
  model::LayerConfig r = c;
  r.recompute = true;
  const schedule::Plan pr = schedule::build_layer_plan(r, M);
  EXPECT_LT(pr.memory.saved_bytes, p.memory.saved_bytes);
  EXPECT_EQ(schedule::estimate_layer_stack(c, N, M, {true, true, false}).bytes("activations + communication (planned)"),
            int64_t(2 * pr.memory.saved_bytes + p.memory.saved_bytes +
                    std::max(pr.memory.shared_bytes, p.memory.shared_bytes)));

  c.bf16 = true;  // 7168 matrix elements per layer in bf16
  EXPECT_EQ(schedule::estimate_layer_stack(c, N, M).bytes("bf16 weight copies"), 3 * 7168 * 2);
}

TEST(MemoryEstimate, ParameterCountsMatchTheStack) {
  // The estimate's list of parameters against the tensors a LayerStack really holds (one rank, EP rank 1 of 2).
  model::LayerConfig c = small_layer();
  c.expert_model_parallel_size = 2;
  for (bool swiglu : {false, true}) {
    c.expert = swiglu ? model::ExpertKind::swiglu : model::ExpertKind::gelu;
    schedule::LayerStack stack(c, 2, 1, 1, nullptr);
    int64_t held = 0;
    for (int i = 0; i < 2; ++i)
      for (auto& [name, tensor] : stack.params(i).named()) held += tensor.numel();
    EXPECT_EQ(2 * schedule::layer_param_counts(c).params, held) << "swiglu " << swiglu;
  }
}

TEST(MemoryEstimate, TrainByHand) {
  train::TrainConfig t;
  t.layer = small_layer();
  t.num_layers = 2;
  t.padded_vocab_size = 256;
  t.ampipe_degree = 1;
  // Layers (ep 1): qkv 3072, proj 1024, ln 128, gate 128, fc1 4*24*32 = 3072, fc2 3072: 10496 elements per layer.
  // Embedding-level: wte 256*32 = 8192, wpe 16*32 = 512, final LayerNorm 64: 8768 elements (tied head).
  const int64_t params = 2 * 10496 + 8768;  // 29760
  const schedule::MemoryEstimate e = train::estimate_train_memory(t, 100);
  EXPECT_EQ(e.bytes("parameters"), params * 4);
  EXPECT_EQ(e.bytes("gradients"), params * 4);
  EXPECT_EQ(e.bytes("optimizer state (AdamW, 2 fp32 moments)"), params * 8);
  EXPECT_EQ(e.bytes("gradient all-reduce buffers"), params * 4);
  // T = 32 tokens: four [T, h] buffers 4*32*32, logits [T, V] 32*256, five [T] vectors; fp32.
  EXPECT_EQ(e.bytes("embedding + LM head buffers"), (4 * 32 * 32 + 32 * 256 + 5 * 32) * 4);
  EXPECT_EQ(e.bytes("data order"), 800);
  const schedule::Plan p = schedule::build_layer_plan(t.layer, 1);
  EXPECT_EQ(e.bytes("activations + communication (planned)"), int64_t(p.planned_bytes(2)));
  EXPECT_EQ(e.bytes("checkpoint buffers (--save / --load)"), 0);  // neither --save nor --load
  // --save at ep 1: nothing is gathered; the optimizer file (two moments of every tensor) is built in memory.
  t.save = "ckpt";
  EXPECT_EQ(train::estimate_train_memory(t).bytes("checkpoint buffers (--save / --load)"), params * 8);
  // --load: the optimizer file read whole, and its tensors parsed from it.
  t.load = "ckpt";
  EXPECT_EQ(train::estimate_train_memory(t).bytes("checkpoint buffers (--save / --load)"), params * 16);
  // ep 2 and --save only: the expert matrices fc1, fc2 (4*24*32 each, full) and both moments gathered whole.
  t.load.clear();
  t.layer.expert_model_parallel_size = 2;
  EXPECT_EQ(train::estimate_train_memory(t).bytes("checkpoint buffers (--save / --load)"),
            params * 8 + 2 * 2 * 3072 * 12);
  t.layer.expert_model_parallel_size = 1;
  t.save.clear();

  t.untie_embeddings_and_output_weights = true;  // + output layer [256, 32]
  EXPECT_EQ(train::estimate_train_memory(t).bytes("parameters"), (params + 8192) * 4);
}

// Two pipeline stages of one layer each on 2 ranks (dp 1), 4 micro-batches: stage 0 holds layer 0 and the embedding
// (wte 8192 + wpe 512), stage 1 layer 1, the final LayerNorm (64) and the tied LM head's copy of wte (8192). Stage 0
// has min(P, K) = 2 micro-batches in flight (two copies of the layer's saved buffers), stage 1 one; each keeps that
// many received inputs plus one, two gradient and four send slots of [T, h]. The estimate without a stage is the
// larger stage's.
TEST(MemoryEstimate, PipelineStagesByHand) {
  train::TrainConfig t;
  t.layer = small_layer();
  t.num_layers = 2;
  t.padded_vocab_size = 256;
  t.pipeline_model_parallel_size = 2;
  t.global_batch_size = 8;  // 4 micro-batches of 2
  const int64_t layer = 10496, Th = 32 * 32;
  const schedule::Plan p = schedule::build_layer_plan(t.layer, 1);
  const int64_t saved = int64_t(p.memory.saved_bytes), shared = int64_t(p.memory.shared_bytes);
  const schedule::MemoryEstimate s0 = train::estimate_train_memory(t, 0, 2, 0);
  const schedule::MemoryEstimate s1 = train::estimate_train_memory(t, 0, 2, 1);
  EXPECT_EQ(s0.bytes("parameters"), (layer + 8192 + 512) * 4);
  EXPECT_EQ(s1.bytes("parameters"), (layer + 64 + 8192) * 4);
  EXPECT_EQ(s0.bytes("optimizer state (AdamW, 2 fp32 moments)"), (layer + 8192 + 512) * 8);
  EXPECT_EQ(s0.bytes("activations + communication (planned)"), 2 * saved + shared);
  EXPECT_EQ(s1.bytes("activations + communication (planned)"), saved + shared);
  EXPECT_EQ(s0.bytes("embedding + LM head buffers"), Th * 4);                         // x0
  EXPECT_EQ(s1.bytes("embedding + LM head buffers"), (3 * Th + 32 * 256 + 5 * 32) * 4);  // the head's
  EXPECT_EQ(s0.bytes("pipeline stage buffers"), Th * (2 + 1 + 6) * 4);
  EXPECT_EQ(s1.bytes("pipeline stage buffers"), Th * (1 + 1 + 6) * 4);
  EXPECT_EQ(train::estimate_train_memory(t, 0, 2).total(), std::max(s0.total(), s1.total()));
  // untied: the last stage's output layer is a parameter of its own, the same size as the copy
  t.untie_embeddings_and_output_weights = true;
  EXPECT_EQ(train::estimate_train_memory(t, 0, 2, 1).bytes("parameters"), (layer + 64 + 8192) * 4);
  EXPECT_EQ(train::estimate_train_memory(t, 0, 2, 0).bytes("parameters"), (layer + 8192 + 512) * 4);
  // 4 layers in 2 virtual stages per rank (rank 0: layers 0 and 2): the same parameters per stage as 2 layers
  // each, but rank 0 keeps all 4 micro-batches of its first chunk in flight (the interleaved warm-up of
  // 2 (P - 1) + (v - 1) P = 4 forwards), rank 1 three; the received inputs per chunk: in flight + 1 each
  t.untie_embeddings_and_output_weights = false;
  t.num_layers = 4;
  t.num_layers_per_virtual_pipeline_stage = 1;
  const schedule::MemoryEstimate v0 = train::estimate_train_memory(t, 0, 2, 0);
  const schedule::MemoryEstimate v1 = train::estimate_train_memory(t, 0, 2, 1);
  EXPECT_EQ(v0.bytes("parameters"), (2 * layer + 8192 + 512) * 4);
  EXPECT_EQ(v0.bytes("activations + communication (planned)"), 4 * 2 * saved + shared);
  EXPECT_EQ(v1.bytes("activations + communication (planned)"), 3 * 2 * saved + shared);
  EXPECT_EQ(v0.bytes("pipeline stage buffers"), Th * (2 * (4 + 1) + 6) * 4);
  EXPECT_EQ(v1.bytes("pipeline stage buffers"), Th * (2 * (3 + 1) + 6) * 4);
}

TEST(MemoryEstimate, FitRules) {
  schedule::MemoryEstimate e;
  e.add("parameters", 3 << 20);
  e.add("gradients", 1 << 20);
  EXPECT_EQ(e.total(), 4 << 20);
  EXPECT_EQ(schedule::memory_fit_error(e, 0, 0, 1), "");          // 0: no check
  EXPECT_EQ(schedule::memory_fit_error(e, 0, 4 << 20, 1), "");    // fits exactly
  const std::string why = schedule::memory_fit_error(e, 0, 1 << 20, 1);
  EXPECT_THAT(why, HasSubstr("the estimated peak memory of this rank, 4.00 MiB (parameters 3.00 MiB, gradients 1.00 MiB)"));
  EXPECT_THAT(why, HasSubstr("exceeds --memory-limit 1.00 MiB (1048576 bytes)"));
  // Against the host: an estimate far beyond any machine does not fit, naming what is available.
  schedule::MemoryEstimate huge;
  huge.add("parameters", int64_t(1) << 60);
  EXPECT_THAT(schedule::memory_fit_error(huge, 0, -1, 2), HasSubstr("/ 2 ranks on this host"));
  EXPECT_EQ(schedule::memory_fit_error(huge, 0, 0, 2), "");  // --memory-limit 0: no check at all
  // What the process already holds is not counted twice against the host (MemAvailable no longer includes it).
  schedule::MemoryEstimate held;
  held.add("process now", int64_t(1) << 60);
  held.add("parameters", 1 << 20);
  EXPECT_EQ(schedule::memory_fit_error(held, int64_t(1) << 60, -1, 1), "");
}

// --use-distributed-optimizer: the AdamW state is this rank's shard, 1/(dp x cp) of the parameters' at ep 1 (8 bytes
// per element, rounded up per group): at dp 4 a quarter of the whole state.
TEST(MemoryEstimate, DistributedOptimizerShardsTheState) {
  train::TrainConfig t;
  const char* key = "optimizer state (AdamW, 2 fp32 moments)";
  const int64_t whole = train::estimate_train_memory(t, 0, 4).bytes(key);
  t.use_distributed_optimizer = true;
  const int64_t sharded = train::estimate_train_memory(t, 0, 4).bytes(key);
  EXPECT_GE(sharded, whole / 4);
  EXPECT_LE(sharded, whole / 4 + 16);
  EXPECT_EQ(train::estimate_train_memory(t, 0, 1).bytes(key), whole);  // dp 1: nothing to shard
  // no shard buffers: the reduce-scatter and the gathers run in place in the flat reduction buffers
  EXPECT_EQ(train::estimate_train_memory(t, 0, 4).bytes("distributed optimizer shard buffers"), 0);
}
