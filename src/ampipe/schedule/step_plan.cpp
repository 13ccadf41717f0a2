#include "ampipe/schedule/step_plan.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "ampipe/core/error.h"
#include "ampipe/schedule/pipeline.h"

namespace ampipe::schedule {

const char* step_op_name(StepOp op) {
  switch (op) {
    case StepOp::embedding: return "embedding";
    case StepOp::layer: return "layer";
    case StepOp::recompute: return "recompute";
    case StepOp::sp_gather: return "sp_gather";
    case StepOp::head: return "head";
    case StepOp::grad_pack: return "grad_pack";
    case StepOp::grad_reduce: return "grad_reduce";
    case StepOp::grad_finish: return "grad_finish";
    case StepOp::optimizer: return "optimizer";
    case StepOp::param_gather: return "param_gather";
    case StepOp::param_unpack: return "param_unpack";
    case StepOp::pp_recv: return "pp_recv";
    case StepOp::pp_wait: return "pp_wait";
    case StepOp::pp_send: return "pp_send";
    case StepOp::tied_grad: return "tied_grad";
    case StepOp::tied_param: return "tied_param";
  }
  return "?";
}

const char* bucket_name(Bucket b) { return b == Bucket::dense ? "dense" : "expert"; }

std::string StepTask::name() const {
  const std::string mb = micro_batch >= 0 ? fmt::format("mb{}.", micro_batch) : std::string();
  switch (op) {
    case StepOp::layer: return fmt::format("{}L{}.{}", mb, layer, model::dir_name(dir));
    case StepOp::recompute: return fmt::format("{}L{}.recompute", mb, layer);
    case StepOp::pp_recv:
    case StepOp::pp_wait:
    case StepOp::pp_send:
      return fmt::format("{}{}{}.{}", mb, chunk > 0 ? fmt::format("c{}.", chunk) : std::string(), step_op_name(op),
                         model::dir_name(dir));
    case StepOp::embedding:
    case StepOp::sp_gather:
    case StepOp::head: return fmt::format("{}{}.{}", mb, step_op_name(op), model::dir_name(dir));
    case StepOp::grad_pack:
    case StepOp::grad_reduce:
    case StepOp::param_gather:
      return fmt::format("{}.{}.{}", step_op_name(op), bucket_name(bucket),
                         layer >= 0 ? fmt::format("L{}", layer) : std::string("outer"));
    case StepOp::param_unpack: return layer >= 0 ? fmt::format("param_unpack.L{}", layer) : "param_unpack";
    case StepOp::grad_finish:
    case StepOp::optimizer:
    case StepOp::tied_grad:
    case StepOp::tied_param: return step_op_name(op);
  }
  return "?";
}

int StepPlan::index_of(StepOp op, Dir d, int micro_batch, int layer) const {
  for (const StepTask& t : tasks)
    if (t.op == op && t.dir == d && t.micro_batch == micro_batch && t.layer == layer) return int(t.id);
  return -1;
}

double StepPlan::collective_bytes(StepOp op) const {
  double b = 0;
  for (const StepTask& t : tasks)
    if (t.op == op && t.is_collective()) b += t.bytes;
  return b;
}

namespace {

// Appends tasks in issue order; every task depends on nothing but what it names (the compute lane runs the
// compute tasks in order anyway).
struct Builder {
  StepPlan& p;
  uint32_t add(StepTask t) {
    t.id = uint32_t(p.tasks.size());
    p.tasks.push_back(std::move(t));
    return p.tasks.back().id;
  }
  static StepTask make(StepOp op, Dir d, int mb, int layer) {
    StepTask t;
    t.op = op;
    t.dir = d;
    t.micro_batch = mb;
    t.layer = layer;
    return t;
  }
  uint32_t compute(StepOp op, Dir d, int mb, int layer, double gemm_flops = 0, double min_dim = 0,
                   double bytes = 0) {
    StepTask t = make(op, d, mb, layer);
    t.gemm_flops = gemm_flops;
    t.gemm_min_dim = min_dim;
    t.bytes = bytes;
    return add(std::move(t));
  }
  uint32_t collective(StepOp op, Dir d, int mb, CollKind kind, comm::GroupKind g, Lane lane, double bytes,
                      std::vector<uint32_t> deps, int layer = -1) {
    StepTask t = make(op, d, mb, layer);
    t.lane = lane;
    t.deps = std::move(deps);
    t.kind = kind;
    t.group = g;
    t.bytes = bytes;
    return add(std::move(t));
  }
  // One bucket: pack its gradients (compute), then issue their all-reduce (the distributed optimizer: reduce-scatter)
  // on the dp lane. Adds the reduce task to `reduces`.
  void bucket(int layer, Bucket b, double bytes, int group_size, std::vector<uint32_t>& reduces) {
    if (group_size <= 1 || bytes <= 0) return;
    const uint32_t pack = compute(StepOp::grad_pack, Dir::bwd, -1, layer, 0, 0, 2 * bytes);
    p.tasks[pack].bucket = b;
    const uint32_t r = collective(StepOp::grad_reduce, Dir::bwd, -1,
                                  p.config.distributed_optimizer ? CollKind::reduce_scatter : CollKind::all_reduce,
                                  b == Bucket::dense ? comm::GroupKind::dp_cp : comm::GroupKind::edp, Lane::dp, bytes,
                                  {pack}, layer);
    p.tasks[r].bucket = b;
    reduces.push_back(r);
  }
};

void check_config(const StepConfig& c) {
  const size_t n = c.layers.size();
  AMPIPE_CHECK(c.micro_batches >= 1, "step plan: {} micro-batches", c.micro_batches);
  AMPIPE_CHECK(c.recompute.empty() || c.recompute.size() == n, "step plan: {} recompute flags for {} layers",
               c.recompute.size(), n);
  AMPIPE_CHECK(c.layer_dense_bytes.empty() || c.layer_dense_bytes.size() == n,
               "step plan: {} dense buckets for {} layers", c.layer_dense_bytes.size(), n);
  AMPIPE_CHECK(c.layer_expert_bytes.empty() || c.layer_expert_bytes.size() == n,
               "step plan: {} expert buckets for {} layers", c.layer_expert_bytes.size(), n);
  AMPIPE_CHECK(c.sp_tp >= 1, "step plan: sequence-parallel tp {}", c.sp_tp);
  AMPIPE_CHECK(c.pp_size >= 1 && c.pp_rank >= 0 && c.pp_rank < c.pp_size, "step plan: stage {} of {}", c.pp_rank,
               c.pp_size);
  AMPIPE_CHECK(c.chunks >= 1 && n % size_t(c.chunks) == 0 && (c.chunks == 1 || c.pp_size > 1),
               "step plan: {} layers in {} chunks of {} stages", n, c.chunks, c.pp_size);
}

}  // namespace

namespace {

// The step Plan's order, one chunk of a micro-batch's forward or backward at a time (pipeline_order), for one stage.
struct StepBuilder {
  explicit StepBuilder(StepPlan& plan) : p(plan) {}
  StepPlan& p;
  Builder b{p};
  const StepConfig& k = p.config;
  const int n = int(k.layers.size());
  const int v = k.chunks, per_chunk = n / v;
  const double T = double(k.tokens), h = double(k.hidden), V = double(k.head_vocab);
  const bool pipeline = k.pp_size > 1;
  std::vector<uint32_t> reduces;
  // The receives of each direction in the order the stage takes them (forward: every chunk's forward but the first
  // virtual stage's; backward: every chunk's backward but the last virtual stage's), and how many are posted.
  std::vector<PipelineStep> recvs[2];
  size_t posted[2] = {0, 0};
  std::map<std::tuple<int, int, bool>, uint32_t> recv_of;  // (micro-batch, chunk, forward?) -> its pp_recv task
  // --overlap-param-gather: each layer's param_gather tasks at the start of the step (unpacked before the layer's
  // first forward; emptied then)
  std::vector<std::vector<uint32_t>> layer_gathers;

  static double bucket_bytes(const std::vector<double>& v, int i) { return v.empty() ? 0.0 : v[size_t(i)]; }
  // The first virtual stage (its forward starts from the embedding) and the last (ends with the head).
  bool first_virtual(int c) const { return k.first_stage() && c == 0; }
  bool last_virtual(int c) const { return k.last_stage() && c == v - 1; }

  // Posts the next receive of direction fwd, if any: one ahead of the one being taken.
  void post_next(bool fwd) {
    std::vector<PipelineStep>& r = recvs[fwd];
    size_t& i = posted[fwd];
    if (i >= r.size()) return;
    const PipelineStep s = r[i++];
    const uint32_t t = b.collective(StepOp::pp_recv, fwd ? Dir::fwd : Dir::bwd, s.micro_batch, CollKind::send_recv,
                                    comm::GroupKind::pp, fwd ? Lane::pp_fwd : Lane::pp_bwd, k.pp_bytes, {});
    p.tasks[t].chunk = s.chunk;
    recv_of[{s.micro_batch, s.chunk, fwd}] = t;
  }
  void wait_recv(int m, int c, bool fwd) {
    const uint32_t w = b.compute(StepOp::pp_wait, fwd ? Dir::fwd : Dir::bwd, m, -1);
    p.tasks[w].chunk = c;
    p.tasks[w].deps = {recv_of.at({m, c, fwd})};
    post_next(fwd);
  }
  void send(int m, int c, bool fwd) {
    const uint32_t t = b.collective(StepOp::pp_send, fwd ? Dir::fwd : Dir::bwd, m, CollKind::send_recv,
                                    comm::GroupKind::pp, fwd ? Lane::pp_fwd : Lane::pp_bwd, k.pp_bytes, {});
    p.tasks[t].chunk = c;
  }

  void forward(int m, int c) {
    // the embedding (read a word and a position row, write x: 12 T h bytes), or the previous stage's activation
    if (k.model && first_virtual(c)) b.compute(StepOp::embedding, Dir::fwd, m, -1, 0, 0, 12 * T * h);
    if (pipeline && !first_virtual(c)) wait_recv(m, c, true);
    for (int i = c * per_chunk; i < (c + 1) * per_chunk; ++i) {
      if (!layer_gathers.empty() && !layer_gathers[size_t(i)].empty()) unpack_layer(i);
      b.compute(StepOp::layer, Dir::fwd, m, i);
    }
    if (pipeline && !last_virtual(c)) send(m, c, true);
    if (!k.model || !last_virtual(c)) return;
    std::vector<uint32_t> deps;
    if (k.sp_tp > 1)  // this rank's T / tp rows of the last layer's output, fp32, to every tp rank
      deps.push_back(b.collective(StepOp::sp_gather, Dir::fwd, m, CollKind::all_gather, comm::GroupKind::tp, Lane::tp,
                                  4 * T / k.sp_tp * h, {}));
    // LN reads y and writes xn: 8 T h; the logits written and read by the cross-entropy: 8 T V; GEMM 2 T h V
    p.tasks[b.compute(StepOp::head, Dir::fwd, m, -1, 2 * T * h * V, std::min({T, h, V}), 8 * T * h + 8 * T * V)].deps =
        deps;
  }

  void backward(int m, int c) {
    // the head's backward (the cross-entropy gradient over the logits 8 T V, the GEMMs dW and dxn 4 T h V, the LN
    // backward reads dxn and y, writes dy: 12 T h), or the next stage's gradient
    if (k.model && last_virtual(c))
      b.compute(StepOp::head, Dir::bwd, m, -1, 4 * T * h * V, std::min({T, h, V}), 12 * T * h + 8 * T * V);
    if (pipeline && !last_virtual(c)) wait_recv(m, c, false);
    const bool last = m == k.micro_batches - 1;  // the chunk's last backward
    for (int i = (c + 1) * per_chunk - 1; i >= c * per_chunk; --i) {
      if (!k.recompute.empty() && k.recompute[size_t(i)]) b.compute(StepOp::recompute, Dir::fwd, m, i);
      b.compute(StepOp::layer, Dir::bwd, m, i);
      // The last backward completes layer i's gradients: its buckets reduce under the layers below.
      if (last) {
        b.bucket(i, Bucket::dense, bucket_bytes(k.layer_dense_bytes, i), k.dense_group_size, reduces);
        b.bucket(i, Bucket::expert, bucket_bytes(k.layer_expert_bytes, i), k.expert_group_size, reduces);
      }
    }
    if (pipeline && !first_virtual(c)) send(m, c, false);
    if (!k.model || !first_virtual(c)) return;
    std::vector<uint32_t> deps;
    if (k.sp_tp > 1)
      deps.push_back(b.collective(StepOp::sp_gather, Dir::bwd, m, CollKind::all_gather, comm::GroupKind::tp, Lane::tp,
                                  4 * T / k.sp_tp * h, {}));
    // read the gradient row, add it into a word and a position row: 20 T h
    p.tasks[b.compute(StepOp::embedding, Dir::bwd, m, -1, 0, 0, 20 * T * h)].deps = deps;
  }

  // The gradients of the parameters outside the layers, the norm, the optimizer (the distributed optimizer: on the
  // shard, then the gathers), the tied embedding's exchange between the first and last stage.
  void finish() {
    if (!k.model) return;
    const bool tied = pipeline && k.tied_bytes > 0;
    std::vector<uint32_t> tied_deps;
    if (tied && (k.first_stage() || k.last_stage()))  // into the first stage's embedding gradient, before its bucket
      tied_deps.push_back(b.collective(StepOp::tied_grad, Dir::bwd, -1, CollKind::send_recv, comm::GroupKind::pp,
                                       Lane::pp_bwd, k.tied_bytes, {}));
    const size_t before = reduces.size();
    b.bucket(-1, Bucket::dense, k.outer_dense_bytes, k.dense_group_size, reduces);
    if (reduces.size() > before && !tied_deps.empty()) p.tasks[reduces.back() - 1].deps.push_back(tied_deps.back());
    // every gradient read, scaled and written, and read again for its square: 12 bytes per parameter
    std::vector<uint32_t> finish_deps = reduces;
    finish_deps.insert(finish_deps.end(), tied_deps.begin(), tied_deps.end());
    p.tasks[b.compute(StepOp::grad_finish, Dir::bwd, -1, -1, 0, 0, 12 * k.params)].deps = finish_deps;
    // AdamW reads the parameter, gradient and both moments and writes three of them (28 bytes per parameter); a
    // bf16 copy reads the fp32 weight and writes 2 bytes
    uint32_t done = 0;
    if (!k.distributed_optimizer) {
      done = b.compute(StepOp::optimizer, Dir::fwd, -1, -1, 0, 0, 28 * k.params + 6 * k.bf16_weights);
    } else {
      // AdamW on the shard (plus its copy out of the reduce-scatter's buffer and, packed, into the gather's: 16 bytes),
      // one all-gather per reduced bucket of its 1/D share, then every parameter copied out (8 bytes) and the bf16
      // copies refreshed
      const double own = k.optimizer_params > 0 ? k.optimizer_params : k.params;
      const uint32_t opt =
          b.compute(StepOp::optimizer, Dir::fwd, -1, -1, 0, 0, 44 * own + (reduces.empty() ? 6 * k.bf16_weights : 0));
      done = opt;
      // (--overlap-param-gather: the layers' gathers are the next step's, at its start; the outer bucket's stay here:
      // the next forward starts with the embedding, and the last stage's tied LM head needs it now)
      std::vector<uint32_t> gathers;
      double unpacked = 0;
      for (uint32_t r : reduces) {
        const StepTask red = p.tasks[r];
        if (k.overlap_param_gather && red.layer >= 0) continue;
        gathers.push_back(gather(red.layer, red.bucket, red.bytes, {opt}));
        unpacked += red.bytes / 4;
      }
      if (!gathers.empty()) {
        done = b.compute(StepOp::param_unpack, Dir::fwd, -1, -1, 0, 0, 8 * unpacked + 6 * k.bf16_weights);
        p.tasks[done].deps = gathers;
      }
    }
    if (tied && (k.first_stage() || k.last_stage()))
      b.collective(StepOp::tied_param, Dir::fwd, -1, CollKind::send_recv, comm::GroupKind::pp, Lane::pp_fwd,
                   k.tied_bytes, {done});
  }

  int group_size(Bucket bk) const { return bk == Bucket::dense ? k.dense_group_size : k.expert_group_size; }
  // Layer i's bucket bytes if it is reduced, and so sharded (a group of more than one rank: Builder::bucket), else 0.
  double sharded_bytes(int i, Bucket bk) const {
    return group_size(bk) > 1 ? bucket_bytes(bk == Bucket::dense ? k.layer_dense_bytes : k.layer_expert_bytes, i)
                              : 0.0;
  }

  // One bucket's all-gather of its updated shards (1/D of the `bytes` its reduction sent), after `deps`.
  uint32_t gather(int layer, Bucket bk, double bytes, std::vector<uint32_t> deps) {
    const uint32_t t = b.collective(StepOp::param_gather, Dir::fwd, -1, CollKind::all_gather,
                                    bk == Bucket::dense ? comm::GroupKind::dp_cp : comm::GroupKind::edp, Lane::dp,
                                    bytes / group_size(bk), std::move(deps), layer);
    p.tasks[t].bucket = bk;
    return t;
  }

  // --overlap-param-gather (Megatron: the first bucket's all-gather dispatched as the next step starts, each one
  // waited for by a forward pre-hook of its layer): the layers' gathers of the previous step's update issued first,
  // each layer's unpacked right before its first forward, so they run under the forwards of the layers before.
  void issue_layer_gathers() {
    if (!k.model || !k.distributed_optimizer || !k.overlap_param_gather) return;
    layer_gathers.assign(size_t(n), {});
    for (int i = 0; i < n; ++i)
      for (Bucket bk : {Bucket::dense, Bucket::expert})
        if (const double bytes = sharded_bytes(i, bk); bytes > 0)
          layer_gathers[size_t(i)].push_back(gather(i, bk, bytes, {}));
  }
  // Waits for layer i's gathers and copies its parameters out (8 bytes each); their bf16 copies are refreshed at
  // the end of the step's param_unpack as without the overlap (the layer refreshes a stale copy as it runs).
  void unpack_layer(int i) {
    const double elements = (sharded_bytes(i, Bucket::dense) + sharded_bytes(i, Bucket::expert)) / 4;
    const uint32_t u = b.compute(StepOp::param_unpack, Dir::fwd, -1, i, 0, 0, 8 * elements);
    p.tasks[u].deps = std::exchange(layer_gathers[size_t(i)], {});
  }

  void build() {
    issue_layer_gathers();
    const std::vector<PipelineStep> order =
        pipeline_order(k.micro_batches, k.pp_size, k.pp_rank, v, k.microbatch_group);
    for (const PipelineStep& s : order)
      if (pipeline && (s.forward ? !first_virtual(s.chunk) : !last_virtual(s.chunk))) recvs[s.forward].push_back(s);
    post_next(true);
    post_next(false);
    for (const PipelineStep& s : order) {
      if (s.forward)
        forward(s.micro_batch, s.chunk);
      else
        backward(s.micro_batch, s.chunk);
    }
    finish();
  }
};

}  // namespace

StepPlan build_step_plan(StepConfig c) {
  check_config(c);
  StepPlan p;
  p.config = std::move(c);
  StepBuilder(p).build();
  return p;
}

StepPlan build_layers_step_plan(std::vector<Plan> layers, const std::vector<bool>& recompute) {
  StepConfig c;
  c.layers = std::move(layers);
  c.recompute = recompute;
  c.model = false;
  return build_step_plan(std::move(c));
}

}  // namespace ampipe::schedule
