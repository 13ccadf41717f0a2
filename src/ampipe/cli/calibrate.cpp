// `ampipe calibrate`: the flags, the summary table and the profile file. The measuring and the fits are library
// work, in sim/calibrate.{h,cpp} (whose header comment says what is measured and how).
#include "ampipe/cli/calibrate.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "ampipe/cli/flag_registry.h"
#include "ampipe/cli/simulate.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/sim/calibrate.h"
#include "ampipe/sim/profile.h"

namespace ampipe::cli {

void CalibrateArgs::add_to(CLI::App& app) {
  FlagTargets t;
  t.calibrate = this;
  add_flags(app, kCalibrate, t);
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string gemm_row(const std::vector<sim::GemmPoint>& pts) {
  std::string s;
  for (const sim::GemmPoint& p : pts) s += fmt::format(" {:>6.3f}", p.tflops);
  return s;
}

// The table of rank 0's measurements, below the banner line.
void print_summary(const sim::Measurements& m) {
  const int g = m.ranks;
  fmt::print("  {:<22}", "GEMM TFLOP/s at d:");
  for (const sim::GemmPoint& q : m.gemm_bf16) fmt::print(" {:>6}", q.d);
  fmt::print("   fit: peak TFLOP/s, half-rate d\n");
  fmt::print("  {:<22}{}   {:.3f}, {:.0f}\n", "  bf16", gemm_row(m.gemm_bf16), m.fit_bf16.peak_tflops,
             m.fit_bf16.half_dim);
  fmt::print("  {:<22}{}   {:.3f}, {:.0f}\n", "  fp32", gemm_row(m.gemm_fp32), m.fit_fp32.peak_tflops,
             m.fit_fp32.half_dim);
  fmt::print("  {:<22} bf16 fwd {:.3f} bwd {:.3f} | fp32 fwd {:.3f} bwd {:.3f} TFLOP/s (causal s 2048, h 1024, 8 "
             "heads)\n",
             "attention", m.attention_bf16.fwd_tflops, m.attention_bf16.bwd_tflops, m.attention_fp32.fwd_tflops,
             m.attention_fp32.bwd_tflops);
  fmt::print("  {:<22} {:.1f} GB/s (layernorm fwd {:.1f}, dropout-add {:.1f})\n", "element-wise", m.elementwise.gbps,
             m.elementwise.layernorm_gbps, m.elementwise.dropout_add_gbps);
  fmt::print("  {:<22} {:.1f} us ({} extra compute tasks at degree 8: {:.3f} vs {:.3f} ms per step)\n", "task overhead",
             m.overhead.us, m.overhead.extra_tasks, m.overhead.step8_ms, m.overhead.step1_ms);
  if (g > 1)
    fmt::print("  {:<22} {:.2f} (GEMM loop {:.1f} ms alone, {:.1f} ms during all-to-alls{})\n", "slowdown during comm",
               m.slowdown.fraction, m.slowdown.alone_ms, m.slowdown.during_ms,
               m.slowdown.covered ? "" : ", lower bound");
  else
    fmt::print("  {:<22} 0 (one rank: not measured)\n", "slowdown during comm");
  fmt::print("  {:<22} latency {:.2f} us, {:.2f} GB/s ({})\n", "link intra", m.link.latency_us, m.link.gbps,
             g > 1 ? fmt::format("all-to-all over {} ranks, max over ranks", g) : "one rank: local memcpy, not a link");
  std::string sizes;
  for (const sim::LinkPoint& q : m.link_points)
    sizes += fmt::format("{}{} KiB {:.1f} us", sizes.empty() ? "" : " | ", q.bytes / 1024, q.seconds * 1e6);
  fmt::print("  {:<22} {}\n", g > 1 ? "  bytes per rank: time" : "  bytes: time", sizes);
}

}  // namespace

sim::Profile calibrate_machine(const comm::Groups& groups, const std::string& name, bool summary) {
  const bool rank0 = comm::Runtime::current().rank() == 0;
  const sim::MachineInfo machine = sim::describe_machine();
  if (rank0 && summary) {
    const int n = groups.world.size();
    fmt::print("ampipe calibrate: {} rank{} x {} | {} | {} | load average {}\n", n, n == 1 ? "" : "s", machine.threads,
               machine.cpu_or_unknown(), machine.host, machine.load);
    std::fflush(stdout);
  }
  const sim::Measurements m = sim::measure_machine(groups, machine);
  if (rank0 && summary) print_summary(m);
  return sim::calibrated_profile(m, name);
}

int run_calibrate(CalibrateArgs& a) {
  const auto start = Clock::now();
  comm::Runtime& rt = comm::Runtime::current();
  const comm::Layout layout = comm::Layout::make(rt.size(), 1, 1, rt.size());
  const comm::Groups groups = rt.make_groups(layout);
  const bool rank0 = rt.rank() == 0;

  // The output path is checked before anything is measured, on rank 0, and every rank learns the verdict.
  std::string bad;
  if (rank0) try {
      check_output_path("--out", a.out_file);
    } catch (const ConfigError& e) {
      bad = e.what();
    }
  if (sim::max_over_ranks(groups.world, bad.empty() ? 0.0 : 1.0, "calibrate.out_ok") > 0)
    throw ConfigError(bad.empty() ? fmt::format("--out {}: rank 0 cannot write it", a.out_file) : bad);

  const sim::Profile p = calibrate_machine(groups, a.name, true);
  if (!rank0) return 0;
  sim::save_profile(p, a.out_file);
  fmt::print("wrote {} ({:.1f} s)\n", a.out_file, seconds_since(start));
  return 0;
}

}  // namespace ampipe::cli
