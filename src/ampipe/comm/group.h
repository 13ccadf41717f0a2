// Process groups. A Group is a handle to the state of one communicator group: its kind and members, one
// duplicated MPI communicator per communication lane (so lanes never mix messages), a separate debug
// communicator for --check-collectives fingerprints, and the collective counter.
//
// Numbering: every collective issued on a group takes the next `seq` of that group, across all lanes, in issue
// order (the counter is taken under the engine's submit lock, so it matches the engine's queue order). The
// contract, as in c10d's ProcessGroupMPI: all members issue a group's collectives in the same order, whatever
// lanes they use. Point-to-point ops are not collectives: they have their own counter and are not checked.
//
// Groups are created by the main thread at start-up, before the first operation starts the engine
// (splitting the world communicator is a blocking collective and only the engine calls MPI afterwards).
//
// The communicators themselves are opaque here (GroupComms, defined in the private mpi_detail.h), so this header
// and everything that includes it compile without MPI.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ampipe/comm/event.h"
#include "ampipe/comm/lane.h"
#include "ampipe/comm/layout.h"

namespace ampipe::comm {

class Engine;
struct GroupComms;  // mpi_detail.h (private to comm/*.cpp)

struct GroupState {
  GroupKind kind = GroupKind::world;
  std::string label;             // "ep[0,2]"
  std::vector<int> members;      // world ranks, index = group rank
  int rank = 0;                  // this process's rank in the group
  Lane default_lane = Lane::dp;  // lane used when an op does not name one
  std::unique_ptr<GroupComms> comms;  // one communicator per lane + the debug one; set by the runtime
  Engine* engine = nullptr;

  // Guarded by the engine's submit lock.
  uint64_t next_seq = 0;
  uint64_t next_p2p = 0;
  // Guarded by mu: the last completed collective, for timeout messages.
  std::mutex mu;
  bool any_completed = false;
  uint64_t last_seq = 0;
  std::string last_tag;
  OpKind last_kind{};

  GroupState();
  ~GroupState();  // out of line: GroupComms is complete only in comm/*.cpp
  GroupState(const GroupState&) = delete;
  GroupState& operator=(const GroupState&) = delete;
};

class Group {
 public:
  Group() = default;
  explicit Group(std::shared_ptr<GroupState> s) : s_(std::move(s)) {}
  bool valid() const { return s_ != nullptr; }
  int rank() const { return s_->rank; }
  int size() const { return int(s_->members.size()); }
  const std::vector<int>& members() const { return s_->members; }
  const std::string& label() const { return s_->label; }
  GroupKind kind() const { return s_->kind; }
  Lane default_lane() const { return s_->default_lane; }
  const std::shared_ptr<GroupState>& state() const { return s_; }

 private:
  std::shared_ptr<GroupState> s_;
};

// The groups of one Layout for this rank.
struct Groups {
  Layout layout;
  Group world, tp, cp, dp, dp_cp, ep, edp;
  Group pp, stage;  // pipeline parallelism: this rank's peers in the other stages, and its own stage's ranks
  const Group& get(GroupKind k) const;
};

}  // namespace ampipe::comm
