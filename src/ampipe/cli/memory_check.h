// --memory-limit and the check that a run's estimated peak memory fits before anything is allocated
// (docs/training.md, "Memory"). Used by train, layer-check and bench-layer.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "ampipe/comm/group.h"
#include "ampipe/schedule/memory_estimate.h"

namespace ampipe::cli {

struct MemoryFlags {
  std::string memory_limit = "auto";  // auto: the host's available memory; 0: no check; else a byte count ("8G")
  // -1: the host's available memory; 0: no check; > 0: the limit in bytes. Throws ConfigError for bad text.
  int64_t limit_bytes() const;
};

// Ranks of `world` on this host (the same host name). Collective over `world`.
int ranks_on_this_host(const comm::Group& world);

// Every rank compares its estimate (the total includes `in_use_bytes`, what the process holds now) with the
// limit or its share of the host's available memory; when any rank's does not fit, every rank throws the first
// such rank's one-line reason as a ConfigError. Collective over `world`.
void check_memory_fits(const schedule::MemoryEstimate& estimate, int64_t in_use_bytes, const MemoryFlags& flags,
                       const comm::Group& world);

}  // namespace ampipe::cli
