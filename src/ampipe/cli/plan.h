// `ampipe plan`: builds the Plan of one layer step (docs/plan.md) for the layer flags and one AMPipe degree, from
// shapes alone (no parameters, no data, no communication), and prints its tasks, their FLOPs and bytes, the
// planned memory and which communication each collective can hide behind; --json writes it all.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "ampipe/cli/layer_flags.h"

namespace ampipe::cli {

struct PlanArgs {
  LayerFlags layer;
  int ampipe_degree = 1;
  int num_layers = 1;
  std::string json_file;
  bool step = false;  // --step: print the whole training step's Plan
  void add_to(CLI::App& app);  // the flags of flag_registry.cpp for plan
};

int run_plan(PlanArgs& args);

}  // namespace ampipe::cli
