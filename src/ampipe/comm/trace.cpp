#include "ampipe/comm/trace.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <fstream>
#include <mutex>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/core/output_file.h"

namespace ampipe::comm {

namespace {
std::mutex g_mu;
std::vector<TraceRecord> g_records;
std::atomic<bool> g_enabled{true};
std::chrono::steady_clock::time_point g_origin = std::chrono::steady_clock::now();
}  // namespace

int64_t Trace::to_us(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - g_origin).count();
}
int64_t Trace::now_us() { return to_us(std::chrono::steady_clock::now()); }
void Trace::set_origin(std::chrono::steady_clock::time_point t) { g_origin = t; }
void Trace::set_enabled(bool on) { g_enabled = on; }
bool Trace::enabled() { return g_enabled.load(); }

void Trace::record(Lane lane, std::string name, int chunk, int64_t start_us, int64_t end_us, size_t bytes,
                   int64_t blocked_us, std::string cat) {
  TraceRecord r;
  r.lane = lane;
  r.name = std::move(name);
  r.chunk = chunk;
  r.start_us = start_us;
  r.end_us = end_us;
  r.bytes = bytes;
  r.blocked_us = blocked_us;
  r.cat = std::move(cat);
  record(std::move(r));
}

void Trace::record(TraceRecord r) {
  if (!enabled()) return;
  std::lock_guard lk(g_mu);
  g_records.push_back(std::move(r));
}

std::vector<TraceRecord> Trace::snapshot() {
  std::lock_guard lk(g_mu);
  return g_records;
}

void Trace::clear() {
  std::lock_guard lk(g_mu);
  g_records.clear();
}

namespace {
nlohmann::json events_json(const std::vector<TraceRecord>& records, int rank) {
  auto ev = nlohmann::json::array();
  ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", fmt::format("rank {}", rank)}}}});
  ev.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  for (int l = 0; l < kNumLanes; ++l) {
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", l},
                  {"args", {{"name", std::string(lane_name(Lane(l)))}}}});
    ev.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", rank}, {"tid", l}, {"args", {{"sort_index", l}}}});
  }
  for (const auto& r : records) {
    nlohmann::json args = {{"chunk", r.chunk}, {"bytes", r.bytes}};
    if (r.blocked_us) args["blocked_us"] = r.blocked_us;
    if (!r.group.empty()) args["group"] = r.group;
    if (r.seq >= 0) args["seq"] = r.seq;
    ev.push_back({{"name", r.name}, {"cat", r.cat}, {"ph", "X"}, {"ts", r.start_us},
                  {"dur", std::max<int64_t>(0, r.end_us - r.start_us)}, {"pid", rank},
                  {"tid", lane_index(r.lane)}, {"args", args}});
  }
  return ev;
}
}  // namespace

size_t Trace::write_chrome_trace(const std::string& path) {
  Runtime& rt = Runtime::current();
  auto records = snapshot();
  std::string mine = events_json(records, rt.rank()).dump();
  // The gather itself is not traced into the file (it is recorded after the snapshot).
  auto all = all_gather_strings(rt.world(), mine, "trace.gather");
  if (rt.rank() != 0) return records.size();
  auto events = nlohmann::json::array();
  size_t n = 0;
  for (const auto& s : all) {
    auto part = nlohmann::json::parse(s);
    for (auto& e : part) {
      if (e["ph"] == "X") ++n;
      events.push_back(std::move(e));
    }
  }
  // Never blocks in open (a FIFO without a reader is refused): a blocked open would hold rank 0 past SIGTERM.
  core::OutputFile f = core::open_output(path, "--trace");
  core::write_output(std::move(f), nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump(1) + "\n",
                     path, "--trace");
  return n;
}

TraceScope::TraceScope(Lane lane, std::string name, int chunk)
    : lane_(lane), name_(std::move(name)), chunk_(chunk), start_(Trace::now_us()) {}

TraceScope::~TraceScope() { Trace::record(lane_, std::move(name_), chunk_, start_, Trace::now_us()); }

}  // namespace ampipe::comm
