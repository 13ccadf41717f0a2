#include "ampipe/cli/auto_degree.h"

#include <fmt/format.h>

#include "ampipe/cli/calibrate.h"
#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/schedule/plan.h"
#include "ampipe/sim/simulator.h"
#include "ampipe/train/train_config.h"

namespace ampipe::cli {

std::string DegreeChoice::describe() const {
  std::string s = "auto: predicted layer step";
  double base = 0;
  for (size_t i = 0; i < predicted_s.size(); ++i) {
    const auto [M, t] = predicted_s[i];
    if (M == 1) base = t;
    s += fmt::format("{} {:.1f} ms at degree {}", i ? "," : "", 1e3 * t, M);
  }
  double chosen = 0;
  for (const auto& [M, t] : predicted_s)
    if (M == degree) chosen = t;
  s += fmt::format("; chose degree {}", degree);
  if (base > 0 && chosen > 0) s += fmt::format(" ({:.3f}x degree 1)", base / chosen);
  return s + fmt::format(" (profile: {})", profile);
}

DegreeChoice choose_degree(const model::LayerConfig& cfg, int num_layers, const comm::Groups& groups,
                           const std::string& sim_profile, const std::function<std::string(int)>& valid) {
  comm::Runtime& rt = comm::Runtime::current();
  DegreeChoice out;
  sim::Profile prof;
  if (!sim_profile.empty()) {
    prof = sim::load_profile(sim_profile, "--sim-profile");  // every rank reads it: a bad file fails everywhere
    out.profile = sim_profile;
  } else {
    if (rt.rank() == 0)
      fmt::print(stderr, "ampipe: note: --ampipe-degree auto without --sim-profile: calibrating this machine for the "
                         "simulator (about ten seconds; `ampipe calibrate --out FILE` once, then --sim-profile FILE)\n");
    prof = calibrate_machine(groups, "self-calibration", false);
    out.profile = "self-calibration at start-up";
  }
  double best = 0;
  for (int M : {1, 2, 4, 8}) {
    if (cfg.seq_length % M != 0) {
      out.skipped.push_back(fmt::format("degree {}: does not divide --seq-length {}", M, cfg.seq_length));
      continue;
    }
    std::string why;
    model::LayerConfig c = cfg;
    try {
      train::drop_idle_pipe_experts(c, {M});
      why = valid ? valid(M) : "";
    } catch (const ConfigError& e) {
      why = e.what();
    }
    if (!why.empty()) {
      out.skipped.push_back(fmt::format("degree {}: {}", M, why));
      continue;
    }
    std::vector<schedule::Plan> plans;
    for (int i = 0; i < num_layers; ++i) {
      model::LayerConfig lc = sim::costed_layer(c);
      lc.layer_index = i;
      plans.push_back(schedule::build_layer_plan(lc, M));
    }
    const double t = sim::simulate(plans, prof).step_s;
    out.predicted_s.emplace_back(M, t);
    if (best == 0 || t < best) {
      best = t;
      out.degree = M;
    }
  }
  if (out.predicted_s.empty()) {
    std::string why;
    for (const std::string& s : out.skipped) why += (why.empty() ? "" : "; ") + s;
    throw ConfigError(fmt::format("--ampipe-degree auto: no degree is valid ({})", why));
  }
  // Rank 0's profile decides (self-calibrations differ a little between ranks).
  out.degree = int(comm::all_reduce_max(groups.world, rt.rank() == 0 ? out.degree : 0, "auto_degree"));
  return out;
}

}  // namespace ampipe::cli
