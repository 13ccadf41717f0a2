// PRIVATE to src/ampipe/comm/*.cpp: no public header (and nothing outside comm/) may include this file.
//
// Everything of the communication module that names MPI lives here, so the public headers (group.h, event.h,
// collectives.h, runtime.h, ...) and every module above comm compile without <mpi.h>:
//   - GroupComms: a group's duplicated communicators (one per communication lane, and the debug one);
//   - Op and CheckRecord: an operation as the engine sees it (its start callback posts MPI calls);
//   - Engine: the one thread per rank that alone calls MPI after initialisation.
//
// The engine (engine.cpp). Submissions (from any thread) go into one FIFO. The engine moves them, in order, into
// per-lane queues. An op on a lane starts (its non-blocking MPI call is posted on the group's communicator for
// that lane) when
//   - it is among the first `lane_depth` (default 1) unfinished ops of its lane, so a lane starts ops in issue
//     order and, with depth 1, runs one at a time (chunk 0's all-to-all gets the link before chunk 1's); the
//     pipeline's point-to-point lanes (pp_fwd, pp_bwd) have no depth limit: a receive posted ahead never holds up
//     a send;
//   - all its `after` events are done (a failed `after` fails the op without starting it);
//   - in --check-collectives mode, its fingerprint exchange on the group's debug communicator completed and all
//     members agree (otherwise the op fails on every member with the same message and is never started).
// Different lanes run concurrently. In-flight requests are progressed with MPI_Test; when a pass over all lanes
// completed nothing the thread sleeps `poll_interval` (default 100 us; a spinning helper thread halves the
// compute thread's speed on these 2-core machines, machine-facts section 2), and with nothing queued it sleeps
// until the next submission.
#pragma once

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ampipe/comm/event.h"
#include "ampipe/comm/group.h"
#include "ampipe/comm/lane.h"

namespace ampipe::comm {

// The communicators of one group (GroupState::comms). Created by the runtime (runtime.cpp) and freed by it before
// MPI is finalised; the compute lane has none (MPI_COMM_NULL).
struct GroupComms {
  std::array<MPI_Comm, kNumLanes> lane;  // [lane_index]
  MPI_Comm debug = MPI_COMM_NULL;        // --check-collectives fingerprint exchanges
  GroupComms() { lane.fill(MPI_COMM_NULL); }
};

// One fingerprint record exchanged in --check-collectives mode (sent as MPI_BYTE). On the wire each member sends
// the record followed by 2 x (group size) int64 element counts: for all_to_all its send counts to and receive counts
// from each group rank (zeros for other ops), so every member can check that what r sends to q is what q expects
// from r (per-rank sizes of an all_to_all legitimately differ, so its record carries bytes = elements = 0).
struct CheckRecord {
  uint64_t fingerprint = 0;
  uint64_t seq = 0;
  uint64_t bytes = 0;     // rank-invariant size (0 for all_to_all)
  uint64_t elements = 0;  // the same in elements of `dtype`
  uint32_t kind = 0;
  uint32_t dtype = 0;
  char tag[48] = {};
};

// An operation as the engine sees it. Built by collectives.cpp.
struct Op {
  std::shared_ptr<EventState> ev;
  std::shared_ptr<GroupState> group;
  bool collective = true;  // numbered by the group's seq and fingerprinted in check mode
  bool check = false;      // set at submit from the runtime option
  uint32_t dtype_code = 0;
  uint64_t check_bytes = 0;
  std::vector<int64_t> check_counts;  // all_to_all: send counts then recv counts (elements), one per group rank
  std::vector<Event> after;
  // Posts the non-blocking MPI call(s) on `comm`, appending to reqs. Runs on the engine thread.
  std::function<void(Op&, MPI_Comm comm)> start;
  // Optional second round: runs on the engine thread once the first round's reqs completed, and posts more
  // non-blocking calls on the same communicator (all_reduce: the local sum, then the all-gather). `finish` runs
  // after those complete.
  std::function<void(Op&, MPI_Comm comm)> then;
  // Runs on the engine thread after all reqs completed (e.g. bf16 conversion back, averaging).
  std::function<void(Op&)> finish;
  std::vector<MPI_Request> reqs;

  // Engine-private state.
  bool started = false;
  MPI_Request check_req = MPI_REQUEST_NULL;
  bool check_pending = false;
  std::vector<unsigned char> check_mine;  // CheckRecord + 2 x group size int64 counts
  std::vector<unsigned char> check_all;   // every member's, in group-rank order
};

// The control channel (runtime.cpp): a communicator of its own, duplicated from the world at start-up, that only
// carries the start-up agreements (Runtime::agree) and the exit notes (Runtime::finish). It is served by the thread
// that calls agree / finish, and polled for exit notes by the engine thread while ops are pending; every MPI call on
// it is made under `mu`. Its messages are at most kMaxControlBytes (eager in every OpenMPI transport), so a send
// completes whether or not the peer ever receives it, and a rank that leaves strands no peer in a send.
struct Control {
  static constexpr int kExitTag = 1;         // one exit note from each rank to each peer, at the end of the process
  static constexpr int kAgreeTagBase = 16;   // agreement n uses tag kAgreeTagBase + n
  static constexpr size_t kMaxControlBytes = 1024;
  enum class ExitKind : int { ok = 0, failed = 1, stopped = 2 };
  struct Note {
    bool arrived = false;
    ExitKind kind = ExitKind::ok;
    int code = 0;
    std::string message;
  };

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::vector<std::string> hosts;  // every rank's host name (gathered at start-up)

  std::mutex mu;
  std::vector<Note> notes;  // [rank]: the exit note of each peer that has sent one (guarded by mu)
  std::vector<MPI_Request> sends;  // unfinished sends of this rank (guarded by mu)
  std::vector<std::shared_ptr<std::string>> send_bufs;  // their buffers, index for index
  std::atomic<int> first_exit{-1};  // the first peer whose exit note arrived (-1: none)
  std::chrono::steady_clock::time_point first_exit_at;

  // "rank 1 (node7)".
  std::string name(int r) const;
  // Receives the exit notes that have arrived (any thread). Returns true when some peer has left.
  bool poll();
  bool poll_locked();
  // Sends `bytes` to `peer` with `tag` (non-blocking; the request is kept in `sends`). Called with mu held.
  void send_locked(const std::string& bytes, int peer, int tag);
  // The line of a peer that left, for ops and agreements it strands: "rank 1 (node7) has left the job (...)".
  std::string left_line(int peer);
  static std::string encode(const Note& n);
  static Note decode(const std::string& bytes);
};

struct EngineOptions {
  std::chrono::microseconds poll_interval{100};
  int lane_depth = 1;
};

class Engine {
 public:
  Engine(int world_rank, EngineOptions opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Numbers the op on its group, queues it and returns its Event; starts the thread on first use.
  Event submit(std::unique_ptr<Op> op);
  bool running() const { return running_; }
  // Waits up to `timeout` for every queued op to finish, then stops the thread. Returns false (and leaves MPI
  // requests outstanding) when ops were still unfinished; the caller must then MPI_Abort, not MPI_Finalize.
  bool stop(std::chrono::milliseconds timeout);
  // Ops queued or in flight (for diagnostics).
  size_t pending() const;
  void set_poll_interval(std::chrono::microseconds us) { poll_us_ = us.count(); }
  // The control channel whose exit notes fail the pending ops (a peer that left will never complete them).
  void set_control(Control* c) { control_ = c; }
  // Ops that were in flight (their MPI requests posted) when a peer left: their requests are abandoned, so the
  // process must not finalise MPI normally (Runtime::finish aborts instead).
  bool abandoned_requests() const { return abandoned_.load(); }
  // A peer's exit note fails the pending ops this long after it arrived (an op the peer completed before it left
  // still completes here in that time).
  static constexpr std::chrono::milliseconds kPeerGrace{1000};

 private:
  void loop();
  bool step();  // one pass; true when something progressed
  void admit(std::unique_ptr<Op> op);
  void finish_op(Op& op);
  void fail_op(Op& op, std::string message, bool peer_stopped = false);
  // A peer left: fails every queued op (and every op submitted later) with the line naming it.
  bool fail_for_peer();

  int world_rank_;
  EngineOptions opts_;
  std::atomic<int64_t> poll_us_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Op>> incoming_;
  std::array<std::deque<std::unique_ptr<Op>>, kNumLanes> lanes_;  // engine thread only
  std::atomic<size_t> pending_{0};
  bool stop_requested_ = false;
  std::atomic<bool> running_{false};
  std::thread thread_;
  Control* control_ = nullptr;
  std::chrono::steady_clock::time_point last_poll_{};
  std::string peer_left_;  // engine thread only: set once a peer's exit note failed the ops
  std::atomic<bool> abandoned_{false};
};

// 64-bit FNV-1a over the check record fields (group label, seq, kind, dtype, bytes, elements, tag).
uint64_t fingerprint(const std::string& group, uint64_t seq, OpKind kind, uint32_t dtype, uint64_t bytes,
                     uint64_t elements, const std::string& tag);

}  // namespace ampipe::comm
