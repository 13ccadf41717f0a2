// The fits behind `ampipe calibrate` (sim/calibrate.h) on exact data made from known parameters, their degenerate
// cases, and the profile made from measurements. Tolerances: exact data go through a few dozen double operations
// (sums, one division), so the parameters come back to ~1e-12 relative; 1e-9 leaves room and still catches any
// wrong formula.
#include "ampipe/sim/calibrate.h"

#include <gtest/gtest.h>

#include <vector>

using namespace ampipe;
using namespace ampipe::sim;

namespace {

constexpr double kRel = 1e-9;

// The sizes calibrate measures the link at (bytes per rank).
const std::vector<double> kSizes = {1 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20};

TEST(CalibrateFit, GemmRecoversPeakAndHalfRateDimension) {
  // rate(d) = peak * d / (d + half), so 1/rate = 1/peak + (half/peak) / d exactly.
  const double peak = 2.0, half = 256;
  std::vector<GemmPoint> pts;
  for (int64_t d : {64, 128, 256, 512, 1024, 2048}) pts.push_back({d, peak * double(d) / (double(d) + half)});
  const GemmFit f = fit_gemm(pts);
  EXPECT_NEAR(f.peak_tflops, peak, kRel * peak);
  EXPECT_NEAR(f.half_dim, half, kRel * half);
}

TEST(CalibrateFit, GemmHalfRateDimensionIsAtLeastOne) {
  // The same rate at every d: slope 0, so half = 0, which the profile cannot take: 1.
  const GemmFit f = fit_gemm({{64, 0.5}, {256, 0.5}, {1024, 0.5}});
  EXPECT_NEAR(f.peak_tflops, 0.5, kRel);
  EXPECT_EQ(f.half_dim, 1.0);
}

TEST(CalibrateFit, GemmDegenerateFitTakesTheBestRate) {
  // Rates that rise far faster than the model allows: the line through (1/d, 1/rate) = (1/64, 10), (1/128, 1),
  // (1/256, 1/1.1) has intercept a = 1/peak < 0 (about -3.6). Then peak = the best rate, 1.1, and half follows from the
  // smallest d: rate(64) = 0.1 = 1.1 * 64 / (64 + half), half = 64 * (1.1 / 0.1 - 1) = 640.
  const GemmFit f = fit_gemm({{64, 0.1}, {128, 1.0}, {256, 1.1}});
  EXPECT_EQ(f.peak_tflops, 1.1);
  EXPECT_NEAR(f.half_dim, 640, kRel * 640);
  // Rates that fall with d (slope b < 0): the best rate, and the smallest d's rate is that best one: half = 0 -> 1.
  const GemmFit g = fit_gemm({{64, 1.0}, {128, 0.8}, {256, 0.5}});
  EXPECT_EQ(g.peak_tflops, 1.0);
  EXPECT_EQ(g.half_dim, 1.0);
}

TEST(CalibrateFit, LinkRecoversLatencyAndBandwidth) {
  // An all-to-all over 2 ranks sends half of each rank's bytes off the rank: t = 5 us + bytes * 0.5 / 2 GB/s.
  const double latency = 5e-6, bandwidth = 2e9, off = 0.5;
  std::vector<LinkPoint> pts;
  for (double b : kSizes) pts.push_back({b, latency + b * off / bandwidth});
  const LinkFit f = fit_link(pts, off);
  EXPECT_NEAR(f.latency_us, 5.0, kRel * 5.0);
  EXPECT_NEAR(f.gbps, 2.0, kRel * 2.0);
}

TEST(CalibrateFit, LinkBandwidthComesFromTheLargeSizesOnly) {
  // The sizes below 1 MiB ride a burst allowance: 64 KiB takes a tenth of its line time. The bandwidth is still the
  // line's (a fit weighing the small sizes would see a faster link); the latency is the smallest size's time less its
  // transfer at that bandwidth.
  const double latency = 20e-6, bandwidth = 1e9, off = 0.75;
  std::vector<LinkPoint> pts;
  for (double b : kSizes) pts.push_back({b, latency + b * off / bandwidth});
  pts[0].seconds = 8e-6;                                            // 1 KiB: under the latency
  pts[1].seconds = latency + 0.1 * pts[1].bytes * off / bandwidth;  // 64 KiB
  const LinkFit f = fit_link(pts, off);
  EXPECT_NEAR(f.gbps, 1.0, kRel);
  EXPECT_NEAR(f.latency_us, 8.0 - 1024 * 0.75 / 1e9 * 1e6, kRel * 8.0);
}

TEST(CalibrateFit, LinkDegenerateCases) {
  // No slope (the same time at 1 MiB and 8 MiB): the largest size's rate, 8 MiB per ms = 8.388608 GB/s; the
  // latency is the smallest size's time less its transfer at that rate: 1 ms * (1 - 1/8) = 875 us.
  const LinkFit flat = fit_link({{1 << 20, 1e-3}, {8 << 20, 1e-3}}, 1.0);
  EXPECT_NEAR(flat.gbps, 8.388608, kRel * 8.4);
  EXPECT_NEAR(flat.latency_us, 875, kRel * 875);
  // Fewer than two sizes of 1 MiB or more: the line through all of them. 1 KiB in 10 us, 64 KiB in 20 us: 64512
  // bytes in 10 us (6.4512 GB/s), latency 10 us - 1024 B / 6.4512 GB/s.
  const LinkFit small = fit_link({{1 << 10, 10e-6}, {64 << 10, 20e-6}}, 1.0);
  EXPECT_NEAR(small.gbps, 6.4512, kRel * 6.5);
  EXPECT_NEAR(small.latency_us, 10 - 1024 / 6.4512e3, kRel * 10);
  // A line that would put the smallest size's time below its transfer (negative latency): its own time stands in.
  const LinkFit steep = fit_link({{1 << 10, 1e-9}, {1 << 20, 1e-3}, {8 << 20, 8e-3}}, 1.0);
  EXPECT_NEAR(steep.latency_us, 1e-3, kRel);
}

TEST(CalibrateProfile, RoundsToFourDigitsAndSharesTheHostMemory) {
  Measurements m;
  m.machine = {.cpu = "", .host = "node7", .load = "0.50", .threads = "1 thread"};
  m.ranks = 2;
  m.memory = {.bytes = int64_t(3) << 30, .source = "MemAvailable"};
  m.rss_start_bytes = int64_t(1) << 29;
  m.fit_bf16 = {.peak_tflops = 0.123456, .half_dim = 333.33};
  m.fit_fp32 = {.peak_tflops = 0.05, .half_dim = 1};
  m.attention_bf16 = {.fwd_tflops = 0.1, .bwd_tflops = 0.2};
  m.attention_fp32 = {.fwd_tflops = 0.3, .bwd_tflops = 0.4};
  m.elementwise.gbps = 12.3456;
  m.overhead.us = 7.77777;
  m.slowdown.fraction = 0.25;
  m.link_points = {{1024, 1e-5}, {1 << 20, 1e-3}};
  m.link = {.latency_us = 9.87654, .gbps = 1.23456};
  const Profile p = calibrated_profile(m, "");
  EXPECT_EQ(p.name, "calibrated: unknown CPU, node7");
  EXPECT_EQ(p.devices_per_node, 2);
  EXPECT_EQ(p.bf16.gemm_peak_tflops, 0.1235);
  EXPECT_EQ(p.bf16.gemm_half_rate_dim, 333.3);
  EXPECT_EQ(p.fp32.attention_bwd_tflops, 0.4);
  EXPECT_EQ(p.elementwise_gbps, 12.35);
  EXPECT_EQ(p.task_overhead_us, 7.778);
  EXPECT_EQ(p.compute_slowdown_during_comm, 0.25);
  EXPECT_EQ(p.links.at("intra").latency_us, 9.877);
  EXPECT_EQ(p.links.at("intra").gbps, 1.235);
  EXPECT_EQ(p.device_memory_gib, 1.5);  // 3 GiB over 2 ranks
  EXPECT_EQ(p.memory_reserve_gib, 0.5);
  EXPECT_EQ(calibrated_profile(m, "mine").name, "mine");
}

}  // namespace
