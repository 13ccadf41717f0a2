// `ampipe preprocess` (Megatron's tools/preprocess_data.py in spirit): --input FILE (plain text) --output-prefix
// PREFIX [--tokenizer-model FILE | --vocab-size N]. Without a model it trains a SentencePiece model on the text
// (train/tokenizer.h: PREFIX.model, PREFIX.vocab); then it tokenizes the text with the model and writes PREFIX.bin,
// an llm.c token file that `ampipe train --data-path` reads (train/text_data.h). --check-roundtrip (hidden, for
// the tests) decodes the ids again and fails (exit 1) unless the text comes back byte for byte.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace ampipe::cli {

struct PreprocessArgs {
  // The smallest vocabulary a trained model can have: its 256 byte pieces, <unk>, <s>, </s> and at least one more.
  static constexpr int64_t kMinVocab = 260;
  std::string input, output_prefix, tokenizer_model;
  int64_t vocab_size = 8000;
  bool check_roundtrip = false;
  CLI::App* app = nullptr;
  void add_to(CLI::App& app);  // the flags of flag_registry.cpp for preprocess
};

int run_preprocess(PreprocessArgs& args);

}  // namespace ampipe::cli
