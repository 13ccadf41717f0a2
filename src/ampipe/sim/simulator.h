// A discrete-event simulator of the very Plans the engine runs (docs/simulator.md). Ranks are symmetric, so one
// rank is simulated: its compute lane runs the compute tasks in Plan order, each as soon as its dependencies are
// done; each communication lane is an ordered queue (one collective at a time, in issue order, as the engine's lane
// depth 1); a collective starts when its dependencies are done, its lane is free and its link is free (lanes that
// use the same link class share it, e.g. an EP all-to-all and a CP ring on one network port). Layers run one after
// another (forward 0..L-1, then backward L-1..0, a recomputed layer's forward replayed right before its backward),
// as schedule::LayerStack runs them; an optional data-parallel gradient all-reduce follows the backward.
//
// Task costs (cost_seconds):
//   compute     task_overhead + GEMM FLOPs / gemm_rate(smallest dimension) (the gate's GEMM at the fp32 rate),
//               + attention FLOPs / attention rate, + the bytes of element-wise stages / elementwise_gbps;
//               while a collective is in flight, compute runs (1 + compute_slowdown_during_comm) times longer
//   collective  latency + off-rank bytes / link bandwidth (an all-to-all over g ranks keeps 1/g of its bytes)
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ampipe/schedule/plan.h"
#include "ampipe/sim/profile.h"

namespace ampipe::sim {

struct SimOptions {
  bool ep_spans_nodes = false;     // the EP group's link class: "inter" when its ranks sit on different nodes
  double dp_allreduce_bytes = 0;   // gradient bytes all-reduced over data parallelism after the backward (0: none)
  int dp_size = 1;                 // ranks in that all-reduce (also the size of dp, dp_cp, edp and world groups)
  bool dp_spans_nodes = false;
  // Groups a Plan may name in future (the ring steps of context parallelism, sequence-parallel gathers): their
  // sizes and link classes. The EP group's size is plan.dims.ep.
  int tp_size = 1, cp_size = 1;
  bool tp_spans_nodes = false, cp_spans_nodes = false;
  // Activation recomputation (--recompute-granularity full): layer i re-runs its forward tasks just before its
  // backward (schedule::LayerStack::set_recompute). Empty or shorter than the layers: no recomputation.
  std::vector<bool> recompute;
};

struct SimRecord {
  std::string name;  // Task::name(), "dp.allreduce", or "wait:<collective>" (cat "wait")
  comm::Lane lane = comm::Lane::compute;
  double start_s = 0, end_s = 0;
  double wait_s = 0;  // compute tasks: time the compute lane waited for a collective before this task
  // Added for the trace: "compute", "wait", or the collective kind ("all_to_all", ...), as comm::TraceRecord::cat.
  std::string cat = "compute";
  std::string stage;  // model::stage_name of the task (of the collective waited for), "dp_allreduce" for that
  int chunk = -1;
  double bytes = 0;     // collectives: bytes this rank sends; compute: memory bytes of the task
  double issue_s = 0;   // collectives: when the compute lane issued it (start_s: when it got its lane and link)
  std::string link;     // collectives: the link class it used ("intra", "inter")
};

struct SimResult {
  double step_s = 0;        // first task start to last task end
  double compute_s = 0;     // sum of compute task durations
  double comm_s = 0;        // sum of collective durations (what the communication alone takes)
  double exposed_s = 0;     // compute lane idle, waiting for communication
  double hidden_fraction = 0;  // (compute + comm - step) / min(compute, comm), as bench-layer reports it
  std::map<std::string, double> lane_busy_s;  // by lane name
  // Which communication the step waits for, by the collective's stage (model::stage_name: "dispatch",
  // "tp_expert_in", "cp_ring", ...; "dp_allreduce"): the collectives' durations, and the exposed waits charged to
  // what held them up (a wait for a combine, before the combine started, to the tp reduction it waited for, and so
  // on; time a collective sat ready but queued, to the collectives occupying its lane or link). They add up to
  // exposed_s.
  std::map<std::string, double> comm_by_stage_s, exposed_by_stage_s;
  std::vector<SimRecord> timeline;            // by start time; the exposed waits are records of cat "wait"
};

// The cost of one task of `plan` on `profile`, without slowdown.
double cost_seconds(const schedule::Task& t, const schedule::Plan& plan, const Profile& profile,
                    const SimOptions& opts);
// The parts of it, for tools (calibration, autotuning):
// GEMM rate in FLOP/s at smallest dimension d: peak * d / (d + half).
double gemm_rate(const ComputeRates& r, double d);
// The smallest GEMM dimension of a GEMM stage's task (0 for a stage that is not a GEMM), docs/simulator.md.
double gemm_min_dim(const schedule::Task& t, const model::LayerDims& d);
// latency + off-rank bytes / bandwidth of a collective of `kind` whose CollectiveSpec::bytes is `bytes`, over
// `group_size` ranks (off-rank bytes: all_to_all bytes*(g-1)/g, all_gather bytes*(g-1), reduce_scatter
// bytes*(g-1)/g, all_reduce 2*bytes*(g-1)/g, send_recv bytes).
double collective_seconds(schedule::CollKind kind, double bytes, int group_size, const LinkClass& link);
// The size of a group and whether it spans nodes, from the Plan (ep) and the options (the others).
int group_size(comm::GroupKind g, const schedule::Plan& plan, const SimOptions& opts);
bool group_spans_nodes(comm::GroupKind g, const SimOptions& opts);

// Simulates a step of the layers (forward of every layer, then backward in reverse order).
SimResult simulate(const std::vector<schedule::Plan>& layers, const Profile& profile, const SimOptions& opts = {});

// Chrome trace JSON of the predicted timeline, in the format comm::Trace writes (traceEvents, ph "X", pid 0,
// tid = lane, microseconds), so a predicted and a recorded trace open side by side in Perfetto.
void write_chrome_trace(const SimResult& r, const std::string& path);

}  // namespace ampipe::sim
