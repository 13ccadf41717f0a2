// Causal flash attention (kernels/attention) throughput on one thread, next to the GEMM rate it is built on.
//
// Notation: s sequence, b = 1, n heads, d = 128 head dim, h = n*d = 1024. q, k, v are column ranges of one
// fused qkv buffer [s*b, 3h], as the attention stage passes them. GFLOP/s counts causal FLOPs only
// (kernels::causal_attention_flops: forward 4*d, backward 10*d per visible (query, key) pair and head).
//
//   ./bench_attention --benchmark_min_time=0.5
// Targets (one thread): bf16 forward >= 50% and backward >= 35% of the bf16 GEMM [4096 x 1024] x [1024 x 4096].
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "ampipe/core/dtype.h"
#include "ampipe/core/parallel.h"
#include "ampipe/core/tensor.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/kernels/gemm.h"

using namespace ampipe;
using namespace ampipe::kernels;

namespace {

constexpr int64_t kHeads = 8, kHeadDim = 128, kBatch = 1;

// Random fp32 values in [-1, 1), and their bf16 copy.
struct Buffer {
  std::vector<float> f32;
  std::vector<bf16> b16;
  explicit Buffer(size_t count, uint32_t seed) : f32(count), b16(count) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    for (size_t i = 0; i < count; ++i) {
      f32[i] = u(rng);
      b16[i] = f32_to_bf16(f32[i]);
    }
  }
  const void* ptr(DType t, size_t offset) const {
    return t == DType::f32 ? static_cast<const void*>(f32.data() + offset) : b16.data() + offset;
  }
};

// A [rows, cols] tensor of random values in [-1, 1) (bf16: rounded from the fp32 draw).
Tensor random_tensor(int64_t rows, int64_t cols, DType t, uint32_t seed) {
  const Buffer buf(size_t(rows * cols), seed);
  return Tensor::from(buf.f32, {rows, cols}, t);
}

DType dtype_arg(const benchmark::State& state) { return state.range(1) == 0 ? DType::f32 : DType::bf16; }

// Args 2 and 3: the query and key block sizes (0: the kernel's defaults), for a tile sweep.
AttentionBlocks blocks_arg(const benchmark::State& state) {
  AttentionBlocks b;
  if (state.range(2) > 0) b.q = state.range(2);
  if (state.range(3) > 0) b.k = state.range(3);
  return b;
}

void BM_AttentionForward(benchmark::State& state) {
  ampipe::set_num_threads(1);
  const int64_t s = state.range(0), h = kHeads * kHeadDim;
  const DType in = dtype_arg(state);
  const AttentionShape sh{s, s, kBatch, kHeads, kHeadDim, 0};
  const Tensor qkv = random_tensor(s * kBatch, 3 * h, in, 1);  // [s*b, 3h]
  const Tensor q = qkv.cols(0, h), k = qkv.cols(h, 2 * h), v = qkv.cols(2 * h, 3 * h);
  Tensor out = Tensor::empty({s * kBatch, h}), lse = Tensor::empty({kBatch * kHeads * s});
  for (auto _ : state) {
    attention_forward(sh, q, k, v, out, lse, blocks_arg(state));
    benchmark::DoNotOptimize(out.raw());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(causal_attention_flops(sh, false) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(dtype_name(in)));
}

void BM_AttentionBackward(benchmark::State& state) {
  ampipe::set_num_threads(1);
  const int64_t s = state.range(0), h = kHeads * kHeadDim;
  const DType in = dtype_arg(state);
  const AttentionShape sh{s, s, kBatch, kHeads, kHeadDim, 0};
  const Tensor qkv = random_tensor(s * kBatch, 3 * h, in, 1);
  const Tensor dout = random_tensor(s * kBatch, h, DType::f32, 2);
  const Tensor q = qkv.cols(0, h), k = qkv.cols(h, 2 * h), v = qkv.cols(2 * h, 3 * h);
  Tensor out = Tensor::empty({s * kBatch, h}), lse = Tensor::empty({kBatch * kHeads * s});
  attention_forward(sh, q, k, v, out, lse);
  Tensor dqkv = Tensor::zeros({s * kBatch, 3 * h});  // fused fp32 gradient, as the attention stage keeps it
  Tensor dq = dqkv.cols(0, h), dk = dqkv.cols(h, 2 * h), dv = dqkv.cols(2 * h, 3 * h);
  for (auto _ : state) {
    attention_backward(sh, dout, q, k, v, out, lse, dq, dk, dv, blocks_arg(state));
    benchmark::DoNotOptimize(dqkv.raw());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(causal_attention_flops(sh, true) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(dtype_name(in)));
}

// C [4096, 4096] = A [4096, 1024] * B [1024, 4096]: the reference rate (an MLP-sized GEMM).
void BM_Gemm(benchmark::State& state) {
  ampipe::set_num_threads(1);
  const DType in = dtype_arg(state);
  GemmDesc g;
  g.m = state.range(0), g.k = 1024, g.n = 4096, g.in = in;
  const Buffer a(size_t(g.m * g.k), 3), b(size_t(g.k * g.n), 4);
  std::vector<float> c(size_t(g.m * g.n));
  for (auto _ : state) {
    gemm(g, a.ptr(in, 0), b.ptr(in, 0), c.data());
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(g.m * g.n * g.k) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(dtype_name(in)) + " " + gemm_impl_name(g));
}

}  // namespace

// Args: {s or m, dtype (0 = f32, 1 = bf16)}. Rates are per CPU second of the calling thread (the default
// clock): with one oneDNN thread that is all the work, and it is robust to other processes on a shared box.
BENCHMARK(BM_Gemm)->ArgNames({"m", "bf16"})->Args({4096, 0})->Args({4096, 1})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionForward)
    ->ArgNames({"s", "bf16", "bq", "bk"})
    ->ArgsProduct({{2048, 4096}, {0, 1}, {0}, {0}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionBackward)
    ->ArgNames({"s", "bf16", "bq", "bk"})
    ->ArgsProduct({{2048, 4096}, {0, 1}, {0}, {0}})
    ->Unit(benchmark::kMillisecond);
// The tile sweep (bf16, s 4096): --benchmark_filter=Tiles
BENCHMARK(BM_AttentionForward)
    ->Name("TilesForward")
    ->ArgNames({"s", "bf16", "bq", "bk"})
    ->ArgsProduct({{4096}, {1}, {64, 128, 256}, {128, 256, 512}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionBackward)
    ->Name("TilesBackward")
    ->ArgNames({"s", "bf16", "bq", "bk"})
    ->ArgsProduct({{4096}, {1}, {64, 128, 256}, {128, 256, 512}})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
