// Megatron's tools/preprocess_data.py: JSON lines in, one indexed dataset (train/indexed_dataset.h) per JSON key out.
//
// Each line of --input is one JSON object, a document. For every key of --json-keys (default `text`) its value, a
// string (or a list of strings, the sentences of a document split before), is tokenized; the ids of its non-empty
// sentences are the document's sequences, and with --append-eod the tokenizer's end-of-document id ends the last of
// them (a document with no token gets none, and stays an empty document, as in Megatron). Key `k` goes to
// {output_prefix}_{k}_document.bin / .idx, in the dtype Megatron chooses (uint16 when the vocabulary has fewer than
// 65500 ids, else int32). Blank lines are skipped (Megatron's json.loads fails on them); a line that is not a JSON
// object, or lacks a key, or whose value is not a string or a list of strings, is refused naming --input, the line and
// the rule. --workers threads tokenize (the output is the same for any number); a progress line every
// --log-interval documents.
//
// The tokenizer comes in as a DocumentTokenizer: the byte-level default and SentencePieceTokenizer here; another
// tokenizer (GPT-2 BPE, Hugging Face) is one more implementation of it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ampipe::train {

class SentencePieceTokenizer;

// What preprocessing needs of a tokenizer: Megatron's tokenizer.tokenize, .eod and .vocab_size. tokenize is called
// from several threads at once.
class DocumentTokenizer {
 public:
  virtual ~DocumentTokenizer() = default;
  virtual std::vector<int32_t> tokenize(const std::string& text) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int32_t> eod() const = 0;  // nullopt: the tokenizer has none (--append-eod is refused)
  virtual std::string describe() const = 0;        // "byte-level (256 ids)"
};

// ids = the UTF-8 bytes (V = 256, this engine's byte-level tokenizer); the end-of-document id is 0, the NUL byte, as
// in Megatron's ByteLevelTokenizer (eos id 0), so the vocabulary stays 256. With --append-eod a text containing a
// NUL is refused (its byte would read as a document end).
class ByteLevelDocumentTokenizer : public DocumentTokenizer {
 public:
  std::vector<int32_t> tokenize(const std::string& text) const override;
  int64_t vocab_size() const override { return 256; }
  std::optional<int32_t> eod() const override { return 0; }
  std::string describe() const override { return "byte-level (256 ids, end of document 0)"; }
};

// A SentencePiece model (train/tokenizer.h); the end-of-document id is the model's `</s>` control piece, Megatron's
// tokenizer.eod for SentencePieceTokenizer (its eos_id), read from the model file.
class SentencePieceDocumentTokenizer : public DocumentTokenizer {
 public:
  explicit SentencePieceDocumentTokenizer(const SentencePieceTokenizer& tokenizer);
  std::vector<int32_t> tokenize(const std::string& text) const override;
  int64_t vocab_size() const override;
  std::optional<int32_t> eod() const override { return eod_; }
  std::string describe() const override;

 private:
  const SentencePieceTokenizer& tok_;
  std::optional<int32_t> eod_;
};

// The id of the control piece named `piece` in a SentencePiece model file (its ModelProto: the pieces in id order,
// each with its text and type), or nullopt when the model has none. Throws ConfigError naming `flag` and the file
// when it is not such a model.
std::optional<int32_t> sentencepiece_control_piece(const std::string& model_path, const std::string& piece,
                                                   const std::string& flag);

struct PreprocessJsonOptions {
  std::string input, output_prefix;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  int workers = 1;
  int64_t log_interval = 1000;
};

struct PreprocessJsonResult {
  struct Output {
    std::string key, prefix;  // prefix: {output_prefix}_{key}_document
    int64_t documents = 0, tokens = 0;
  };
  std::vector<Output> outputs;
  int64_t lines = 0, blank_lines = 0, bytes = 0;
  double seconds = 0;
};

// Writes the datasets; `say` gets the progress lines. Throws ConfigError on bad input (naming --input, the line and
// the rule) or an unwritable output (naming --output-prefix).
PreprocessJsonResult preprocess_json(const PreprocessJsonOptions& options, const DocumentTokenizer& tokenizer,
                                     const std::function<void(const std::string&)>& say);

}  // namespace ampipe::train
