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
// prints them and aborts the MPI job instead of hanging. This is the only way code outside comm/ reaches MPI:
// no public header of comm/ includes the MPI header (the MPI-typed state lives in the private mpi_detail.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ampipe/comm/group.h"
#include "ampipe/comm/layout.h"

namespace ampipe::comm {

class Engine;  // mpi_detail.h (private to comm/*.cpp)

struct RuntimeOptions {
  std::chrono::milliseconds comm_timeout{300'000};  // --comm-timeout SECONDS: default for Event::wait()
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

  const RuntimeOptions& options() const { return opts_; }
  // Must be called at the same point on every rank (the mode is read when an op is issued).
  void set_check_collectives(bool on) { opts_.check_collectives = on; }
  void set_comm_timeout(std::chrono::milliseconds t) { opts_.comm_timeout = t; }
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
};

// The runtime's comm_timeout (300 s when no runtime exists).
std::chrono::milliseconds default_timeout();

}  // namespace ampipe::comm
