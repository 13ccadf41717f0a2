// A discrete-event simulator of the very Plans the engine runs (docs/simulator.md). It costs a step Plan
// (schedule/step_plan.h): the order of layers, micro-batches, recompute replays, the model's work outside the
// layers and the bucketed data-parallel gradient reduction are the step Plan's, not the simulator's. Ranks are
// symmetric, so one rank is simulated: its compute lane runs the compute tasks in Plan order, each as soon as its
// dependencies are done; each communication lane is an ordered queue (one collective at a time, in issue order, as
// the engine's lane depth 1); a collective starts when its dependencies are done, its lane is free and its link is
// free (lanes that use the same link class share it, e.g. an EP all-to-all and a CP ring on one network port). A
// layer task of the step Plan is its layer Plan's tasks of that direction, and ends, as Executor::run does, waiting
// for the collectives it issued; a collective of the step Plan (a gradient bucket's all-reduce, a sequence-parallel
// gather) is waited for only by the tasks that depend on it.
//
// Task costs (cost_seconds, step_task_seconds):
//   compute     task_overhead + GEMM FLOPs / gemm_rate(smallest dimension) (the gate's GEMM and the LM head's at
//               the fp32 rate), + attention FLOPs / attention rate, + the bytes of element-wise work /
//               elementwise_gbps; while a collective is in flight, compute runs (1 + compute_slowdown_during_comm)
//               times longer
//   collective  latency + off-rank bytes / link bandwidth (an all-to-all over g ranks keeps 1/g of its bytes)
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ampipe/schedule/pipeline.h"
#include "ampipe/schedule/plan.h"
#include "ampipe/schedule/step_plan.h"
#include "ampipe/sim/profile.h"

namespace ampipe::sim {

struct SimOptions {
  bool ep_spans_nodes = false;     // the EP group's link class: "inter" when its ranks sit on different nodes
  int dp_size = 1;                 // data-parallel size (with cp_size and the layers' ep, the dp_cp and edp groups)
  bool dp_spans_nodes = false;
  // The sizes and link classes of the tp and cp groups. The EP group's size is the layer Plans' dims.ep (ep_size:
  // set from them by simulate, for the step Plan's expert-data-parallel buckets).
  int tp_size = 1, cp_size = 1, ep_size = 1;
  bool tp_spans_nodes = false, cp_spans_nodes = false;
  bool pp_spans_nodes = false;  // neighbouring pipeline stages on different nodes (the pp group's link class)
  // simulate(layers, ...) only, the layers-only step Plan: layer i re-runs its forward tasks just before its
  // backward (--recompute-granularity full). Empty: no recomputation. A step Plan carries its own.
  std::vector<bool> recompute;
};

struct SimRecord {
  std::string name;  // Task::name() or StepTask::name() (several micro-batches: "mb{m}." before a layer task's),
                     // "recompute:" before a replayed one's, or "wait:<collective>" (cat "wait")
  comm::Lane lane = comm::Lane::compute;
  double start_s = 0, end_s = 0;
  double wait_s = 0;  // compute tasks: time the compute lane waited for a collective before this task
  // Added for the trace: "compute", "wait", or the collective kind ("all_to_all", ...), as comm::TraceRecord::cat.
  std::string cat = "compute";
  std::string stage;  // model::stage_name of the task (of the collective waited for); step tasks:
                      // schedule::step_op_name, "dp_allreduce" for the gradient buckets' all-reduces
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

// The cost of a step task that is not a layer task (a layer task costs its layer Plan's tasks), without slowdown.
double step_task_seconds(const schedule::StepTask& t, const Profile& profile, const SimOptions& opts);
// The size of a group a step task names (ep: opts.ep_size).
int step_group_size(comm::GroupKind g, const SimOptions& opts);

// Simulates the step Plan.
SimResult simulate(const schedule::StepPlan& step, const Profile& profile, const SimOptions& opts = {});

// Pipeline stages (docs/simulator.md, "Pipeline stages"): each stage's step Plan of one micro-batch simulated on its
// own gives its forward (to its first backward task), its backward (to its last) and its tail (the gradient
// reductions left, the norm and the optimizer); the stages' 1F1B timeline over K micro-batches
// (schedule::pipeline_timeline) with one activation's send between neighbours adds the slowest tail. With v virtual
// stages (chunks), the timeline is Megatron's interleaved one: each chunk takes 1/v of its stage's forward and
// backward (the embedding and head are not told apart from the layers there), and every chunk's activation is sent.
struct PipelineSim {
  int chunks = 1;
  std::vector<double> fwd_s, bwd_s, tail_s;  // per stage, one micro-batch
  double send_s = 0;                         // one activation (or its gradient) to the neighbouring stage
  std::vector<schedule::PipelineSlot> timeline;
  double step_s = 0;   // the timeline's end plus the slowest tail
  double bubble = 0;   // the stages' idle share of the timeline (schedule::pipeline_bubble)
  int slowest = 0;     // the stage with the most work per micro-batch
};
PipelineSim simulate_pipeline(const std::vector<schedule::StepPlan>& one_micro_batch, int micro_batches,
                              const Profile& profile, const SimOptions& opts = {}, int chunks = 1,
                              int microbatch_group = 0);

// The layer as the simulator costs it. A dropless router's capacity is known only after routing, so its Plan is
// built for the bound (every token of a chunk to one expert); the simulator costs it at a balanced load instead,
// every expert ceil(S k / E) of a chunk's S tokens (a fixed capacity of factor 1, padded): the least a dropless
// step moves. Other layers are returned as they are.
model::LayerConfig costed_layer(model::LayerConfig l);
// Simulates the layers alone (schedule::build_layers_step_plan: forward of every layer, then backward in reverse
// order, opts.recompute's replays).
SimResult simulate(const std::vector<schedule::Plan>& layers, const Profile& profile, const SimOptions& opts = {});

// Chrome trace JSON of the predicted timeline, in the format comm::Trace writes (traceEvents, ph "X", pid 0,
// tid = lane, microseconds), so a predicted and a recorded trace open side by side in Perfetto.
void write_chrome_trace(const SimResult& r, const std::string& path);

}  // namespace ampipe::sim
