// `--ampipe-degree auto` for train and bench-layer: the degree whose layer step the simulator (sim/) predicts
// fastest on a hardware profile: --sim-profile FILE, or else a self-calibration of this machine (calibrate_machine,
// ten seconds or so, announced in one line). Every rank takes rank 0's choice, so the ranks run the same Plan.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ampipe/comm/group.h"
#include "ampipe/model/layer_config.h"

namespace ampipe::cli {

struct DegreeChoice {
  int degree = 1;
  std::vector<std::pair<int, double>> predicted_s;  // (degree, predicted layer step in seconds), valid ones only
  std::vector<std::string> skipped;                  // "degree M: why"
  std::string profile;                               // where the profile came from
  // "auto: predicted layer step 812.3 ms at degree 1, 701.2 ms at 2, ...; chose degree 2 (1.16x degree 1)"
  std::string describe() const;
};

// Candidates {1, 2, 4, 8} that divide the sequence and that `valid` accepts (it returns "" or why not; e.g. the
// trainer's whole validation for that degree). num_layers layers of `cfg` are simulated (forward and backward, one
// micro-batch) with the EP group on one node. Collective over groups.world.
DegreeChoice choose_degree(const model::LayerConfig& cfg, int num_layers, const comm::Groups& groups,
                           const std::string& sim_profile, const std::function<std::string(int)>& valid);

}  // namespace ampipe::cli
