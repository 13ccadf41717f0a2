// `ampipe bench-layer`: forward + backward of --num-layers MoE layers for each --ampipe-degree in one run.
//
// Repetitions are interleaved (rep 0 of every degree, then rep 1, ...) so that the machine's drift hits every
// configuration alike, and each rank starts every repetition after a barrier. Per configuration it reports
// (docs/design.md, "How we measure"):
//   step     wall time of forward + backward (median, and min..max over the repetitions)
//   compute  time inside compute stages (executor)
//   comm     the step's all-to-alls run alone, back to back on the ep lane, with nothing else running; likewise
//            the tensor-parallel collectives (tp and etp lanes) and, with context parallelism, the K/V ring's steps
//            (the cp lane's send_recvs, forward and backward), each lane alone
//   exposed  time compute was blocked waiting on communication; per lane from the step's wait records
//            (comm/trace.h: every blocking wait names the task it waited for, so its lane): the all-to-alls', the
//            ring's and the tp collectives' exposed time (a wait on two lanes at once counts for the one waited on)
//   hidden   (serial - step) / min(compute, comm), serial = compute + comm (comm: every lane's, alone); per lane
//            1 - exposed(lane) / comm(lane alone): the share of the ring's (or the all-to-alls') time the step hid
//   speed-up step(degree 1) / step(this degree), TFLOP/s (causal attention counted as such), and memory: the
//   step's peak growth (peak RSS during the step minus RSS when it started: what the step's activations,
//   contexts and buffers need) next to the absolute peak RSS, and the planned memory of the stack (its Plans'
//   buffers, docs/plan.md). One stack is re-planned for each degree (set_degree: the parameters and the bf16 weight
//   copies are kept, the arena is sized for the largest plan), so the absolute peak is that of the largest plan.
#include "ampipe/cli/bench_layer.h"

#include "ampipe/core/output_file.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "ampipe/cli/auto_degree.h"
#include "ampipe/cli/flag_registry.h"
#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/comm/trace.h"
#include "ampipe/core/host_memory.h"
#include "ampipe/core/philox.h"
#include "ampipe/core/parallel.h"
#include "ampipe/model/size_check.h"
#include "ampipe/schedule/layer_stack.h"
#include "ampipe/sim/simulator.h"
#include "ampipe/train/train_config.h"

namespace ampipe::cli {

void BenchLayerArgs::add_to(CLI::App& app) {
  FlagTargets t;
  t.layer = &layer;
  t.comm = &comm;
  t.memory = &memory;
  t.bench = this;
  add_flags(app, kBenchLayer, t);
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A /proc/self/status field in bytes (VmHWM: peak resident set size, VmRSS: current).
int64_t status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line))
    if (line.compare(0, n, field) == 0) return std::stoll(line.substr(n)) * 1024;
  return 0;
}
int64_t peak_rss() { return status_bytes("VmHWM:"); }
int64_t current_rss() { return status_bytes("VmRSS:"); }
// reset_peak_rss() restarts VmHWM at the current RSS (Linux clear_refs 5).
void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct ConfigResult {
  int degree = 1;
  int pipe_n = 0;  // pipe-experts slices per expert; 0: without pipe-experts
  int tp_overlap = 0;  // --ampipe-tp-sp-comm-overlap
  std::vector<double> step_s, compute_s, comm_s, comm_tp_s, comm_cp_s, exposed_s;
  std::vector<double> exposed_ep_s, exposed_cp_s, exposed_tp_s;  // compute blocked on that lane's tasks
  double flops = 0;
  int64_t peak_rss = 0;
  int64_t peak_growth = 0;  // max over repetitions of (peak RSS during the step - RSS at its start)
  size_t planned = 0;       // the stack's planned buffers (LayerStack::planned_bytes)
  double predicted_s = 0;   // the simulator's step for the same Plans (--sim-profile), 0 without
};

// Which timed class of communication a Plan task belongs to (the lanes time_comm_alone times): the EP all-to-alls,
// the context-parallel ring's steps, every tensor-parallel collective (the experts' etp lane included), or none
// (the small capacity all-gathers of --moe-no-drop, the cp gate-statistics all-reduce, compute).
enum class CommClass { none, ep, cp, tp };
CommClass comm_class(const schedule::Task& t) {
  if (!t.is_collective()) return CommClass::none;
  switch (t.lane) {
    case comm::Lane::ep:
      return t.collective->kind == schedule::CollKind::all_to_all ? CommClass::ep : CommClass::none;
    case comm::Lane::cp:
      return t.collective->kind == schedule::CollKind::send_recv ? CommClass::cp : CommClass::none;
    case comm::Lane::tp:
    case comm::Lane::etp: return CommClass::tp;
    default: return CommClass::none;
  }
}

// One class's collectives alone: the same Plan tasks and buffers, in Plan order, back to back on their lane (ep: the
// all-to-alls; tp: every tensor-parallel collective, the experts' on the etp lane included; cp: the ring's steps).
double time_comm_alone(schedule::LayerStack& st, const comm::Group& group, CommClass cls) {
  if (group.size() == 1) return 0.0;
  comm::barrier_sync(group, "comm_alone.start");
  const auto t0 = Clock::now();
  std::vector<comm::Event> evs;
  for (int i = 0; i < st.num_layers(); ++i)
    for (const schedule::Task& t : st.plan(i).tasks) {
      // compute tasks are skipped, and so are the tiny capacity all-gathers of --moe-no-drop and the cp statistics
      if (comm_class(t) != cls) continue;
      evs.push_back(st.executor().issue(t, st.layer(i), {}, "alone." + t.name()));
    }
  comm::wait_all(evs);
  return seconds_since(t0);
}

// Exposed time per class from the step's trace: Event::wait records "wait:<tag>" (the task's name) on the compute
// lane for every wait that blocked; the task's class says whose wait it was.
struct Exposed {
  double ep = 0, cp = 0, tp = 0;
};
Exposed exposed_by_class(const schedule::LayerStack& st, const std::vector<comm::TraceRecord>& records) {
  std::map<std::string, CommClass> cls;
  for (int i = 0; i < st.num_layers(); ++i)
    for (const schedule::Task& t : st.plan(i).tasks)
      if (t.is_collective()) cls[t.name()] = comm_class(t);
  Exposed e;
  for (const comm::TraceRecord& r : records) {
    if (r.cat != "wait" || r.name.compare(0, 5, "wait:") != 0) continue;
    const auto it = cls.find(r.name.substr(5));
    if (it == cls.end()) continue;
    const double s = double(r.end_us - r.start_us) * 1e-6;
    if (it->second == CommClass::ep) e.ep += s;
    if (it->second == CommClass::cp) e.cp += s;
    if (it->second == CommClass::tp) e.tp += s;
  }
  return e;
}

// 1 - exposed / alone: the share of a class's communication the step hid (0 without that communication).
double lane_hidden(double exposed, double alone) { return alone > 0 ? 1.0 - exposed / alone : 0.0; }

}  // namespace

namespace {

// The flags that need no ranks: the degrees (with auto the choice is made once the groups exist, it may calibrate;
// degree 1 runs next to it), the sweeps, the repetitions. Returns whether --ampipe-degree is auto.
bool check_bench_args(BenchLayerArgs& a, model::LayerConfig& cfg, comm::Runtime& rt) {
  const Degrees given = parse_degree(a.degree_text, Grammar::degree_list);
  // With auto the choice is made once the groups exist (it may calibrate); degree 1 runs next to it.
  a.degrees = given.is_auto ? std::vector<int>{1} : given.list;
  for (int M : a.degrees) {
    if (M < 1 || cfg.seq_length % M != 0)
      throw ConfigError(fmt::format("--ampipe-degree {} is invalid for --seq-length {}: the degree must be >= 1 and "
                                    "divide the sequence length",
                                    M, cfg.seq_length));
    model::check_plan_size(cfg, M, std::max(a.num_layers, 1));  // the Plans' task lists (model/size_check.h)
    model::LayerConfig c = cfg;
    c.ampipe_tp_sp_comm_overlap = false;  // the sweep decides; the flag itself is checked with degree > 1 below
    c.check_tensor_parallel(M);
    if (cfg.ampipe_tp_sp_comm_overlap && a.tp_overlap_sweep.empty()) cfg.check_tensor_parallel(M);
  }
  for (int v : a.tp_overlap_sweep)
    if ((v != 0 && v != 1) || (v == 1 && cfg.tp() < 2))
      throw ConfigError(fmt::format("--tp-overlap-sweep {} is invalid: give 0 and/or 1, and 1 needs "
                                    "--tensor-model-parallel-size > 1",
                                    v));
  a.layer.check_pipe_experts(cfg, a.degrees);
  if (rt.rank() == 0)
    for (const std::string& n : a.layer.notices) fmt::print(stderr, "ampipe: note: {}\n", n);
  if (a.num_layers < 1) throw ConfigError(fmt::format("--num-layers {} is invalid: it must be >= 1", a.num_layers));
  if (a.iters < 1 || a.warmup < 0)
    throw ConfigError(fmt::format("--iters {} / --warmup {} are invalid: need iters >= 1, warmup >= 0", a.iters,
                                  a.warmup));
  return given.is_auto;
}

// The configurations: every degree, crossed with --pipe-experts-sweep when given (else the layer flags' setting)
// and --tp-overlap-sweep; those that cannot run are skipped with their reason.
std::vector<ConfigResult> bench_configs(const BenchLayerArgs& a, const model::LayerConfig& cfg,
                                        std::vector<std::string>& skipped) {
  std::vector<ConfigResult> res;
  const std::vector<int> overlaps =
      a.tp_overlap_sweep.empty() ? std::vector<int>{cfg.ampipe_tp_sp_comm_overlap ? 1 : 0} : a.tp_overlap_sweep;
  for (int M : a.degrees) {
    if (a.pipe_experts_sweep.empty()) {
      for (int v : overlaps) {
        if (v == 1 && M == 1) continue;  // nothing to overlap across chunks
        ConfigResult r;
        r.degree = M;
        r.pipe_n = cfg.use_pipe_experts ? cfg.pipe_experts_multi_data : 0;
        r.tp_overlap = v;
        res.push_back(r);
      }
      continue;
    }
    for (int N : a.pipe_experts_sweep) {
      if (N < 0) throw ConfigError(fmt::format("--pipe-experts-sweep {} is invalid: N must be >= 0", N));
      model::LayerConfig c = cfg;
      c.use_pipe_experts = N > 0;
      c.pipe_experts_multi_data = std::max(N, 1);
      try {
        if (!train::drop_idle_pipe_experts(c, {M}).empty()) {
          skipped.push_back(fmt::format("degree {} N {}: nothing to pipeline", M, N));
          continue;
        }
      } catch (const ConfigError& e) {
        skipped.push_back(fmt::format("degree {} N {}: {}", M, N, e.what()));
        continue;
      }
      ConfigResult r;
      r.degree = M;
      r.pipe_n = N;
      r.tp_overlap = overlaps.front();
      res.push_back(r);
    }
  }
  if (res.empty()) throw ConfigError("--pipe-experts-sweep: no combination with --ampipe-degree is valid");
  return res;
}

// This rank's peak memory before the stack is built: one stack re-planned for every configuration, its arena sized
// for the largest, so the largest estimate (schedule/memory_estimate.h), plus x and dy; refused when it does not fit.
void check_bench_memory(const BenchLayerArgs& a, const model::LayerConfig& cfg, const std::vector<ConfigResult>& res,
                        const comm::Groups& groups) {
  schedule::MemoryEstimate mem;
  for (const ConfigResult& r : res) {
    model::LayerConfig c = cfg;
    c.use_pipe_experts = r.pipe_n > 0;
    c.pipe_experts_multi_data = std::max(r.pipe_n, 1);
    c.ampipe_tp_sp_comm_overlap = r.tp_overlap > 0;
    schedule::MemoryEstimate e = schedule::estimate_layer_stack(c, a.num_layers, r.degree);
    if (e.total() > mem.total()) mem = std::move(e);
  }
  mem.add("input and upstream gradient",
          model::checked_elements("the [s, b, h] input and upstream gradient",
                                  {{nullptr, 2 * 4}, {"--seq-length", cfg.seq_length},
                                   {"--micro-batch-size", cfg.micro_batch_size}, {"--hidden-size", cfg.hidden_size}},
                                  1));
  const int64_t rss_now = std::max<int64_t>(core::current_rss_bytes(), 0);
  mem.parts.insert(mem.parts.begin(), {"process now (code, MPI)", rss_now});
  check_memory_fits(mem, rss_now, a.memory, groups.world);
}

// The timed repetitions, configurations interleaved within each; the --trace file gets the last repetition of
// every configuration.
void time_configs(const BenchLayerArgs& a, std::vector<ConfigResult>& res, schedule::LayerStack& st, const Tensor& x,
                  const Tensor& dy, uint64_t token_base, comm::Groups& groups) {
  const bool tracing = !a.trace_file.empty();
  // Every timed step is traced (its wait records give each lane's exposed time); the --trace file gets the last
  // repetition of every configuration, kept aside here and recorded again before it is written.
  std::vector<comm::TraceRecord> kept;
  for (int rep = 0; rep < a.warmup + a.iters; ++rep)
    for (size_t c = 0; c < res.size(); ++c) {
      st.replan(res[c].degree, res[c].pipe_n, res[c].tp_overlap);
      const bool timed = rep >= a.warmup, last = rep == a.warmup + a.iters - 1;
      st.executor().reset_stats();
      st.zero_grads();
      comm::barrier_sync(groups.world, "bench.rep");
      comm::Trace::clear();
      comm::Trace::set_enabled(timed);
      reset_peak_rss();
      const int64_t rss0 = current_rss();
      const auto t0 = Clock::now();
      st.forward(x, token_base);
      st.backward(dy, float(a.layer.moe_aux_loss_coeff));
      const double step = seconds_since(t0);
      if (tracing && last)
        comm::Trace::record(comm::Lane::compute,
                            fmt::format("bench.step degree={} N={} tp-overlap={}", res[c].degree, res[c].pipe_n,
                                        res[c].tp_overlap),
                            -1,
                            comm::Trace::to_us(t0), comm::Trace::now_us(), 0, 0, "step");
      comm::Trace::set_enabled(false);
      const std::vector<comm::TraceRecord> records = comm::Trace::snapshot();
      if (tracing && last) kept.insert(kept.end(), records.begin(), records.end());
      const double comm_alone = time_comm_alone(st, groups.ep, CommClass::ep);
      const double comm_tp_alone = time_comm_alone(st, groups.tp, CommClass::tp);
      const double comm_cp_alone = time_comm_alone(st, groups.cp, CommClass::cp);
      if (timed) {
        const Exposed ex = exposed_by_class(st, records);
        ConfigResult& r = res[c];
        r.step_s.push_back(step);
        r.compute_s.push_back(double(st.executor().stats().compute_us) * 1e-6);
        r.exposed_s.push_back(double(st.executor().stats().blocked_us) * 1e-6);
        r.comm_s.push_back(comm_alone);
        r.comm_tp_s.push_back(comm_tp_alone);
        r.comm_cp_s.push_back(comm_cp_alone);
        r.exposed_ep_s.push_back(ex.ep);
        r.exposed_cp_s.push_back(ex.cp);
        r.exposed_tp_s.push_back(ex.tp);
        r.flops = st.flops();
        r.planned = st.planned_bytes();
        r.peak_rss = std::max(r.peak_rss, peak_rss());
        r.peak_growth = std::max(r.peak_growth, peak_rss() - rss0);
      }
    }
  comm::Trace::clear();
  if (tracing) {
    comm::Trace::set_enabled(true);
    for (comm::TraceRecord& r : kept) comm::Trace::record(std::move(r));
    comm::Trace::set_enabled(false);
    comm::Trace::write_chrome_trace(a.trace_file);
  }

}

// The table (and --json) from rank 0: every rank ran the same configurations; rank 0's timings stand for the step.
void report_bench(const BenchLayerArgs& a, const model::LayerConfig& cfg, const std::vector<ConfigResult>& res,
                  const std::vector<std::string>& skipped, const comm::Layout& layout, int world) {
  // Report from rank 0 (every rank ran the same configurations; rank 0's timings stand for the step).
  const double base_step = median(res[0].step_s);
  nlohmann::json out = nlohmann::json::array();
  const bool tp = cfg.tp() > 1, cp = cfg.cp() > 1, ep = layout.ep > 1;
  fmt::print("ampipe bench-layer: s={} b={} h={} F={} heads={} E={} top-{} {} layers={} | ranks={} {}{}ep={} | "
             "{} warm-up + {} timed repetitions, interleaved\n",
             cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_attention_heads,
             cfg.num_experts, cfg.moe_router_topk, cfg.bf16 ? "bf16" : "fp32", a.num_layers, world,
             tp ? fmt::format("tp={}{} ", cfg.tp(), cfg.sp() ? " (sequence parallel)" : "") : "",
             cp ? fmt::format("cp={} ", cfg.cp()) : "", layout.ep, a.warmup, a.iters);
  fmt::print("  {}\n", threading_summary(world));
  for (const std::string& s : skipped) fmt::print("  skipped: {}\n", s);
  // comm ms: the all-to-alls alone; tp comm ms: the tensor-parallel collectives alone; ring ms: the cp ring's steps
  // alone; hidden: the share of the smaller of compute and (all communication) that the step hides,
  // (compute + comm + tp comm + ring - step) / min; a2a / ring / tp hid: per class, 1 - exposed / alone.
  fmt::print("{:>6} {:>3}{} {:>10} {:>17} {:>10} {:>10}{}{} {:>10} {:>7}{}{}{} {:>8} {:>8} {:>10} {:>9} {:>9}{}\n",
             "degree", "N", tp ? " tp-ov" : "", "step ms", "min..max", "compute ms", "comm ms",
             tp ? " tp comm ms" : "", cp ? "    ring ms" : "", "exposed ms", "hidden", ep ? " a2a hid" : "",
             cp ? " ring hid" : "", tp ? "  tp hid" : "", "speedup", "TFLOP/s", "step +MiB", "peak MiB", "plan MiB",
             a.sim_profile.empty() ? "" : " predicted ms  error");
  for (const ConfigResult& r : res) {
    const double step = median(r.step_s), comp = median(r.compute_s), comm_ep = median(r.comm_s),
                 comm_tp = median(r.comm_tp_s), comm_cp = median(r.comm_cp_s), exposed = median(r.exposed_s);
    const double exp_ep = median(r.exposed_ep_s), exp_cp = median(r.exposed_cp_s), exp_tp = median(r.exposed_tp_s);
    const double hid_ep = lane_hidden(exp_ep, comm_ep), hid_cp = lane_hidden(exp_cp, comm_cp),
                 hid_tp = lane_hidden(exp_tp, comm_tp);
    const double comm_t = comm_ep + comm_tp + comm_cp;
    const double lo = *std::min_element(r.step_s.begin(), r.step_s.end());
    const double hi = *std::max_element(r.step_s.begin(), r.step_s.end());
    const double mn = std::min(comp, comm_t);
    const double hidden = mn > 0 ? (comp + comm_t - step) / mn : 0.0;
    fmt::print(
        "{:>6} {:>3}{} {:>10.2f} {:>8.2f}..{:<8.2f} {:>10.2f} {:>10.2f}{}{} {:>10.2f} {:>7.2f}{}{}{} {:>8.3f} {:>8.4f} "
        "{:>10.1f} {:>9.1f} {:>9.1f}{}\n",
        r.degree, r.pipe_n, tp ? fmt::format(" {:>5}", r.tp_overlap ? "on" : "off") : "", 1e3 * step, 1e3 * lo,
        1e3 * hi, 1e3 * comp, 1e3 * comm_ep, tp ? fmt::format(" {:>10.2f}", 1e3 * comm_tp) : "",
        cp ? fmt::format(" {:>10.2f}", 1e3 * comm_cp) : "", 1e3 * exposed, hidden,
        ep ? fmt::format(" {:>7.2f}", hid_ep) : "", cp ? fmt::format(" {:>8.2f}", hid_cp) : "",
        tp ? fmt::format(" {:>7.2f}", hid_tp) : "", base_step / step,
        r.flops / step / 1e12, double(r.peak_growth) / (1 << 20), double(r.peak_rss) / (1 << 20),
        double(r.planned) / (1 << 20),
        r.predicted_s > 0 ? fmt::format(" {:>12.2f} {:>+6.1f}%", 1e3 * r.predicted_s, 100 * (r.predicted_s / step - 1))
                          : std::string());
    std::vector<double> all_ms;  // every timed step, in ms like the other *_ms fields (was seconds)
    for (double t : r.step_s) all_ms.push_back(1e3 * t);
    out.push_back({{"degree", r.degree},
                   {"pipe_experts_multi_data", r.pipe_n},
                   {"step_ms", 1e3 * step},
                   {"step_ms_min", 1e3 * lo},
                   {"step_ms_max", 1e3 * hi},
                   {"step_ms_all", all_ms},
                   {"compute_ms", 1e3 * comp},
                   {"tp_overlap", r.tp_overlap},
                   {"comm_alone_ms", 1e3 * comm_ep},
                   {"comm_tp_alone_ms", 1e3 * comm_tp},
                   {"comm_cp_ring_alone_ms", 1e3 * comm_cp},
                   {"exposed_ms", 1e3 * exposed},
                   {"exposed_ep_ms", 1e3 * exp_ep},
                   {"exposed_cp_ring_ms", 1e3 * exp_cp},
                   {"exposed_tp_ms", 1e3 * exp_tp},
                   {"hidden_fraction", hidden},
                   {"ep_hidden_fraction", hid_ep},
                   {"cp_ring_hidden_fraction", hid_cp},
                   {"tp_hidden_fraction", hid_tp},
                   {"speedup", base_step / step},
                   {"tflops", r.flops / step / 1e12},
                   {"peak_rss_bytes", r.peak_rss},
                   {"step_peak_growth_bytes", r.peak_growth},
                   {"planned_bytes", r.planned},
                   {"predicted_step_ms", 1e3 * r.predicted_s}});
  }
  if (!a.json_file.empty()) {
    nlohmann::json config = a.layer.to_json(cfg);
    config["num_layers"] = a.num_layers;
    config["ranks"] = world;
    nlohmann::json doc{{"config", config}, {"results", out}};
    core::write_output(core::open_output(a.json_file, "--json"), doc.dump(2) + "\n", a.json_file, "--json");
  }
}

}  // namespace

int run_bench_layer(BenchLayerArgs& a) {
  model::LayerConfig cfg = a.layer.finish();
  comm::Runtime& rt = comm::Runtime::current();
  a.comm.apply();
  if (a.poll_us >= 0) rt.set_poll_interval(std::chrono::microseconds(a.poll_us));
  const bool auto_degree = check_bench_args(a, cfg, rt);
  // world = tp x cp x dp (Layout::make refuses a world not divisible by tp x cp, in one line)
  const comm::Layout layout = comm::Layout::make(rt.size(), cfg.tp(), cfg.cp(), cfg.expert_model_parallel_size);
  (void)a.memory.limit_bytes();  // a bad --memory-limit is refused before anything runs
  comm::Groups groups = rt.make_groups(layout);
  {
    nlohmann::json agree = a.layer.to_json(cfg);
    agree["seed"] = cfg.seed;
    agree["hidden_dropout"] = cfg.hidden_dropout;
    agree["ampipe_degree"] = a.degree_text;
    agree["pipe_experts_sweep"] = a.pipe_experts_sweep;
    agree["tp_overlap_sweep"] = a.tp_overlap_sweep;
    agree["num_layers"] = a.num_layers;
    agree["iters"] = a.iters;
    agree["warmup"] = a.warmup;
    check_ranks_agree(agree, groups.world);
  }
  check_output_file("--trace", a.trace_file, groups.world);
  check_output_file("--json", a.json_file, groups.world);
  const comm::Layout::Coord me = layout.coord(rt.rank());
  if (auto_degree) {
    const DegreeChoice choice = choose_degree(cfg, a.num_layers, groups, a.sim_profile, nullptr);
    if (rt.rank() == 0) fmt::print("{}\n", choice.describe());
    if (choice.degree != 1) a.degrees.push_back(choice.degree);
  }
  // One stack (one copy of the parameters, gradients and bf16 weights), re-planned for each configuration before
  // its repetition: re-planning is outside the timed step, and the arena only grows while the first round runs.
  std::vector<std::string> skipped;
  std::vector<ConfigResult> res = bench_configs(a, cfg, skipped);
  check_bench_memory(a, cfg, res, groups);
  // Context and sequence parallel: this rank's rows, s / cp (/ tp with SP) of them (the layout differs by degree,
  // but any rows will do for timing: each rank draws its own share of the micro-batch's numbers).
  const int64_t tp_rows = cfg.sp() ? cfg.tp() : 1;
  const Shape act{cfg.seq_length / cfg.cp() / tp_rows, cfg.micro_batch_size, cfg.hidden_size};
  Tensor x = Tensor::empty(act), dy = Tensor::empty(act);
  const core::PhiloxKey key{cfg.seed, 0, core::RngPurpose::data};
  const int64_t base = (int64_t(me.cp) * tp_rows + (cfg.sp() ? me.tp : 0)) * x.numel();
  parallel_for(x.numel(), kElementGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      x.data<float>()[i] = core::philox_normal(key, uint64_t(2 * me.dp), uint64_t(base + i));
      dy.data<float>()[i] = core::philox_normal(key, uint64_t(2 * me.dp + 1), uint64_t(base + i));
    }
  });
  const uint64_t token_base = uint64_t(me.dp) * uint64_t(cfg.tokens());
  model::LayerConfig first = cfg;
  first.ampipe_tp_sp_comm_overlap = res[0].tp_overlap > 0;
  schedule::LayerStack st(first, a.num_layers, res[0].degree, me.ep, &groups);
  if (!a.sim_profile.empty()) {  // the prediction of the very Plans that run (sim/simulator.h)
    const sim::Profile prof = sim::load_profile(a.sim_profile, "--sim-profile");
    for (ConfigResult& r : res) {
      st.replan(r.degree, r.pipe_n, r.tp_overlap);
      std::vector<schedule::Plan> plans;
      for (int i = 0; i < st.num_layers(); ++i) plans.push_back(st.plan(i));
      r.predicted_s = sim::simulate(plans, prof).step_s;
    }
  }
  rt.end_startup();  // the steps: waits are bounded by --comm-timeout from here on
  time_configs(a, res, st, x, dy, token_base, groups);
  if (rt.rank() == 0) report_bench(a, cfg, res, skipped, layout, rt.size());
  return 0;
}

}  // namespace ampipe::cli
