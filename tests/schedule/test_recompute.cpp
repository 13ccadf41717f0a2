// Activation recomputation (schedule::LayerStack::set_recompute): a recomputed layer re-runs its forward before its
// backward, so the output, the input gradient and every parameter gradient equal those of the stack that keeps
// its activations (bitwise: the same Plans run on the same inputs with the same random numbers), over two
// micro-batches (the gradients accumulate) and at AMPipe degrees 1 and 2; and the memory it keeps per layer is
// exactly its output and input gradient.
#include <gtest/gtest.h>

#include "layer_harness.h"

using namespace ampipe;
using ampipe::testing::seeded_normal;

namespace {

model::LayerConfig config() {
  model::LayerConfig c;
  c.seq_length = 32;
  c.micro_batch_size = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 4;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_train_capacity_factor = 1.0;  // tokens dropped: recomputation must drop the same ones
  c.moe_min_capacity = 1;
  c.hidden_dropout = 0.1;
  c.noisy_gate_policy = model::NoisyGatePolicy::jitter;
  c.init_method_std = 0.1;
  c.seed = 99;
  return c;
}

struct StackRun : ampipe::testing::StackRun {
  size_t planned = 0;
};

StackRun run(const std::vector<bool>& recompute, int M, bool selective = false, bool bf16 = false) {
  model::LayerConfig cfg = config();
  cfg.recompute_attention = selective;
  cfg.bf16 = bf16;
  schedule::LayerStack stack(cfg, int(recompute.size()), M, 0, nullptr);
  stack.set_recompute(recompute);
  StackRun r;
  r.planned = stack.planned_bytes();
  static_cast<ampipe::testing::StackRun&>(r) = ampipe::testing::run_two_micro_batches(stack, cfg);
  return r;
}

void expect_identical(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.get(i), b.get(i)) << what << " element " << i;
}

}  // namespace

TEST(Recompute, EqualsKeepingTheActivationsBitwise) {
  for (int M : {1, 2}) {
    const StackRun keep = run({false, false, false}, M);
    for (const std::vector<bool>& rc : {std::vector<bool>{true, true, true}, std::vector<bool>{true, false, false},
                                        std::vector<bool>{false, true, true}}) {
      const StackRun got = run(rc, M);
      const std::string what = fmt::format("degree {} recompute {}{}{}", M, int(rc[0]), int(rc[1]), int(rc[2]));
      for (size_t m = 0; m < 2; ++m) {
        expect_identical(got.ys[m], keep.ys[m], what + " y");
        expect_identical(got.dxs[m], keep.dxs[m], what + " dx");
      }
      for (size_t i = 0; i < keep.grads.size(); ++i)
        for (const auto& [name, g] : keep.grads[i]) expect_identical(got.grads[i].at(name), g, what + " " + name);
    }
  }
}

TEST(Recompute, ARecomputedLayerKeepsOnlyItsOutputAndInputGradient) {
  for (int M : {1, 2}) {
    model::LayerConfig cfg = config();
    const schedule::Plan keep = schedule::build_layer_plan(cfg, M);
    cfg.recompute = true;
    const schedule::Plan rc = schedule::build_layer_plan(cfg, M);
    const size_t y = rc.memory.spec(model::Buf::y)->bytes(), dx = rc.memory.spec(model::Buf::dx)->bytes();
    EXPECT_EQ(rc.memory.saved_bytes, y + dx) << "degree " << M;  // 64-byte multiples: [s, b, h] fp32 each
    EXPECT_EQ(rc.memory.saved_bytes + rc.memory.shared_bytes, keep.memory.saved_bytes + keep.memory.shared_bytes)
        << "the same buffers, only their scope moves";
    // A stack of 3 recomputed layers: 3 x (y + dx) + one shared region; less than keeping every layer's.
    EXPECT_EQ(run({true, true, true}, M).planned, 3 * (y + dx) + rc.memory.shared_bytes);
    EXPECT_LT(run({true, true, true}, M).planned, run({false, false, false}, M).planned);
  }
}

// Selective recomputation (--recompute-granularity selective): every chunk's attention forward re-runs before its
// attention backward; the results are bitwise those of keeping the attention output (the same kernel on the same
// saved q, k, v), in fp32 and bf16 (whose out-projection weight gradient reads the recomputed bf16 copy), and the
// attention output and its lse move from the saved to the shared region.
TEST(Recompute, SelectiveRecomputesTheAttentionCoreBitwise) {
  for (bool bf16 : {false, true})
    for (int M : {1, 2}) {
      const StackRun keep = run({false, false}, M, false, bf16), got = run({false, false}, M, true, bf16);
      const std::string what = fmt::format("selective degree {} bf16 {}", M, bf16);
      for (size_t m = 0; m < 2; ++m) {
        expect_identical(got.ys[m], keep.ys[m], what + " y");
        expect_identical(got.dxs[m], keep.dxs[m], what + " dx");
      }
      for (size_t i = 0; i < keep.grads.size(); ++i)
        for (const auto& [name, g] : keep.grads[i]) expect_identical(got.grads[i].at(name), g, what + " " + name);
      model::LayerConfig cfg = config();
      cfg.bf16 = bf16;
      const schedule::Plan p_keep = schedule::build_layer_plan(cfg, M);
      cfg.recompute_attention = true;
      const schedule::Plan p_sel = schedule::build_layer_plan(cfg, M);
      size_t moved = 0;
      for (model::Buf b : {model::Buf::attn, model::Buf::attn_bf16, model::Buf::lse})
        if (const model::BufferSpec* s = p_sel.memory.spec(b)) {
          EXPECT_EQ(s->scope, model::Scope::shared) << model::buf_name(b);
          moved += s->bytes();
        }
      EXPECT_EQ(p_sel.memory.saved_bytes + moved, p_keep.memory.saved_bytes) << what;
      EXPECT_EQ(got.planned + 2 * moved, keep.planned + (p_sel.memory.shared_bytes - p_keep.memory.shared_bytes))
          << what;
      int recomputes = 0;
      for (const schedule::Task& t : p_sel.tasks) recomputes += t.stage == model::Stage::attention_recompute;
      EXPECT_EQ(recomputes, M);
    }
}
