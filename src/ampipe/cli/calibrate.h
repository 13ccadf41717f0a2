// `ampipe calibrate`: measures the machine it runs on (GEMM, attention and element-wise rates, the per-task
// overhead, the compute slowdown while a collective runs, and the all-to-all link under mpirun) in well under a
// minute, and writes a hardware profile (sim/profile.h) for `ampipe simulate`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace ampipe::cli {

struct CalibrateArgs {
  std::string out_file;
  std::string name;
  void add_to(CLI::App& app);
};

int run_calibrate(CalibrateArgs& args);

}  // namespace ampipe::cli
