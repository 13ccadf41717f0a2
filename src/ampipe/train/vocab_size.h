// The model's vocabulary V (the rows of the token embedding and the LM head) from Megatron-LM's three flags
// (docs/training.md, "Vocabulary"):
//   --vocab-size N                      the vocabulary before padding, where no tokenizer gives one (Megatron's
//                                       NullTokenizer): token files and indexed datasets read without
//                                       --tokenizer-type, whose ids must be < N; default: the largest id + 1, or 256
//                                       for byte-level text. With a tokenizer its count is the vocabulary (Megatron
//                                       reads --vocab-size only for NullTokenizer and TikTokenizer): a smaller N is
//                                       refused, a larger one has no effect (a note).
//   --make-vocab-size-divisible-by D    Megatron's padding (default 128): V = the vocabulary rounded up to a multiple
//                                       of D x --tensor-model-parallel-size, with Megatron's log line
//                                       " > padded vocab (size: X) with Y dummy tokens (new size: Z)";
//   --padded-vocab-size P               V = P as given (Megatron computes the padding only when it is not given):
//                                       P >= the vocabulary, and divisible by --tensor-model-parallel-size
//                                       (Megatron splits the embedding and the LM head over the tp ranks by rows).
// A checkpoint records V (metadata.json "config": "padded_vocab_size", a model-shape key): a resume must have the
// same V (check_checkpoint_vocab), --use-checkpoint-args takes it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ampipe/train/train_config.h"

namespace ampipe::train {

// Megatron's _vocab_size_with_padding: `vocab` rounded up to a multiple of `divisible_by` x `tp` (each >= 1).
// Throws ConfigError naming --make-vocab-size-divisible-by when the result does not fit 64 bits.
int64_t pad_vocab_size(int64_t vocab, int64_t divisible_by, int64_t tp);

// Megatron's log line of the padding: " > padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)".
std::string padded_vocab_line(int64_t vocab, int64_t padded);

// What the data need: `ids` ids (the tokenizer's count, the largest id + 1 of token data, 256 for byte-level text),
// `source` saying why for the error lines ("the tokenizer is GPT2BPETokenizer (...: 50257 ids)", "--data-path x.bin
// holds token id 499", "the bundled corpus is byte-level text"), `tokenizer`: whether a tokenizer gives them (then
// --vocab-size can only repeat its count).
struct DataVocab {
  int64_t ids = 256;
  std::string source = "byte-level text";
  bool tokenizer = false;
  std::string tokenizer_type;  // --tokenizer-type, for the note
};

struct VocabSizing {
  int64_t vocab = 0;      // before padding: the data's ids or --vocab-size
  int64_t padded = 0;     // V: the model's vocabulary (TrainConfig::padded_vocab_size)
  bool computed = false;  // padded by Megatron's rule (not --padded-vocab-size)
  std::string padding;    // how V came about, for the resume refusal: "--padded-vocab-size 512", "the vocabulary 300
                          // padded to a multiple of --make-vocab-size-divisible-by 128 x --tensor-model-parallel-size 2"
  std::vector<std::string> notes;  // flags this run does not use, for rank 0's start-up notes
  // Megatron's log line (computed only: Megatron prints nothing when --padded-vocab-size is given), else "".
  std::string log_line() const { return computed ? padded_vocab_line(vocab, padded) : std::string(); }
};

// Sizes the vocabulary of `c` for the data: applies --vocab-size, then --padded-vocab-size or Megatron's padding,
// and sets c.padded_vocab_size = V. `padded_origin` is said after a given --padded-vocab-size in the error lines
// (" (the --load checkpoint's, --use-checkpoint-args)"). Throws ConfigError naming the flag, the value and the rule:
// a --vocab-size below the ids the data need, a --padded-vocab-size below the vocabulary.
VocabSizing size_vocabulary(TrainConfig& c, const DataVocab& data, const std::string& padded_origin = "");

// The rules of the three flags that do not depend on the data (TrainConfig::validate calls it): --vocab-size and
// --padded-vocab-size >= 1 (0 is their fields' "not given": refused only when `vocab_given` / `padded_given`, as the
// flags' parser knows), --make-vocab-size-divisible-by >= 1 with its multiple of tp within 64 bits,
// --padded-vocab-size divisible by --tensor-model-parallel-size.
void validate_vocab_flags(const TrainConfig& c, bool vocab_given = false, bool padded_given = false);

// A resume's vocabulary against the checkpoint's (its metadata.json "config"): the same V, or ConfigError naming
// --load, both sizes, how this run's came about and the two ways out (--padded-vocab-size, --use-checkpoint-args).
// A checkpoint written before padded_vocab_size was recorded passes (load_checkpoint compares the tensors' shapes).
void check_checkpoint_vocab(const std::string& load, int64_t iteration, const nlohmann::json& ckpt_config,
                            const VocabSizing& v);

}  // namespace ampipe::train
