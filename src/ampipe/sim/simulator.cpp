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
  switch (t.stage) {
    case Stage::ln1_qkv:
    case Stage::qkv: return std::min({Sc, h, 3 * hl});  // [S_c, h] x [h, 3h/t] and its dx GEMM
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

int group_size(GroupKind g, const Plan& plan, const SimOptions& o) {
  switch (g) {
    case GroupKind::ep: return int(std::max<int64_t>(1, plan.dims.ep));
    case GroupKind::tp: return o.tp_size;
    case GroupKind::cp: return o.cp_size;
    case GroupKind::dp: return o.dp_size;
    case GroupKind::dp_cp: return o.dp_size * o.cp_size;
    case GroupKind::edp: return std::max(1, o.dp_size * o.cp_size / int(std::max<int64_t>(1, plan.dims.ep)));
    case GroupKind::world: return o.tp_size * o.cp_size * o.dp_size;
  }
  return 1;
}

bool group_spans_nodes(GroupKind g, const SimOptions& o) {
  switch (g) {
    case GroupKind::ep: return o.ep_spans_nodes;
    case GroupKind::tp: return o.tp_spans_nodes;
    case GroupKind::cp: return o.cp_spans_nodes;
    case GroupKind::dp: return o.dp_spans_nodes;
    case GroupKind::dp_cp:
    case GroupKind::edp: return o.dp_spans_nodes || o.cp_spans_nodes;
    case GroupKind::world: return o.tp_spans_nodes || o.cp_spans_nodes || o.dp_spans_nodes || o.ep_spans_nodes;
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
  if (is_gemm_stage(t.stage)) {
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

// One task of the step being simulated (or the data-parallel all-reduce, task == nullptr).
struct Item {
  const Task* task = nullptr;
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

SimResult simulate(const std::vector<Plan>& layers, const Profile& profile, const SimOptions& opts) {
  // ---- the items: every task of every layer (index base[i] + task id), then the dp all-reduce ----
  std::vector<Item> items;
  std::vector<size_t> base;
  for (const Plan& plan : layers) {
    base.push_back(items.size());
    for (size_t k = 0; k < plan.tasks.size(); ++k) {
      const Task& t = plan.tasks[k];
      AMPIPE_CHECK(t.id == k, "simulate: task {} has id {}: ids must be indices", t.name(), t.id);
      Item it;
      it.task = &t;
      it.name = t.name();
      it.lane = t.lane;
      it.coll = t.is_collective();
      it.stage = model::stage_name(t.stage);
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
      for (uint32_t d : t.deps) {
        AMPIPE_CHECK(d < t.id, "simulate: task {} depends on task {}, not an earlier one", it.name, d);
        it.deps.push_back(base.back() + d);
      }
      items.push_back(std::move(it));
    }
  }
  // Phases, as schedule::LayerStack runs them: forward of layer 0..L-1, then backward of L-1..0. At the end of a
  // phase the compute lane waits for every collective it issued (Executor::run), then the next phase starts.
  std::vector<std::vector<size_t>> phases;
  auto add_phase = [&](size_t i, Dir dir) {
    std::vector<size_t> p;
    for (const Task& t : layers[i].tasks)
      if (t.dir == dir) p.push_back(base[i] + t.id);
    if (!p.empty()) phases.push_back(std::move(p));
  };
  for (size_t i = 0; i < layers.size(); ++i) add_phase(i, Dir::fwd);
  for (size_t i = layers.size(); i-- > 0;) {
    if (i < opts.recompute.size() && opts.recompute[i]) {  // the forward again, as new items ("recompute:" names)
      const size_t first = items.size();
      std::vector<size_t> index(layers[i].tasks.size(), 0);  // task id -> its replay item
      std::vector<size_t> p;
      for (const Task& t : layers[i].tasks) {
        if (t.dir != Dir::fwd) continue;
        Item it = items[base[i] + t.id];
        it.name = "recompute:" + it.name;
        for (size_t& d : it.deps) d = index[d - base[i]];  // forward tasks depend on forward tasks only
        index[t.id] = items.size();
        p.push_back(items.size());
        items.push_back(std::move(it));
      }
      if (items.size() > first) phases.push_back(std::move(p));
    }
    add_phase(i, Dir::bwd);
  }
  // over dp x cp: dense gradients are sums over every cp rank's rows too
  const int reduce_size = opts.dp_size * opts.cp_size;
  const bool reduce_spans = opts.dp_spans_nodes && (opts.dp_size > 1 || opts.cp_spans_nodes);
  if (opts.dp_allreduce_bytes > 0 && reduce_size > 1) {
    Item it;
    it.name = "dp.allreduce";
    it.stage = "dp_allreduce";
    it.lane = Lane::dp;
    it.coll = true;
    it.cat = schedule::coll_kind_name(CollKind::all_reduce);
    it.link = profile.link_name(reduce_spans);
    it.bytes = opts.dp_allreduce_bytes;
    it.cost = collective_seconds(CollKind::all_reduce, opts.dp_allreduce_bytes, reduce_size,
                                 profile.link(reduce_spans));
    phases.push_back({items.size()});
    items.push_back(std::move(it));
  }

  // ---- the event loop ----
  SimResult res;
  const double slow = 1 + profile.compute_slowdown_during_comm;
  double now = 0;
  size_t ph = 0, pos = 0;
  long running = kNone;        // the compute task in progress
  double remaining = 0;        // its work left, in seconds at full speed
  double free_since = 0;       // when the compute lane last became idle
  std::vector<size_t> issued;  // collectives of the current phase, in issue order
  std::array<std::deque<size_t>, comm::kNumLanes> queue;
  std::array<long, comm::kNumLanes> lane_busy;
  lane_busy.fill(kNone);
  std::map<std::string, long> link_busy;
  int in_flight = 0;
  uint64_t seq = 0;
  std::vector<SimRecord> waits;
  std::map<std::string, double> exposed_by_stage;
  // A wait [from, to) for collective x is charged to what held it up: x while it ran; before x started, the
  // collective dependency of x that ended last (recursively: a combine waits for its tp reduction, that for the
  // experts' all-gather ...), and, for time x sat ready but queued, the collectives occupying its lane or link then
  // (x itself for any part nothing occupied).
  auto queued = [&](double a, double b, size_t xi) {
    const Item& x = items[xi];
    std::vector<size_t> occ;
    std::vector<double> cut{a, b};
    for (size_t yi = 0; yi < items.size(); ++yi) {
      const Item& y = items[yi];
      if (yi == xi || !y.coll || y.start < 0 || y.start >= b || y.end <= a) continue;
      if (y.lane != x.lane && y.link != x.link) continue;
      occ.push_back(yi);
      cut.push_back(std::max(a, y.start));
      cut.push_back(std::min(b, y.end));
    }
    std::sort(cut.begin(), cut.end());
    for (size_t k = 0; k + 1 < cut.size(); ++k) {
      const double lo = cut[k], hi = cut[k + 1];
      if (hi <= lo) continue;
      size_t who = xi;  // the first occupant covering [lo, hi), in item order
      for (size_t yi : occ)
        if (items[yi].start <= lo && items[yi].end >= hi) {
          who = yi;
          break;
        }
      exposed_by_stage[items[who].stage] += hi - lo;
    }
  };
  std::function<void(double, double, size_t)> charge = [&](double from, double to, size_t xi) {
    const Item& x = items[xi];
    const double began = std::clamp(x.start, from, to);
    exposed_by_stage[x.stage] += to - began;
    if (began <= from) return;
    size_t last = items.size();
    for (size_t d : x.deps)
      if (items[d].coll && items[d].end > from && (last == items.size() || items[d].end > items[last].end)) last = d;
    const double dep_end = last == items.size() ? from : std::min(items[last].end, began);
    queued(dep_end, began, xi);
    if (last != items.size()) charge(from, dep_end, last);
  };

  auto deps_done = [&](const Item& it) {
    return std::all_of(it.deps.begin(), it.deps.end(), [&](size_t d) { return items[d].done; });
  };
  // The compute lane waited [from, now) for `on` (in this order, as the executor waits on events one by one): one
  // "wait:<collective>" record per collective that was not finished yet when its wait began.
  auto record_waits = [&](double from, const std::vector<size_t>& on) {
    double cur = from;
    for (size_t d : on) {
      const Item& x = items[d];
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
      waits.push_back(std::move(w));
      cur = x.end;
    }
  };

  for (;;) {
    // Start everything that can start at `now`.
    for (bool progress = true; progress;) {
      progress = false;
      if (running == kNone && ph < phases.size()) {
        const std::vector<size_t>& P = phases[ph];
        if (pos < P.size()) {
          Item& it = items[P[pos]];
          if (it.coll) {  // issued without waiting; its lane and link decide when it starts
            it.issue = now;
            it.seq = seq++;
            queue[size_t(comm::lane_index(it.lane))].push_back(P[pos]);
            issued.push_back(P[pos]);
            ++pos;
            progress = true;
          } else if (deps_done(it)) {
            record_waits(free_since, it.deps);
            it.wait = now - free_since;
            it.start = now;
            running = long(P[pos]);
            remaining = it.cost;
            ++pos;
            progress = true;
          }
        } else if (std::all_of(issued.begin(), issued.end(), [&](size_t d) { return items[d].done; })) {
          record_waits(free_since, issued);
          free_since = now;
          issued.clear();
          ++ph;
          pos = 0;
          progress = true;
        }
      }
      // Heads of the lane queues that are ready, in issue order, each if its link is free.
      std::vector<size_t> ready;
      for (int l = 0; l < comm::kNumLanes; ++l)
        if (lane_busy[size_t(l)] == kNone && !queue[size_t(l)].empty() && deps_done(items[queue[size_t(l)].front()]))
          ready.push_back(queue[size_t(l)].front());
      std::sort(ready.begin(), ready.end(), [&](size_t a, size_t b) { return items[a].seq < items[b].seq; });
      for (size_t r : ready) {
        Item& it = items[r];
        auto [lk, fresh] = link_busy.try_emplace(it.link, kNone);
        (void)fresh;
        if (lk->second != kNone) continue;
        it.start = now;
        it.end = now + it.cost;
        lk->second = long(r);
        const size_t l = size_t(comm::lane_index(it.lane));
        lane_busy[l] = long(r);
        queue[l].pop_front();
        ++in_flight;
        progress = true;
      }
    }

    const bool comm_idle = std::all_of(lane_busy.begin(), lane_busy.end(), [](long b) { return b == kNone; });
    if (running == kNone && ph >= phases.size() && comm_idle) break;

    // The next event: the compute task's end (at the current rate) or a collective's end.
    const double factor = in_flight > 0 ? slow : 1.0;
    const double inf = std::numeric_limits<double>::infinity();
    const double compute_end = running != kNone ? now + remaining * factor : inf;
    double next = compute_end;
    for (long b : lane_busy)
      if (b != kNone) next = std::min(next, items[size_t(b)].end);
    AMPIPE_CHECK(next < inf, "simulate: nothing can run at {} s (phase {}, task {}): a dependency on a later phase?",
                 now, ph, ph < phases.size() && pos < phases[ph].size() ? items[phases[ph][pos]].name : "-");
    if (running != kNone) remaining = next == compute_end ? 0 : std::max(0.0, remaining - (next - now) / factor);
    now = next;
    for (long& b : lane_busy) {
      if (b == kNone || items[size_t(b)].end > now) continue;
      Item& it = items[size_t(b)];
      it.done = true;
      link_busy[it.link] = kNone;
      --in_flight;
      b = kNone;
    }
    if (running != kNone && next == compute_end) {
      Item& it = items[size_t(running)];
      it.end = now;
      it.done = true;
      running = kNone;
      free_since = now;
    }
  }

  // ---- the results ----
  res.lane_busy_s["compute"] = 0;
  double first = std::numeric_limits<double>::infinity(), last = 0;
  for (const Item& it : items) {
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
  for (SimRecord& w : waits) {
    res.exposed_s += w.end_s - w.start_s;
    last = std::max(last, w.end_s);
    res.timeline.push_back(std::move(w));
  }
  res.exposed_by_stage_s = std::move(exposed_by_stage);
  std::stable_sort(res.timeline.begin(), res.timeline.end(),
                   [](const SimRecord& a, const SimRecord& b) { return a.start_s < b.start_s; });
  res.step_s = res.timeline.empty() ? 0 : last - first;
  const double m = std::min(res.compute_s, res.comm_s);
  res.hidden_fraction = m > 0 ? (res.compute_s + res.comm_s - res.step_s) / m : 0;
  return res;
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
