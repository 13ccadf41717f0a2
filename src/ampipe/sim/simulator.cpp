#include "ampipe/sim/simulator.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>

#include "ampipe/core/error.h"
#include "ampipe/core/safetensors.h"

namespace ampipe::sim {

using comm::GroupKind;
using comm::Lane;
using model::Dir;
using model::Stage;
using schedule::CollKind;
using schedule::Plan;
using schedule::Task;

namespace {

bool is_gemm_stage(Stage s) {
  switch (s) {
    case Stage::ln1_qkv:
    case Stage::qkv:
    case Stage::out_proj:
    case Stage::experts:
    case Stage::attention_wgrad:
    case Stage::expert_wgrad:
    case Stage::mlp:
    case Stage::mlp_wgrad:
    case Stage::gate: return true;
    default: return false;
  }
}

// amount / rate, refusing a zero rate that is needed (a hand-made Profile with a field left at 0).
double per(double amount, double rate, const Profile& p, const char* field) {
  if (amount <= 0) return 0;
  if (!(rate > 0))
    throw ConfigError(fmt::format("profile {}: field {} is {}: it must be a positive number", p.name, field, rate));
  return amount / rate;
}

}  // namespace

double gemm_rate(const ComputeRates& r, double d) {
  return r.gemm_peak_tflops * 1e12 * d / (d + r.gemm_half_rate_dim);
}

double gemm_min_dim(const Task& t, const model::LayerDims& d) {
  // tp ranks: the attention core's GEMMs have hl = h/t columns of q, k, v (out-projection K), the experts F/t
  const double h = double(d.h), hl = double(d.hl), F = double(d.Fl), Sc = double(d.Sc), Scl = double(d.Scl),
               T = double(d.T), E = double(d.E);
  switch (t.stage.compute()) {
    case Stage::ln1_qkv:
    case Stage::qkv: return std::min({Sc, h, double(d.qkvl)});  // [S_c, h] x [h, qkvl] and its dx GEMM
    case Stage::out_proj: return std::min({Sc, h, hl});  // [S_c, h/t] x [h/t, h] and its dx GEMM
    case Stage::gate: return std::min({Scl, h, E});  // [Scl, h] x [h, E]; backward K = E (dx) and K = Scl (dWg)
    case Stage::experts: {                          // per local expert [R, h] x [h, F1], [R, F] x [F, h]
      double rows = double(d.R());
      if (t.piece >= 0 && size_t(t.piece) < d.pieces.size()) {
        const model::ExpertPiece& p = d.pieces[size_t(t.piece)];
        rows = double(d.srcs * p.slots);
      }
      return std::min({rows, h, F});
    }
    case Stage::attention_wgrad: return std::min({T, h, hl});  // K = T over all chunks' rows
    case Stage::expert_wgrad: return std::min({double(d.M) * double(d.R()), h, F});  // K = M*R
    case Stage::mlp: return std::min({Sc, h, double(d.Fml)});  // [S_c, h] x [h, F1_m/t], [S_c, F_m/t] x [F_m/t, h]
    case Stage::mlp_wgrad: return std::min({T, h, double(d.Fml)});  // K = T
    default: return 0;
  }
}

double collective_seconds(CollKind kind, double bytes, int g, const LinkClass& link) {
  double off = 0;  // bytes that leave the rank
  if (g > 1) {
    const double gg = double(g);
    switch (kind) {
      case CollKind::all_to_all: off = bytes * (gg - 1) / gg; break;
      case CollKind::all_gather: off = bytes * (gg - 1); break;
      case CollKind::reduce_scatter: off = bytes * (gg - 1) / gg; break;
      case CollKind::all_reduce: off = 2 * bytes * (gg - 1) / gg; break;
      case CollKind::send_recv: off = bytes; break;
    }
  }
  double s = link.latency_us * 1e-6;
  if (off > 0) {
    if (!(link.gbps > 0))
      throw ConfigError(fmt::format("profile: a link's gbps is {}: it must be a positive number", link.gbps));
    s += off / (link.gbps * 1e9);
  }
  return s;
}

namespace {
// The size of group g with an EP group of `ep` ranks.
int group_size_with_ep(GroupKind g, int ep, const SimOptions& o) {
  switch (g) {
    case GroupKind::ep: return std::max(1, ep);
    case GroupKind::tp: return o.tp_size;
    case GroupKind::cp: return o.cp_size;
    case GroupKind::dp: return o.dp_size;
    case GroupKind::dp_cp: return o.dp_size * o.cp_size;
    case GroupKind::edp: return std::max(1, o.dp_size * o.cp_size / std::max(1, ep));
    case GroupKind::world:
    case GroupKind::stage: return o.tp_size * o.cp_size * o.dp_size;
    case GroupKind::pp: return 2;  // a send to the neighbouring stage (simulate_pipeline)
  }
  return 1;
}
}  // namespace

int group_size(GroupKind g, const Plan& plan, const SimOptions& o) {
  return group_size_with_ep(g, int(plan.dims.ep), o);
}

bool group_spans_nodes(GroupKind g, const SimOptions& o) {
  switch (g) {
    case GroupKind::ep: return o.ep_spans_nodes;
    case GroupKind::tp: return o.tp_spans_nodes;
    case GroupKind::cp: return o.cp_spans_nodes;
    case GroupKind::dp: return o.dp_spans_nodes;
    case GroupKind::dp_cp:
    case GroupKind::edp: return o.dp_spans_nodes || o.cp_spans_nodes;
    case GroupKind::world:
    case GroupKind::stage: return o.tp_spans_nodes || o.cp_spans_nodes || o.dp_spans_nodes || o.ep_spans_nodes;
    case GroupKind::pp: return o.pp_spans_nodes;
  }
  return false;
}

double cost_seconds(const Task& t, const Plan& plan, const Profile& profile, const SimOptions& opts) {
  if (t.is_collective()) {
    const schedule::CollectiveSpec& c = *t.collective;
    return collective_seconds(c.kind, c.bytes, group_size(c.group, plan, opts),
                              profile.link(group_spans_nodes(c.group, opts)));
  }
  double s = profile.task_overhead_us * 1e-6;
  if (is_gemm_stage(t.stage.compute())) {
    const bool fp32 = t.stage == Stage::gate || plan.dims.cd == DType::f32;
    const ComputeRates& r = t.stage == Stage::gate ? profile.fp32 : profile.rates(plan.dims.cd);
    const double d = std::max(1.0, gemm_min_dim(t, plan.dims));
    s += per(t.flops, gemm_rate(r, d), profile,
             fp32 ? "compute.fp32.gemm_peak_tflops" : "compute.bf16.gemm_peak_tflops");
  } else if (t.stage == Stage::attention || t.stage == Stage::attention_recompute) {
    const ComputeRates& r = profile.rates(plan.dims.cd);
    const bool fwd = t.dir == Dir::fwd || t.stage == Stage::attention_recompute;  // a recompute is a forward
    const char* dt = plan.dims.cd == DType::f32 ? "fp32" : "bf16";
    const std::string field = fmt::format("compute.{}.attention_{}_tflops", dt, fwd ? "fwd" : "bwd");
    s += per(t.flops, (fwd ? r.attention_fwd_tflops : r.attention_bwd_tflops) * 1e12, profile, field.c_str());
  } else {  // element-wise: residual_ln2, gate_assign, weighted_sum, aux_loss
    s += per(t.bytes, profile.elementwise_gbps * 1e9, profile, "elementwise_gbps");
  }
  return s;
}

namespace {

// One task of the step being simulated: a layer Plan's task or a step task.
struct Item {
  std::string name;
  Lane lane = Lane::compute;
  bool coll = false;
  std::string stage;  // model::stage_name of the task, "dp_allreduce" for the gradient all-reduce
  std::string cat = "compute";
  std::string link;  // collectives: the link class, a shared resource
  int chunk = -1;
  double bytes = 0;
  double cost = 0;
  std::vector<size_t> deps;  // item indices
  uint64_t seq = 0;          // issue order of collectives
  double issue = -1, start = -1, end = -1, wait = 0;
  bool done = false;
};

constexpr long kNone = -1;

}  // namespace

double step_task_seconds(const schedule::StepTask& t, const Profile& profile, const SimOptions& opts) {
  AMPIPE_CHECK(!t.is_layer(), "step_task_seconds: {} is a layer task (its cost is its layer Plan's)", t.name());
  if (t.is_collective()) {
    return collective_seconds(t.kind, t.bytes, step_group_size(t.group, opts),
                              profile.link(group_spans_nodes(t.group, opts)));
  }
  double s = profile.task_overhead_us * 1e-6;
  s += per(t.gemm_flops, gemm_rate(profile.fp32, std::max(1.0, t.gemm_min_dim)), profile,
           "compute.fp32.gemm_peak_tflops");
  return s + per(t.bytes, profile.elementwise_gbps * 1e9, profile, "elementwise_gbps");
}

int step_group_size(GroupKind g, const SimOptions& o) { return group_size_with_ep(g, o.ep_size, o); }

namespace {

// The items of one step: each layer task expanded into its layer Plan's tasks of its direction (a phase that ends
// waiting for its collectives, as Executor::run does), each other step task one item (its own phase; its
// collectives are waited for where a later task depends on them).
struct Phase {
  std::vector<size_t> items;
  bool drain = true;
};

Item plan_item(const Task& t, const Plan& plan, const Profile& profile, const SimOptions& opts,
               const std::string& prefix) {
  Item it;
  it.name = prefix + t.name();
  it.lane = t.lane;
  it.coll = t.is_collective();
  it.stage = t.stage.name();
  AMPIPE_CHECK(it.coll == (t.lane != Lane::compute), "simulate: task {} is {} on lane {}", it.name,
               it.coll ? "a collective" : "compute", comm::lane_name(t.lane));
  it.chunk = t.chunk;
  if (it.coll) {
    it.cat = schedule::coll_kind_name(t.collective->kind);
    it.link = profile.link_name(group_spans_nodes(t.collective->group, opts));
    it.bytes = t.collective->bytes;
  } else {
    it.bytes = t.bytes;
  }
  it.cost = cost_seconds(t, plan, profile, opts);
  return it;
}

// The stage a step task's item is charged to ("dp_allreduce" for the gradient buckets, as the reports name it).
std::string step_stage(const schedule::StepTask& t) {
  return t.op == schedule::StepOp::grad_reduce ? "dp_allreduce" : schedule::step_op_name(t.op);
}

void add_step_items(const schedule::StepPlan& step, const Profile& profile, const SimOptions& opts,
                    std::vector<Item>& items, std::vector<Phase>& phases) {
  const bool many = step.config.micro_batches > 1;
  std::vector<size_t> item_of(step.tasks.size(), 0);  // step task -> its (last) item
  for (const schedule::StepTask& st : step.tasks) {
    if (st.is_layer()) {
      const Plan& plan = step.layer(st.layer);
      const bool replay = st.op == schedule::StepOp::recompute;
      const Dir dir = replay ? Dir::fwd : st.dir;
      const std::string prefix =
          (replay ? "recompute:" : "") + (many ? fmt::format("mb{}.", st.micro_batch) : std::string());
      std::vector<long> index(plan.tasks.size(), kNone);  // task id -> its item in this phase
      Phase ph;
      for (size_t k = 0; k < plan.tasks.size(); ++k) {
        const Task& t = plan.tasks[k];
        AMPIPE_CHECK(t.id == k, "simulate: task {} has id {}: ids must be indices", t.name(), t.id);
        if (t.dir != dir) continue;
        Item it = plan_item(t, plan, profile, opts, prefix);
        for (uint32_t d : t.deps) {
          AMPIPE_CHECK(d < t.id, "simulate: task {} depends on task {}, not an earlier one", it.name, d);
          if (index[d] != kNone) it.deps.push_back(size_t(index[d]));  // the other direction's: done before
        }
        index[k] = long(items.size());
        ph.items.push_back(items.size());
        items.push_back(std::move(it));
      }
      if (!ph.items.empty()) {
        item_of[st.id] = ph.items.back();
        phases.push_back(std::move(ph));
      }
      continue;
    }
    Item it;
    it.name = st.name();
    it.lane = st.lane;
    it.coll = st.is_collective();
    it.stage = step_stage(st);
    it.bytes = st.bytes;
    if (it.coll) {
      it.cat = schedule::coll_kind_name(st.kind);
      it.link = profile.link_name(group_spans_nodes(st.group, opts));
    }
    it.cost = step_task_seconds(st, profile, opts);
    for (uint32_t d : st.deps) {
      AMPIPE_CHECK(d < st.id, "simulate: step task {} depends on task {}, not an earlier one", it.name, d);
      it.deps.push_back(item_of[d]);
    }
    item_of[st.id] = items.size();
    phases.push_back(Phase{{items.size()}, false});
    items.push_back(std::move(it));
  }
}

}  // namespace

SimResult simulate(const std::vector<Plan>& layers, const Profile& profile, const SimOptions& opts) {
  return simulate(schedule::build_layers_step_plan(layers, opts.recompute), profile, opts);
}

namespace {

// The event loop over one step's items: the compute lane walks the phases in order, the lanes serve their queues.
class Simulation {
 public:
  Simulation(std::vector<Item> items, std::vector<Phase> phases, const Profile& profile)
      : items_(std::move(items)), phases_(std::move(phases)), slow_(1 + profile.compute_slowdown_during_comm) {
    lane_busy_.fill(kNone);
  }
  SimResult run();

 private:
  bool deps_done(const Item& it) const {
    return std::all_of(it.deps.begin(), it.deps.end(), [&](size_t d) { return items_[d].done; });
  }
  bool start_compute_lane();  // issues collectives, starts the next compute task or ends a phase; false: nothing
  bool start_collectives();   // the ready heads of the lane queues whose link is free
  void advance();             // to the next event: a compute task's or a collective's end
  void queued(double a, double b, size_t xi);
  void charge(double from, double to, size_t xi);
  void record_waits(double from, const std::vector<size_t>& on);
  SimResult results();

  std::vector<Item> items_;
  std::vector<Phase> phases_;
  const double slow_;
  double now_ = 0;
  size_t ph_ = 0, pos_ = 0;
  long running_ = kNone;        // the compute task in progress
  double remaining_ = 0;        // its work left, in seconds at full speed
  double free_since_ = 0;       // when the compute lane last became idle
  std::vector<size_t> issued_;  // collectives of the current phase, in issue order
  std::array<std::deque<size_t>, comm::kNumLanes> queue_;
  std::array<long, comm::kNumLanes> lane_busy_;
  std::map<std::string, long> link_busy_;
  int in_flight_ = 0;
  uint64_t seq_ = 0;
  // Collectives in the order they started (start times ascending).
  std::vector<size_t> started_;
  std::vector<SimRecord> waits_;
  std::map<std::string, double> exposed_by_stage_;
};

// Time [a, b) that collective x sat ready but queued is charged to the collectives occupying its lane or link then
// (x itself for any part nothing occupied). One lane runs one collective at a time, and so does one link: scanning
// back from the latest started, once a collective of x's lane and one of x's link have ended before `a`, no
// earlier one of either can overlap [a, b).
void Simulation::queued(double a, double b, size_t xi) {
  const Item& x = items_[xi];
  std::vector<size_t> occ;
  std::vector<double> cut{a, b};
  bool lane_closed = false, link_closed = false;
  for (size_t k = started_.size(); k-- > 0 && !(lane_closed && link_closed);) {
    const size_t yi = started_[k];
    const Item& y = items_[yi];
    const bool same_lane = y.lane == x.lane, same_link = y.link == x.link;
    if (yi == xi || (!same_lane && !same_link) || y.start >= b) continue;
    if (y.end <= a) {
      lane_closed = lane_closed || same_lane;
      link_closed = link_closed || same_link;
      continue;
    }
    occ.push_back(yi);
    cut.push_back(std::max(a, y.start));
    cut.push_back(std::min(b, y.end));
  }
  std::sort(occ.begin(), occ.end());  // item order
  std::sort(cut.begin(), cut.end());
  for (size_t k = 0; k + 1 < cut.size(); ++k) {
    const double lo = cut[k], hi = cut[k + 1];
    if (hi <= lo) continue;
    size_t who = xi;  // the first occupant covering [lo, hi), in item order
    for (size_t yi : occ)
      if (items_[yi].start <= lo && items_[yi].end >= hi) {
        who = yi;
        break;
      }
    exposed_by_stage_[items_[who].stage] += hi - lo;
  }
}

// A wait [from, to) for collective x is charged to what held it up: x while it ran; before x started, the
// collective dependency of x that ended last (recursively: a combine waits for its tp reduction, that for the
// experts' all-gather ...), and the time x sat ready but queued (queued()).
void Simulation::charge(double from, double to, size_t xi) {
  const Item& x = items_[xi];
  const double began = std::clamp(x.start, from, to);
  exposed_by_stage_[x.stage] += to - began;
  if (began <= from) return;
  size_t last = items_.size();
  for (size_t d : x.deps)
    if (items_[d].coll && items_[d].end > from && (last == items_.size() || items_[d].end > items_[last].end)) last = d;
  const double dep_end = last == items_.size() ? from : std::min(items_[last].end, began);
  queued(dep_end, began, xi);
  if (last != items_.size()) charge(from, dep_end, last);
}

// The compute lane waited [from, now) for `on` (in this order, as the executor waits on events one by one): one
// "wait:<collective>" record per collective that was not finished yet when its wait began.
void Simulation::record_waits(double from, const std::vector<size_t>& on) {
  double cur = from;
  for (size_t d : on) {
    const Item& x = items_[d];
    if (!x.coll || x.end <= cur) continue;
    SimRecord w;
    w.name = "wait:" + x.name;
    w.lane = Lane::compute;
    w.start_s = cur;
    w.end_s = x.end;
    w.cat = "wait";
    w.chunk = x.chunk;
    w.bytes = x.bytes;
    w.stage = x.stage;
    charge(w.start_s, w.end_s, d);
    waits_.push_back(std::move(w));
    cur = x.end;
  }
}

bool Simulation::start_compute_lane() {
  if (running_ != kNone || ph_ >= phases_.size()) return false;
  const std::vector<size_t>& P = phases_[ph_].items;
  if (pos_ < P.size()) {
    Item& it = items_[P[pos_]];
    if (it.coll) {  // issued without waiting; its lane and link decide when it starts
      it.issue = now_;
      it.seq = seq_++;
      queue_[size_t(comm::lane_index(it.lane))].push_back(P[pos_]);
      if (phases_[ph_].drain) issued_.push_back(P[pos_]);
      ++pos_;
      return true;
    }
    if (!deps_done(it)) return false;
    record_waits(free_since_, it.deps);
    it.wait = now_ - free_since_;
    it.start = now_;
    running_ = long(P[pos_]);
    remaining_ = it.cost;
    ++pos_;
    return true;
  }
  if (!std::all_of(issued_.begin(), issued_.end(), [&](size_t d) { return items_[d].done; })) return false;
  record_waits(free_since_, issued_);  // the end of a phase: every collective it issued
  free_since_ = now_;
  issued_.clear();
  ++ph_;
  pos_ = 0;
  return true;
}

bool Simulation::start_collectives() {
  std::vector<size_t> ready;
  for (int l = 0; l < comm::kNumLanes; ++l)
    if (lane_busy_[size_t(l)] == kNone && !queue_[size_t(l)].empty() && deps_done(items_[queue_[size_t(l)].front()]))
      ready.push_back(queue_[size_t(l)].front());
  std::sort(ready.begin(), ready.end(), [&](size_t a, size_t b) { return items_[a].seq < items_[b].seq; });
  bool progress = false;
  for (size_t r : ready) {
    Item& it = items_[r];
    auto lk = link_busy_.try_emplace(it.link, kNone).first;
    if (lk->second != kNone) continue;
    it.start = now_;
    it.end = now_ + it.cost;
    started_.push_back(r);
    lk->second = long(r);
    const size_t l = size_t(comm::lane_index(it.lane));
    lane_busy_[l] = long(r);
    queue_[l].pop_front();
    ++in_flight_;
    progress = true;
  }
  return progress;
}

void Simulation::advance() {
  const double factor = in_flight_ > 0 ? slow_ : 1.0;
  const double inf = std::numeric_limits<double>::infinity();
  const double compute_end = running_ != kNone ? now_ + remaining_ * factor : inf;
  double next = compute_end;
  for (long b : lane_busy_)
    if (b != kNone) next = std::min(next, items_[size_t(b)].end);
  AMPIPE_CHECK(next < inf, "simulate: nothing can run at {} s (phase {}, task {}): a dependency on a later phase?",
               now_, ph_,
               ph_ < phases_.size() && pos_ < phases_[ph_].items.size() ? items_[phases_[ph_].items[pos_]].name : "-");
  if (running_ != kNone) remaining_ = next == compute_end ? 0 : std::max(0.0, remaining_ - (next - now_) / factor);
  now_ = next;
  for (long& b : lane_busy_) {
    if (b == kNone || items_[size_t(b)].end > now_) continue;
    Item& it = items_[size_t(b)];
    it.done = true;
    link_busy_[it.link] = kNone;
    --in_flight_;
    b = kNone;
  }
  if (running_ != kNone && next == compute_end) {
    Item& it = items_[size_t(running_)];
    it.end = now_;
    it.done = true;
    running_ = kNone;
    free_since_ = now_;
  }
}

SimResult Simulation::run() {
  for (;;) {
    for (bool progress = true; progress;) {  // start everything that can start now
      progress = start_compute_lane();
      progress = start_collectives() || progress;
    }
    const bool comm_idle = std::all_of(lane_busy_.begin(), lane_busy_.end(), [](long b) { return b == kNone; });
    if (running_ == kNone && ph_ >= phases_.size() && comm_idle) break;
    advance();
  }
  return results();
}

SimResult Simulation::results() {
  SimResult res;
  res.lane_busy_s["compute"] = 0;
  double first = std::numeric_limits<double>::infinity(), last = 0;
  for (const Item& it : items_) {
    if (it.start < 0) continue;
    SimRecord r;
    r.name = it.name;
    r.lane = it.lane;
    r.start_s = it.start;
    r.end_s = it.end;
    r.wait_s = it.coll ? 0 : it.wait;
    r.cat = it.cat;
    r.chunk = it.chunk;
    r.bytes = it.bytes;
    r.issue_s = it.coll ? it.issue : it.start;
    r.link = it.link;
    r.stage = it.stage;
    const double dur = it.end - it.start;
    (it.coll ? res.comm_s : res.compute_s) += dur;
    if (it.coll) res.comm_by_stage_s[it.stage] += dur;
    res.lane_busy_s[std::string(comm::lane_name(it.lane))] += dur;
    first = std::min(first, it.start);
    last = std::max(last, it.end);
    res.timeline.push_back(std::move(r));
  }
  for (SimRecord& w : waits_) {
    res.exposed_s += w.end_s - w.start_s;
    last = std::max(last, w.end_s);
    res.timeline.push_back(std::move(w));
  }
  res.exposed_by_stage_s = std::move(exposed_by_stage_);
  std::stable_sort(res.timeline.begin(), res.timeline.end(),
                   [](const SimRecord& a, const SimRecord& b) { return a.start_s < b.start_s; });
  res.step_s = res.timeline.empty() ? 0 : last - first;
  const double m = std::min(res.compute_s, res.comm_s);
  res.hidden_fraction = m > 0 ? (res.compute_s + res.comm_s - res.step_s) / m : 0;
  return res;
}

}  // namespace

model::LayerConfig costed_layer(model::LayerConfig l) {
  if (l.dense() || !l.dropless()) return l;
  if (l.megatron_router()) {
    l.moe_expert_capacity_factor = 1.0;
    l.moe_pad_expert_input_to_capacity = true;
  } else {  // DeepSpeed-MoE's gate with --moe-no-drop
    l.moe_no_drop = false;
    l.moe_train_capacity_factor = 1.0;
    l.moe_min_capacity = 0;
  }
  return l;
}

SimResult simulate(const schedule::StepPlan& step, const Profile& profile, const SimOptions& opts_in) {
  SimOptions opts = opts_in;
  if (step.num_layers() > 0) opts.ep_size = int(std::max<int64_t>(1, step.layer(0).dims.ep));
  std::vector<Item> items;
  std::vector<Phase> phases;
  add_step_items(step, profile, opts, items, phases);
  return Simulation(std::move(items), std::move(phases), profile).run();
}

PipelineSim simulate_pipeline(const std::vector<schedule::StepPlan>& stages, int K, const Profile& profile,
                              const SimOptions& opts, int chunks, int group) {
  PipelineSim ps;
  ps.chunks = chunks;
  const int P = int(stages.size());
  AMPIPE_CHECK(P >= 1 && K >= 1, "simulate_pipeline: {} stages, {} micro-batches", P, K);
  double most = -1;
  for (int q = 0; q < P; ++q) {
    const schedule::StepPlan& st = stages[size_t(q)];
    AMPIPE_CHECK(st.config.micro_batches == 1 && st.config.pp_size == P && st.config.pp_rank == q,
                 "simulate_pipeline: stage {} is not a one-micro-batch step Plan of stage {} of {}", q, q, P);
    if (q == 0 && st.config.pp_bytes > 0)
      ps.send_s = collective_seconds(schedule::CollKind::send_recv, st.config.pp_bytes, 2,
                                     profile.link(opts.pp_spans_nodes));
    const SimResult r = simulate(st, profile, opts);
    // The compute lane's forward and backward: step tasks ".fwd" / ".bwd", layer tasks "L{i}.fwd." / "L{i}.bwd." and
    // "recompute:" (backward), with the waits between and after them (a layer's phase ends waiting for its
    // collectives). Each starts where its received tensor is taken: the waits for pp_recv are the standalone run
    // waiting for its own send, which the timeline adds between the stages instead; the waits for the gradient
    // buckets, the norm and the optimizer after the last backward are the tail.
    auto is_bwd = [](const std::string& n) {
      return n.ends_with(".bwd") || n.find(".bwd.") != std::string::npos || n.starts_with("recompute:");
    };
    enum Part { fwd, bwd, tail };
    Part part = fwd;
    double fwd_start = 0, fwd_end = 0, bwd_start = -1, bwd_end = 0, compute_end = 0;
    for (const SimRecord& rec : r.timeline) {
      if (rec.lane != Lane::compute) continue;
      compute_end = std::max(compute_end, rec.end_s);
      const bool wait = rec.cat == "wait";
      if (wait && rec.name.find("pp_recv") != std::string::npos) continue;  // its own send's time
      if (!wait && (rec.name.starts_with("grad_finish") || rec.name.starts_with("optimizer"))) part = tail;
      if (part == tail) continue;
      if (!wait && rec.name == "mb0.pp_wait.fwd") fwd_start = rec.end_s;
      if (!wait && is_bwd(rec.name) && part == fwd) {
        part = bwd;
        bwd_start = rec.start_s;
      }
      if (!wait && rec.name == "mb0.pp_wait.bwd") bwd_start = rec.end_s;
      if (wait && rec.name.find("grad_reduce") != std::string::npos) continue;  // the buckets: the tail
      (part == fwd ? fwd_end : bwd_end) = std::max(part == fwd ? fwd_end : bwd_end, rec.end_s);
    }
    if (bwd_start < 0) bwd_start = bwd_end = fwd_end;
    const double last_bwd = std::max(bwd_end, bwd_start);
    ps.fwd_s.push_back(std::max(0.0, fwd_end - fwd_start));
    ps.bwd_s.push_back(std::max(0.0, last_bwd - bwd_start));
    ps.tail_s.push_back(std::max(0.0, compute_end - last_bwd));
    if (ps.fwd_s.back() + ps.bwd_s.back() > most) {
      most = ps.fwd_s.back() + ps.bwd_s.back();
      ps.slowest = q;
    }
  }
  ps.timeline = schedule::pipeline_timeline(K, ps.fwd_s, ps.bwd_s, ps.send_s, chunks, group);
  double end = 0;
  for (const schedule::PipelineSlot& sl : ps.timeline) end = std::max(end, sl.end);
  ps.step_s = end + *std::max_element(ps.tail_s.begin(), ps.tail_s.end());
  ps.bubble = schedule::pipeline_bubble(ps.timeline, P);
  return ps;
}

void write_chrome_trace(const SimResult& r, const std::string& path) {
  using json = nlohmann::json;
  auto ev = json::array();
  const int pid = 0;
  ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "rank 0 (simulated)"}}}});
  ev.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  for (int l = 0; l < comm::kNumLanes; ++l) {
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", l},
                  {"args", {{"name", std::string(comm::lane_name(Lane(l)))}}}});
    ev.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", l}, {"args", {{"sort_index", l}}}});
  }
  for (const SimRecord& s : r.timeline) {
    json args = {{"chunk", s.chunk}, {"bytes", s.bytes}};
    if (s.cat == "wait") args["blocked_us"] = (s.end_s - s.start_s) * 1e6;
    if (s.wait_s > 0) args["wait_us"] = s.wait_s * 1e6;
    if (!s.link.empty()) {
      args["link"] = s.link;
      args["issued_us"] = s.issue_s * 1e6;
    }
    ev.push_back({{"name", s.name}, {"cat", s.cat}, {"ph", "X"}, {"ts", s.start_s * 1e6},
                  {"dur", std::max(0.0, s.end_s - s.start_s) * 1e6}, {"pid", pid},
                  {"tid", comm::lane_index(s.lane)}, {"args", args}});
  }
  const std::string text = json{{"traceEvents", ev}, {"displayTimeUnit", "ms"}}.dump(1) + "\n";
  try {
    core::write_file_atomic(path, text);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("trace file {}", e.what()));
  }
}

}  // namespace ampipe::sim
