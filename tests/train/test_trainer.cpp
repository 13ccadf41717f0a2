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

// Run c saved and stopped after iteration `at` (--exit-interval), then resumed from that checkpoint: the resumed
// iterations' losses and the final weights (and routers' biases) equal `full`, c's uninterrupted run, bit for bit.
void expect_resume_is_bitwise(const train::TrainConfig& c, const RunResult& full, int at, const std::string& tag) {
  const std::string dir = temp_dir(tag);
  train::TrainConfig first = c;
  first.save = dir;
  first.exit_interval = at;
  run_training(first, *g_groups);
  train::TrainConfig second = c;
  second.load = dir;
  const RunResult tail = run_training(second, *g_groups);
  ASSERT_EQ(tail.losses.size() + size_t(at), full.losses.size());
  for (size_t i = 0; i < tail.losses.size(); ++i)
    EXPECT_EQ(tail.losses[i], full.losses[size_t(at) + i]) << "iteration " << at + 1 + int(i);
  for (const auto& [name, w] : full.weights) EXPECT_EQ(rel_err(tail.weights.at(name), w), 0.0) << name;
  fs::remove_all(dir);
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

// A Qwen3-MoE-style attention (--qk-layernorm: q and k normalised per head before RoPE) in training: degree 4 equals
// degree 1 after 20 AdamW steps (the norms' [d] weights trained away from 1), the checkpoint holds the norms, and
// --apply-wd-to-qk-layernorm (weight decay on them) trains another model.
TEST(Trainer, QkLayerNormDegreesEqualDegreeOne) {
  train::TrainConfig c = tiny_config();
  c.layer.normalization = model::Normalization::rmsnorm;
  c.layer.num_attention_heads = 4;
  c.layer.num_query_groups = 2;
  c.layer.position_embedding = model::PositionEmbedding::rope;
  c.layer.qk_layernorm = true;
  c.weight_decay = 0.5;
  const RunResult ref = run_training(c, *g_groups);
  ASSERT_EQ(ref.weights.count("layers.0.attn.q_layernorm.weight"), 1u);
  ASSERT_EQ(ref.weights.count("layers.0.attn.k_layernorm.weight"), 1u);
  EXPECT_EQ(ref.weights.count("layers.0.attn.q_layernorm.bias"), 0u);  // RMSNorm
  const Tensor& qn = ref.weights.at("layers.0.attn.q_layernorm.weight");
  EXPECT_EQ(qn.numel(), c.layer.head_dim());
  float moved = 0;
  for (int64_t i = 0; i < qn.numel(); ++i) moved = std::max(moved, std::abs(qn.get(i) - 1.0f));
  EXPECT_GT(moved, 1e-4f) << "the q norm's weights did not train";
  c.ampipe_degree = 4;
  expect_same_run(run_training(c, *g_groups), ref, 1e-5);
  c.ampipe_degree = 1;
  c.apply_wd_to_qk_layernorm = true;
  EXPECT_NE(run_training(c, *g_groups).weights.at("layers.0.attn.q_layernorm.weight").get(0), qn.get(0));
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

// A DeepSeek-like model in training: block 0 dense (its FFN a dense MLP of --ffn-hidden-size), block 1 an MoE block
// with a shared expert beside Megatron-Core's dropless router (SwiGLU, RMSNorm): degree 4 equals degree 1, and the
// blocks have the parameters of their kind.
TEST(Trainer, DenseFirstSharedExpertDegreesEqualDegreeOne) {
  train::TrainConfig c = tiny_config();
  c.layer.normalization = model::Normalization::rmsnorm;
  c.layer.expert = model::ExpertKind::swiglu;
  c.layer.moe_router = model::Router::megatron;
  c.layer.ffn_hidden_size = 8;          // the experts' F (--moe-ffn-hidden-size)
  c.layer.mlp_ffn_hidden_size = 16;     // the shared expert (--moe-shared-expert-intermediate-size)
  c.dense_ffn_hidden_size = 48;         // the dense block's FFN (--ffn-hidden-size)
  c.first_k_dense_replace = 1;
  c.moe_aux_loss_coeff = 0.01;
  const RunResult ref = run_training(c, *g_groups);
  const int64_t h = c.layer.hidden_size;
  EXPECT_EQ(ref.weights.count("layers.0.moe.gate.weight"), 0u);
  EXPECT_EQ(ref.weights.at("layers.0.mlp.fc1.weight").numel(), 2 * 48 * h);  // SwiGLU: [2F, h]
  EXPECT_EQ(ref.weights.at("layers.0.mlp.fc2.weight").numel(), h * 48);
  EXPECT_EQ(ref.weights.at("layers.1.mlp.fc2.weight").numel(), h * 16);
  EXPECT_EQ(ref.weights.at("layers.1.moe.experts.fc2.weight").numel(), 4 * h * 8);
  c.ampipe_degree = 4;
  expect_same_run(run_training(c, *g_groups), ref, 1e-5);
  // and the shared expert is in the model: without it the run differs
  c.layer.mlp_ffn_hidden_size = 0;
  c.ampipe_degree = 1;
  EXPECT_NE(run_training(c, *g_groups).losses.back(), ref.losses.back());
}

// A dense GPT (no --num-experts): every block's FFN a dense MLP; degree 2 equals degree 1, no aux loss.
TEST(Trainer, DenseGptDegreesEqualDegreeOne) {
  train::TrainConfig c = tiny_config();
  c.dense = true;
  c.layer = c.layer.as_dense(24);
  c.moe_aux_loss_coeff = 0.01;  // no router: nothing to balance
  const RunResult ref = run_training(c, *g_groups);
  for (const auto& [name, w] : ref.weights) EXPECT_EQ(name.find(".moe."), std::string::npos) << name;
  EXPECT_EQ(ref.weights.at("layers.1.mlp.fc1.weight").numel(), 24 * c.layer.hidden_size);
  c.ampipe_degree = 2;
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
  RunResult joined{head.losses, tail.weights, {}};
  joined.losses.insert(joined.losses.end(), tail.losses.begin(), tail.losses.end());
  expect_same_run(joined, full, 1e-5);
  fs::remove_all(dir);
}

TEST(Trainer, ResumeSameDegreeIsBitwiseExact) {
  train::TrainConfig c = tiny_config();
  c.train_iters = 8;
  expect_resume_is_bitwise(c, run_training(c, *g_groups), 3, "exact");
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

// DeepSeek-V3's router in training (--moe-router-score-function sigmoid, group-limited routing, the per-sequence
// aux loss, --moe-router-enable-expert-bias): the bias moves after each step by rate * sign(mean - n_e), n_e the
// choices routed to expert e in that step (pinned against the logged expert loads, which count the same choices);
// degree 4 equals degree 1 (biases included: Trainer::full_params lists them), and a resumed run continues exactly
// (the bias is saved as layers.{i}.moe.gate.expert_bias).
TEST(Trainer, ExpertBiasFollowsTheLoadsAndDegreesAndResumeAgree) {
  train::TrainConfig c = tiny_config();
  c.layer.moe_router = model::Router::megatron;
  c.layer.moe_router_score_function = model::ScoreFunction::sigmoid;
  c.layer.moe_router_load_balancing = model::Balancing::seq_aux_loss;
  c.layer.moe_router_num_groups = 2;
  c.layer.moe_router_group_topk = 1;
  c.layer.moe_router_topk_scaling_factor = 2.5;
  c.layer.moe_router_enable_expert_bias = true;
  c.layer.moe_router_bias_update_rate = 0.01;
  c.moe_aux_loss_coeff = 0.01;
  c.train_iters = 6;
  c.log_interval = 1;
  c.validate(1);
  std::vector<std::vector<float>> bias(size_t(c.num_layers), std::vector<float>(size_t(c.layer.num_experts), 0.0f));
  RunResult ref;
  {
    train::Trainer t(c, *g_groups, corpus_data(c));
    const train::TrainResult r = t.train();
    ASSERT_EQ(r.moe.size(), size_t(c.train_iters));
    for (const train::MoeLog& w : r.moe) {
      ASSERT_EQ(w.layers.size(), size_t(c.num_layers));
      for (size_t l = 0; l < w.layers.size(); ++l) {
        double sum = 0;
        for (const int64_t n : w.layers[l].tokens) sum += double(n);
        const double mean = sum / double(c.layer.num_experts);
        for (size_t e = 0; e < bias[l].size(); ++e) {
          const double off = mean - double(w.layers[l].tokens[e]);
          bias[l][e] += float(off > 0 ? 0.01 : off < 0 ? -0.01 : 0.0);
        }
      }
    }
    for (const auto& it : r.iterations) ref.losses.push_back(it.lm_loss);
    ref.weights = t.full_params();
  }
  bool moved = false;
  for (int l = 0; l < c.num_layers; ++l) {
    const Tensor& b = ref.weights.at(fmt::format("layers.{}.moe.gate.expert_bias", l));
    ASSERT_EQ(b.numel(), c.layer.num_experts);
    for (int64_t e = 0; e < b.numel(); ++e) {
      EXPECT_NEAR(b.get(e), bias[size_t(l)][size_t(e)], 1e-6) << "layer " << l << " expert " << e;
      moved = moved || b.get(e) != 0.0f;
    }
  }
  EXPECT_TRUE(moved);
  train::TrainConfig m4 = c;
  m4.ampipe_degree = 4;
  expect_same_run(run_training(m4, *g_groups), ref, 1e-5);
  expect_resume_is_bitwise(c, ref, 3, "expert_bias");
}

// Absolute pins of the optimizer and the schedule (issue 27: AdamW without the second-moment bias correction, and a
// learning rate one iteration late at its call site, survived the relative tests).

// train::AdamW over 3 steps against values computed by hand in double precision (torch.optim.AdamW's order):
//   p *= 1 - lr wd (decay params only);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps),   g = clip * grad
// with b1 0.9, b2 0.999, eps 1e-8, wd 0.1, lr 0.1, 0.05, 0.02 and clip 1, 1, 0.5 at steps 1, 2, 3. Step 2 of w[0]:
//   p = 0.89 (1 - 0.005) = 0.88555; m = 0.9 * 0.05 + 0.1 * -0.25 = 0.02, v = 0.999 * 2.5e-4 + 1e-3 * 0.0625 = 3.1225e-4;
//   m_hat = 0.02 / 0.19 = 0.105263, v_hat = 3.1225e-4 / 1.999e-3 = 0.156203: p = 0.88555 - 0.05 * 0.105263 / 0.395225
//   = 0.872233. Without the second-moment correction step 1 alone would move w[0] by 3.2 instead of 0.1; with the
// corrections off by one step, step 2 by 0.0094 instead of 0.0133. Tolerance 2e-6: fp32 arithmetic on values of
// order 1 (the kernel's 1 - b2 in fp32 is 1.3e-5 relative off).
TEST(AdamW, ThreeStepsMatchTheHandComputedValues) {
  std::vector<train::NamedParam> ps(2);
  ps[0].name = "w";
  ps[0].decay = true;
  ps[0].param = Tensor::from({1.0f, -0.5f}, {2});
  ps[0].grad = Tensor::zeros({2});
  ps[1].name = "b";
  ps[1].decay = false;
  ps[1].param = Tensor::from({0.3f}, {1});
  ps[1].grad = Tensor::zeros({1});
  train::AdamW opt(ps);
  const double lr[3] = {0.1, 0.05, 0.02};
  const float clip[3] = {1.0f, 1.0f, 0.5f};
  const float gw[3][2] = {{0.5f, 0.2f}, {-0.25f, 0.2f}, {1.0f, -0.4f}}, gb[3] = {0.1f, 0.1f, -0.3f};
  const double want_w[3][2] = {{0.8900000020, -0.5949999950}, {0.8722331503, -0.6420249925},
                               {0.8588990707, -0.6459807947}};
  const double want_b[3] = {0.2000000100, 0.1500000150, 0.1486981012};
  const double want_m[2] = {0.068, 0.0142}, want_v[2] = {0.00056193775, 0.00011988004};
  for (int t = 0; t < 3; ++t) {
    ps[0].grad.data<float>()[0] = gw[t][0];
    ps[0].grad.data<float>()[1] = gw[t][1];
    ps[1].grad.data<float>()[0] = gb[t];
    opt.step(ps, lr[t], 0.1, 0.9, 0.999, 1e-8, clip[t]);
    EXPECT_EQ(opt.steps(), t + 1);
    EXPECT_NEAR(ps[0].param.get(0), want_w[t][0], 2e-6) << "step " << t + 1;
    EXPECT_NEAR(ps[0].param.get(1), want_w[t][1], 2e-6) << "step " << t + 1;
    EXPECT_NEAR(ps[1].param.get(0), want_b[t], 2e-6) << "step " << t + 1 << " (no weight decay)";
  }
  // The moments after step 3 (the clip scales the gradient before both).
  EXPECT_NEAR(opt.exp_avg(0).get(0), want_m[0], 1e-7);
  EXPECT_NEAR(opt.exp_avg(0).get(1), want_m[1], 1e-7);
  EXPECT_NEAR(opt.exp_avg_sq(0).get(0), want_v[0], 1e-8);
  EXPECT_NEAR(opt.exp_avg_sq(0).get(1), want_v[1], 1e-8);
}

// The learning rate of every warm-up iteration, as logged and as applied, against Megatron's schedule computed by
// hand: lr (it + 1) / W for it < W (iteration it + 1 of the log), then the cosine decay. With W = 4, lr 3e-3:
// 7.5e-4, 1.5e-3, 2.25e-3, 3e-3. The applied one: with betas 0 (m = g, v = g^2, both corrections 1) every AdamW step
// moves each weight whose gradient is far above eps by exactly lr, so the largest change of a step is its lr (to
// 2e-4 relative: half an fp32 ulp of a LayerNorm weight of 1 is 6e-8, eps 1e-8 is negligible against the largest
// gradients).
TEST(Trainer, WarmupLearningRatesAreMegatronsAsLoggedAndApplied) {
  train::TrainConfig c = tiny_config();
  c.train_iters = 6;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.lr_warmup_iters = 4;
  c.lr_decay_style = "cosine";
  c.weight_decay = 0;
  c.adam_beta1 = 0;
  c.adam_beta2 = 0;
  c.clip_grad = 0;
  c.layer.hidden_dropout = 0;
  c.layer.attention_dropout = 0;
  c.validate(1);
  train::Trainer t(c, *g_groups, corpus_data(c));
  // iterations 1..4: warm-up; 5: cos decay at r = 0 (lr); 6: r = 1/2, min_lr + (lr - min_lr) / 2 = 1.65e-3
  const double want[6] = {7.5e-4, 1.5e-3, 2.25e-3, 3e-3, 3e-3, 1.65e-3};
  for (int it = 0; it < 6; ++it) {
    const std::map<std::string, Tensor> before = t.full_params();
    const train::TrainResult r = t.train({}, 1);
    ASSERT_EQ(r.iterations.size(), 1u);
    EXPECT_EQ(r.iterations[0].iteration, it + 1);
    EXPECT_NEAR(r.iterations[0].lr, want[it], 1e-12) << "logged lr of iteration " << it + 1;
    double moved = 0;
    for (const auto& [name, p] : t.full_params()) {
      const Tensor& b = before.at(name);
      for (int64_t i = 0; i < p.numel(); ++i) moved = std::max(moved, std::abs(double(p.get(i)) - double(b.get(i))));
    }
    EXPECT_NEAR(moved, want[it], 2e-4 * want[it]) << "lr applied at iteration " << it + 1;
  }
}
