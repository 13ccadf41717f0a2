// What this host can still give a process, and what this process uses: MemAvailable (/proc/meminfo), the memory
// cgroup's limit (cgroup v2 memory.max, v1 memory.limit_in_bytes) and the process's resident set (/proc/self/status).
// Used to refuse a run whose estimated peak memory does not fit before anything is allocated (docs/training.md,
// "Memory").
#pragma once

#include <cstdint>
#include <string>

namespace ampipe::core {

// Memory a process on this host can still allocate: the smaller of MemAvailable and, for every memory cgroup this
// process is in that has a limit, the limit minus the cgroup's current usage. bytes < 0: nothing could be read.
struct HostMemory {
  int64_t bytes = -1;
  std::string source;  // "MemAvailable", "cgroup v2 memory.max 8.00 GiB - 1.20 GiB in use", ...
};
HostMemory available_memory();

// This process's resident set now (VmRSS) and its peak (VmHWM), in bytes; -1 if /proc/self/status cannot be read.
int64_t current_rss_bytes();
int64_t peak_rss_bytes();
// Restarts the peak (VmHWM) at the current resident set (Linux: clear_refs 5); false if it could not.
bool reset_peak_rss();

// A byte count as a user writes it: digits with an optional binary suffix K, M, G, T, P (1024-based; "KiB", "KB"
// and "k" spellings accepted, "B" alone allowed): "8G", "512M", "1048576", "1.5G". Throws ConfigError naming `flag`
// when the text is not such a count or does not fit in int64.
int64_t parse_bytes(const std::string& flag, const std::string& text);

// "1.50 GiB", "512 MiB", "4 B": three significant digits, binary prefixes.
std::string format_bytes(double bytes);

}  // namespace ampipe::core
