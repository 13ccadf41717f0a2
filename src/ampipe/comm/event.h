// Event: the handle an async operation returns (c10d's Work, DeepEP's EventHandle).
//
//   ready()        never blocks.
//   wait(timeout)  blocks the caller until the operation completed, records how long it was blocked (the exposed
//                  communication, also written to the trace as "wait:<tag>" on the compute lane) and throws
//                  CommError when the operation failed (e.g. a --check-collectives mismatch) or when the timeout
//                  passes. The timeout message names the rank, the op, the group, its seq, bytes, tag, lane, the
//                  op's state (queued behind `after` events / exchanging fingerprints / in flight) and the last
//                  completed op on that group.
//
// The operation's send/recv Tensors are held by the engine (shared storage) until the operation completed; the
// caller must not write a send buffer or read a recv buffer before then.
// A default-constructed Event is complete (waiting on it is a no-op), so `after` lists may contain it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "ampipe/comm/lane.h"

namespace ampipe::comm {

enum class OpKind : uint8_t { all_to_all, all_gather, reduce_scatter, all_reduce, send, recv, send_recv, barrier,
                              check };
std::string_view op_kind_name(OpKind k);

struct GroupState;

struct OpInfo {
  std::string group;   // label, e.g. "ep[0,2]"
  uint64_t seq = 0;    // collective number on the group (p2p ops: number among the group's p2p ops)
  OpKind kind = OpKind::barrier;
  size_t bytes = 0;    // bytes this rank sends (recv: receives)
  std::string tag;     // the task, e.g. "L3.fwd.dispatch.c0"
  Lane lane = Lane::ep;
  int chunk = -1;
  int peer = -1;       // p2p only: group rank of the peer (send_recv: destination)
};

enum class OpStage : int { queued, checking, in_flight, done, failed };

// Shared state of one operation; written by the engine thread, read by anyone.
struct EventState {
  OpInfo info;
  int world_rank = 0;
  std::shared_ptr<GroupState> group;
  std::atomic<int> stage{int(OpStage::queued)};
  std::chrono::steady_clock::time_point issued, started, finished;
  std::string error;  // set before stage becomes failed
  bool peer_stopped = false;  // failed because a peer left the job (wait throws PeerStopped); set with error
  std::atomic<int64_t> blocked_us{0};
  std::mutex mu;
  std::condition_variable cv;

  void complete();                          // engine: mark done and wake waiters
  void fail(std::string message, bool by_peer = false);  // engine: mark failed and wake waiters
};

class Event {
 public:
  Event() = default;
  explicit Event(std::shared_ptr<EventState> s) : s_(std::move(s)) {}

  bool ready() const;    // done or failed; never blocks
  bool failed() const;
  void wait(std::chrono::milliseconds timeout) const;
  void wait() const;     // with the runtime's --comm-timeout (default 300 s)
  const OpInfo& info() const;
  // Total time callers spent blocked in wait() on this event, in microseconds.
  int64_t blocked_us() const;
  // Error message of a failed operation ("" otherwise).
  std::string error() const;
  const std::shared_ptr<EventState>& state() const { return s_; }

 private:
  std::shared_ptr<EventState> s_;
};

}  // namespace ampipe::comm
