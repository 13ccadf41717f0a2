// Single-rank trainer tests (MPI singleton: the Runtime is created by a test environment): the loss falls on the
// corpus; AMPipe degrees 2 and 4 equal degree 1 over 20 iterations; resume equals the uninterrupted run; a save
// interrupted before the marker leaves the previous checkpoint loadable; checkpoints load across degrees.
#include <gmock/gmock.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "ampipe/comm/collectives.h"
#include "ampipe/core/safetensors.h"
#include "train/train_harness.h"

using namespace ampipe;
using namespace ampipe::testing;
namespace fs = std::filesystem;

namespace {

comm::Runtime* g_rt = nullptr;
comm::Groups* g_groups = nullptr;

class RuntimeEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    static int argc = 1;
    static char name[] = "test_train_trainer";
    static char* args[] = {name, nullptr};
    static char** argv = args;
    g_rt = new comm::Runtime(&argc, &argv);
    g_groups = new comm::Groups(g_rt->make_groups(comm::Layout::make(1, 1, 1, 1)));
  }
  void TearDown() override {
    delete g_groups;
    delete g_rt;
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new RuntimeEnv);

std::string temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ampipe_train_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

}  // namespace

TEST(Trainer, LossFallsOnTheCorpus) {
  train::TrainConfig c = tiny_config();
  c.layer.hidden_dropout = 0.0;
  c.train_iters = 40;
  c.lr = 1e-2;
  c.lr_warmup_iters = 5;
  c.global_batch_size = 8;
  c.eval_interval = 40;
  c.eval_iters = 2;
  c.validate(1);
  train::Trainer t(c, *g_groups, corpus_data(c));
  const double before = t.evaluate();
  const train::TrainResult r = t.train();
  ASSERT_EQ(r.iterations.size(), 40u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += r.iterations[size_t(i)].lm_loss / 5;
    last += r.iterations[size_t(35 + i)].lm_loss / 5;
  }
  // Byte-level: uniform is ln 256 = 5.55; 40 steps of a tiny model reach well below 3.5 on English text.
  EXPECT_NEAR(first, std::log(256.0), 0.6);
  EXPECT_LT(last, 3.5);
  ASSERT_EQ(r.evals.size(), 1u);
  EXPECT_LT(r.evals[0].lm_loss, before - 1.5) << "validation loss " << before << " -> " << r.evals[0].lm_loss;
}

// fp32; only the summation order inside the chunked layers differs, so 1e-5 relative (docs/design.md, "Numerics and determinism"), also
// after 20 AdamW steps (tensor-norm relative error).
TEST(Trainer, AmpipeDegreesEqualDegreeOne) {
  train::TrainConfig c = tiny_config();
  const RunResult ref = run_training(c, *g_groups);
  for (int M : {2, 4}) {
    c.ampipe_degree = M;
    SCOPED_TRACE("ampipe degree " + std::to_string(M));
    expect_same_run(run_training(c, *g_groups), ref, 1e-5);
  }
}

// RMSNorm blocks and final norm (no biases): degrees equal degree 1, and the checkpoint holds no bias.
TEST(Trainer, RmsNormDegreesEqualDegreeOne) {
  train::TrainConfig c = tiny_config();
  c.layer.normalization = model::Normalization::rmsnorm;
  c.layer.layernorm_epsilon = 1e-6f;
  const RunResult ref = run_training(c, *g_groups);
  for (const auto& [name, w] : ref.weights) EXPECT_EQ(name.find(".bias"), std::string::npos) << name;
  EXPECT_EQ(ref.weights.count("final_layernorm.weight"), 1u);
  c.ampipe_degree = 4;
  expect_same_run(run_training(c, *g_groups), ref, 1e-5);
  // and it is another model than LayerNorm's
  c.layer.normalization = model::Normalization::layernorm;
  c.ampipe_degree = 1;
  EXPECT_NE(run_training(c, *g_groups).losses.back(), ref.losses.back());
}

// A Llama/Mixtral-style attention (grouped queries, rotary embeddings, RMSNorm, SwiGLU) in training: degree 4 equals
// degree 1, the model has no position table and a [(n + 2g)d, h] QKV weight.
TEST(Trainer, GroupedQueryRopeDegreesEqualDegreeOne) {
  train::TrainConfig c = tiny_config();
  c.layer.normalization = model::Normalization::rmsnorm;
  c.layer.expert = model::ExpertKind::swiglu;
  c.layer.num_attention_heads = 4;  // head dim 4, two query heads per K, V head
  c.layer.num_query_groups = 2;
  c.layer.position_embedding = model::PositionEmbedding::rope;
  c.layer.rotary_base = 1000;
  const RunResult ref = run_training(c, *g_groups);
  EXPECT_EQ(ref.weights.count("embedding.position_embeddings.weight"), 0u);
  const int64_t h = c.layer.hidden_size, kv = 2 * c.layer.head_dim();
  EXPECT_EQ(ref.weights.at("layers.0.attn.qkv.weight").numel(), (h + 2 * kv) * h);
  c.ampipe_degree = 4;
  expect_same_run(run_training(c, *g_groups), ref, 1e-5);
  // and the rotation is in the model: without it (no positions at all) the run differs
  c.layer.position_embedding = model::PositionEmbedding::none;
  c.ampipe_degree = 1;
  EXPECT_NE(run_training(c, *g_groups).losses.back(), ref.losses.back());
}

// Megatron-Core's dropless top-3 router (pre-softmax, a scaling factor) in training: degree 4 equals degree 1.
TEST(Trainer, MegatronRouterDegreesEqualDegreeOne) {
  train::TrainConfig c = tiny_config();
  c.layer.moe_router = model::Router::megatron;
  c.layer.moe_router_topk = 3;
  c.layer.moe_router_pre_softmax = true;
  c.layer.moe_router_topk_scaling_factor = 1.5;
  c.moe_aux_loss_coeff = 0.01;
  const RunResult ref = run_training(c, *g_groups);
  c.ampipe_degree = 4;
  expect_same_run(run_training(c, *g_groups), ref, 1e-5);
}

TEST(Trainer, GradientAccumulationEqualsFewerLargerMicroBatches) {
  // 4 micro-batches of 2 = 2 micro-batches of 4 (same samples): the gradient is the mean over the global batch.
  // Without dropout and aux loss: dropout keys are token indices in the [s, b] layout of a micro-batch, and the
  // aux loss is a per-micro-batch statistic (not linear in the tokens), so both legitimately depend on b.
  train::TrainConfig c = tiny_config();
  c.layer.hidden_dropout = 0;
  c.layer.attention_dropout = 0;
  c.moe_aux_loss_coeff = 0;
  c.global_batch_size = 8;
  c.train_iters = 5;
  const RunResult a = run_training(c, *g_groups);
  c.layer.micro_batch_size = 4;
  const RunResult b = run_training(c, *g_groups);
  // Different micro-batch shapes change the [s, b] token order inside the GEMMs: summation order only.
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 1e-4 * a.losses[i]);
}

TEST(Trainer, ResumeEqualsUninterrupted) {
  train::TrainConfig c = tiny_config();
  c.train_iters = 10;
  const RunResult full = run_training(c, *g_groups);
  const std::string dir = temp_dir("resume");
  train::TrainConfig first = c;
  first.save = dir;
  first.exit_interval = 6;
  const RunResult head = run_training(first, *g_groups);
  ASSERT_EQ(head.losses.size(), 6u);
  train::TrainConfig second = c;
  second.load = dir;
  second.ampipe_degree = 2;  // a checkpoint of degree 1 loads with degree 2
  const RunResult tail = run_training(second, *g_groups);
  ASSERT_EQ(tail.losses.size(), 4u);
  RunResult joined{head.losses, tail.weights};
  joined.losses.insert(joined.losses.end(), tail.losses.begin(), tail.losses.end());
  expect_same_run(joined, full, 1e-5);
  fs::remove_all(dir);
}

TEST(Trainer, ResumeSameDegreeIsBitwiseExact) {
  train::TrainConfig c = tiny_config();
  c.train_iters = 8;
  const RunResult full = run_training(c, *g_groups);
  const std::string dir = temp_dir("exact");
  train::TrainConfig first = c;
  first.save = dir;
  first.exit_interval = 3;
  run_training(first, *g_groups);
  train::TrainConfig second = c;
  second.load = dir;
  const RunResult tail = run_training(second, *g_groups);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(tail.losses[i], full.losses[3 + i]) << "iteration " << 4 + i;
  for (const auto& [name, w] : full.weights) EXPECT_EQ(rel_err(tail.weights.at(name), w), 0.0) << name;
  fs::remove_all(dir);
}

TEST(Trainer, InterruptedSaveLeavesPreviousCheckpointLoadable) {
  train::TrainConfig c = tiny_config();
  c.train_iters = 6;
  const std::string dir = temp_dir("interrupted");
  c.save = dir;
  c.validate(1);
  train::Trainer t(c, *g_groups, corpus_data(c));
  // Iteration 3 is saved normally (the end of a 3-iteration call); the save of iteration 6 stops after its files,
  // before the marker (a crash there), and a crash in the middle of a file leaves a stray temporary and a
  // truncated file.
  t.train({}, 3);
  const auto w3 = t.full_params();
  t.set_save_options({.skip_marker = true});
  t.train({}, 3);
  ASSERT_EQ(t.iteration(), 6);
  {
    std::ofstream(dir + "/iter_0000006/model.safetensors", std::ios::trunc) << "trunc";
    std::ofstream(dir + "/iter_0000006/.model.safetensors.tmp") << "partial";
  }
  std::ifstream marker(dir + "/" + train::kLatestMarker);
  std::string text;
  std::getline(marker, text);
  EXPECT_EQ(text, "3");
  train::TrainConfig lc = tiny_config();
  lc.train_iters = 6;
  lc.load = dir;
  train::Trainer r(lc, *g_groups, corpus_data(lc));
  EXPECT_EQ(r.maybe_load(), 3);
  EXPECT_EQ(r.consumed_samples(), 3 * 2);
  const auto loaded = r.full_params();
  for (const auto& [name, w] : w3) EXPECT_EQ(rel_err(loaded.at(name), w), 0.0) << name;
  fs::remove_all(dir);
}

TEST(Trainer, LoadErrorsNameTheFile) {
  train::TrainConfig c = tiny_config();
  c.train_iters = 2;
  c.lr_warmup_iters = 1;
  const std::string dir = temp_dir("errors");
  c.save = dir;
  run_training(c, *g_groups);
  train::TrainConfig lc = tiny_config();
  lc.load = dir;
  auto load_msg = [&](const train::TrainConfig& cfg) -> std::string {
    try {
      train::Trainer r(cfg, *g_groups, corpus_data(cfg));
      r.maybe_load();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  train::TrainConfig other = lc;
  other.layer.hidden_size = 32;
  EXPECT_THAT(load_msg(other), ::testing::HasSubstr("the checkpoint has --hidden-size 16, this run has --hidden-size 32"));
  {
    std::ofstream(dir + "/iter_0000002/optimizer.safetensors", std::ios::trunc) << "xx";
  }
  EXPECT_THAT(load_msg(lc), ::testing::HasSubstr("iter_0000002/optimizer.safetensors"));
  fs::remove(dir + "/iter_0000002/metadata.json");
  EXPECT_THAT(load_msg(lc), ::testing::HasSubstr("metadata.json: the file is missing"));
  fs::remove(dir + "/" + train::kLatestMarker);
  EXPECT_THAT(load_msg(lc), ::testing::HasSubstr("no checkpoint there"));
  fs::remove_all(dir);
}

// Memory is planned once: after the first iterations, further training iterations (micro-batches through the
// layer stack, head, gradient reduction, AdamW) allocate no tensor storage.
TEST(Trainer, SteadyStateIterationsAllocateNoTensorStorage) {
  for (bool bf16 : {false, true}) {
    train::TrainConfig c = ampipe::testing::tiny_config();
    c.ampipe_degree = 2;
    c.eval_iters = 1;
    c.layer.bf16 = bf16;
    c.validate(1);
    train::Trainer t(c, *g_groups, ampipe::testing::corpus_data(c));
    t.train({}, 2);
    const TensorAllocStats before = tensor_alloc_stats();
    t.train({}, 3);
    const TensorAllocStats after = tensor_alloc_stats();
    EXPECT_EQ(t.iteration(), 5);
    EXPECT_EQ(after.count - before.count, 0u) << (after.bytes - before.bytes) << " bytes in 3 iterations, bf16 " << bf16;
  }
}

// The expert loads of each log window (issue 14 item 4): per layer, kept + dropped = all choices = window
// iterations x global batch x s x top-k; and the drop share over all layers equals the per-iteration token drops,
// which count slot -1 separately (count_drops, all-reduced per iteration).
TEST(Trainer, ExpertLoadsCountEveryChoiceOnce) {
  train::TrainConfig c = ampipe::testing::tiny_config();
  c.layer.moe_train_capacity_factor = 0.75;  // drops
  c.ampipe_degree = 2;
  c.train_iters = 4;
  c.log_interval = 2;
  c.validate(1);
  train::Trainer t(c, *g_groups, ampipe::testing::corpus_data(c));
  const train::TrainResult r = t.train();
  ASSERT_EQ(r.moe.size(), 2u);
  const int64_t G = c.global_batch(1);
  for (size_t w = 0; w < r.moe.size(); ++w) {
    EXPECT_EQ(r.moe[w].iteration, int64_t(2 * (w + 1)));
    ASSERT_EQ(r.moe[w].layers.size(), size_t(c.num_layers));
    int64_t dropped = 0, choices = 0;
    for (const train::MoeLayerStats& l : r.moe[w].layers) {
      ASSERT_EQ(l.tokens.size(), size_t(c.layer.num_experts));
      int64_t kept = 0, mx = 0;
      for (int64_t n : l.tokens) {
        kept += n;
        mx = std::max(mx, n);
      }
      EXPECT_EQ(l.choices, 2 * G * c.layer.seq_length * c.layer.moe_router_topk);
      EXPECT_EQ(kept + l.dropped, l.choices);
      EXPECT_DOUBLE_EQ(l.load_imbalance(), double(mx) / (double(kept) / double(l.tokens.size())));
      dropped += l.dropped;
      choices += l.choices;
    }
    EXPECT_GT(dropped, 0) << "capacity factor 0.75 drops choices";
    const double per_iteration =
        (r.iterations[2 * w].drop_fraction + r.iterations[2 * w + 1].drop_fraction) / 2.0;
    EXPECT_NEAR(double(dropped) / double(choices), per_iteration, 1e-6);
  }
}
