#include "ampipe/cli/memory_check.h"

#include <unistd.h>

#include <vector>

#include "ampipe/comm/collectives.h"
#include "ampipe/core/error.h"
#include "ampipe/core/host_memory.h"

namespace ampipe::cli {

int64_t MemoryFlags::limit_bytes() const {
  if (memory_limit == "auto") return -1;
  return core::parse_bytes("--memory-limit", memory_limit);
}

int ranks_on_this_host(const comm::Group& world) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  int n = 0;
  for (const std::string& h : comm::all_gather_strings(world, host, "memory.hosts")) n += h == host;
  return n;
}

void check_memory_fits(const schedule::MemoryEstimate& estimate, int64_t in_use_bytes, const MemoryFlags& flags,
                       const comm::Group& world) {
  const int64_t limit = flags.limit_bytes();
  const int local = ranks_on_this_host(world);
  const std::string mine = schedule::memory_fit_error(estimate, in_use_bytes, limit, local);
  for (const std::string& why : comm::all_gather_strings(world, mine, "memory.fit"))
    if (!why.empty()) throw ConfigError(why);
}

}  // namespace ampipe::cli
