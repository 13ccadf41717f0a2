#include "ampipe/core/parallel.h"

#include <fmt/format.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <vector>

namespace ampipe {

int parallel_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }
void set_num_threads(int n) { omp_set_num_threads(n); }

namespace {
// The CPUs this process may run on, as ranges: "0-3,8".
std::string cpu_ranges(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}
}  // namespace

std::string threading_summary(int world) {
  const int threads = omp_get_max_threads();
  const char* env = std::getenv("OMP_NUM_THREADS");
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int ranks = std::max(1, local != nullptr ? std::atoi(local) : world);
  std::string line = fmt::format("threads: {} compute thread{} per rank ({}) + 1 communication engine thread; CPUs "
                                 "{} ({} of {}{})",
                                 threads, threads == 1 ? "" : "s",
                                 env != nullptr ? fmt::format("OMP_NUM_THREADS={}", env)
                                                : "OMP_NUM_THREADS unset: 1 per rank",
                                 cpu_ranges(cpus), cpus.size(), online,
                                 long(cpus.size()) < online ? ", bound by the launcher" : ": not bound");
  // Ranks on this host share its CPUs when unbound; bound, each has its own set.
  const long share = long(cpus.size()) < online ? long(cpus.size()) : long(cpus.size()) / ranks;
  if (long(threads) > std::max(1L, share))
    line += fmt::format("; oversubscribed: {} threads on {} CPU{} per rank ({} rank{} on this host), so OpenMP "
                        "threads wait on each other: use OMP_NUM_THREADS={}",
                        threads, std::max(1L, share), share == 1 ? "" : "s", ranks, ranks == 1 ? "" : "s",
                        std::max(1L, share));
  else if (env == nullptr && share > 1)
    line += fmt::format("; {} CPUs per rank are free: OMP_NUM_THREADS={} would use them", share, share);
  return line;
}

namespace detail {

void parallel_pieces(int64_t n, int64_t grain, PieceFn fn, void* ctx) {
  const int64_t pieces = (n + grain - 1) / grain;
  const int threads = int(std::min<int64_t>(pieces, parallel_threads()));
  if (threads <= 1) {
    for (int64_t p = 0; p < pieces; ++p) fn(ctx, p * grain, std::min(n, (p + 1) * grain));
    return;
  }
  // An exception must not leave an OpenMP region (it would terminate): the first one is kept and rethrown here.
  std::exception_ptr failed;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t p = 0; p < pieces; ++p) {
    try {
      fn(ctx, p * grain, std::min(n, (p + 1) * grain));
    } catch (...) {
#pragma omp critical(ampipe_parallel_failure)
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

}  // namespace detail
}  // namespace ampipe
