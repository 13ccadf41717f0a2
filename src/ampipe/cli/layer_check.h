// `ampipe layer-check`: one forward + backward of one MoE layer; see layer_check.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "ampipe/cli/layer_flags.h"
#include "ampipe/cli/memory_check.h"

namespace ampipe::cli {

struct LayerCheckArgs {
  LayerFlags layer;
  CommFlags comm;
  MemoryFlags memory;  // --memory-limit
  int ampipe_degree = 1;
  int64_t global_batch_size = 0;
  std::string export_dir;
  std::string trace_file;
  void add_to(CLI::App& app);  // the flags of flag_registry.cpp for layer-check
};

int run_layer_check(LayerCheckArgs& args);

}  // namespace ampipe::cli
