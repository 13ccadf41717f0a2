// `ampipe simulate`: predicts the training iteration of `ampipe train`'s flags on a hardware profile
// (sim/profile.h) for one or several AMPipe degrees, from the layers' Plans alone (no parameters, no activations,
// no communication), so it runs at any scale in a moment; picks the fastest degree.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "ampipe/cli/train_flags.h"

namespace ampipe::cli {

struct SimulateArgs {
  TrainFlags train;             // the flags of `ampipe train` (its --ampipe-degree and --sim-profile: see add_to)
  std::string degrees = "auto"; // --ampipe-degree LIST|auto
  int world_size = 0;           // 0: the MPI world size
  int nodes = 0;                // 0: world size / the profile's devices_per_node (at least 1)
  std::string profile_file;
  double compute_efficiency = 1;  // --compute-efficiency: a factor on every compute rate of the profile
  std::string json_file;
  void add_to(CLI::App& app);
};

int run_simulate(SimulateArgs& args);

// Throws ConfigError "FLAG PATH: ..." unless PATH names a file in an existing, writable directory (checked before
// any work, so that a bad output path fails at once).
void check_output_path(const std::string& flag, const std::string& path);

}  // namespace ampipe::cli
