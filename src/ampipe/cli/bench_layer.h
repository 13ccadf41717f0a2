// `ampipe bench-layer`: times forward + backward of one or more MoE layers for several AMPipe degrees in one run.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "ampipe/cli/layer_flags.h"
#include "ampipe/cli/memory_check.h"

namespace ampipe::cli {

struct BenchLayerArgs {
  LayerFlags layer;
  CommFlags comm;
  MemoryFlags memory;  // --memory-limit
  std::string degree_text = "1,2,4";  // --ampipe-degree as given: a comma list, or `auto`
  std::vector<int> degrees;           // the degrees run (from degree_text; with auto, 1 and the chosen one)
  std::string sim_profile;               // --sim-profile (with --ampipe-degree auto)
  std::vector<int> pipe_experts_sweep;  // --pipe-experts-sweep: N values (0 = without) crossed with the degrees
  std::vector<int> tp_overlap_sweep;    // --tp-overlap-sweep: 0 / 1 (--ampipe-tp-sp-comm-overlap off / on) crossed too
  int num_layers = 1;
  int warmup = 2;
  int iters = 5;
  std::string json_file;
  std::string trace_file;
  int64_t poll_us = -1;  // --poll-us: the engine's sleep after an idle pass (Runtime::set_poll_interval); < 0: default
  void add_to(CLI::App& app);  // the flags of flag_registry.cpp for bench-layer
};

int run_bench_layer(BenchLayerArgs& args);

}  // namespace ampipe::cli
