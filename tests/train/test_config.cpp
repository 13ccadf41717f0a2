// TrainConfig::validate rules that need more than one rank to reach (the CLI tests in tests/CMakeLists.txt cover
// the others through the binary), and the learning-rate schedule and the data sampling.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

#include "ampipe/train/adamw.h"
#include "ampipe/train/text_data.h"
#include "ampipe/train/train_config.h"

using namespace ampipe;

namespace {
std::string message(const train::TrainConfig& c, int world) {
  try {
    c.validate(world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(TrainConfig, TensorParallelIsRefusedAsNotRunYet) {
  train::TrainConfig c;
  c.tensor_model_parallel_size = 2;
  EXPECT_THAT(message(c, 2), ::testing::HasSubstr("--tensor-model-parallel-size 2 is not supported by this engine yet"));
  EXPECT_THAT(message(c, 3), ::testing::HasSubstr("world size 3 is not tp x cp x dp"));
}

TEST(TrainConfig, ContextParallelWorldSize) {
  train::TrainConfig c;
  c.context_parallel_size = 2;
  EXPECT_THAT(message(c, 3), ::testing::HasSubstr("world size 3 is not tp x cp x dp"));
  EXPECT_THAT(message(c, 4), ::testing::HasSubstr("--context-parallel-size 2 is not supported by this engine yet"));
}

TEST(TrainConfig, ExpertParallelInsideDataParallel) {
  train::TrainConfig c;
  c.layer.expert_model_parallel_size = 4;
  EXPECT_THAT(message(c, 2), ::testing::HasSubstr("--expert-model-parallel-size 4 does not divide"));
  EXPECT_EQ(message(c, 4), "");
}

TEST(TrainConfig, GlobalBatchDividesOverDataParallelRanks) {
  train::TrainConfig c;
  c.layer.micro_batch_size = 2;
  c.global_batch_size = 6;
  EXPECT_THAT(message(c, 2), ::testing::HasSubstr("--global-batch-size 6 is not divisible by --micro-batch-size 2 x "
                                                  "data-parallel size 2"));
  EXPECT_EQ(message(c, 3), "");
}

TEST(TrainConfig, DegreeOneAcceptsTheDefaults) { EXPECT_EQ(message(train::TrainConfig{}, 1), ""); }

TEST(LearningRate, WarmupThenCosineToMinLr) {
  train::TrainConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.lr_warmup_iters = 10;
  c.train_iters = 110;
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 0), 0.1);
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 9), 1.0);
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 10), 1.0);
  EXPECT_NEAR(train::learning_rate(c, 60), 0.55, 1e-12);
  EXPECT_NEAR(train::learning_rate(c, 110), 0.1, 1e-12);
}

TEST(TextData, ShuffledEpochsVisitEveryWindowOnceAndHoldOutTheTail) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += char('a' + i % 26);
  train::TextData d(train::text_corpus(text), 8, 0.1, 3, "test");
  EXPECT_EQ(d.train_samples(), (1800 - 1) / 8);
  EXPECT_EQ(d.valid_samples(), (200 - 1) / 8);
  std::vector<int32_t> in(8), tg(8);
  std::set<int32_t> firsts_epoch0;
  const int64_t N = d.train_samples();
  std::vector<int> order;
  for (int64_t g = 0; g < N; ++g) {
    d.train_sample(g, in, tg);
    for (int i = 0; i < 7; ++i) EXPECT_EQ(tg[size_t(i)], in[size_t(i + 1)]);
    order.push_back(in[0]);
  }
  // Deterministic by seed: a second object gives the same order; epoch 1 is a different order.
  train::TextData d2(train::text_corpus(text), 8, 0.1, 3, "test");
  d2.train_sample(5, in, tg);
  EXPECT_EQ(in[0], order[5]);
  int same = 0;
  for (int64_t g = 0; g < N; ++g) {
    d.train_sample(N + g, in, tg);
    same += in[0] == order[size_t(g)];
  }
  EXPECT_LT(same, N / 2);
}

TEST(TextData, RejectsEmptyAndBinaryFiles) {
  EXPECT_THROW(train::load_corpus("/dev/null"), ConfigError);
  EXPECT_THROW(train::load_corpus("/nonexistent"), ConfigError);
  EXPECT_NO_THROW(train::load_corpus(""));  // the bundled corpus
}

namespace {
// Writes an llm.c token file: 256 int32 header (magic, version, count), then uint16 ids.
std::string write_token_file(const std::string& name, const std::vector<uint16_t>& ids, int32_t version = 1,
                             int32_t count = -1) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::vector<int32_t> header(256, 0);
  header[0] = train::kTokenFileMagic;
  header[1] = version;
  header[2] = count >= 0 ? count : int32_t(ids.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 256 * 4);  // little-endian host (x86-64)
  out.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
  return path;
}
}  // namespace

TEST(TextData, ReadsPreTokenizedLlmcTokenFiles) {
  std::vector<uint16_t> ids;
  for (int i = 0; i < 3000; ++i) ids.push_back(uint16_t((i * 7919) % 50257));
  const train::Corpus c = train::load_corpus(write_token_file("ok.bin", ids));
  ASSERT_EQ(c.tokens.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(c.tokens[i], int32_t(ids[i]));
  EXPECT_EQ(c.vocab_size, 50304);  // largest id 50256 -> 50257, rounded up to a multiple of 128
  const train::TextData d(c, 16, 0.1, 3, "tokens");
  std::vector<int32_t> in(16), tg(16);
  d.valid_sample(0, in, tg);
  EXPECT_EQ(in[1], tg[0]);  // targets are the inputs shifted by one token
  // A wrong version or a count that does not match the file size is refused, naming the flag and the file.
  for (const std::string& bad : {write_token_file("v2.bin", ids, 2), write_token_file("short.bin", ids, 1, 5000)}) {
    try {
      train::load_corpus(bad);
      FAIL() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--data-path " + bad), std::string::npos) << e.what();
    }
  }
}
