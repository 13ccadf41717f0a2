#include "ampipe/comm/event.h"

#include <fmt/format.h>

#include "ampipe/comm/group.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/comm/trace.h"
#include "ampipe/core/error.h"

namespace ampipe::comm {

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::all_to_all: return "all_to_all";
    case OpKind::all_gather: return "all_gather";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::all_reduce: return "all_reduce";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::send_recv: return "send_recv";
    case OpKind::barrier: return "barrier";
    case OpKind::check: return "check";
  }
  return "?";
}

void EventState::complete() {
  {
    std::lock_guard lk(mu);
    stage = int(OpStage::done);
  }
  cv.notify_all();
}

void EventState::fail(std::string message, bool by_peer) {
  {
    std::lock_guard lk(mu);
    error = std::move(message);
    peer_stopped = by_peer;
    stage = int(OpStage::failed);
  }
  cv.notify_all();
}

namespace {
bool finished(const EventState& s) {
  int st = s.stage.load();
  return st == int(OpStage::done) || st == int(OpStage::failed);
}

std::string size_str(size_t bytes) {
  if (bytes >= (size_t(1) << 20)) return fmt::format("{:.1f} MiB", double(bytes) / double(1 << 20));
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", double(bytes) / 1024.0);
  return fmt::format("{} B", bytes);
}
}  // namespace

bool Event::ready() const { return !s_ || finished(*s_); }
bool Event::failed() const { return s_ && s_->stage.load() == int(OpStage::failed); }

std::string Event::error() const {
  if (!failed()) return {};
  std::lock_guard lk(s_->mu);
  return s_->error;
}

const OpInfo& Event::info() const {
  static const OpInfo empty{};
  return s_ ? s_->info : empty;
}

int64_t Event::blocked_us() const { return s_ ? s_->blocked_us.load() : 0; }

void Event::wait() const { wait(default_timeout()); }

void Event::wait(std::chrono::milliseconds timeout) const {
  if (!s_) return;
  EventState& s = *s_;
  if (!finished(s)) {
    auto t0 = std::chrono::steady_clock::now();
    bool ok;
    {
      std::unique_lock lk(s.mu);
      ok = s.cv.wait_for(lk, timeout, [&] { return finished(s); });
    }
    auto t1 = std::chrono::steady_clock::now();
    int64_t blocked = std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count();
    s.blocked_us += blocked;
    if (Trace::enabled()) {
      TraceRecord r;
      r.lane = Lane::compute;
      r.name = "wait:" + s.info.tag;
      r.chunk = s.info.chunk;
      r.start_us = Trace::to_us(t0);
      r.end_us = Trace::to_us(t1);
      r.bytes = s.info.bytes;
      r.blocked_us = blocked;
      r.cat = "wait";
      r.group = s.info.group;
      r.seq = int64_t(s.info.seq);
      Trace::record(std::move(r));
    }
    if (!ok) {
      const OpInfo& in = s.info;
      std::string state;
      switch (OpStage(s.stage.load())) {
        case OpStage::queued: state = "queued, not started (waiting for its lane or its `after` events)"; break;
        case OpStage::checking: state = "exchanging --check-collectives fingerprints"; break;
        case OpStage::in_flight:
          state = fmt::format("in flight for {} ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                                         std::chrono::steady_clock::now() - s.started)
                                                         .count());
          break;
        default: state = "finishing"; break;
      }
      std::string last = "none";
      if (s.group) {
        std::lock_guard lk(s.group->mu);
        if (s.group->any_completed)
          last = fmt::format("seq={} {} ({})", s.group->last_seq, op_kind_name(s.group->last_kind),
                             s.group->last_tag);
      }
      std::string peer = in.peer >= 0 ? fmt::format(" peer {}", in.peer) : "";
      throw CommError(fmt::format(
          "rank {}: timed out after {} ms waiting for {} seq={} on group {}{} ({}), tag {}, lane {}; state: {}; "
          "last completed on this group: {}. A peer may have died or issued a different collective; rerun with "
          "--check-collectives to compare ranks, or raise {}.",
          s.world_rank, timeout.count(), op_kind_name(in.kind), in.seq, in.group, peer, size_str(in.bytes), in.tag,
          lane_name(in.lane), state, last, default_timeout_flag()));
    }
  }
  if (s.stage.load() == int(OpStage::failed)) {
    std::lock_guard lk(s.mu);
    if (s.peer_stopped) throw PeerStopped(s.error);
    throw CommError(s.error);
  }
}

}  // namespace ampipe::comm
