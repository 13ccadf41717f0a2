// GEMM throughput (kernels::gemm, oneDNN matmul) on one thread for the MoE expert shapes.
//
// Notation: T tokens (rows), h = 1024 hidden, F = 4096 FFN hidden. The four GEMMs of a linear layer y = x W:
//   fwd_nn  y [T, F] = x [T, h] * W [h, F]                (m = T, k = h, n = F)
//   fwd_nt  y [T, F] = x [T, h] * W [F, h]^T              (the layer's linear_forward: weights stored [out, in])
//   bwd_dx  dx [T, h] = dy [T, F] * W [F, h]              (m = T, k = F, n = h)
//   bwd_dw  dW [F, h] += dy [T, F]^T * x [T, h]           (m = F, k = T, n = h, accumulate, as the layer does)
// Inputs are fp32 or bf16 (A and B the same), C is always fp32, accumulation fp32. On CPUs without bf16
// instructions (AVX2 only) kernels::gemm widens bf16 inputs to fp32 and runs the fp32 primitive: the label
// then reads "bf16-via-f32:<fp32 impl>".
//
//   ./bench_gemm --benchmark_min_time=1
// Rates are per CPU second of the calling thread (one oneDNN thread), robust to other load on a shared box.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "ampipe/core/dtype.h"
#include "ampipe/core/parallel.h"
#include "ampipe/kernels/gemm.h"

using namespace ampipe;
using namespace ampipe::kernels;

namespace {

constexpr int64_t kHidden = 1024, kFfn = 4096;

enum Kind : int64_t { fwd_nn, fwd_nt, bwd_dx, bwd_dw };
const char* kind_name(int64_t k) {
  switch (k) {
    case fwd_nn: return "fwd_nn";
    case fwd_nt: return "fwd_nt";
    case bwd_dx: return "bwd_dx";
    default: return "bwd_dw";
  }
}

GemmDesc desc_of(int64_t T, int64_t kind, DType in) {
  GemmDesc g;
  g.in = in;
  g.out = DType::f32;
  switch (kind) {
    case fwd_nn: g.m = T, g.k = kHidden, g.n = kFfn; break;
    case fwd_nt: g.m = T, g.k = kHidden, g.n = kFfn, g.tb = Trans::t; break;
    case bwd_dx: g.m = T, g.k = kFfn, g.n = kHidden; break;
    default: g.m = kFfn, g.k = T, g.n = kHidden, g.ta = Trans::t, g.accumulate = true; break;
  }
  return g;
}

struct Buffer {
  std::vector<float> f32;
  std::vector<bf16> b16;
  Buffer(size_t count, uint32_t seed) : f32(count), b16(count) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    for (size_t i = 0; i < count; ++i) {
      f32[i] = u(rng);
      b16[i] = f32_to_bf16(f32[i]);
    }
  }
  const void* ptr(DType t) const { return t == DType::f32 ? static_cast<const void*>(f32.data()) : b16.data(); }
};

// Args: {T, kind, dtype (0 = f32, 1 = bf16)}.
void BM_Gemm(benchmark::State& state) {
  ampipe::set_num_threads(1);
  const int64_t T = state.range(0), kind = state.range(1);
  const DType in = state.range(2) == 0 ? DType::f32 : DType::bf16;
  const GemmDesc g = desc_of(T, kind, in);
  const Buffer a(size_t(g.m * g.k), 3), b(size_t(g.k * g.n), 4);
  std::vector<float> c(size_t(g.m * g.n), 0.0f);
  gemm(g, a.ptr(in), b.ptr(in), c.data());  // primitive creation outside the timed loop
  for (auto _ : state) {
    gemm(g, a.ptr(in), b.ptr(in), c.data());
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(g.m) * double(g.n) * double(g.k) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(kind_name(kind)) + " " + std::string(dtype_name(in)) + " m=" + std::to_string(g.m) +
                 " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) + " " + gemm_impl_name(g));
}

// The local experts' forward GEMM y_l [R, F] = x_l [R, h] W_l [F, h]^T for L = 8 experts of R rows each, as one
// batched call (--moe-grouped-gemm) or one call per expert, on `threads` oneDNN threads.
// Args: {R, grouped (0/1), dtype (0 = f32, 1 = bf16), threads}. Rates are per wall second (real time).
void BM_Experts(benchmark::State& state) {
  constexpr int64_t L = 8, h = 512, F = 1024;
  const int64_t R = state.range(0);
  const bool grouped = state.range(1) != 0;
  const DType in = state.range(2) == 0 ? DType::f32 : DType::bf16;
  ampipe::set_num_threads(int(state.range(3)));
  GemmDesc g;
  g.in = in;
  g.m = R, g.k = h, g.n = F, g.tb = Trans::t;
  const Buffer x(size_t(L * R * h), 5), w(size_t(L * F * h), 6);
  std::vector<float> y(size_t(L * R * F), 0.0f);
  const size_t e = dtype_size(in);
  auto run = [&] {
    if (grouped) {
      GemmDesc b = g;
      b.batch = L, b.stride_a = R * h, b.stride_b = F * h, b.stride_c = R * F;
      gemm(b, x.ptr(in), w.ptr(in), y.data());
      return;
    }
    for (int64_t l = 0; l < L; ++l)
      gemm(g, static_cast<const char*>(x.ptr(in)) + size_t(l * R * h) * e,
           static_cast<const char*>(w.ptr(in)) + size_t(l * F * h) * e, y.data() + l * R * F);
  };
  run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(L * R) * double(F) * double(h) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(grouped ? "grouped" : "per-expert") + " " + std::string(dtype_name(in)) + " L=8 R=" +
                 std::to_string(R) + " h=512 F=1024");
}

}  // namespace

BENCHMARK(BM_Experts)
    ->ArgNames({"R", "grouped", "bf16", "threads"})
    ->ArgsProduct({{32, 128, 512}, {0, 1}, {0, 1}, {2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_Gemm)
    ->ArgNames({"T", "kind", "bf16"})
    ->ArgsProduct({{2048, 4096}, {fwd_nn, fwd_nt, bwd_dx, bwd_dw}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
