// Op trace: every compute task (recorded by callers) and every collective (recorded by the engine on completion)
// becomes one record: lane, name (the task/tag), chunk, start, end, bytes and blocked time. Waits record a
// "wait:<tag>" record on the compute lane whose duration is the exposed communication.
//
// Timestamps: microseconds of std::chrono::steady_clock since this rank's origin. The runtime sets the origin right
// after a world barrier at start-up, so ranks agree to within the barrier's skew (tens of microseconds on shm).
//
// write_chrome_trace(path) is collective over the world: every rank must call it (after its own last op); the
// records are gathered to rank 0 through the engine and rank 0 writes Chrome trace JSON (traceEvents, ph "X",
// pid = rank, tid = lane, with process/thread name metadata), which opens in Perfetto and chrome://tracing.
//
//   comm::Trace::record(Lane::compute, "attention", c, t0, t1);
//   { comm::TraceScope s(Lane::compute, "experts", c); run_experts(c); }
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ampipe/comm/lane.h"

namespace ampipe::comm {

struct TraceRecord {
  Lane lane = Lane::compute;
  std::string name;
  int chunk = -1;
  int64_t start_us = 0, end_us = 0;
  size_t bytes = 0;
  int64_t blocked_us = 0;
  std::string cat;     // "compute", "wait", or the op kind ("all_to_all", ...)
  std::string group;   // collectives: group label
  int64_t seq = -1;    // collectives: seq on the group
  int64_t issued_us = -1;  // collectives: when the caller issued it (start_us is when the engine posted it)
};

class Trace {
 public:
  static int64_t now_us();
  static void set_origin(std::chrono::steady_clock::time_point t);
  static int64_t to_us(std::chrono::steady_clock::time_point t);
  static void set_enabled(bool on);
  static bool enabled();

  static void record(Lane lane, std::string name, int chunk, int64_t start_us, int64_t end_us, size_t bytes = 0,
                     int64_t blocked_us = 0, std::string cat = "compute");
  static void record(TraceRecord r);
  static std::vector<TraceRecord> snapshot();
  static void clear();

  // Collective over the world group (see above). Rank 0 writes `path`; returns the number of records written
  // (on rank 0; other ranks return their own count).
  static size_t write_chrome_trace(const std::string& path);
};

// RAII: records [construction, destruction) as one task.
class TraceScope {
 public:
  TraceScope(Lane lane, std::string name, int chunk = -1);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Lane lane_;
  std::string name_;
  int chunk_;
  int64_t start_;
};

}  // namespace ampipe::comm
