// Megatron-LM flags that `ampipe train` parses only to refuse, each with its reason (docs/training.md, "Megatron
// launch scripts"): a launch script that relies on one of them stops with one line instead of training something
// else. A flag whose value is the one this engine runs anyway (--pipeline-model-parallel-size 1,
// --position-embedding-type learned_absolute, ...) is accepted. The Megatron / MindSpeed flags that have no effect on
// this engine (GPU kernel fusion, NCCL/CUDA settings, dataloader workers, timers and logging detail, checkpoint
// format details) are parsed with their grammar and kept here too: one start-up note names those given.
#pragma once

#include <CLI/CLI.hpp>
#include <deque>
#include <string>
#include <vector>

#include "ampipe/cli/flag_registry.h"

namespace ampipe::cli {

struct RefusedFlags {
  // The flags, their reasons and the values they accept are the registry's (flag_registry.cpp, refused());
  // add_flags puts one Entry here for each flag the subcommand takes.
  struct Entry {
    const FlagSpec* spec = nullptr;
    std::string value;                // as parsed
    std::vector<std::string> values;  // Grammar::text_list (Megatron's nargs)
    bool on = false;    // for switches
    CLI::Option* opt = nullptr;
  };
  std::deque<Entry> entries;  // the options hold references into it: a deque keeps them when it grows

  // Throws ConfigError for the first refused flag given (on the command line or by --config).
  void check() const;
  // The no-op flags given, as one note ("no effect on this engine: --no-masked-softmax-fusion (GPU kernel fusion),
  // --num-workers 2 (dataloader workers)"); `extra` items join it (--distributed-backend nccl). "" when none.
  std::string noop_note(const std::vector<std::string>& extra = {}) const;
};

}  // namespace ampipe::cli
