// The executor: runs a Plan's tasks against one model::Layer. Compute tasks run in Plan order on the calling (main)
// thread through Layer::run; a communication task is issued on its lane as soon as the compute task before it in
// the Plan has run, carrying its producers as `after` events, and compute waits on an Event only where a task
// depends on it. No barrier or global synchronisation inside a layer step. The executor knows no stage by name: a
// collective is whatever its CollectiveSpec says (kind, group, buffers), run through a comm::Backend on the task's
// lane (comm/backend.h): the executor holds no communication code of its own.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "ampipe/comm/backend.h"
#include "ampipe/comm/collectives.h"
#include "ampipe/comm/event.h"
#include "ampipe/comm/group.h"
#include "ampipe/model/layer.h"
#include "ampipe/schedule/plan.h"

namespace ampipe::schedule {

struct ExecStats {
  int64_t blocked_us = 0;  // compute blocked on communication (exposed communication)
  int64_t compute_us = 0;  // time inside compute stages
};

class Executor {
 public:
  // groups: this rank's process groups; null runs every collective as a one-rank group (local copies, no MPI),
  // as does a group of size 1.
  explicit Executor(const comm::Groups* groups = nullptr) : groups_(groups) {}

  // Runs the tasks of direction `dir` of `plan` on `layer` (Layer::begin_forward / begin_backward first). Returns
  // when every compute task has run and every collective of this direction has completed.
  void run(const Plan& plan, Dir dir, model::Layer& layer);

  const ExecStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  // Issues one collective task on its group and lane through the group's comm::Backend, reading and writing the
  // layer's buffers (also used by bench-layer to time the communication alone): a process group's MpiBackend, or
  // for a one-rank group (or no groups) the LocalBackend, whose copies are made here on the compute thread.
  comm::Event issue(const Task& t, model::Layer& layer, std::vector<comm::Event> after, const std::string& tag);

 private:
  comm::Backend& backend_for(comm::GroupKind g);

  const comm::Groups* groups_;
  comm::LocalBackend local_;
  std::map<comm::GroupKind, std::unique_ptr<comm::MpiBackend>> mpi_;  // made on first use, per group
  std::vector<comm::Event> done_;  // per task id of the Plan being run
  ExecStats stats_;
};

}  // namespace ampipe::schedule
