// Megatron's tools/preprocess_data.py: JSON lines in, one indexed dataset (train/indexed_dataset.h) per JSON key out.
//
// Each line of --input is one JSON object, a document. For every key of --json-keys (default `text`) its value, a
// string (or a list of strings, the sentences of a document split before), is tokenized; the ids of its non-empty
// sentences are the document's sequences, and with --append-eod the tokenizer's end-of-document id (its eod()) ends
// the last of them (a document with no token gets none, and stays an empty document, as in Megatron). Key `k` goes to
// {output_prefix}_{k}_document.bin / .idx, in the dtype Megatron chooses (uint16 when the vocabulary has fewer than
// 65500 ids, else int32). Blank lines are skipped (Megatron's json.loads fails on them); a line that is not a JSON
// object, or lacks a key, or whose value is not a string or a list of strings, is refused naming --input, the line and
// the rule. --workers threads tokenize (the output is the same for any number); a progress line every
// --log-interval documents.
//
// The tokenizer comes in as a train::Tokenizer (train/tokenizer.h: SentencePiece, GPT-2 BPE, Hugging Face
// tokenizer.json; make_tokenizer from Megatron's flags), or ByteLevelTokenizer below when no --tokenizer-type is given.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ampipe/train/tokenizer.h"

namespace ampipe::train {

// ids = the UTF-8 bytes (V = 256, this engine's byte-level tokenizer); the end-of-document id is 0, the NUL byte, as
// in Megatron's ByteLevelTokenizer (eos id 0), so the vocabulary stays 256. With --append-eod a text containing a NUL
// is refused (its byte would read as a document end).
class ByteLevelTokenizer : public Tokenizer {
 public:
  int64_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;  // the bytes, invalid UTF-8 as U+FFFD
  int32_t eod() const override { return 0; }
  std::string describe() const override { return "byte-level (256 ids, end of document 0)"; }
};

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
PreprocessJsonResult preprocess_json(const PreprocessJsonOptions& options, const Tokenizer& tokenizer,
                                     const std::function<void(const std::string&)>& say);

}  // namespace ampipe::train
