// Measuring the machine a run is on, for a hardware profile (profile.h): `ampipe calibrate`, and
// `--ampipe-degree auto` without --sim-profile. What is measured and how each number follows from the measurements is
// written at the top of calibrate.cpp; the fits are separate functions so that tests can check them on exact data.
//
//   const sim::Measurements m = sim::measure_machine(groups, sim::describe_machine());
//   const sim::Profile p = sim::calibrated_profile(m, name);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampipe/comm/group.h"
#include "ampipe/core/host_memory.h"
#include "ampipe/sim/profile.h"

namespace ampipe::sim {

// ---- the fits (pure functions) ----

// The GEMM rate at the shapes whose smallest dimension is d.
struct GemmPoint {
  int64_t d = 0;
  double tflops = 0;
};

// rate(d) = peak * d / (d + half).
struct GemmFit {
  double peak_tflops = 0, half_dim = 0;
};

// Least squares of 1/rate = a + b * (1/d) over `pts` (2+ points, rates > 0): peak = 1/a, half = b/a. Degenerate
// (a <= 0 or b < 0, e.g. rates that fall with d): the best measured rate is the peak and half follows from the
// smallest d. half_dim is at least 1 (a profile needs a positive number).
GemmFit fit_gemm(const std::vector<GemmPoint>& pts);

// The time of one all-to-all of `bytes` per rank (or of one copy of `bytes`).
struct LinkPoint {
  double bytes = 0;
  double seconds = 0;
};

struct LinkFit {
  double latency_us = 0, gbps = 0;
};

// t = latency + off_fraction * bytes / bandwidth (off_fraction: the share of a rank's bytes that leaves it,
// (g - 1) / g for an all-to-all over g ranks, 1 for a copy). The bandwidth is the slope of an ordinary least-squares
// line through the points of 1 MiB and more (all points when fewer than 2 are that large); the latency is the smallest
// size's time less its transfer at that bandwidth. Degenerate: a slope <= 0 gives the largest size's rate, a latency
// <= 0 the smallest size's time.
LinkFit fit_link(const std::vector<LinkPoint>& pts, double off_fraction);

// ---- the measurements ----

struct AttentionRates {
  double fwd_tflops = 0, bwd_tflops = 0;
};

struct ElementwiseRates {
  double layernorm_gbps = 0, dropout_add_gbps = 0, gbps = 0;
};

struct TaskOverhead {
  double us = 0;
  int extra_tasks = 0;  // compute tasks at degree 8 less those at degree 1
  double step1_ms = 0, step8_ms = 0;
};

struct CommSlowdown {
  double fraction = 0;
  double alone_ms = 0, during_ms = 0;
  int collectives = 0;
  bool covered = true;  // the all-to-alls outlasted the GEMM loop in every repetition
};

// The machine, as a profile's name and source describe it ("" where a file could not be read).
struct MachineInfo {
  std::string cpu;      // /proc/cpuinfo's model name
  std::string host;     // gethostname
  std::string load;     // the 1-minute load average
  std::string threads;  // "OMP_NUM_THREADS=n" or "1 thread"
  std::string cpu_or_unknown() const { return cpu.empty() ? "unknown CPU" : cpu; }
};
MachineInfo describe_machine();

struct Measurements {
  MachineInfo machine;
  int ranks = 1;                 // the world's size; the link is measured over it when it is 2+
  core::HostMemory memory;       // what this host can still give (all its ranks together)
  int64_t rss_start_bytes = -1;  // this rank's resident set before anything was measured
  std::vector<GemmPoint> gemm_bf16, gemm_fp32;
  GemmFit fit_bf16, fit_fp32;
  AttentionRates attention_bf16, attention_fp32;
  ElementwiseRates elementwise;
  TaskOverhead overhead;
  CommSlowdown slowdown;               // one rank: not measured (0)
  std::vector<LinkPoint> link_points;  // one rank: a local memcpy's
  LinkFit link;
};

// Measures this machine: every rank of groups.world takes part (each rank gets its own numbers; the
// communication times are the max over ranks). Collective over groups.world. Takes well under a minute.
Measurements measure_machine(const comm::Groups& groups, const MachineInfo& machine);

// The profile of `m` (numbers rounded to 4 significant digits, `source` saying how each was measured); `name`, ""
// for "calibrated: <CPU model>, <host>".
Profile calibrated_profile(const Measurements& m, const std::string& name);

// The max over the ranks of `world` of `value` (to the nanosecond, for times: so that every rank takes the same
// decisions after it). Collective over `world`.
double max_over_ranks(const comm::Group& world, double value, const std::string& tag);

}  // namespace ampipe::sim
