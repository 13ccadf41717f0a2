// Megatron's vocabulary sizing (train/vocab_size.h): the padding rule against numbers computed by hand, the rules of
// --vocab-size, --padded-vocab-size and --make-vocab-size-divisible-by, and a resume's vocabulary against the
// checkpoint's.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "ampipe/core/error.h"
#include "ampipe/train/vocab_size.h"

using namespace ampipe;

namespace {

// The ConfigError's message of `f()`, or "" when it does not throw.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

train::TrainConfig with_tp(int tp) {
  train::TrainConfig c;
  c.layer.tensor_model_parallel_size = tp;
  return c;
}

train::DataVocab tokenizer_of(int64_t ids) {
  train::DataVocab d;
  d.ids = ids;
  d.source = "the tokenizer is T";
  d.tokenizer = true;
  d.tokenizer_type = "GPT2BPETokenizer";
  return d;
}

}  // namespace

// ceil(V / (D x tp)) x D x tp, each worked out by hand.
TEST(VocabSize, PadsToAMultipleOfTheDivisorTimesTensorParallelSize) {
  // GPT-2's 50257: 128 -> 393 x 128 = 50304; x tp 2 (256) -> 197 x 256 = 50432; x tp 8 (1024) -> 50 x 1024 = 51200
  EXPECT_EQ(train::pad_vocab_size(50257, 128, 1), 50304);
  EXPECT_EQ(train::pad_vocab_size(50257, 128, 2), 50432);
  EXPECT_EQ(train::pad_vocab_size(50257, 128, 8), 51200);
  // bytes: 256 is a multiple of 128 and of 256 (tp 2), not of 512 (tp 4): 512
  EXPECT_EQ(train::pad_vocab_size(256, 128, 1), 256);
  EXPECT_EQ(train::pad_vocab_size(256, 128, 2), 256);
  EXPECT_EQ(train::pad_vocab_size(256, 128, 4), 512);
  EXPECT_EQ(train::pad_vocab_size(1, 128, 1), 128);
  EXPECT_EQ(train::pad_vocab_size(129, 128, 1), 256);
  // Qwen's tokenizer (151665 ids): 128 -> 1185 x 128 = 151680; Megatron's Qwen3 scripts' 1187 -> 128 x 1187 = 151936;
  // 1 x tp 8 -> 18959 x 8 = 151672
  EXPECT_EQ(train::pad_vocab_size(151665, 128, 1), 151680);
  EXPECT_EQ(train::pad_vocab_size(151665, 1187, 1), 151936);
  EXPECT_EQ(train::pad_vocab_size(151665, 1, 8), 151672);
  EXPECT_EQ(train::pad_vocab_size(300, 100, 1), 300);  // already a multiple: no dummy token
}

TEST(VocabSize, LogsMegatronsLine) {
  EXPECT_EQ(train::padded_vocab_line(50257, 50304),
            " > padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)");
  EXPECT_EQ(train::padded_vocab_line(256, 256), " > padded vocab (size: 256) with 0 dummy tokens (new size: 256)");
}

TEST(VocabSize, RefusesPaddingThatOverflows) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_NE(error_of([&] { (void)train::pad_vocab_size(kMax - 1, 128, 1); }).find("overflows 64-bit arithmetic"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)train::pad_vocab_size(1, kMax / 2, 4); })
                .find("--make-vocab-size-divisible-by 4611686018427387903 is too large"),
            std::string::npos);
}

// Without a tokenizer the vocabulary is the data's ids, or --vocab-size when given (at least those ids).
TEST(VocabSize, SizesTheDataOrTheGivenVocabulary) {
  train::TrainConfig c = with_tp(2);
  train::DataVocab bytes;  // byte-level text: 256 ids
  train::VocabSizing v = train::size_vocabulary(c, bytes);
  EXPECT_EQ(v.vocab, 256);
  EXPECT_EQ(v.padded, 256);
  EXPECT_EQ(c.padded_vocab_size, 256);
  EXPECT_TRUE(v.computed);
  EXPECT_EQ(v.log_line(), " > padded vocab (size: 256) with 0 dummy tokens (new size: 256)");

  c = with_tp(2);
  c.vocab_size = 300;  // 300 over a multiple of 128 x 2: 512
  v = train::size_vocabulary(c, bytes);
  EXPECT_EQ(v.vocab, 300);
  EXPECT_EQ(c.padded_vocab_size, 512);
  EXPECT_EQ(v.padding, "the vocabulary 300 padded to a multiple of --make-vocab-size-divisible-by 128 x "
                       "--tensor-model-parallel-size 2");

  c = with_tp(1);
  c.make_vocab_size_divisible_by = 1;
  c.vocab_size = 50257;
  EXPECT_EQ(train::size_vocabulary(c, bytes).padded, 50257);

  c = with_tp(1);
  c.vocab_size = 200;
  EXPECT_EQ(error_of([&] { train::size_vocabulary(c, bytes); }),
            "--vocab-size 200 is smaller than the vocabulary the data need, 256 ids (byte-level text): every id must "
            "be below it");
}

// With a tokenizer its count is the vocabulary: a smaller --vocab-size is refused, a larger one is only noted
// (Megatron reads it for NullTokenizer and TikTokenizer only).
TEST(VocabSize, TheTokenizerGivesTheVocabulary) {
  train::TrainConfig c = with_tp(1);
  c.vocab_size = 50257;
  train::VocabSizing v = train::size_vocabulary(c, tokenizer_of(50257));
  EXPECT_EQ(c.padded_vocab_size, 50304);
  EXPECT_TRUE(v.notes.empty());

  c = with_tp(1);
  c.vocab_size = 60000;
  v = train::size_vocabulary(c, tokenizer_of(50257));
  EXPECT_EQ(v.vocab, 50257);
  EXPECT_EQ(c.padded_vocab_size, 50304);
  ASSERT_EQ(v.notes.size(), 1u);
  EXPECT_NE(v.notes[0].find("--vocab-size 60000 has no effect with --tokenizer-type GPT2BPETokenizer"),
            std::string::npos);

  c = with_tp(1);
  c.vocab_size = 1000;
  EXPECT_NE(error_of([&] { train::size_vocabulary(c, tokenizer_of(50257)); })
                .find("--vocab-size 1000 is smaller than the vocabulary the data need, 50257 ids (the tokenizer is T)"),
            std::string::npos);
}

// --padded-vocab-size is the model's vocabulary as given: at least the vocabulary, divisible by tp, not padded.
TEST(VocabSize, TakesThePaddedSizeAsGiven) {
  train::TrainConfig c = with_tp(2);
  c.padded_vocab_size = 50258;  // not a multiple of 128: taken as it is (Megatron pads only what it computes)
  train::VocabSizing v = train::size_vocabulary(c, tokenizer_of(50257));
  EXPECT_EQ(v.padded, 50258);
  EXPECT_FALSE(v.computed);
  EXPECT_EQ(v.log_line(), "");
  EXPECT_EQ(v.padding, "--padded-vocab-size 50258");

  c = with_tp(1);
  c.padded_vocab_size = 50000;
  EXPECT_EQ(error_of([&] { train::size_vocabulary(c, tokenizer_of(50257), " (the checkpoint's)"); }),
            "--padded-vocab-size 50000 (the checkpoint's) is smaller than the vocabulary, 50257 ids (the tokenizer is "
            "T): the token embedding and the LM head need a row for every id");

  c = with_tp(2);
  c.padded_vocab_size = 50257;
  EXPECT_EQ(error_of([&] { train::validate_vocab_flags(c); }),
            "--padded-vocab-size 50257 is not divisible by --tensor-model-parallel-size 2: Megatron splits the token "
            "embedding and the LM head over the tp ranks by rows of the vocabulary (pass a multiple of 2, e.g. 50258)");
}

// 0 and negative values; 0 is the fields' "not given", refused only when the flag was given.
TEST(VocabSize, RefusesZeroAndNegativeValues) {
  train::TrainConfig c;
  EXPECT_EQ(error_of([&] { train::validate_vocab_flags(c); }), "");
  EXPECT_NE(error_of([&] { train::validate_vocab_flags(c, true, false); })
                .find("--vocab-size 0 is invalid: it must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { train::validate_vocab_flags(c, false, true); })
                .find("--padded-vocab-size 0 is invalid: it must be >= 1"),
            std::string::npos);
  c.vocab_size = -5;
  EXPECT_NE(error_of([&] { train::validate_vocab_flags(c); }).find("--vocab-size -5 is invalid"), std::string::npos);
  c = train::TrainConfig();
  c.padded_vocab_size = -1;
  EXPECT_NE(error_of([&] { train::validate_vocab_flags(c); }).find("--padded-vocab-size -1 is invalid"),
            std::string::npos);
  for (int64_t d : {0, -128}) {
    c = train::TrainConfig();
    c.make_vocab_size_divisible_by = d;
    EXPECT_EQ(error_of([&] { c.validate(1); }).rfind(fmt::format("--make-vocab-size-divisible-by {} is invalid: it "
                                                                 "must be >= 1",
                                                                 d),
                                                     0),
              0u);
  }
}

// A checkpoint records its V as a model-shape key; a resume must have the same V.
TEST(VocabSize, AResumeNeedsTheCheckpointsVocabulary) {
  bool recorded = false;
  for (const train::ConfigKey& k : train::config_keys())
    if (std::string(k.key) == "padded_vocab_size") {
      recorded = true;
      EXPECT_TRUE(k.uses & train::kKeyCheckpoint);
      EXPECT_EQ(k.model, train::ModelArg::shape);
    } else if (std::string(k.key) == "vocab_size" || std::string(k.key) == "make_vocab_size_divisible_by") {
      EXPECT_FALSE(k.uses & train::kKeyCheckpoint) << k.key;  // V is what the checkpoint's tensors have
    }
  EXPECT_TRUE(recorded);

  train::TrainConfig c = with_tp(2);
  const train::VocabSizing v = train::size_vocabulary(c, tokenizer_of(50257));  // 50432
  EXPECT_EQ(error_of([&] { train::check_checkpoint_vocab("ck", 4, {{"padded_vocab_size", 50432}}, v); }), "");
  EXPECT_EQ(error_of([&] { train::check_checkpoint_vocab("ck", 4, nlohmann::json::object(), v); }), "");  // older
  EXPECT_EQ(error_of([&] { train::check_checkpoint_vocab("ck", 4, {{"padded_vocab_size", 50304}}, v); }),
            "--load ck (iteration 4): the checkpoint's model has a vocabulary of 50304 rows (--padded-vocab-size), "
            "this run's has 50432 (the vocabulary 50257 padded to a multiple of --make-vocab-size-divisible-by 128 x "
            "--tensor-model-parallel-size 2): pass --padded-vocab-size 50304, or --use-checkpoint-args to take the "
            "checkpoint's");
}
