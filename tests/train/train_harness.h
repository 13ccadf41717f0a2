// Helpers of the trainer tests: a tiny GPT-MoE config, runs of the Trainer, and comparisons by parameter name.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ampipe/comm/runtime.h"
#include "ampipe/train/text_data.h"
#include "ampipe/train/megatron_args.h"
#include "ampipe/train/trainer.h"

namespace ampipe::testing {

// Tiny model; capacity factor 4 with top-2 of 4 experts: capacity >= all tokens, nothing is dropped, so every
// AMPipe degree and EP size must give the same result (docs/design.md, "Numerics and determinism"). Dropout on (hidden
// and attention): its random numbers are keyed by position, so it must not change that either.
inline train::TrainConfig tiny_config() {
  train::TrainConfig c;
  model::LayerConfig& l = c.layer;
  l.seq_length = 16;
  l.micro_batch_size = 2;
  l.hidden_size = 16;
  l.ffn_hidden_size = 32;
  l.num_attention_heads = 2;
  l.num_experts = 4;
  l.moe_router_topk = 2;
  l.moe_train_capacity_factor = 4.0;
  l.moe_min_capacity = 1;
  l.hidden_dropout = 0.1;
  l.attention_dropout = 0.1;  // also keyed by position: every degree and layout draws the same mask
  l.init_method_std = 0.1;
  l.seed = 7;
  c.num_layers = 2;
  c.use_flash_attn = true;
  c.train_iters = 20;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.lr_warmup_iters = 4;
  c.eval_interval = 0;
  c.log_interval = 1000;
  c.clip_grad = 1.0;
  c.padded_vocab_size = train::kVocabSize;  // the bundled corpus's bytes (corpus_data), padded: 256
  return c;
}

inline std::shared_ptr<const train::TextData> corpus_data(const train::TrainConfig& c) {
  static const train::Corpus corpus = train::load_corpus("");
  return std::make_shared<const train::TextData>(corpus, c.layer.seq_length, train::data_split(c), c.layer.seed,
                                                 "corpus");
}

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, Tensor> weights;
  std::vector<double> evals;  // validation losses (with --eval-interval)
};

inline RunResult run_training(const train::TrainConfig& c, const comm::Groups& g) {
  c.validate(g.world.size());
  train::Trainer t(c, g, corpus_data(c));
  t.maybe_load();
  const train::TrainResult r = t.train();
  RunResult out;
  for (const auto& it : r.iterations) out.losses.push_back(it.lm_loss);
  for (const auto& e : r.evals) out.evals.push_back(e.lm_loss);
  out.weights = t.full_params();
  return out;
}

// ||a - b|| / ||b|| over the whole tensor.
inline double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double d = 0, n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    d += (x - y) * (x - y);
    n += y * y;
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

inline void expect_same_run(const RunResult& got, const RunResult& ref, double tol) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_LE(std::abs(got.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]), tol) << "loss of iteration " << i + 1;
  ASSERT_EQ(got.evals.size(), ref.evals.size());
  for (size_t i = 0; i < ref.evals.size(); ++i)
    EXPECT_LE(std::abs(got.evals[i] - ref.evals[i]) / std::abs(ref.evals[i]), tol) << "validation loss " << i + 1;
  ASSERT_EQ(got.weights.size(), ref.weights.size());
  for (const auto& [name, w] : ref.weights) {
    ASSERT_TRUE(got.weights.count(name)) << name;
    EXPECT_LE(rel_err(got.weights.at(name), w), tol) << name;
  }
}

}  // namespace ampipe::testing
