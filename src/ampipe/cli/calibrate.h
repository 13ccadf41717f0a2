// `ampipe calibrate`: measures the machine it runs on (GEMM, attention and element-wise rates, the per-task
// overhead, the compute slowdown while a collective runs, and the all-to-all link under mpirun) in well under a
// minute, and writes a hardware profile (sim/profile.h) for `ampipe simulate`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "ampipe/comm/group.h"
#include "ampipe/sim/profile.h"

namespace ampipe::cli {

struct CalibrateArgs {
  std::string out_file;
  std::string name;
  void add_to(CLI::App& app);  // the flags of flag_registry.cpp for calibrate
};

int run_calibrate(CalibrateArgs& args);

// Measures this machine (sim::measure_machine: every rank of `groups.world` takes part; the link is measured over the
// world when it has 2+ ranks) and returns rank 0's profile on rank 0 (other ranks get their own measurements).
// `summary`: print the table (rank 0). Used by `calibrate` and by `--ampipe-degree auto` without --sim-profile.
sim::Profile calibrate_machine(const comm::Groups& groups, const std::string& name, bool summary);

}  // namespace ampipe::cli
