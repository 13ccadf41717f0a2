// Deterministic multi-threading for every host loop that touches a tensor's elements (the kernels, the model's
// element-wise work, Tensor::copy_from and fill, parameter initialisation), on OpenMP: the runtime oneDNN uses, so
// the GEMMs and these loops share one thread pool (OMP_NUM_THREADS threads per rank). In core, the lowest layer, so
// that every module can use it; an accelerator backend brings its own streams and leaves this to the host.
//
// parallel_for(n, grain, body) splits [0, n) into pieces of `grain` indices (the last one shorter) and calls
// body(begin, end) once per piece, the pieces spread statically over the threads. The pieces depend on n and grain
// only, never on the thread count, and a kernel writes every output element from exactly one piece with the same
// arithmetic it would use serially: so a kernel's result is the same bits at any thread count (tested:
// ThreadCount.*). A reduction across pieces (a parameter gradient summed over rows) is split by columns instead, or
// summed per piece and the pieces added in piece order, never in the order threads finish.
//
// Called from inside a parallel region (a GEMM or kernel inside another kernel's parallel loop) or with one thread,
// the loop runs on the calling thread, piece by piece in order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace ampipe {

// Threads a parallel_for may use here: OpenMP's max threads, or 1 inside a parallel region.
int parallel_threads();
// Sets this rank's compute threads: every parallel_for and oneDNN's GEMMs (omp_set_num_threads).
void set_num_threads(int n);

// One line for a run's banner: the compute threads per rank and where they come from, the communication engine
// thread, the CPUs this rank may run on (its binding), and a warning when the ranks on this host times their threads
// outnumber those CPUs (OpenMP threads then spin against each other). Ranks on this host: OpenMPI's
// OMPI_COMM_WORLD_LOCAL_SIZE when the launcher sets it, else all `world` ranks.
std::string threading_summary(int world);

namespace detail {
using PieceFn = void (*)(void* ctx, int64_t begin, int64_t end);
void parallel_pieces(int64_t n, int64_t grain, PieceFn fn, void* ctx);
}  // namespace detail

template <class Body>
void parallel_for(int64_t n, int64_t grain, Body&& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n <= grain) {
    body(int64_t(0), n);
    return;
  }
  using B = std::remove_reference_t<Body>;
  detail::parallel_pieces(
      n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<B*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

// Grains. kElementGrain: elements a piece of an element-wise loop (16 Ki, a multiple of any vector width), so that a
// piece amortises its scheduling and small tensors stay on one thread. rows_grain: the rows of that many elements
// for a row-wise loop whose rows hold `cols` each. kColumnGrain: columns a piece of a sum over rows split by columns.
constexpr int64_t kElementGrain = int64_t(1) << 14;
constexpr int64_t kColumnGrain = 128;
inline int64_t rows_grain(int64_t cols) { return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, cols)); }

}  // namespace ampipe
