// Megatron's data pipeline (train/megatron_data.h): --data-path's grammar, the split over documents, the blending rule
// (Megatron's sequence of datasets and its proportions), the windows of a split and their order.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "ampipe/core/error.h"
#include "ampipe/train/megatron_data.h"

using namespace ampipe;
using train::BlendIndex;

namespace {

// A dataset of `docs` documents of `len` tokens each whose ids are their positions in the file plus `base`, so a
// window's first id says where it starts.
std::string write_counting(const std::string& name, int docs, int len, int base = 0) {
  const std::string p = ::testing::TempDir() + "/md_" + name;
  train::IndexedDatasetWriter w(p, train::TokenDType::int32, "--output-prefix");
  int32_t next = base;
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> t(static_cast<size_t>(len));
    for (int32_t& x : t) x = next++;
    const std::vector<int64_t> l = {len};
    w.add_document(t, l);
  }
  w.finalize();
  return p;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(MegatronData, BlendGrammarIsGetBlendFromList) {
  train::Blend b = train::parse_blend({"A"}, "--data-path");
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"A"}));
  EXPECT_TRUE(b.weights.empty());
  b = train::parse_blend({"0.7", "A", "30", " B "}, "--data-path");
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"A", "B"}));  // prefixes are stripped, as in Megatron
  EXPECT_EQ(b.weights, (std::vector<double>{0.7, 30}));
  b = train::parse_blend({"A", "B"}, "--data-path");  // prefixes only: weighted by their sizes
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"A", "B"}));
  EXPECT_TRUE(b.weights.empty());
  b = train::parse_blend({"0.5", "A", "B"}, "--data-path");  // an odd count is prefixes only, "0.5" one of them
  EXPECT_EQ(b.prefixes.size(), 3u);
  EXPECT_NE(error_of([] { train::parse_blend({"0.5", "A", "B", "C"}, "--data-path"); })
                .find("\"0.5\" is a weight but \"B\" in the same place of its pair is not"),
            std::string::npos);
  EXPECT_NE(error_of([] { train::parse_blend({"0", "A", "1", "B"}, "--train-data-path"); })
                .find("--train-data-path 0 A 1 B: the weight 0 of A is invalid: weights must be finite and > 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { train::parse_blend({"nan", "A"}, "--data-path"); }).find("the weight nan of A is invalid"),
            std::string::npos);
  EXPECT_NE(error_of([] { train::parse_blend({}, "--data-path"); }).find("--data-path is empty"), std::string::npos);
  EXPECT_EQ(train::normalize_weights({3, 1}), (std::vector<double>{0.75, 0.25}));
}

TEST(MegatronData, SplitIsMegatronsRoundedBookends) {
  auto r = train::split_ranges({969, 30, 1}, 1000);
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].end, 969);
  EXPECT_EQ(r[1].begin, 969);
  EXPECT_EQ(r[1].end, 999);
  EXPECT_EQ(r[2].begin, 999);
  EXPECT_EQ(r[2].end, 1000);
  r = train::split_ranges({1, 1, 0}, 5);  // 0.5 * 5 = 2.5 rounds half to even (Python's round): 2
  EXPECT_EQ(r[0].end, 2);
  EXPECT_EQ(r[1].begin, 2);
  EXPECT_EQ(r[1].end, 5);
  EXPECT_EQ(r[2].begin, r[2].end);  // weight 0: no split
  r = train::split_ranges({1, 1, 0}, 7);  // 3.5 -> 4
  EXPECT_EQ(r[0].end, 4);
}

TEST(MegatronData, BlendIndexIsMegatronsRule) {
  // helpers.cpp build_blending_indices by hand: sample g goes to argmax_d w_d * max(g, 1) - count_d.
  const std::vector<int> want = {0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0};
  const BlendIndex b(train::normalize_weights({0.7, 0.3}));
  int64_t counts[2] = {0, 0};
  for (int g = 0; g < int(want.size()); ++g) {
    const BlendIndex::Pick p = b.at(g);
    EXPECT_EQ(p.dataset, want[size_t(g)]) << g;
    EXPECT_EQ(p.sample, counts[p.dataset]++) << g;
  }
  const BlendIndex three(train::normalize_weights({5, 3, 2}));
  const std::vector<int> want3 = {0, 1, 2, 0, 1, 0, 2, 0, 1, 0, 0, 1, 2, 0, 1, 0, 2, 0, 1, 0};
  for (int g = 0; g < int(want3.size()); ++g) EXPECT_EQ(three.at(g).dataset, want3[size_t(g)]) << g;
}

TEST(MegatronData, BlendProportionsAreExactToWithinOneSampleForTwoAndTwoForMore) {
  const std::vector<std::vector<double>> blends = {
      {0.7, 0.3}, {0.5, 0.5}, {0.999, 0.001}, {1, 3}, {1, 1, 1}, {5, 3, 2}, {0.5, 0.25, 0.125, 0.125},
      {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {1, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01}};
  constexpr int64_t kSamples = 200000;  // past the 2^16 stride of the saved counts, three times
  for (const auto& raw : blends) {
    const std::vector<double> w = train::normalize_weights(raw);
    const BlendIndex b(w);
    std::vector<int64_t> c(w.size(), 0);
    double worst = 0;
    for (int64_t g = 0; g < kSamples; ++g) {
      const BlendIndex::Pick p = b.at(g);
      ASSERT_EQ(p.sample, c[size_t(p.dataset)]);
      ++c[size_t(p.dataset)];
      for (size_t d = 0; d < w.size(); ++d) worst = std::max(worst, std::abs(double(c[d]) - w[d] * double(g + 1)));
    }
    EXPECT_LT(worst, w.size() == 2 ? 1.0 : 2.0) << raw.size() << " datasets, first weight " << raw[0];
    // Random access (back across the saved counts, forward past them) gives what the forward walk gave.
    for (int64_t g : {int64_t(150001), int64_t(3), int64_t(65536), int64_t(65535), int64_t(199999), int64_t(0)}) {
      const BlendIndex fresh(w);
      EXPECT_EQ(b.at(g).dataset, fresh.at(g).dataset) << g;
      EXPECT_EQ(b.at(g).sample, fresh.at(g).sample) << g;
    }
  }
}

TEST(MegatronData, SplitsWindowsAndOrder) {
  // 100 documents of 10 tokens: the split 80,10,10 gives documents [0, 80), [80, 90), [90, 100).
  const std::string p = write_counting("one", 100, 10);
  train::MegatronDataArgs a;
  a.data_path = {p};
  a.split = {80, 10, 10};
  a.seq_length = 8;
  a.seed = 5;
  const train::MegatronData md(a);
  EXPECT_EQ(md.tokens(), 1000);
  EXPECT_EQ(md.max_token(), 999);
  EXPECT_EQ(md.train().samples(), (800 - 1) / 8);  // windows of s + 1 at stride s over the split's tokens
  ASSERT_NE(md.valid(), nullptr);
  ASSERT_NE(md.test(), nullptr);
  EXPECT_EQ(md.valid()->samples(), (100 - 1) / 8);
  std::vector<int32_t> in(8), tg(8);
  md.valid()->sample(2, in, tg);  // unshuffled: window 2 of the validation split, which starts at token 800
  EXPECT_EQ(in.front(), 800 + 16);
  EXPECT_EQ(tg.back(), 800 + 24);
  md.test()->sample(12 + 3, in, tg);  // sample j is window j mod N
  EXPECT_EQ(in.front(), 900 + 3 * 8);
  // Training: each epoch is a permutation of the split's windows, another one the next epoch, never outside it.
  const int64_t n = md.train().samples();
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int32_t> starts;
    for (int64_t j = 0; j < n; ++j) {
      md.train().sample(epoch * n + j, in, tg);
      EXPECT_EQ(in.front() % 8, 0);
      EXPECT_LT(tg.back(), 800);
      EXPECT_EQ(tg[0], in[1]);
      starts.insert(in.front());
    }
    EXPECT_EQ(int64_t(starts.size()), n);
  }
  // The same sample on any instance (any rank, a resumed run).
  const train::MegatronData again(a);
  std::vector<int32_t> in2(8), tg2(8);
  for (int64_t j : {int64_t(77), int64_t(3), int64_t(150)}) {
    md.train().sample(j, in, tg);
    again.train().sample(j, in2, tg2);
    EXPECT_EQ(in, in2);
  }
}

TEST(MegatronData, BlendsAndPerSplitPaths) {
  const std::string a = write_counting("a", 50, 20), b = write_counting("b", 50, 20, 100000);
  train::MegatronDataArgs args;
  args.data_path = {"3", a, "1", b};
  args.split = {90, 10, 0};
  args.seq_length = 16;
  const train::MegatronData md(args);
  EXPECT_EQ(md.test(), nullptr);  // --split gives the test split nothing
  std::vector<int32_t> in(16), tg(16);
  int from_b = 0;
  for (int64_t j = 0; j < 4000; ++j) {
    md.train().sample(j, in, tg);
    from_b += in.front() >= 100000;
  }
  EXPECT_EQ(from_b, 1000);  // a quarter of the samples, exactly (Megatron's rule: within one sample)
  // Unweighted: weighted by the parts' windows; the validation split holds the samples before one part repeats.
  args.data_path = {a, b};
  const train::MegatronData by_size(args);
  EXPECT_EQ(by_size.train().weights(), (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(by_size.valid()->samples(), 2 * ((100 - 1) / 16));
  // Per-split paths: each dataset whole; no --valid-data-path, no validation split.
  train::MegatronDataArgs per;
  per.train_data_path = {a};
  per.test_data_path = {b};
  per.seq_length = 16;
  const train::MegatronData ps(per);
  EXPECT_EQ(ps.train().samples(), (1000 - 1) / 16);
  EXPECT_EQ(ps.valid(), nullptr);
  EXPECT_EQ(ps.test()->samples(), (1000 - 1) / 16);
  // A training or validation part without a window is refused, naming the flag, the dataset and the split.
  args.seq_length = 128;
  EXPECT_NE(error_of([&] { train::MegatronData bad(args); })
                .find("--data-path " + a + ": its validation split (sequences [45, 50) of 50, 100 tokens) holds no "
                                           "window of --seq-length 128 + 1 tokens"),
            std::string::npos)
      << error_of([&] { train::MegatronData bad(args); });
  per.train_data_path.clear();
  EXPECT_NE(error_of([&] { train::MegatronData bad(per); }).find("--test-data-path is given without --train-data-path"),
            std::string::npos);
}
