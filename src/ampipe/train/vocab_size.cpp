#include "ampipe/train/vocab_size.h"

#include <limits>

#include "ampipe/core/error.h"

namespace ampipe::train {

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// The multiple Megatron pads to: --make-vocab-size-divisible-by x --tensor-model-parallel-size.
int64_t padding_multiple(int64_t divisible_by, int64_t tp) {
  if (divisible_by < 1)
    throw ConfigError(fmt::format("--make-vocab-size-divisible-by {} is invalid: it must be >= 1 (the vocabulary is "
                                  "padded to a multiple of it x --tensor-model-parallel-size)",
                                  divisible_by));
  if (tp < 1) throw ConfigError(fmt::format("--tensor-model-parallel-size {} is invalid: it must be >= 1", tp));
  if (divisible_by > kMax / tp)
    throw ConfigError(fmt::format("--make-vocab-size-divisible-by {} is too large: {} x --tensor-model-parallel-size "
                                  "{} overflows 64-bit arithmetic",
                                  divisible_by, divisible_by, tp));
  return divisible_by * tp;
}

}  // namespace

int64_t pad_vocab_size(int64_t vocab, int64_t divisible_by, int64_t tp) {
  const int64_t m = padding_multiple(divisible_by, tp);
  AMPIPE_CHECK(vocab >= 1, "pad_vocab_size: vocabulary {} < 1", vocab);
  const int64_t q = vocab / m + (vocab % m != 0 ? 1 : 0);  // ceil(vocab / m), without vocab + m - 1
  if (q > kMax / m)
    throw ConfigError(fmt::format("--make-vocab-size-divisible-by {}: the vocabulary {} rounded up to a multiple of "
                                  "{} x --tensor-model-parallel-size {} overflows 64-bit arithmetic",
                                  divisible_by, vocab, divisible_by, tp));
  return q * m;
}

std::string padded_vocab_line(int64_t vocab, int64_t padded) {
  return fmt::format(" > padded vocab (size: {}) with {} dummy tokens (new size: {})", vocab, padded - vocab, padded);
}

void validate_vocab_flags(const TrainConfig& c, bool vocab_given, bool padded_given) {
  const int tp = c.layer.tensor_model_parallel_size;
  if (c.vocab_size < 0 || (vocab_given && c.vocab_size == 0))
    throw ConfigError(fmt::format("--vocab-size {} is invalid: it must be >= 1 (the vocabulary before padding)",
                                  c.vocab_size));
  if (c.padded_vocab_size < 0 || (padded_given && c.padded_vocab_size == 0))
    throw ConfigError(fmt::format("--padded-vocab-size {} is invalid: it must be >= 1 (the rows of the token "
                                  "embedding and the LM head)",
                                  c.padded_vocab_size));
  (void)padding_multiple(c.make_vocab_size_divisible_by, tp < 1 ? 1 : tp);  // tp itself: validate's own rule
  if (tp > 1 && c.padded_vocab_size > 0 && c.padded_vocab_size % tp != 0)
    throw ConfigError(fmt::format("--padded-vocab-size {} is not divisible by --tensor-model-parallel-size {}: "
                                  "Megatron splits the token embedding and the LM head over the tp ranks by rows "
                                  "of the vocabulary (pass a multiple of {}, e.g. {})",
                                  c.padded_vocab_size, tp, tp, (c.padded_vocab_size / tp + 1) * tp));
}

VocabSizing size_vocabulary(TrainConfig& c, const DataVocab& data, const std::string& padded_origin) {
  validate_vocab_flags(c);
  VocabSizing v;
  v.vocab = data.ids;
  if (c.vocab_size > 0) {
    if (c.vocab_size < data.ids)
      throw ConfigError(fmt::format("--vocab-size {} is smaller than the vocabulary the data need, {} ids ({}): "
                                    "every id must be below it",
                                    c.vocab_size, data.ids, data.source));
    if (!data.tokenizer)
      v.vocab = c.vocab_size;
    else if (c.vocab_size > data.ids)  // Megatron reads --vocab-size for NullTokenizer and TikTokenizer only
      v.notes.push_back(fmt::format("--vocab-size {} has no effect with --tokenizer-type {}: the vocabulary is the "
                                    "tokenizer's {} ids (Megatron reads --vocab-size only without a tokenizer's "
                                    "files: NullTokenizer, TikTokenizer)",
                                    c.vocab_size, data.tokenizer_type, data.ids));
  }
  const std::string vocab_words =
      c.vocab_size > 0 && !data.tokenizer ? fmt::format("--vocab-size {}", c.vocab_size) : data.source;
  const int tp = c.layer.tensor_model_parallel_size;
  if (c.padded_vocab_size > 0) {
    if (c.padded_vocab_size < v.vocab)
      throw ConfigError(fmt::format("--padded-vocab-size {}{} is smaller than the vocabulary, {} ids ({}): the "
                                    "token embedding and the LM head need a row for every id",
                                    c.padded_vocab_size, padded_origin, v.vocab, vocab_words));
    v.padded = c.padded_vocab_size;
    v.padding = fmt::format("--padded-vocab-size {}{}", c.padded_vocab_size, padded_origin);
  } else {
    v.padded = pad_vocab_size(v.vocab, c.make_vocab_size_divisible_by, tp);
    v.computed = true;
    v.padding = fmt::format("the vocabulary {} padded to a multiple of --make-vocab-size-divisible-by {} x "
                            "--tensor-model-parallel-size {}",
                            v.vocab, c.make_vocab_size_divisible_by, tp);
  }
  c.padded_vocab_size = v.padded;
  return v;
}

void check_checkpoint_vocab(const std::string& load, int64_t iteration, const nlohmann::json& ckpt_config,
                            const VocabSizing& v) {
  if (!ckpt_config.contains("padded_vocab_size")) return;
  const nlohmann::json& theirs = ckpt_config["padded_vocab_size"];
  if (theirs == nlohmann::json(v.padded)) return;
  throw ConfigError(fmt::format("--load {} (iteration {}): the checkpoint's model has a vocabulary of {} rows "
                                "(--padded-vocab-size), this run's has {} ({}): pass --padded-vocab-size {}, or "
                                "--use-checkpoint-args to take the checkpoint's",
                                load, iteration, theirs.dump(), v.padded, v.padding, theirs.dump()));
}

}  // namespace ampipe::train
