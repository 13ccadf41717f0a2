// Whole MoE layer forward + backward throughput on 1 or 2 threads, next to the GEMM rate it is built on.
//
// Notation: s sequence, b = 1 micro-batch, h = 1024 hidden, n = 8 heads (d = 128), F = 4096 FFN hidden,
// E = 4 experts, top-2, capacity factor 1, hidden dropout 0.1, GeLU experts, ep = 1, M the AMPipe degree.
// One step = schedule::LayerStack::forward + backward of a one-layer stack (the step driver every caller uses;
// the all-to-alls are local copies). TFLOP/s = Layer::flops() (causal attention FLOPs, GEMMs at the
// capacity-padded expert rows, gate) per step time. BM_Gemm is C [4096, 4096] = A [4096, 1024] * B [1024, 4096], the reference rate for the ratio.
//
//   ./bench_layer --benchmark_min_time=1
// Target: bf16 layer fwd+bwd >= 85% of the bf16 GEMM rate at the same thread count; 2 threads >= 1.8x one.
// Times are wall clock (real time): with 2 threads the calling thread's CPU time would miss the other's work.
// After the table, the per-stage time breakdown (ms per step, from comm::Trace records of the executor's compute
// tasks, summed over chunks) is printed for every layer benchmark, and the step split into the time inside
// kernels::gemm (every GEMM, attention's block GEMMs included; kernels::set_gemm_clock) and everything else
// (element-wise work, copies, the executor): exact at one thread, where nothing overlaps.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ampipe/comm/trace.h"
#include "ampipe/core/parallel.h"
#include "ampipe/core/philox.h"
#include "ampipe/kernels/gemm.h"
#include "ampipe/schedule/layer_stack.h"

using namespace ampipe;

namespace {

model::LayerConfig layer_config(int64_t s, bool bf16) {
  model::LayerConfig cfg;
  cfg.seq_length = s;
  cfg.micro_batch_size = 1;
  cfg.hidden_size = 1024;
  cfg.ffn_hidden_size = 4096;
  cfg.num_attention_heads = 8;
  cfg.num_experts = 4;
  cfg.moe_router_topk = 2;
  cfg.moe_train_capacity_factor = 1.0;
  cfg.hidden_dropout = 0.1;
  cfg.bf16 = bf16;
  cfg.validate();
  return cfg;
}

Tensor seeded_normal(Shape shape, uint64_t seed, uint64_t id) {
  Tensor t = Tensor::empty(std::move(shape));
  const core::PhiloxKey key{seed, 0, core::RngPurpose::data};
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = core::philox_normal(key, id, uint64_t(i));
  return t;
}

// Stage name without layer and chunk: "L0.fwd.attention.c1" -> "fwd.attention".
std::string stage_key(const std::string& name) {
  std::string s = name;
  if (const auto dot = s.find('.'); dot != std::string::npos && s[0] == 'L') s = s.substr(dot + 1);
  if (const auto dot = s.rfind(".c"); dot != std::string::npos && dot + 2 < s.size() &&
                                      std::all_of(s.begin() + long(dot) + 2, s.end(), ::isdigit))
    s = s.substr(0, dot);
  return s;
}

struct Breakdown {
  std::map<std::string, double> ms;  // per step
  double step_ms = 0, gemm_ms = 0;
  int threads = 1;
};
std::map<std::string, Breakdown>& breakdowns() {
  static std::map<std::string, Breakdown> b;
  return b;
}

// Args: {s, dtype (0 = f32, 1 = bf16), M, threads}.
void BM_Layer(benchmark::State& state) {
  const int threads = int(state.range(3));
  set_num_threads(threads);
  const int64_t s = state.range(0);
  const bool bf16 = state.range(1) != 0;
  const int M = int(state.range(2));
  const model::LayerConfig cfg = layer_config(s, bf16);
  const Shape act{cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size};
  const Tensor x = seeded_normal(act, cfg.seed, 0), dy = seeded_normal(act, cfg.seed, 1);
  schedule::LayerStack stack(cfg, 1, M, 0, nullptr, cfg.layer_index);

  std::map<std::string, int64_t> us;
  int64_t wall_us = 0, steps = 0;
  double flops = 0;
  comm::Trace::set_enabled(true);
  kernels::set_gemm_clock(true);
  for (auto _ : state) {
    comm::Trace::clear();
    const int64_t t0 = comm::Trace::now_us();
    stack.forward(x, 0);
    const Tensor dx = stack.backward(dy, 0.01f);
    const int64_t t4 = comm::Trace::now_us();
    benchmark::DoNotOptimize(dx.raw());
    flops = stack.flops();
    wall_us += t4 - t0;
    ++steps;
    int64_t compute = 0;
    for (const comm::TraceRecord& r : comm::Trace::snapshot()) {
      if (r.cat != "compute") continue;
      us[stage_key(r.name)] += r.end_us - r.start_us;
      compute += r.end_us - r.start_us;
    }
    us["(a2a local copies, zeroing, executor)"] += (t4 - t0) - compute;
  }
  const double gemm_s = kernels::gemm_clock_seconds();
  kernels::set_gemm_clock(false);
  comm::Trace::set_enabled(false);
  comm::Trace::clear();
  state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/step"] = flops * 1e-9;
  state.SetLabel(std::string(bf16 ? "bf16" : "f32") + " M=" + std::to_string(M) + " threads=" +
                 std::to_string(threads));
  Breakdown b;
  b.threads = threads;
  b.gemm_ms = gemm_s * 1e3 / double(steps);
  for (const auto& [k, v] : us) b.ms[k] = double(v) / 1e3 / double(steps);
  b.step_ms = double(wall_us) / 1e3 / double(steps);
  breakdowns()["BM_Layer/s:" + std::to_string(s) + "/bf16:" + std::to_string(int(bf16)) + "/M:" +
               std::to_string(M) + "/threads:" + std::to_string(threads)] = b;
}

// C [4096, 4096] = A [4096, 1024] * B [1024, 4096], fp32 out: the same reference GEMM as bench_attention.
void BM_Gemm(benchmark::State& state) {
  set_num_threads(int(state.range(2)));
  const DType in = state.range(1) == 0 ? DType::f32 : DType::bf16;
  kernels::GemmDesc g;
  g.m = state.range(0), g.k = 1024, g.n = 4096, g.in = in;
  std::vector<float> af(size_t(g.m * g.k)), bf(size_t(g.k * g.n)), c(size_t(g.m * g.n));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : af) v = u(rng);
  for (float& v : bf) v = u(rng);
  std::vector<bf16> ab(af.size()), bb(bf.size());
  for (size_t i = 0; i < af.size(); ++i) ab[i] = f32_to_bf16(af[i]);
  for (size_t i = 0; i < bf.size(); ++i) bb[i] = f32_to_bf16(bf[i]);
  const void* a = in == DType::f32 ? static_cast<const void*>(af.data()) : ab.data();
  const void* b = in == DType::f32 ? static_cast<const void*>(bf.data()) : bb.data();
  for (auto _ : state) {
    kernels::gemm(g, a, b, c.data());
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(g.m * g.n * g.k) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(dtype_name(in)) + " threads=" + std::to_string(state.range(2)) + " " +
                 kernels::gemm_impl_name(g));
}

}  // namespace

// Rates are per wall-clock second (run on an otherwise idle machine): with 2 threads the calling thread's CPU
// time would count half the work.
BENCHMARK(BM_Gemm)
    ->ArgNames({"m", "bf16", "threads"})
    ->ArgsProduct({{4096}, {0, 1}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Layer)
    ->ArgNames({"s", "bf16", "M", "threads"})
    ->ArgsProduct({{2048}, {0, 1}, {1, 2}, {1}})
    ->ArgsProduct({{4096}, {0, 1}, {1}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (const auto& [name, b] : breakdowns()) {
    std::printf("\nStage breakdown of %s (ms per step, wall clock, summed over chunks; step %.1f ms)\n", name.c_str(),
                b.step_ms);
    if (b.threads == 1)
      std::printf("  inside GEMMs (attention's block GEMMs included): %.1f ms (%.1f%%); everything else %.1f ms "
                  "(%.1f%%)\n", b.gemm_ms, 100.0 * b.gemm_ms / b.step_ms, b.step_ms - b.gemm_ms,
                  100.0 * (b.step_ms - b.gemm_ms) / b.step_ms);
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [k, v] : b.ms) rows.emplace_back(v, k);
    std::sort(rows.rbegin(), rows.rend());
    for (const auto& [v, k] : rows) std::printf("  %-44s %9.1f  %5.1f%%\n", k.c_str(), v, 100.0 * v / b.step_ms);
  }
  return 0;
}
