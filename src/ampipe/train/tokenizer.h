// Subword tokenizer: SentencePiece models (Debian's libsentencepiece-dev), Megatron's --tokenizer-type
// SentencePieceTokenizer --tokenizer-model FILE, and training a model for `ampipe preprocess`.
//
// The library is optional at build time (CMake: pkg-config sentencepiece; AMPIPE_HAVE_SENTENCEPIECE): without it
// every function here throws ConfigError saying so. Its headers are included only in tokenizer.cpp.
//
// Models trained here are exact: identity normalization, no dummy prefix, whitespace kept as it is, and byte
// fallback (a character not in the vocabulary becomes its UTF-8 bytes, pieces <0x00>..<0xFF>), so
// decode(encode(text)) == text for valid UTF-8 without U+2581 (SentencePiece's space mark, which decodes as a
// space); invalid UTF-8 decodes as U+FFFD. `ampipe preprocess --check-roundtrip` checks a given text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ampipe::train {

// Whether this build links libsentencepiece.
bool sentencepiece_available();

class SentencePieceTokenizer {
 public:
  // Loads a model file. Throws ConfigError naming `flag` and the path when it is missing or not a SentencePiece
  // model.
  SentencePieceTokenizer(const std::string& model_path, const std::string& flag);
  ~SentencePieceTokenizer();
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  int64_t vocab_size() const;  // pieces in the model; ids are in [0, vocab_size)
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

// Trains a SentencePiece model (unigram, character coverage 1.0, byte fallback, the settings above) on `text`, one
// sentence per line, and writes prefix.model and prefix.vocab. Throws ConfigError naming --vocab-size when the
// library refuses the size for this text (e.g. fewer pieces than the text's characters plus the 256 bytes), or
// --output-prefix when the files cannot be written.
void train_sentencepiece(const std::string& text, const std::string& prefix, int64_t vocab_size);

}  // namespace ampipe::train
