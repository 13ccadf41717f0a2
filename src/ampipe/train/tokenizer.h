// Subword tokenizers behind one interface (`Tokenizer`), made by `make_tokenizer` from Megatron's flags
// (--tokenizer-type, --tokenizer-model, --vocab-file, --merge-file):
//   SentencePieceTokenizer  a SentencePiece model (Debian's libsentencepiece-dev), also trained here for
//                           `ampipe preprocess`;
//   Llama2Tokenizer         the same model with <s> put before each encoded text (Megatron's _Llama2Tokenizer);
//   GPT2BPETokenizer        byte-level BPE from GPT-2's vocab.json + merges.txt (train/bpe_tokenizer.h);
//   HuggingFaceTokenizer    byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama-3, Qwen2 style;
//                           train/bpe_tokenizer.h).
//
// SentencePiece is optional at build time (CMake: pkg-config sentencepiece; AMPIPE_HAVE_SENTENCEPIECE): without it
// its functions throw ConfigError saying so. Its headers are included only in tokenizer.cpp.
//
// SentencePiece models trained here are exact: identity normalization, no dummy prefix, whitespace kept as it is,
// and byte fallback (a character not in the vocabulary becomes its UTF-8 bytes, pieces <0x00>..<0xFF>), so
// decode(encode(text)) == text for valid UTF-8 without U+2581 (SentencePiece's space mark, which decodes as a
// space); invalid UTF-8 decodes as U+FFFD. `ampipe preprocess --check-roundtrip` checks a given text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ampipe::train {

// Text to token ids and back. Ids are in [0, vocab_size()).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int64_t vocab_size() const = 0;
  // The ids of `text` as Megatron's tokenize gives them (a tokenizer.json's post-processor may add a BOS id).
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // The text of `ids` (UTF-8; bytes that do not form valid UTF-8 become U+FFFD). Throws ConfigError for an id
  // outside [0, vocab_size()).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The end-of-document id Megatron appends (--append-eod); -1 when the tokenizer has none.
  virtual int32_t eod() const = 0;
  // One line for logs: the type, the files, the vocabulary size.
  virtual std::string describe() const = 0;
};

// The tokenizer of Megatron's flags: `type` is --tokenizer-type, `model` --tokenizer-model, `vocab_file`
// --vocab-file, `merge_file` --merge-file. type "" returns nullptr (no subword tokenizer: bytes of plain text, ids
// of a token file; train/text_data.h). Each type needs its files and refuses the others (never ignored):
// SentencePieceTokenizer and HuggingFaceTokenizer take --tokenizer-model (for HuggingFaceTokenizer a tokenizer.json
// or a directory holding one), GPT2BPETokenizer --vocab-file and --merge-file. Throws ConfigError (one line naming
// the flag, the value and the rule) for an unknown type, a missing or unused flag, or a file that cannot be read.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model,
                                          const std::string& vocab_file, const std::string& merge_file);

// Whether this build links libsentencepiece.
bool sentencepiece_available();

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Loads a model file. Throws ConfigError naming `flag` and the path when it is missing or not a SentencePiece
  // model. add_bos: Megatron's Llama2Tokenizer, whose tokenize puts the model's <s> id before every text it
  // encodes (a document in preprocess, the corpus at load); the end of document is </s> either way.
  SentencePieceTokenizer(const std::string& model_path, const std::string& flag, bool add_bos = false);
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  int64_t vocab_size() const override;  // pieces in the model; ids are in [0, vocab_size)
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t eod() const override;  // the model's </s> id (-1 when it has none)
  std::string describe() const override;
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  bool add_bos_ = false;
};

// Trains a SentencePiece model (unigram, character coverage 1.0, byte fallback, the settings above) on `text`, one
// sentence per line, and writes prefix.model and prefix.vocab. Throws ConfigError naming --vocab-size when the
// library refuses the size for this text (e.g. fewer pieces than the text's characters plus the 256 bytes), or
// --output-prefix when the files cannot be written.
void train_sentencepiece(const std::string& text, const std::string& prefix, int64_t vocab_size);

}  // namespace ampipe::train
