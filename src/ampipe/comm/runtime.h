// Runtime: MPI initialisation (full thread support, or a clear failure), the world, the groups and the one
// communication engine of this rank. Construct one per process, in main, before anything else uses comm:
//
//   comm::Runtime rt(&argc, &argv, {.comm_timeout = 300s, .check_collectives = false});
//   comm::Groups g = rt.make_groups(comm::Layout::make(rt.size(), tp, cp, ep));   // before the first op
//   comm::Event e = comm::all_to_all(g.ep, send, recv, counts, "L0.fwd.dispatch.c0");
//   ...
//   e.wait();                       // throws CommError on timeout / mismatch
//   ... catch (const CommError& e) { rt.abort(e.what()); }   // prints, aborts the MPI job on every rank
//
// The destructor drains the engine (up to comm_timeout) and finalises MPI; if ops are still unfinished it
// prints them and aborts the MPI job instead of hanging.
//
// No rank leaves alone. A process ends with finish(), the exit agreement: every rank sends every peer one exit note
// (ok / failed with its code and line / stopped because a peer left) over a control communicator of its own and
// collects theirs, so every rank returns the same exit code and exactly one line is printed: the failing rank's,
// naming the rank and its host ("rank 1 (node7): --data-path ...: the file does not exist"), or the plain line when
// every rank failed alike. A rank still working when a peer's note arrives is stopped where it waits: the engine
// fails its pending ops with PeerStopped (after Engine::kPeerGrace), and agree() throws it at once. Start-up
// exchanges (agree(), and every op before end_startup()) wait at most --startup-timeout (default 30 s, well under
// --comm-timeout), and a rank that does not arrive is named. This is the only way code outside comm/ reaches MPI:
// no public header of comm/ includes the MPI header (the MPI-typed state lives in the private mpi_detail.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ampipe/comm/group.h"
#include "ampipe/comm/layout.h"

namespace ampipe::comm {

class Engine;     // mpi_detail.h (private to comm/*.cpp)
struct Control;   // mpi_detail.h

struct RuntimeOptions {
  std::chrono::milliseconds comm_timeout{300'000};  // --comm-timeout SECONDS: default for Event::wait()
  std::chrono::milliseconds startup_timeout{30'000};  // --startup-timeout SECONDS: agree() and waits before the first step
  std::chrono::microseconds poll_interval{100};      // engine sleep when a pass completed nothing
  bool check_collectives = false;                    // --check-collectives: fingerprint every collective
  int lane_depth = 1;                                // ops in flight per lane
  bool trace = true;                                 // record ops in comm::Trace
};

class Runtime {
 public:
  Runtime(int* argc, char*** argv, RuntimeOptions opts = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The live runtime (AMPIPE_CHECKs there is one).
  static Runtime& current();
  static bool exists();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Group& world() const { return world_; }

  // Creates this rank's groups for `layout` (collective over the world; main thread; before the first op).
  Groups make_groups(const Layout& layout);

  // "rank 1 (node7)": a rank and its host, for lines that name a rank.
  std::string rank_name(int r) const;

  // A start-up agreement, collective over the world (the calling thread; no engine op): every rank contributes
  // `mine` (at most 1000 bytes) and gets every rank's, in rank order. Waits at most the start-up timeout. Throws
  // PeerStopped when a peer left the job before arriving (naming it and why), CommError naming the ranks that did
  // not arrive in time (and --startup-timeout). `what` names the agreement in those lines.
  std::vector<std::string> agree(const std::string& what, const std::string& mine);

  enum class Exit { ok, failed, stopped };
  // The exit agreement (see above), called once at the end of the process by main, on every rank: `kind` and
  // `code` are this rank's outcome, `message` its error line without "ampipe: error: " (empty: nothing to say).
  // Prints the one line and returns the exit code every rank returns. When a peer does not answer within the
  // bound (the start-up timeout after a failure, --comm-timeout after a success), or when this rank abandoned
  // MPI requests, it prints which rank went away and aborts the MPI job instead.
  int finish(Exit kind, int code, const std::string& message);

  // The start-up phase ends before the first step, with a last agreement (collective over the world): no rank
  // steps while a peer failed its start-up (a checkpoint it could not load, a file it could not open) and would
  // leave it in the first collective. From then on waits default to --comm-timeout.
  void end_startup();
  bool in_startup() const { return startup_; }

  const RuntimeOptions& options() const { return opts_; }
  // Must be called at the same point on every rank (the mode is read when an op is issued).
  void set_check_collectives(bool on) { opts_.check_collectives = on; }
  void set_comm_timeout(std::chrono::milliseconds t) { opts_.comm_timeout = t; }
  void set_startup_timeout(std::chrono::milliseconds t) { opts_.startup_timeout = t; }
  void set_poll_interval(std::chrono::microseconds us);

  // Prints "rank R: <message>" to stderr and aborts the MPI job (the world communicator) with `code`: every rank
  // exits non-zero.
  [[noreturn]] void abort(const std::string& message, int code = 1);

 private:
  RuntimeOptions opts_;
  int rank_ = 0, size_ = 1;
  Group world_;
  std::vector<std::shared_ptr<GroupState>> groups_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Control> control_;
  bool startup_ = true;
  bool finished_ = false;
  uint64_t agreements_ = 0;
};

// The default wait of Event::wait(): the start-up timeout before the first step (when shorter), then comm_timeout
// (300 s when no runtime exists); default_timeout_flag() is the flag that sets it, for timeout lines.
std::chrono::milliseconds default_timeout();
const char* default_timeout_flag();

// Whether this process was started by an MPI launcher with more than one rank (OpenMPI's, MPICH's or Slurm's
// environment), so that it must take part in the world even when it only prints its help.
bool launched_with_peers();

}  // namespace ampipe::comm
