// Megatron-LM flags that `ampipe train` parses only to refuse, each with its reason (docs/training.md, "Megatron
// launch scripts"): a launch script that relies on one of them stops with one line instead of training something
// else. A flag whose value is the one this engine runs anyway (--pipeline-model-parallel-size 1,
// --position-embedding-type learned_absolute, ...) is accepted.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace ampipe::cli {

struct RefusedFlags {
  // Why a tokenizer other than the byte level, the token file's ids and SentencePiece is refused (--vocab-file,
  // --merge-file, --tokenizer-type other than SentencePieceTokenizer).
  static constexpr const char* kTokenizerReason =
      "this engine reads plain text byte by byte (V = 256), pre-tokenized llm.c token files (--data-path), or "
      "SentencePiece models (--tokenizer-type SentencePieceTokenizer --tokenizer-model FILE; ampipe preprocess)";
  struct Entry {
    const char* flag = nullptr;
    const char* accepted = nullptr;  // the one value accepted (nullptr: none)
    const char* reason = nullptr;
    std::string value;     // as parsed
    bool is_switch = false;
    bool on = false;       // for switches
    CLI::Option* opt = nullptr;
  };
  std::vector<Entry> entries;

  // Adds every refused flag to `app` in the option group `group`.
  void add_to(CLI::App& app, const std::string& group);
  // Throws ConfigError for the first refused flag given (on the command line or by --config).
  void check() const;
  // Takes `flag` off `app` and out of check(), for a command that gives it a meaning of its own (`ampipe simulate`
  // costs --position-embedding-type rope, which `train` refuses).
  void release(CLI::App& app, const std::string& flag);
};

}  // namespace ampipe::cli
