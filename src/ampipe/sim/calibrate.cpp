// The measurements behind `ampipe calibrate`'s hardware profile (profile.h) of the machine it runs on, taken in well
// under a minute.
//
// Every number is the median wall time of several repetitions (at least 3, up to 7 within a per-measurement time
// budget; one untimed call first creates the oneDNN primitives and touches the memory), measured by every rank at
// once with one compute thread per rank (app.cpp sets one oneDNN / OpenMP thread unless OMP_NUM_THREADS is set), as
// `ampipe bench-layer` and `ampipe train` run. Rank 0's numbers are written. What is measured, and how:
//
//   gemm_peak_tflops, gemm_half_rate_dim   kernels::gemm (fp32 output, as the layer's GEMMs) for bf16 and fp32
//       inputs at shapes whose smallest dimension d is 64, 128, 256, 512 (two skinny shapes each: [d x 2048] *
//       [2048 x 2048] and [2048 x d] * [d x 2048], their rate = their FLOPs / their summed time) and square
//       1024, 2048, timed in interleaved rounds over all shapes (median per shape). The model
//       rate(d) = peak * d / (d + half) is linear in 1/d after inverting:
//           1/rate = 1/peak + (half/peak) * (1/d)  =  a + b * x,   x = 1/d,
//       fitted by ordinary least squares of y = 1/rate on x: peak = 1/a, half = b/a. (When the fit is degenerate,
//       a <= 0 or b < 0, the peak is the best measured rate and half follows from the smallest d.)
//   attention_fwd_tflops, _bwd_tflops      kernels::attention_forward / attention_backward (Tensor form) for one
//       causal sequence, s 2048, b 1, h 1024, 8 heads (d 128), rate = kernels::causal_attention_flops / time.
//   elementwise_gbps                      bytes read + written / time of two element-wise kernels of the layer on
//       a [8192, 1024] fp32 activation: layernorm_forward (reads x, writes y, mean, rstd) and dropout_add_forward
//       with p 0.1 (reads x and the residual, writes y); their total bytes over their total time.
//   task_overhead_us                      the marginal cost of one more compute task of the engine: a tiny MoE layer
//       (s 64, b 1, h 64, F 128, 4 heads, 4 experts, top-2, fp32) runs forward + backward through
//       schedule::LayerStack at AMPipe degree 1 and 8, interleaved. Both degrees do the same FLOPs (causal
//       attention counts only visible pairs; the capacities sum to the same slots), so
//           overhead = (step(M = 8) - step(M = 1)) / (compute tasks(M = 8) - compute tasks(M = 1)),
//       which is everything a task costs besides its arithmetic: executor bookkeeping, dependency waits, trace
//       records, kernel call and oneDNN primitive look-up (the extra local all-to-all copies of the chunks are
//       folded in too, a few bytes each).
//   compute_slowdown_during_comm          (2+ ranks) an fp32 1024^3 GEMM loop timed alone and while all-to-alls
//       of 16 MiB per rank run back to back on the communication engine (enough of them to outlast the loop);
//       slowdown = time(during) / time(alone) - 1, at least 0. With one rank: 0 (nothing to measure).
//   links.intra                           (2+ ranks) all-to-all over the world (one lane, as the Plan's EP
//       all-to-alls) of 1 KiB .. 64 MiB per rank; each time is the max over ranks; fitted
//           t = latency + off-rank bytes / bandwidth,   off-rank bytes = bytes per rank * (g - 1) / g
//       the bandwidth from the ordinary least-squares slope over the sizes of 1 MiB and more (small messages ride a
//       shaper's burst allowance or the eager protocol: a fit that weighed them, e.g. in relative error, would see a
//       link several times faster than bulk transfers do), the latency from the smallest size's time less its
//       transfer at that bandwidth (fit_link). devices_per_node is the world size: calibrate measures one node.
//       With one rank no link exists: a local memcpy of the same sizes stands in (say so in "source"); run under
//       mpirun -np 2 for a real link.
#include "ampipe/sim/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>

#include "ampipe/comm/collectives.h"
#include "ampipe/core/philox.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/kernels/dropout.h"
#include "ampipe/kernels/gemm.h"
#include "ampipe/kernels/layernorm.h"
#include "ampipe/schedule/layer_stack.h"

namespace ampipe::sim {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One untimed call, then the median wall time of 3..max_reps timed calls that fit in budget_s (one timed call only
// when a single call takes longer than budget_s).
double time_median(const std::function<void()>& fn, double budget_s, int max_reps = 7) {
  auto t0 = Clock::now();
  fn();
  const double first = seconds_since(t0);
  const int reps = first > budget_s ? 1 : std::clamp(int(budget_s / std::max(first, 1e-9)), 3, max_reps);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    t0 = Clock::now();
    fn();
    t.push_back(seconds_since(t0));
  }
  return median(t);
}

std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  const core::PhiloxKey key{seed, 0, core::RngPurpose::data};
  for (size_t i = 0; i < n; ++i) v[i] = 0.5f * core::philox_normal(key, 0, uint64_t(i));
  return v;
}

std::string first_line_of(const char* path, const std::string& prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, prefix.size(), prefix) == 0) {
      std::string v = line.substr(line.find(':') == std::string::npos ? prefix.size() : line.find(':') + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "";
}

// ---- GEMM ----------------------------------------------------------------------------------------------------------

std::vector<GemmPoint> measure_gemm(DType in) {
  constexpr int64_t N = 2048;
  const std::vector<float> a32 = random_values(size_t(N * N), 1), b32 = random_values(size_t(N * N), 2);
  std::vector<bf16> a16(a32.size()), b16(b32.size());
  for (size_t i = 0; i < a32.size(); ++i) {
    a16[i] = f32_to_bf16(a32[i]);
    b16[i] = f32_to_bf16(b32[i]);
  }
  std::vector<float> c(size_t(N * N));
  const void* a = in == DType::bf16 ? static_cast<const void*>(a16.data()) : a32.data();
  const void* b = in == DType::bf16 ? static_cast<const void*>(b16.data()) : b32.data();
  // Shapes (m, n, k): for d in 64..512 few rows ([d x 2048] * [2048 x 2048]: an expert with a small capacity, an
  // attention block) and a short inner dimension ([2048 x d] * [d x 2048]: a head's Q K^T); then squares.
  std::vector<std::array<int64_t, 3>> shapes;
  for (int64_t d : {64, 128, 256, 512}) {
    shapes.push_back({d, N, N});
    shapes.push_back({N, N, d});
  }
  for (int64_t d : {1024, 2048}) shapes.push_back({d, d, d});
  auto run = [&](const std::array<int64_t, 3>& sh) {
    kernels::GemmDesc g;
    g.m = sh[0], g.n = sh[1], g.k = sh[2], g.in = in, g.out = DType::f32;
    const auto t0 = Clock::now();
    kernels::gemm(g, a, b, c.data());
    return seconds_since(t0);
  };
  // One untimed call per shape (primitive creation), then rounds over all shapes, interleaved so that drift in the
  // machine's load hits every shape alike: 3..7 rounds within about 2.5 s.
  double round_s = 0;
  for (const auto& sh : shapes) round_s += run(sh);
  const int rounds = std::clamp(int(2.5 / std::max(round_s, 1e-9)), 3, 7);
  std::vector<std::vector<double>> t(shapes.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < shapes.size(); ++i) t[i].push_back(run(shapes[i]));
  auto flops = [&](size_t i) { return 2.0 * double(shapes[i][0]) * double(shapes[i][1]) * double(shapes[i][2]); };
  std::vector<GemmPoint> pts;
  for (size_t i = 0; i < 8; i += 2)  // the two skinny shapes of one d: their FLOPs over their time
    pts.push_back({shapes[i][0], (flops(i) + flops(i + 1)) / (median(t[i]) + median(t[i + 1])) / 1e12});
  for (size_t i = 8; i < shapes.size(); ++i) pts.push_back({shapes[i][0], flops(i) / median(t[i]) / 1e12});
  return pts;
}

// ---- attention, element-wise, task overhead ------------------------------------------------------------------------

AttentionRates measure_attention(DType in) {
  kernels::AttentionShape sh{.sq = 2048, .skv = 2048, .b = 1, .n = 8, .d = 128, .q_offset = 0};
  const int64_t rows = sh.sq * sh.b, h = sh.n * sh.d;
  const Tensor q = Tensor::from(random_values(size_t(rows * h), 3), {rows, h}, in);
  const Tensor k = Tensor::from(random_values(size_t(rows * h), 4), {rows, h}, in);
  const Tensor v = Tensor::from(random_values(size_t(rows * h), 5), {rows, h}, in);
  const Tensor dout = Tensor::from(random_values(size_t(rows * h), 6), {rows, h});
  Tensor out = Tensor::empty({rows, h}), lse = Tensor::empty({sh.b * sh.n * sh.sq});
  Tensor dq = Tensor::empty({rows, h}), dk = Tensor::zeros({rows, h}), dv = Tensor::zeros({rows, h});
  AttentionRates r;
  const double tf = time_median([&] { kernels::attention_forward(sh, q, k, v, out, lse); }, 1.0, 5);
  const double tb = time_median([&] { kernels::attention_backward(sh, dout, q, k, v, out, lse, dq, dk, dv); }, 1.5, 5);
  r.fwd_tflops = kernels::causal_attention_flops(sh, false) / tf / 1e12;
  r.bwd_tflops = kernels::causal_attention_flops(sh, true) / tb / 1e12;
  return r;
}

ElementwiseRates measure_elementwise() {
  constexpr int64_t T = 8192, h = 1024;
  const Tensor x = Tensor::from(random_values(size_t(T * h), 7), {T, h});
  const Tensor res = Tensor::from(random_values(size_t(T * h), 8), {T, h});
  const Tensor gamma = Tensor::from(std::vector<float>(size_t(h), 1.0f), {h});
  const Tensor beta = Tensor::zeros({h});
  Tensor y = Tensor::empty({T, h}), mean = Tensor::empty({T}), rstd = Tensor::empty({T});
  const core::PhiloxKey key{1234, 0, core::RngPurpose::attn_dropout};
  const double t_ln = time_median([&] { kernels::layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd); }, 0.3);
  const double t_do = time_median([&] { kernels::dropout_add_forward(x, res, 0.1f, key, 0, y); }, 0.3);
  const double b_ln = 4.0 * double(2 * T * h + 2 * T), b_do = 4.0 * double(3 * T * h);
  ElementwiseRates r;
  r.layernorm_gbps = b_ln / t_ln / 1e9;
  r.dropout_add_gbps = b_do / t_do / 1e9;
  r.gbps = (b_ln + b_do) / (t_ln + t_do) / 1e9;
  return r;
}

TaskOverhead measure_task_overhead() {
  model::LayerConfig cfg;
  cfg.seq_length = 64;
  cfg.micro_batch_size = 1;
  cfg.hidden_size = 64;
  cfg.ffn_hidden_size = 128;
  cfg.num_attention_heads = 4;
  cfg.num_experts = 4;
  cfg.moe_router_topk = 2;
  cfg.moe_train_capacity_factor = 1.0;
  cfg.moe_min_capacity = 1;
  cfg.validate();
  schedule::LayerStack st(cfg, 1, 1, 0, nullptr);
  const Shape act{cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size};
  const Tensor x = Tensor::from(random_values(size_t(cfg.tokens() * cfg.hidden_size), 9), act);
  const Tensor dy = Tensor::from(random_values(size_t(cfg.tokens() * cfg.hidden_size), 10), act);
  auto compute_tasks = [&] {
    int n = 0;
    for (const schedule::Task& t : st.plan(0).tasks) n += !t.is_collective();
    return n;
  };
  auto step = [&] {
    st.zero_grads();
    const auto t0 = Clock::now();
    st.forward(x, 0);
    st.backward(dy, 0.01f);
    return seconds_since(t0);
  };
  st.set_degree(8);
  const int n8 = compute_tasks();
  st.set_degree(1);
  const int n1 = compute_tasks();
  for (int i = 0; i < 3; ++i) {  // warm-up of both plans (primitives, arena)
    step();
    st.set_degree(8);
    step();
    st.set_degree(1);
  }
  std::vector<double> t1, t8;
  const auto t0 = Clock::now();
  for (int i = 0; i < 41 && (i < 9 || seconds_since(t0) < 2.0); ++i) {  // interleaved: drift hits both alike
    st.set_degree(1);
    t1.push_back(step());
    st.set_degree(8);
    t8.push_back(step());
  }
  TaskOverhead o;
  o.step1_ms = 1e3 * median(t1);
  o.step8_ms = 1e3 * median(t8);
  o.extra_tasks = n8 - n1;
  // At least 0.1 us: the profile needs a positive number, and a negative difference is noise.
  o.us = std::max(0.1, 1e3 * (o.step8_ms - o.step1_ms) / double(std::max(1, o.extra_tasks)));
  return o;
}

// ---- communication -------------------------------------------------------------------------------------------------

CommSlowdown measure_slowdown(const comm::Groups& g) {
  constexpr int64_t D = 1024, kBytes = 16 << 20;
  const std::vector<float> a = random_values(size_t(D * D), 11), b = random_values(size_t(D * D), 12);
  std::vector<float> c(size_t(D * D));
  kernels::GemmDesc gd;
  gd.m = gd.n = gd.k = D;
  auto t0 = Clock::now();
  kernels::gemm(gd, a.data(), b.data(), c.data());
  const double one = seconds_since(t0);
  const int K = std::clamp(int(std::ceil(0.15 / std::max(one, 1e-6))), 2, 50);  // a ~0.15 s loop
  auto loop = [&] {
    const auto s0 = Clock::now();
    for (int i = 0; i < K; ++i) kernels::gemm(gd, a.data(), b.data(), c.data());
    return seconds_since(s0);
  };
  const int gsize = g.ep.size();
  const int64_t n = kBytes / 4 / gsize * gsize;
  Tensor send = Tensor::from(random_values(size_t(n), 13), {n}), recv = Tensor::empty({n});
  const comm::SplitCounts counts{std::vector<int64_t>(size_t(gsize), n / gsize),
                                 std::vector<int64_t>(size_t(gsize), n / gsize)};
  // One all-to-all alone (after a warm-up one), and how many of them outlast the loop.
  comm::all_to_all(g.ep, send, recv, counts, "calibrate.slowdown.warmup").wait();
  comm::barrier_sync(g.world, "calibrate.slowdown");
  t0 = Clock::now();
  comm::all_to_all(g.ep, send, recv, counts, "calibrate.slowdown.a2a").wait();
  const double a2a = max_over_ranks(g.world, seconds_since(t0), "calibrate.slowdown.a2a_time");
  const double loop_max = max_over_ranks(g.world, loop(), "calibrate.slowdown.loop_time");
  const int N = std::clamp(int(std::ceil(1.5 * loop_max / std::max(a2a, 1e-6))) + 1, 2, 400);
  std::vector<double> alone, during;
  CommSlowdown s;
  s.collectives = N;
  for (int rep = 0; rep < 3; ++rep) {
    comm::barrier_sync(g.world, "calibrate.slowdown.alone");
    alone.push_back(loop());
    comm::barrier_sync(g.world, "calibrate.slowdown.during");
    std::vector<comm::Event> evs;
    for (int i = 0; i < N; ++i)
      evs.push_back(comm::all_to_all(g.ep, send, recv, counts, fmt::format("calibrate.slowdown.bg{}", i)));
    during.push_back(loop());
    s.covered = s.covered && !evs.back().ready();
    comm::wait_all(evs);
  }
  s.alone_ms = 1e3 * median(alone);
  s.during_ms = 1e3 * median(during);
  s.fraction = std::max(0.0, s.during_ms / s.alone_ms - 1);
  return s;
}

constexpr int64_t kLinkSizes[] = {1 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20};

std::vector<LinkPoint> measure_all_to_all(const comm::Groups& g) {
  const int gsize = g.ep.size();
  std::vector<LinkPoint> pts;
  for (int64_t bytes : kLinkSizes) {
    const int64_t n = bytes / 4;
    Tensor send = Tensor::from(random_values(size_t(n), 14), {n}), recv = Tensor::empty({n});
    const comm::SplitCounts counts{std::vector<int64_t>(size_t(gsize), n / gsize),
                                   std::vector<int64_t>(size_t(gsize), n / gsize)};
    std::vector<double> t;
    const int reps = bytes <= (1 << 20) ? 9 : 5;
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 is a warm-up
      comm::barrier_sync(g.world, "calibrate.link");
      const auto t0 = Clock::now();
      comm::all_to_all(g.ep, send, recv, counts, fmt::format("calibrate.link.{}", bytes)).wait();
      const double s = max_over_ranks(g.world, seconds_since(t0), "calibrate.link.time");
      if (rep > 0) t.push_back(s);
    }
    pts.push_back({double(n / gsize * gsize) * 4, median(t)});
    if (pts.back().seconds > 0.5) break;  // a slow link: larger sizes would blow the time budget (same on all ranks)
  }
  return pts;
}

std::vector<LinkPoint> measure_memcpy() {
  std::vector<LinkPoint> pts;
  for (int64_t bytes : kLinkSizes) {
    std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes));
    const double s = time_median(
        [&] {
          std::memcpy(dst.data(), src.data(), size_t(bytes));
          asm volatile("" : : "r"(dst.data()) : "memory");  // the copy is used: not optimised away
        },
        0.05, 9);
    pts.push_back({double(bytes), s});
  }
  return pts;
}

}  // namespace

GemmFit fit_gemm(const std::vector<GemmPoint>& pts) {
  double sx = 0, sy = 0;
  for (const GemmPoint& p : pts) {
    sx += 1.0 / double(p.d);
    sy += 1.0 / p.tflops;
  }
  const double n = double(pts.size()), mx = sx / n, my = sy / n;
  double sxy = 0, sxx = 0;
  for (const GemmPoint& p : pts) {
    const double dx = 1.0 / double(p.d) - mx, dy = 1.0 / p.tflops - my;
    sxy += dx * dy;
    sxx += dx * dx;
  }
  const double b = sxx > 0 ? sxy / sxx : 0, a = my - b * mx;
  GemmFit f;
  if (a > 0 && b >= 0) {
    f.peak_tflops = 1 / a;
    f.half_dim = b / a;
  } else {  // degenerate: the best rate, and the half-rate dimension that the smallest d implies
    const auto best = std::max_element(pts.begin(), pts.end(), [](auto& x, auto& y) { return x.tflops < y.tflops; });
    const auto low = std::min_element(pts.begin(), pts.end(), [](auto& x, auto& y) { return x.d < y.d; });
    f.peak_tflops = best->tflops;
    f.half_dim = double(low->d) * (f.peak_tflops / low->tflops - 1);
  }
  f.half_dim = std::max(f.half_dim, 1.0);  // the profile needs a positive number
  return f;
}

LinkFit fit_link(const std::vector<LinkPoint>& pts, double off_fraction) {
  // t = latency + off-rank bytes / bandwidth. The bandwidth is the slope over the sizes of 1 MiB and more (ordinary
  // least squares in absolute time): small messages ride a shaper's burst allowance (tbf) or the eager protocol and
  // would make a relative-error fit see a link several times faster than bulk transfers do. The latency is the
  // smallest size's time less its transfer at that bandwidth.
  std::vector<LinkPoint> big;
  for (const LinkPoint& p : pts)
    if (p.bytes >= double(1 << 20)) big.push_back(p);
  if (big.size() < 2) big = pts;
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const LinkPoint& p : big) {
    const double x = p.bytes * off_fraction, y = p.seconds;
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double det = n * sxx - sx * sx;
  double c = det > 0 ? (n * sxy - sx * sy) / det : 0;  // seconds per off-rank byte
  const LinkPoint& largest =
      *std::max_element(pts.begin(), pts.end(), [](auto& x, auto& y) { return x.bytes < y.bytes; });
  const LinkPoint& smallest =
      *std::min_element(pts.begin(), pts.end(), [](auto& x, auto& y) { return x.bytes < y.bytes; });
  if (!(c > 0)) c = largest.seconds / (largest.bytes * off_fraction);  // degenerate: the largest size's rate
  double lat = smallest.seconds - smallest.bytes * off_fraction * c;
  if (!(lat > 0)) lat = smallest.seconds;
  return {lat * 1e6, 1 / c / 1e9};
}

double max_over_ranks(const comm::Group& world, double value, const std::string& tag) {
  if (world.size() == 1) return value;
  return double(comm::all_reduce_max(world, int64_t(std::llround(value * 1e9)), tag)) * 1e-9;
}

MachineInfo describe_machine() {
  MachineInfo m;
  m.cpu = first_line_of("/proc/cpuinfo", "model name");
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  m.host = host;
  const std::string load = first_line_of("/proc/loadavg", "");
  m.load = load.substr(0, load.find(' '));
  const char* omp = std::getenv("OMP_NUM_THREADS");
  m.threads = omp ? fmt::format("OMP_NUM_THREADS={}", omp) : "1 thread";
  return m;
}

Measurements measure_machine(const comm::Groups& groups, const MachineInfo& machine) {
  Measurements m;
  m.machine = machine;
  m.ranks = groups.world.size();
  // Memory: what this host can still give each rank, and what a rank holds before it allocates anything (code, MPI:
  // the "process now" part of ampipe train's memory banner, the framework's reserve here).
  m.memory = core::available_memory();
  m.rss_start_bytes = core::current_rss_bytes();

  // Compute: every rank at once (as in training), rank 0's numbers are kept.
  comm::barrier_sync(groups.world, "calibrate.compute");
  m.gemm_bf16 = measure_gemm(DType::bf16);
  m.gemm_fp32 = measure_gemm(DType::f32);
  m.fit_bf16 = fit_gemm(m.gemm_bf16);
  m.fit_fp32 = fit_gemm(m.gemm_fp32);
  m.attention_bf16 = measure_attention(DType::bf16);
  m.attention_fp32 = measure_attention(DType::f32);
  m.elementwise = measure_elementwise();
  m.overhead = measure_task_overhead();

  // Communication.
  comm::barrier_sync(groups.world, "calibrate.comm");
  const int g = m.ranks;
  if (g > 1) {
    m.slowdown = measure_slowdown(groups);
    m.link_points = measure_all_to_all(groups);
    m.link = fit_link(m.link_points, double(g - 1) / g);
  } else {
    m.link_points = measure_memcpy();
    m.link = fit_link(m.link_points, 1.0);
  }
  return m;
}

Profile calibrated_profile(const Measurements& m, const std::string& name) {
  const MachineInfo& mi = m.machine;
  const GemmFit &f16 = m.fit_bf16, &f32 = m.fit_fp32;
  const AttentionRates &at16 = m.attention_bf16, &at32 = m.attention_fp32;
  const TaskOverhead& ov = m.overhead;
  const CommSlowdown& sd = m.slowdown;
  const core::HostMemory& avail = m.memory;
  const int g = m.ranks;
  Profile p;
  auto r4 = [](double x) { return x > 0 ? std::stod(fmt::format("{:.4g}", x)) : x; };  // 4 significant digits
  p.name = name.empty() ? fmt::format("calibrated: {}, {}", mi.cpu_or_unknown(), mi.host) : name;
  p.devices_per_node = g;
  p.bf16 = {r4(f16.peak_tflops), r4(f16.half_dim), r4(at16.fwd_tflops), r4(at16.bwd_tflops)};
  p.fp32 = {r4(f32.peak_tflops), r4(f32.half_dim), r4(at32.fwd_tflops), r4(at32.bwd_tflops)};
  p.elementwise_gbps = r4(m.elementwise.gbps);
  p.task_overhead_us = r4(ov.us);
  p.compute_slowdown_during_comm = r4(sd.fraction);
  p.links["intra"] = {r4(m.link.latency_us), r4(m.link.gbps)};
  if (avail.bytes > 0) {
    p.device_memory_gib = r4(double(avail.bytes) / double(g) / double(1 << 30));
    p.memory_reserve_gib = r4(std::max<double>(0, double(m.rss_start_bytes)) / double(1 << 30));
  }
  p.source = fmt::format(
      "ampipe calibrate on {} ({}), {} rank(s) x {}, load average {} at start; medians of 3+ repetitions (wall "
      "time). GEMM: kernels::gemm fp32 output at smallest dimension d 64..512 (skinny) and 1024, 2048 (square), "
      "rate(d) = peak*d/(d+half) fitted by least squares on 1/rate vs 1/d. Attention: kernels::attention_forward/"
      "backward, s 2048 h 1024 8 heads causal, causal_attention_flops / time. Element-wise: layernorm_forward and "
      "dropout_add_forward (p 0.1) on [8192, 1024] fp32, bytes read+written / time. Task overhead: a tiny layer "
      "(s 64 h 64 E 4) through schedule::LayerStack, (step at degree 8 - step at degree 1) / {} extra compute tasks "
      "({:.3f} vs {:.3f} ms). Slowdown: {}. Link intra: {}. Memory: {} per rank ({} at start / {} ranks), of "
      "which the reserve is a rank's resident set before calibrate allocated anything.",
      mi.cpu_or_unknown(), mi.host, g, mi.threads, mi.load, ov.extra_tasks, ov.step8_ms, ov.step1_ms,
      g > 1 ? fmt::format("fp32 1024^3 GEMM loop {:.1f} ms alone, {:.1f} ms while {} all-to-alls of 16 MiB per rank "
                          "ran{}",
                          sd.alone_ms, sd.during_ms, sd.collectives,
                          sd.covered ? "" : " (they finished before the loop in some repetitions: a lower bound)")
            : "one rank, not measured (0)",
      g > 1 ? fmt::format("all-to-all over {} ranks (one node; devices_per_node = ranks), {} .. {} KiB per rank, "
                          "t = latency + off-rank bytes / bandwidth: bandwidth from a least-squares slope over the "
                          "sizes >= 1 MiB, latency from the smallest size",
                          g, m.link_points.front().bytes / 1024, m.link_points.back().bytes / 1024)
            : "NOT a link: one rank, so a local memcpy of 1 KiB .. 64 MiB stands in (a shared-memory copy rate); run "
              "under mpirun -np 2 or more to measure the all-to-all",
      avail.bytes > 0 ? core::format_bytes(double(avail.bytes) / g) : std::string("not read"),
      avail.bytes > 0 ? avail.source : std::string("nothing readable"), g);
  return p;
}

}  // namespace ampipe::sim
