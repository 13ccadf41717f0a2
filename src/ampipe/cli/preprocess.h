// `ampipe preprocess`, two interfaces of one subcommand:
//  - Megatron's tools/preprocess_data.py (train/preprocess_data.h): --input FILE.jsonl [--json-keys K ...]
//    --output-prefix PREFIX [--tokenizer-type TYPE and its files, as train::make_tokenizer takes them] [--append-eod]
//    [--workers N] [--log-interval N] writes {PREFIX}_{K}_document.bin/.idx, Megatron's indexed dataset, for
//    `ampipe train --data-path {PREFIX}_{K}_document`. Chosen when --input ends in .json or .jsonl, or any of its own
//    flags is given. Without --tokenizer-type the tokenizer is byte-level (UTF-8 bytes, end of document 0).
//  - plain text: --input FILE --output-prefix PREFIX [--tokenizer-model FILE | --vocab-size N]. Without a model it
//    trains a SentencePiece model on the text (train/tokenizer.h: PREFIX.model, PREFIX.vocab); then it tokenizes the
//    text with the model and writes PREFIX.bin, an llm.c token file that `ampipe train --data-path` reads
//    (train/text_data.h). --check-roundtrip (hidden, for the tests) decodes the ids again and fails (exit 1) unless
//    the text comes back byte for byte.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ampipe::cli {

struct PreprocessArgs {
  // The smallest vocabulary a trained model can have: its 256 byte pieces, <unk>, <s>, </s> and at least one more.
  static constexpr int64_t kMinVocab = 260;
  std::string input, output_prefix, tokenizer_model;
  int64_t vocab_size = 8000;
  bool check_roundtrip = false;
  // preprocess_data.py's (JSON lines)
  std::vector<std::string> json_keys{"text"};
  std::string tokenizer_type, vocab_file, merge_file, lang = "english";
  bool append_eod = false, split_sentences = false, keep_newlines = false, keep_sequential_samples = false;
  int workers = 1, partitions = 1;
  int64_t log_interval = 1000;
  CLI::App* app = nullptr;
  void add_to(CLI::App& app);  // the flags of flag_registry.cpp for preprocess
};

int run_preprocess(PreprocessArgs& args);

}  // namespace ampipe::cli
