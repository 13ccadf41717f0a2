#include "ampipe/kernels/gemm.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <dnnl.hpp>
#include <memory>
#include <unordered_map>
#include <vector>

#include "ampipe/kernels/checks.h"

namespace ampipe::kernels {
namespace {

struct GemmState;
void run_emulated(const GemmDesc& d, struct Prim& p, const void* a, const void* b, void* c, GemmState& st,
                  ComputeContext& ctx);

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

struct DescHash {
  size_t operator()(const GemmDesc& d) const {
    size_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(uint64_t(d.m));
    mix(uint64_t(d.n));
    mix(uint64_t(d.k));
    mix(uint64_t(d.lda));
    mix(uint64_t(d.ldb));
    mix(uint64_t(d.ldc));
    mix(uint64_t(d.batch));
    mix(uint64_t(d.stride_a));
    mix(uint64_t(d.stride_b));
    mix(uint64_t(d.stride_c));
    mix(uint64_t(d.ta) | uint64_t(d.tb) << 2 | uint64_t(d.in) << 4 | uint64_t(d.out) << 6 |
        uint64_t(d.accumulate) << 8);
    uint32_t a;
    std::memcpy(&a, &d.alpha, 4);
    mix(a);
    return h;
  }
};

dnnl::memory::data_type dt(DType t) {
  return t == DType::f32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
}

GemmDesc normalised(GemmDesc d) {
  if (d.lda == 0) d.lda = d.ta == Trans::n ? d.k : d.m;
  if (d.ldb == 0) d.ldb = d.tb == Trans::n ? d.n : d.k;
  if (d.ldc == 0) d.ldc = d.n;
  return d;
}

struct Prim {
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  std::string impl;
  // CPUs without bf16 instructions (AVX2-only, e.g. AMD Zen 3): oneDNN 2.6 has no bf16 matmul there. The
  // bf16 inputs are widened to fp32 (exact) and multiplied by the fp32 primitive `emulated`, so the result
  // is the same as bf16 inputs with fp32 accumulation; only the speed differs.
  std::unique_ptr<Prim> emulated;
  GemmDesc emulated_desc;
};

Prim make(const GemmDesc& d);

// The fp32 descriptor that emulates a bf16 one: packed fp32 copies of A and B, C unchanged unless bf16.
GemmDesc emulation_desc(const GemmDesc& d) {
  GemmDesc e = d;
  e.in = DType::f32;
  e.batch = 1;  // a batch runs matrix by matrix (gemm)
  e.stride_a = e.stride_b = e.stride_c = 0;
  e.lda = d.ta == Trans::n ? d.k : d.m;
  e.ldb = d.tb == Trans::n ? d.n : d.k;
  if (d.out == DType::bf16) {
    e.out = DType::f32;
    e.ldc = d.n;
  }
  return e;
}

// A matrix's memory descriptor, [rows, cols] with row stride ld (transposed: column stride ld), batched when
// batch > 1 ([batch, rows, cols], matrices `stride` elements apart).
dnnl::memory::desc matrix_md(int64_t rows, int64_t cols, DType t, bool trans, int64_t ld, int64_t batch,
                             int64_t stride) {
  using dims = dnnl::memory::dims;
  const dims st = trans ? dims{1, ld} : dims{ld, 1};
  if (batch == 1) return dnnl::memory::desc(dims{rows, cols}, dt(t), st);
  return dnnl::memory::desc(dims{batch, rows, cols}, dt(t), dims{stride, st[0], st[1]});
}

Prim make(const GemmDesc& d) {
  const auto a_md = matrix_md(d.m, d.k, d.in, d.ta == Trans::t, d.lda, d.batch, d.stride_a);
  const auto b_md = matrix_md(d.k, d.n, d.in, d.tb == Trans::t, d.ldb, d.batch, d.stride_b);
  const auto c_md = matrix_md(d.m, d.n, d.out, false, d.ldc, d.batch, d.stride_c);
  dnnl::primitive_attr attr;
  // alpha as an eltwise post-op before the sum, so that C = alpha * AB + C (output scales are not
  // implemented for bf16 inputs in oneDNN 2.6).
  dnnl::post_ops po;
  if (d.alpha != 1.0f) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, d.alpha, 0.0f);
  if (d.accumulate) po.append_sum(1.0f);
  attr.set_post_ops(po);
  Prim p;
  try {
    const dnnl::matmul::desc md(a_md, b_md, c_md);
    const dnnl::matmul::primitive_desc pd(md, attr, engine());
    p.prim = dnnl::matmul(pd);
    p.impl = pd.impl_info_str();
  } catch (const dnnl::error& e) {
    if (d.in == DType::bf16) {
      p.emulated_desc = emulation_desc(d);
      p.emulated = std::make_unique<Prim>(make(p.emulated_desc));
      p.impl = "bf16-via-f32:" + p.emulated->impl;
      return p;
    }
    AMPIPE_CHECK(false, "oneDNN has no matmul for m={} n={} k={} ta={} tb={} in={} out={}: {}", d.m, d.n, d.k,
                 int(d.ta), int(d.tb), dtype_name(d.in), dtype_name(d.out), e.what());
  }
  p.a = dnnl::memory(a_md, engine(), DNNL_MEMORY_NONE);
  p.b = dnnl::memory(b_md, engine(), DNNL_MEMORY_NONE);
  p.c = dnnl::memory(c_md, engine(), DNNL_MEMORY_NONE);
  return p;
}

// What the GEMM keeps in a compute context, per calling thread (context.h).
struct GemmState {
  // oneDNN splits the work over the threads it may use when the primitive is created: one cache per thread count,
  // or a primitive made for one thread would run on one thread after ampipe::set_num_threads(2).
  std::unordered_map<int, std::unordered_map<GemmDesc, std::unique_ptr<Prim>, DescHash>> caches;
  std::vector<float> wa, wb, wc;  // the bf16 emulation's fp32 copies
  std::unique_ptr<dnnl::stream> stream;
};

Prim& lookup(const GemmDesc& d, GemmState& st) {
  auto& cache = st.caches[omp_get_max_threads()];
  auto it = cache.find(d);
  if (it == cache.end()) it = cache.emplace(d, std::make_unique<Prim>(make(d))).first;
  return *it->second;
}

// Widens a bf16 matrix of `rows` x `cols` with row stride `ld` into packed fp32.
void widen(const bf16* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) dst[r * cols + j] = bf16_to_f32(src[r * ld + j]);
}

void run_emulated(const GemmDesc& d, Prim& p, const void* a, const void* b, void* c, GemmState& st,
                  ComputeContext& ctx) {
  std::vector<float>&wa = st.wa, &wb = st.wb, &wc = st.wc;
  const GemmDesc& e = p.emulated_desc;
  const int64_t a_rows = d.ta == Trans::n ? d.m : d.k, a_cols = d.ta == Trans::n ? d.k : d.m;
  const int64_t b_rows = d.tb == Trans::n ? d.k : d.n, b_cols = d.tb == Trans::n ? d.n : d.k;
  wa.resize(size_t(a_rows * a_cols));
  wb.resize(size_t(b_rows * b_cols));
  widen(static_cast<const bf16*>(a), a_rows, a_cols, d.lda, wa.data());
  widen(static_cast<const bf16*>(b), b_rows, b_cols, d.ldb, wb.data());
  if (d.out == DType::f32) {
    gemm(e, wa.data(), wb.data(), c, ctx);
    return;
  }
  wc.resize(size_t(d.m * d.n));
  bf16* cb = static_cast<bf16*>(c);
  if (d.accumulate) widen(cb, d.m, d.n, d.ldc, wc.data());
  gemm(e, wa.data(), wb.data(), wc.data(), ctx);
  for (int64_t i = 0; i < d.m; ++i)
    for (int64_t j = 0; j < d.n; ++j) cb[i * d.ldc + j] = f32_to_bf16(wc[size_t(i * d.n + j)]);
}

}  // namespace

namespace {
std::atomic<bool> g_clock_on{false};
std::atomic<int64_t> g_clock_ns{0};
thread_local int g_depth = 0;  // gemm() calls itself (batches, the bf16 emulation): only the outer call is timed

void gemm_untimed(const GemmDesc& desc, const void* a, const void* b, void* c, ComputeContext& ctx);
}  // namespace

void set_gemm_clock(bool on) {
  g_clock_ns = 0;
  g_clock_on = on;
}
double gemm_clock_seconds() { return double(g_clock_ns.load()) * 1e-9; }

void gemm(const GemmDesc& desc, const void* a, const void* b, void* c, ComputeContext& ctx) {
  if (!g_clock_on.load(std::memory_order_relaxed) || g_depth > 0) return gemm_untimed(desc, a, b, c, ctx);
  const auto t0 = std::chrono::steady_clock::now();
  ++g_depth;
  try {
    gemm_untimed(desc, a, b, c, ctx);
  } catch (...) {
    --g_depth;
    throw;
  }
  --g_depth;
  g_clock_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

namespace {
void gemm_untimed(const GemmDesc& desc, const void* a, const void* b, void* c, ComputeContext& ctx) {
  if (desc.m == 0 || desc.n == 0 || desc.batch == 0) return;
  const GemmDesc d = normalised(desc);
  GemmState& st = ctx.state<GemmState>();  // one look-up per call (it takes the context's lock)
  if (d.batch > 1 && (d.k == 0 || lookup(d, st).emulated)) {  // matrix by matrix (the emulation widens one at a time)
    GemmDesc one = d;
    one.batch = 1;
    one.stride_a = one.stride_b = one.stride_c = 0;
    const size_t ea = dtype_size(d.in), ec = dtype_size(d.out);
    for (int64_t i = 0; i < d.batch; ++i)
      gemm(one, static_cast<const char*>(a) + size_t(i * d.stride_a) * ea,
           static_cast<const char*>(b) + size_t(i * d.stride_b) * ea,
           static_cast<char*>(c) + size_t(i * d.stride_c) * ec, ctx);
    return;
  }
  if (d.k == 0) {  // empty reduction: C = 0 (or unchanged when accumulating)
    if (!d.accumulate)
      for (int64_t i = 0; i < d.m; ++i)
        std::memset(static_cast<char*>(c) + size_t(i * d.ldc) * dtype_size(d.out), 0,
                    size_t(d.n) * dtype_size(d.out));
    return;
  }
  Prim& p = lookup(d, st);
  if (p.emulated) {
    run_emulated(d, p, a, b, c, st, ctx);
    return;
  }
  p.a.set_data_handle(const_cast<void*>(a));
  p.b.set_data_handle(const_cast<void*>(b));
  p.c.set_data_handle(c);
  std::unique_ptr<dnnl::stream>& stream = st.stream;
  if (!stream) stream = std::make_unique<dnnl::stream>(engine());
  p.prim.execute(*stream, {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}});
  stream->wait();
}
}  // namespace

namespace {
GemmDesc tensor_desc(const Tensor& a, Trans ta, const Tensor& b, Trans tb, const Tensor& c, bool accumulate,
                     float alpha) {
  const int64_t lda = detail::matrix_ld(a, "gemm", "A"), ldb = detail::matrix_ld(b, "gemm", "B"),
                ldc = detail::matrix_ld(c, "gemm", "C");
  AMPIPE_CHECK(a.dtype() == b.dtype(), "gemm A {} and B {} dtypes differ", dtype_name(a.dtype()),
               dtype_name(b.dtype()));
  GemmDesc d;
  d.ta = ta;
  d.tb = tb;
  d.m = ta == Trans::n ? a.size(0) : a.size(1);
  d.k = ta == Trans::n ? a.size(1) : a.size(0);
  d.n = tb == Trans::n ? b.size(1) : b.size(0);
  const int64_t kb = tb == Trans::n ? b.size(0) : b.size(1);
  AMPIPE_CHECK(kb == d.k && c.size(0) == d.m && c.size(1) == d.n,
               "gemm shapes: op(A) [{}, {}], op(B) [{}, {}], C {}", d.m, d.k, kb, d.n, shape_str(c.shape()));
  d.lda = lda;
  d.ldb = ldb;
  d.ldc = ldc;
  d.in = a.dtype();
  d.out = c.dtype();
  d.alpha = alpha;
  d.accumulate = accumulate;
  return d;
}
}  // namespace

void gemm(const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c, bool accumulate, float alpha,
          ComputeContext& ctx) {
  gemm(tensor_desc(a, ta, b, tb, c, accumulate, alpha), a.raw(), b.raw(), c.raw(), ctx);
}

void gemm_batched(const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c, int64_t batch, int64_t stride_a,
                  int64_t stride_b, int64_t stride_c, bool accumulate, ComputeContext& ctx) {
  GemmDesc d = tensor_desc(a, ta, b, tb, c, accumulate, 1.0f);
  AMPIPE_CHECK(batch >= 1 && (batch == 1 || (stride_a > 0 && stride_b > 0 && stride_c > 0)),
               "gemm_batched: batch {} with strides {}, {}, {}", batch, stride_a, stride_b, stride_c);
  d.batch = batch;
  if (batch > 1) {
    d.stride_a = stride_a;
    d.stride_b = stride_b;
    d.stride_c = stride_c;
  }
  gemm(d, a.raw(), b.raw(), c.raw(), ctx);
}

std::string gemm_impl_name(const GemmDesc& d) {
  return lookup(normalised(d), ComputeContext::host().state<GemmState>()).impl;
}

}  // namespace ampipe::kernels
