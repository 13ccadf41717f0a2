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
  // --step: the whole training iteration's step Plan (schedule/step_plan.h) instead of one layer's, for
  // --global-batch-size sequences on --world-size devices with a --vocab-size LM head
  bool step = false;
  int64_t global_batch_size = 0;  // 0: one micro-batch per data-parallel rank
  int world_size = 1;
  int64_t vocab_size = 256;
  int pipeline_model_parallel_size = 1;  // --step: the stages' timeline and each stage's step Plan
  int num_virtual_stages_per_pipeline_rank = 0;  // --step: model chunks per stage (the interleaved schedule)
  int microbatch_group_size_per_vp_stage = 0;     // --step: its micro-batch groups (0: the stages)
  void add_to(CLI::App& app);  // the flags of flag_registry.cpp for plan
};

int run_plan(PlanArgs& args);

}  // namespace ampipe::cli
