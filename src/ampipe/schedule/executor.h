// The executor: runs a Plan's tasks against one model::LayerStep (STYLE.md 2.4). Compute tasks run in Plan
// order on the calling (main) thread; a communication task is issued on its lane as soon as the compute task
// before it in the Plan has run, carrying its producers as `after` events, and compute waits on an Event only
// where a task depends on it. No barrier or global synchronisation inside a layer step.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "ampipe/comm/event.h"
#include "ampipe/comm/group.h"
#include "ampipe/model/layer_step.h"
#include "ampipe/schedule/plan.h"

namespace ampipe::schedule {

// The all-to-all a Plan stage moves (dispatch, combine_a2a and their backward), or none for other stages.
std::optional<model::A2a> a2a_of(Stage s);

struct ExecStats {
  int64_t blocked_us = 0;  // compute blocked on communication (exposed communication)
  int64_t compute_us = 0;  // time inside compute stages
};

class Executor {
 public:
  // ep: the expert-parallel group; null or size 1 runs the all-to-alls as local copies (no MPI).
  explicit Executor(const comm::Group* ep = nullptr) : ep_(ep) {}

  // Runs the forward (or backward) tasks of `plan` on `step`. begin_forward / begin_backward must have been
  // called on the step.
  void forward(const Plan& plan, model::LayerStep& step) { run(plan, step, Dir::fwd); }
  void backward(const Plan& plan, model::LayerStep& step) { run(plan, step, Dir::bwd); }

  const ExecStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  void run(const Plan& plan, model::LayerStep& step, Dir dir);
  void run_stage(const Task& t, model::LayerStep& step);
  comm::Event issue_collective(const Task& t, model::LayerStep& step, std::vector<comm::Event> after);

  const comm::Group* ep_;
  std::vector<comm::Event> done_;  // per task id
  ExecStats stats_;
};

}  // namespace ampipe::schedule
