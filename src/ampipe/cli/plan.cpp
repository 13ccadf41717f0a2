// `ampipe plan`: the Plan of one layer step, printed (docs/plan.md has the format and an example).
//
// Everything here is derived from schedule::build_layer_plan(cfg, M): the task table in issue order, the closed-form
// FLOPs and collective bytes the tasks carry, the planned buffers (model::BufferLayout) and, from the dependencies
// alone, which compute each collective can hide behind: the compute tasks issued after it and before the first task
// that depends on it. The plan is built for --expert-model-parallel-size without launching ranks, so one process
// prints the plan of any ep; under mpirun every rank builds it and rank 0 prints it.
#include "ampipe/cli/plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ampipe/cli/flag_registry.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/core/host_memory.h"
#include "ampipe/model/stage_io.h"
#include "ampipe/schedule/memory_estimate.h"
#include "ampipe/schedule/model_step.h"
#include "ampipe/schedule/plan.h"
#include "ampipe/schedule/pipeline.h"
#include "ampipe/schedule/step_plan.h"
#include "ampipe/train/train_config.h"

namespace ampipe::cli {

void PlanArgs::add_to(CLI::App& app) {
  FlagTargets t;
  t.layer = &layer;
  t.plan = this;
  add_flags(app, kPlan, t);
}

namespace {

using schedule::CollKind;
using schedule::Plan;
using schedule::StepPlan;
using schedule::Task;

// 3 significant digits with a decimal prefix: "12.9 GF", "805 MF", "0 F".
std::string si(double v, const char* unit) {
  static constexpr const char* kPrefix[] = {"", "K", "M", "G", "T", "P", "E"};
  size_t i = 0;
  while (std::fabs(v) >= 999.5 && i + 1 < std::size(kPrefix)) {
    v /= 1000;
    ++i;
  }
  const double a = std::fabs(v);
  const int prec = i == 0 || a >= 99.95 ? 0 : a >= 9.995 ? 1 : 2;
  return fmt::format("{:.{}f} {}{}", v, prec, kPrefix[i], unit);
}

const char* scope_name(model::Scope s) { return s == model::Scope::saved ? "saved" : "shared"; }

std::string deps_str(const Task& t) {
  if (t.deps.empty()) return "-";
  std::string s;
  for (uint32_t d : t.deps) s += (s.empty() ? "" : ",") + std::to_string(d);
  return s;
}

// The compute a collective can hide behind: the compute tasks issued after it and before the first compute task
// that waits for it. A task waits for collective t when it depends on t, or on a collective issued after t on the
// same lane (a lane is an ordered queue: that one completes after t), or on a collective that depends on one of
// those. None of the compute tasks in between depends on t, directly or not.
struct Overlap {
  uint32_t coll = 0;
  std::vector<uint32_t> compute;
  double flops = 0;
  int waiter = -1;   // the first compute task that waits for it; -1: none in this Plan
  int through = -1;  // the task of `waiter`'s deps that it waits on (coll itself, or a later collective)
};

std::vector<Overlap> overlaps(const Plan& p) {
  std::vector<Overlap> out;
  for (const Task& t : p.tasks) {
    if (!t.is_collective()) continue;
    Overlap o;
    o.coll = t.id;
    std::vector<bool> after_t(p.tasks.size(), false);  // tasks that cannot finish before t does
    after_t[t.id] = true;
    for (size_t i = size_t(t.id) + 1; i < p.tasks.size() && o.waiter < 0; ++i) {
      const Task& c = p.tasks[i];
      int via = -1;
      for (uint32_t d : c.deps)
        if (after_t[d] && (via < 0 || d == t.id)) via = int(d);
      if (c.is_collective()) {
        after_t[i] = via >= 0 || c.lane == t.lane;
      } else if (via >= 0) {
        o.waiter = int(i);
        o.through = via;
      } else {
        o.compute.push_back(c.id);
        o.flops += c.flops;
      }
    }
    out.push_back(std::move(o));
  }
  return out;
}

std::string overlap_line(const Plan& p, const Overlap& o) {
  std::string s = p.tasks[o.coll].name();
  if (o.compute.empty())
    s += " overlaps no compute (exposed)";
  else if (o.compute.size() == 1)
    s += fmt::format(" overlaps {} (1 task, {})", p.tasks[o.compute[0]].name(), si(o.flops, "FLOP"));
  else
    s += fmt::format(" overlaps {} .. {} ({} tasks, {})", p.tasks[o.compute.front()].name(),
                     p.tasks[o.compute.back()].name(), o.compute.size(), si(o.flops, "FLOP"));
  if (o.waiter < 0) return s + "; waited by nothing in this Plan";
  s += "; waited by " + p.tasks[size_t(o.waiter)].name();
  if (o.through != int(o.coll))
    s += fmt::format(" (through {}, queued behind it on the {} lane)", p.tasks[size_t(o.through)].name(),
                     comm::lane_name(p.tasks[o.coll].lane));
  return s;
}

std::string work_str(const Task& t) {
  if (!t.is_collective()) return si(t.flops, "F");
  const schedule::CollectiveSpec& c = *t.collective;
  return fmt::format("{} {} {} {} -> {}", schedule::coll_kind_name(c.kind), comm::group_kind_name(c.group),
                     core::format_bytes(c.bytes), model::buf_name(c.send), model::buf_name(c.recv));
}

constexpr CollKind kKinds[] = {CollKind::all_to_all, CollKind::all_gather, CollKind::reduce_scatter,
                               CollKind::all_reduce, CollKind::send_recv};

// The planned bytes of a stack of `layers` such layers with activation recomputation (ampipe train's
// --recompute-granularity): full, every layer (each keeps only its output and input gradient), or selective (the
// attention output and lse transient).
struct RecomputeBytes {
  size_t full = 0, selective = 0;
};
RecomputeBytes recompute_bytes(model::LayerConfig cfg, int M, int layers) {
  RecomputeBytes r;
  cfg.recompute = true;
  r.full = schedule::build_layer_plan(cfg, M).planned_bytes(layers);
  cfg.recompute = false;
  cfg.recompute_attention = true;
  r.selective = schedule::build_layer_plan(cfg, M).planned_bytes(layers);
  return r;
}

nlohmann::json to_json(const model::LayerConfig& cfg, const PlanArgs& a, const Plan& p,
                       const std::vector<Overlap>& ov, double fwd, double bwd, const schedule::MemoryEstimate& mem) {
  using nlohmann::json;
  const model::LayerDims& d = p.dims;
  json doc;
  doc["format"] = "ampipe plan";
  doc["config"] = a.layer.to_json(cfg);
  doc["config"]["ampipe_degree"] = a.ampipe_degree;
  doc["config"]["num_layers"] = a.num_layers;
  doc["dims"] = {{"s", d.s},   {"b", d.b},   {"h", d.h},   {"F", d.F},   {"F1", d.F1},
                 {"n", d.n},   {"d", d.d},   {"E", d.E},   {"k", d.k},   {"ep", d.ep},
                 {"L", d.L},   {"T", d.T},   {"M", d.M},   {"sq", d.sq}, {"Sc", d.Sc},
                 {"C", d.C},   {"R", d.R()}, {"capacity_is_bound", d.capacity_is_bound},
                 {"agree_capacity", d.agree_capacity}, {"defer_expert_wgrad", d.defer_expert_wgrad},
                 {"jitter", d.jitter},
                 {"compute_dtype", std::string(dtype_name(d.cd))}};
  json tasks = json::array();
  for (const Task& t : p.tasks) {
    json j{{"id", t.id},
           {"name", t.name()},
           {"dir", model::dir_name(t.dir)},
           {"stage", t.stage.name()},
           {"layer", t.layer},
           {"chunk", t.chunk},
           {"piece", t.piece},
           {"lane", std::string(comm::lane_name(t.lane))},
           {"deps", t.deps},
           {"flops", t.flops},
           {"bytes", t.bytes},
           {"collective", nullptr}};
    if (t.is_collective()) {
      const schedule::CollectiveSpec& c = *t.collective;
      j["collective"] = {{"kind", schedule::coll_kind_name(c.kind)},
                         {"group", std::string(comm::group_kind_name(c.group))},
                         {"send", model::buf_name(c.send)},
                         {"recv", model::buf_name(c.recv)},
                         {"bytes", c.bytes}};
    } else {  // the compute stage's inputs and outputs (model/stage_io.h)
      const model::StageIO io = model::stage_io(p.dims, t.stage.compute(), t.dir);
      auto names = [](const std::vector<model::Buf>& v) {
        json n = json::array();
        for (model::Buf b : v) n.push_back(model::buf_name(b));
        return n;
      };
      j["reads"] = names(io.reads);
      j["writes"] = names(io.writes);
    }
    tasks.push_back(std::move(j));
  }
  doc["tasks"] = std::move(tasks);
  json bufs = json::array();
  for (const model::BufferSpec& s : p.memory.specs)
    bufs.push_back({{"name", s.name},
                    {"dtype", std::string(dtype_name(s.dtype))},
                    {"shape", s.shape},
                    {"chunks", s.chunks},
                    {"scope", scope_name(s.scope)},
                    {"slot_bytes", s.slot_bytes()},
                    {"bytes", s.bytes()},
                    {"offsets", p.memory.offset[size_t(s.id)]}});
  doc["buffers"] = std::move(bufs);
  json coll = json::object();
  for (CollKind k : kKinds) {
    int n = 0;
    for (const Task& t : p.tasks) n += t.is_collective() && t.collective->kind == k;
    if (n > 0) coll[schedule::coll_kind_name(k)] = {{"tasks", n}, {"bytes", p.collective_bytes(k)}};
  }
  json ovj = json::array();
  for (const Overlap& o : ov) {
    std::vector<std::string> names;
    for (uint32_t i : o.compute) names.push_back(p.tasks[i].name());
    ovj.push_back({{"collective", p.tasks[o.coll].name()},
                   {"overlaps", names},
                   {"flops", o.flops},
                   {"waited_by", o.waiter < 0 ? json(nullptr) : json(p.tasks[size_t(o.waiter)].name())},
                   {"through", o.through < 0 ? json(nullptr) : json(p.tasks[size_t(o.through)].name())}});
  }
  json parts = json::object();
  for (const schedule::MemoryEstimate::Part& part : mem.parts) parts[part.name] = part.bytes;
  doc["summary"] = {{"flops", {{"forward", fwd}, {"backward", bwd}, {"total", p.flops()}}},
                    {"collectives", std::move(coll)},
                    {"memory",
                     {{"saved_bytes_per_layer", p.memory.saved_bytes},
                      {"shared_bytes", p.memory.shared_bytes},
                      {"num_layers", a.num_layers},
                      {"planned_bytes", p.planned_bytes(a.num_layers)},
                      {"planned_bytes_recompute_full", recompute_bytes(cfg, d.M, a.num_layers).full},
                      {"planned_bytes_recompute_selective", recompute_bytes(cfg, d.M, a.num_layers).selective},
                      {"estimate", {{"total_bytes", mem.total()}, {"parts", parts}}}}},
                    {"overlap", std::move(ovj)}};
  return doc;
}

}  // namespace

namespace {

void print_step_plan(const PlanArgs& a, const schedule::ModelShape& m, int64_t G, const StepPlan& p,
                     std::ofstream& json_out, bool json);

// `ampipe plan --step`: the step Plan of a --num-layers model (schedule/model_step.h, the engine's head: the whole
// vocabulary on every tp rank), task by task; a layer task stands for its layer Plan (`ampipe plan` without --step).
int run_step_plan(const PlanArgs& a, const model::LayerConfig& cfg, std::ofstream& json_out, bool rank0) {
  const int P = a.pipeline_model_parallel_size;
  const int v = std::max(1, a.num_virtual_stages_per_pipeline_rank);
  if (P < 1) throw ConfigError(fmt::format("--pipeline-model-parallel-size {} is invalid: it must be >= 1", P));
  if (a.num_virtual_stages_per_pipeline_rank < 0 || (v > 1 && P == 1))
    throw ConfigError(fmt::format("--num-virtual-stages-per-pipeline-rank {} is invalid: it must be >= 1 and needs "
                                  "--pipeline-model-parallel-size > 1",
                                  a.num_virtual_stages_per_pipeline_rank));
  if (a.num_layers % (P * v) != 0)
    throw ConfigError(fmt::format("--num-layers {} is not divisible by --pipeline-model-parallel-size {}{}",
                                  a.num_layers, P,
                                  v > 1 ? fmt::format(" x {} virtual stages per rank", v) : std::string()));
  const int tpcp = cfg.tp() * cfg.cp() * P;
  if (a.world_size < 1 || a.world_size % tpcp != 0)
    throw ConfigError(fmt::format("--world-size {} is invalid: it must be a positive multiple of tp x cp{} = {}",
                                  a.world_size, P > 1 ? " x pp" : "", tpcp));
  if (a.vocab_size < 1) throw ConfigError(fmt::format("--vocab-size {} is invalid: it must be >= 1", a.vocab_size));
  schedule::ModelShape m;
  m.layer = cfg;
  m.num_layers = a.num_layers;
  m.vocab = a.vocab_size;
  m.vocab_parallel = false;
  m.dp = a.world_size / tpcp;
  if ((m.dp * cfg.cp()) % cfg.expert_model_parallel_size != 0)
    throw ConfigError(fmt::format("--world-size {}: dp x cp = {} is not divisible by --expert-model-parallel-size {}",
                                  a.world_size, m.dp * cfg.cp(), cfg.expert_model_parallel_size));
  const int64_t per_iter = cfg.micro_batch_size * m.dp;
  const int64_t G = a.global_batch_size > 0 ? a.global_batch_size : per_iter;
  if (G % per_iter != 0)
    throw ConfigError(fmt::format("--global-batch-size {} is not divisible by --micro-batch-size {} x data-parallel "
                                  "size {}",
                                  G, cfg.micro_batch_size, m.dp));
  m.micro_batches = int(G / per_iter);
  m.pp = P;
  m.chunks = v;
  {  // the interleaved schedule's rules: train's own
    train::TrainConfig t;
    t.num_layers = a.num_layers;
    t.pipeline_model_parallel_size = P;
    t.num_virtual_stages_per_pipeline_rank = v > 1 ? v : 0;
    t.microbatch_group_size_per_vp_stage = a.microbatch_group_size_per_vp_stage;
    t.validate_virtual_stages();
    t.validate_virtual_microbatches(m.micro_batches);
  }
  m.microbatch_group = a.microbatch_group_size_per_vp_stage;
  if (P > 1 && rank0) {  // the timeline in units of one chunk's forward (a backward: two), every stage alike
    const std::vector<schedule::PipelineSlot> t = schedule::pipeline_timeline(
        m.micro_batches, std::vector<double>(size_t(P), v), std::vector<double>(size_t(P), 2.0 * v), 0, v,
        m.microbatch_group);
    const double idle = double(P - 1) / v;
    fmt::print("ampipe plan --step: {} pipeline stages of {} layer{}{}, {} micro-batches per data-parallel rank: "
               "Megatron's {} schedule, a forward one column, a backward two\n{}"
               "  bubble: {:.1f}% of the stages' time ({} = {:.1f}%)\n\n",
               P, a.num_layers / P, a.num_layers / P == 1 ? "" : "s",
               v > 1 ? fmt::format(" in {} virtual stages (chunks a, b, ...)", v) : std::string(), m.micro_batches,
               v > 1 ? "interleaved" : "1F1B", schedule::draw_pipeline(t, P, 1.0),
               100 * schedule::pipeline_bubble(t, P),
               v > 1 ? "((P - 1) / v) / (K + (P - 1) / v)" : "(P - 1) / (K + P - 1)",
               100.0 * idle / (double(m.micro_batches) + idle));
  }
  for (int stage = 0; stage < P; ++stage) {
    m.pp_rank = stage;
    if (P > 1 && rank0) fmt::print("stage {}:\n", stage);
    print_step_plan(a, m, G, schedule::build_step_plan(schedule::model_step_config(m, a.ampipe_degree)), json_out,
                    rank0 && stage == 0);
  }
  if (rank0 && !a.json_file.empty()) fmt::print("wrote {}{}\n", a.json_file, P > 1 ? " (stage 0's step Plan)" : "");
  return 0;
}

// One step Plan, task by task (json: also to --json).
void print_step_plan(const PlanArgs& a, const schedule::ModelShape& m, int64_t G, const StepPlan& p,
                     std::ofstream& json_out, bool json) {
  const bool rank0 = !comm::Runtime::exists() || comm::Runtime::current().rank() == 0;
  if (json && json_out.is_open()) {
    nlohmann::json tasks = nlohmann::json::array();
    for (const schedule::StepTask& t : p.tasks)
      tasks.push_back({{"id", t.id}, {"name", t.name()}, {"op", schedule::step_op_name(t.op)},
                       {"dir", model::dir_name(t.dir)}, {"micro_batch", t.micro_batch}, {"layer", t.layer},
                       {"lane", std::string(comm::lane_name(t.lane))}, {"deps", t.deps}, {"bytes", t.bytes},
                       {"gemm_flops", t.gemm_flops}, {"collective", t.is_collective()},
                       {"layer_tasks", t.is_layer() ? int(p.layer(t.layer).tasks.size()) : 0}});
    json_out << nlohmann::json{{"format", "ampipe plan --step"}, {"micro_batches", m.micro_batches},
                               {"data_parallel_size", m.dp}, {"num_layers", a.num_layers},
                               {"ampipe_degree", a.ampipe_degree}, {"tasks", tasks}}
                    .dump(2)
             << "\n";
    json_out.close();
    if (!json_out) throw ConfigError(fmt::format("--json {}: cannot write the file", a.json_file));
  }
  if (!rank0) return;
  fmt::print("ampipe plan --step: {} layer{}, {} micro-batch{} per rank (global batch {}, dp={}), ampipe-degree={}, "
             "V={} | {} step tasks\n\n",
             p.num_layers(), p.num_layers() == 1 ? "" : "s", m.micro_batches, m.micro_batches == 1 ? "" : "es", G,
             m.dp, a.ampipe_degree, a.vocab_size, p.tasks.size());
  auto deps_of = [](const schedule::StepTask& t) {
    std::string deps;
    for (uint32_t d : t.deps) deps += (deps.empty() ? "" : ",") + std::to_string(d);
    return deps.empty() ? std::string("-") : deps;
  };
  size_t wname = 4, wdeps = 4;
  for (const schedule::StepTask& t : p.tasks) {
    wname = std::max(wname, t.name().size());
    wdeps = std::max(wdeps, deps_of(t).size());
  }
  fmt::print("{:>4}  {:<{}}  {:<7}  {:<{}}  {}\n", "id", "task", wname, "lane", "deps", wdeps, "work");
  for (const schedule::StepTask& t : p.tasks) {
    std::string work;
    if (t.is_layer()) {
      double f = 0;
      int n = 0;
      for (const Task& lt : p.layer(t.layer).tasks)
        if (lt.dir == t.dir) {
          f += lt.flops;
          ++n;
        }
      work = fmt::format("layer Plan: its {} {} tasks, {}", n, model::dir_name(t.dir), si(f, "F"));
    }
    else if (t.is_collective())
      work = fmt::format("{} {} {}", schedule::coll_kind_name(t.kind), comm::group_kind_name(t.group),
                         core::format_bytes(t.bytes));
    else
      work = t.gemm_flops > 0 ? fmt::format("{} GEMM, {} element-wise", si(t.gemm_flops, "F"), core::format_bytes(t.bytes))
                              : fmt::format("{} element-wise", core::format_bytes(t.bytes));
    fmt::print("{:>4}  {:<{}}  {:<7}  {:<{}}  {}\n", t.id, t.name(), wname, comm::lane_name(t.lane), deps_of(t),
               wdeps, work);
  }
  fmt::print("\ngradient buckets: {} all-reduce{} on the dp lane, {} in all; each layer's issued right after its "
             "backward in the last micro-batch (docs/plan.md, \"The step Plan\")\n",
             std::count_if(p.tasks.begin(), p.tasks.end(), [](const auto& t) { return t.op == schedule::StepOp::grad_reduce; }),
             std::count_if(p.tasks.begin(), p.tasks.end(), [](const auto& t) { return t.op == schedule::StepOp::grad_reduce; }) == 1 ? "" : "s",
             core::format_bytes(p.collective_bytes(schedule::StepOp::grad_reduce)));
  if (m.pp > 1)
    fmt::print("pipeline: {} sent (activations on pp_fwd, gradients on pp_bwd){}\n\n",
               core::format_bytes(p.collective_bytes(schedule::StepOp::pp_send)),
               p.collective_bytes(schedule::StepOp::tied_grad) > 0
                   ? fmt::format(", the tied embedding's gradient and weight {} each way",
                                 core::format_bytes(p.collective_bytes(schedule::StepOp::tied_grad)))
                   : std::string());
}

}  // namespace

int run_plan(PlanArgs& a) {
  model::LayerConfig cfg = a.layer.finish();
  const int M = a.ampipe_degree;
  LayerFlags::check_degree(cfg, M);
  a.layer.check_pipe_experts(cfg, {M});
  if (a.num_layers < 1) throw ConfigError(fmt::format("--num-layers {} is invalid: it must be >= 1", a.num_layers));
  const bool rank0 = !comm::Runtime::exists() || comm::Runtime::current().rank() == 0;
  std::ofstream json_out;
  if (!a.json_file.empty() && rank0) {  // before any output, so a bad path fails with nothing else printed
    json_out.open(a.json_file);
    if (!json_out) throw ConfigError(fmt::format("--json {}: cannot write the file", a.json_file));
  }
  if (a.step) return run_step_plan(a, cfg, json_out, rank0);
  const Plan p = schedule::build_layer_plan(cfg, M);
  const schedule::MemoryEstimate mem = schedule::estimate_layer_stack(cfg, a.num_layers, M);
  const std::vector<Overlap> ov = overlaps(p);
  double fwd = 0, bwd = 0;
  for (const Task& t : p.tasks) (t.dir == model::Dir::fwd ? fwd : bwd) += t.flops;
  if (json_out.is_open()) {
    json_out << to_json(cfg, a, p, ov, fwd, bwd, mem).dump(2) << "\n";
    json_out.close();
    if (!json_out) throw ConfigError(fmt::format("--json {}: cannot write the file", a.json_file));
  }
  if (!rank0) return 0;
  for (const std::string& n : a.layer.notices) fmt::print(stderr, "ampipe: note: {}\n", n);

  const model::LayerDims& d = p.dims;
  const std::string cap =
      d.capacity_is_bound ? fmt::format("C={} (bound S_c: --moe-no-drop)", d.C) : fmt::format("C={}", d.C);
  const std::string seq =
      d.cp > 1 ? fmt::format("s={} ({} per cp rank, cp={} ring)", d.s_global, d.s, d.cp) : fmt::format("s={}", d.s);
  fmt::print("ampipe plan: {} b={} h={} F={} heads={} E={} top-{} {} {} | ep={} L={} | ampipe-degree={} "
             "S_c={} {} per chunk | {} tasks\n",
             seq, d.b, d.h, d.F, d.n, d.E, d.k, cfg.bf16 ? "bf16" : "fp32",
             cfg.expert == model::ExpertKind::swiglu ? "swiglu" : "gelu", d.ep, d.L, d.M, d.Sc, cap, p.tasks.size());

  size_t wname = 4, wdeps = 4;
  for (const Task& t : p.tasks) {
    wname = std::max(wname, t.name().size());
    wdeps = std::max(wdeps, deps_str(t).size());
  }
  fmt::print("\n{:>4}  {:<{}}  {:<7}  {:<{}}  {}\n", "id", "task", wname, "lane", "deps", wdeps,
             "FLOPs | collective bytes send -> recv");
  for (const Task& t : p.tasks)
    fmt::print("{:>4}  {:<{}}  {:<7}  {:<{}}  {}\n", t.id, t.name(), wname, comm::lane_name(t.lane), deps_str(t),
               wdeps, work_str(t));

  fmt::print("\nFLOPs: forward {}, backward {}, total {} (closed form, docs/plan.md)\n", si(fwd, "FLOP"),
             si(bwd, "FLOP"), si(p.flops(), "FLOP"));
  fmt::print("collectives (bytes this rank sends per layer step):\n");
  for (CollKind k : kKinds) {
    int n = 0;
    for (const Task& t : p.tasks) n += t.is_collective() && t.collective->kind == k;
    if (n > 0)
      fmt::print("  {:<14} {:>3} tasks  {}\n", schedule::coll_kind_name(k), n, core::format_bytes(p.collective_bytes(k)));
  }
  fmt::print("memory (planned): saved {} per layer, shared {}; {} layer{}: {} x saved + shared = {}\n",
             core::format_bytes(double(p.memory.saved_bytes)), core::format_bytes(double(p.memory.shared_bytes)), a.num_layers,
             a.num_layers == 1 ? "" : "s", a.num_layers, core::format_bytes(double(p.planned_bytes(a.num_layers))));
  const RecomputeBytes rc = recompute_bytes(cfg, d.M, a.num_layers);
  fmt::print("  with ampipe train's recomputation: --recompute-granularity full (every layer keeps its output and input "
             "gradient) {}, selective (attention output and lse transient) {}\n",
             core::format_bytes(double(rc.full)), core::format_bytes(double(rc.selective)));
  fmt::print("memory estimate per rank, {} layer{} (parameters, gradients, bf16 copies, planned buffers; no "
             "optimizer or embeddings: ampipe train adds those): {}\n",
             a.num_layers, a.num_layers == 1 ? "" : "s", mem.describe());
  std::vector<const model::BufferSpec*> big;
  for (const model::BufferSpec& s : p.memory.specs) big.push_back(&s);
  std::stable_sort(big.begin(), big.end(), [](auto* x, auto* y) { return x->bytes() > y->bytes(); });
  big.resize(std::min<size_t>(big.size(), 6));
  fmt::print("  largest buffers:\n");
  for (const model::BufferSpec* s : big)
    fmt::print("    {:<18} {:<6} {:<4} {:<16} x{:<2} {}\n", s->name, scope_name(s->scope), dtype_name(s->dtype),
               shape_str(s->shape), s->chunks, core::format_bytes(double(s->bytes())));
  fmt::print("overlap (compute issued after each collective and before the first compute task that waits for it; "
             "docs/plan.md):\n");
  for (const Overlap& o : ov) fmt::print("  {}\n", overlap_line(p, o));
  if (!a.json_file.empty()) fmt::print("wrote {}\n", a.json_file);
  return 0;
}

}  // namespace ampipe::cli
