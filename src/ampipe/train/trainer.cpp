#include "ampipe/train/trainer.h"

#include <algorithm>
#include <functional>

#include <tuple>
#include <utility>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/comm/trace.h"
#include "ampipe/train/stop_signal.h"
#include "ampipe/train/tensorboard.h"

namespace ampipe::train {

namespace {

// Megatron's log-line timestamp: " [YYYY-MM-DD HH:MM:SS]", local time.
std::string log_timestamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}


using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

Trainer::Trainer(const TrainConfig& cfg, const comm::Groups& groups, std::shared_ptr<const TextData> data)
    : cfg_(cfg),
      g_(groups),
      data_(std::move(data)),
      model_(cfg, groups.layout.coord(groups.world.rank()).ep, &groups) {
  AMPIPE_CHECK(groups.layout.ep == cfg.layer.expert_model_parallel_size, "layout ep {} vs config ep {}",
               groups.layout.ep, cfg.layer.expert_model_parallel_size);
  s_ = cfg.layer.seq_length;
  b_ = cfg.layer.micro_batch_size;
  G_ = cfg.global_batch(groups.world.size());
  K_ = G_ / (b_ * groups.layout.dp);
  dp_rank_ = groups.layout.coord(groups.world.rank()).dp;
  tokens_.resize(size_t(s_ * b_));
  targets_.resize(size_t(s_ * b_));
  auto& ps = model_.params();
  const PipelineStage& stage = model_.stage();
  for (size_t i = 0; i < ps.size(); ++i) {
    (ps[i].expert ? expert_idx_ : dense_idx_).push_back(i);
    int layer = -1;  // the stage's layer index (the step Plan's), from the model-wide one of the name
    if (ps[i].name.rfind("layers.", 0) == 0) layer = stage.local(std::stoi(ps[i].name.substr(7)));
    layer_of_.push_back(layer);
  }
  layout_ = GradLayout(ps, layer_of_, g_.dp_cp.size(), g_.dp_cp.rank(), g_.edp.size(), g_.edp.rank(),
                       cfg.use_distributed_optimizer);
  opt_ = cfg.use_distributed_optimizer ? AdamW(ps, layout_.segments()) : AdamW(ps);
  // zeros: a sharded run's padding is reduced and gathered with it, and must stay finite
  dense_buf_ = Tensor::zeros({std::max<int64_t>(layout_.buffer_size(false), 1)});
  expert_buf_ = Tensor::zeros({std::max<int64_t>(layout_.buffer_size(true), 1)});
  scalars_ = Tensor::empty({5});
  // every layer of the model: each stage counts its own, the others stay 0 and the all-reduce joins them
  moe_counts_.assign(size_t(cfg.num_layers) * size_t(cfg.layer.num_experts + 2), 0);
  moe_buf_ = Tensor::empty({int64_t(2 * moe_counts_.size())});
  if (stage.size > 1) {  // the pipeline's slots (schedule/step_plan.h: receives posted one ahead)
    const Shape a = model_.stage_activation_shape();
    // 1F1B: at most min(P - stage, K) micro-batches between their forward and their backward on this stage (a model
    // chunk's most, interleaved)
    const int in_flight = cfg.pipeline_in_flight(stage.rank, K_);
    model_.stack().set_slots(in_flight);  // the layers' saved activations of each
    // each chunk's inputs of the micro-batches in flight, and one coming
    pp_in_.resize(size_t(stage.chunks));
    for (std::vector<Tensor>& chunk : pp_in_)
      for (int k = 0; k < in_flight + 1; ++k) chunk.push_back(Tensor::empty(a));
    for (int k = 0; k < 2; ++k) {
      pp_grad_in_.push_back(Tensor::empty(a));
      pp_out_.push_back(Tensor::empty(a));
      pp_grad_out_.push_back(Tensor::empty(a));
    }
    pp_out_ev_.resize(2);
    pp_grad_out_ev_.resize(2);
  }
}

Trainer::~Trainer() = default;

double MoeLayerStats::load_imbalance() const {
  int64_t sum = 0, mx = 0;
  for (int64_t t : tokens) {
    sum += t;
    mx = std::max(mx, t);
  }
  return sum > 0 ? double(mx) * double(tokens.size()) / double(sum) : 0.0;
}

// tokens_/targets_ [s, b] of micro-batch samples first_sample + [0, b): token (i, bb) at i*b + bb.
void Trainer::fill_batch(int64_t first_sample, Split which) {
  std::vector<int32_t> in(static_cast<size_t>(s_)), tg(static_cast<size_t>(s_));
  for (int64_t bb = 0; bb < b_; ++bb) {
    if (which == Split::valid)
      data_->valid_sample(first_sample + bb, in, tg);
    else if (which == Split::test)
      data_->test_sample(first_sample + bb, in, tg);
    else
      data_->train_sample(first_sample + bb, in, tg);
    for (int64_t i = 0; i < s_; ++i) {
      tokens_[size_t(i * b_ + bb)] = in[size_t(i)];
      targets_[size_t(i * b_ + bb)] = tg[size_t(i)];
    }
  }
}

// Sum over the ranks holding the same parameter, times 1/(G/b): the data-parallel mean over micro-batches. Also
// takes the sums of squares of the reduced gradients (dense_sumsq_, expert_sumsq_) in the same pass.
namespace {
// sum of x^2 with 8 independent partial sums (vectorisable without reassociating one chain).
double sum_squares(const float* x, int64_t n) {
  double acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += double(x[k + j]) * double(x[k + j]);
  for (; k < n; ++k) acc[0] += double(x[k]) * double(x[k]);
  double s = 0;
  for (double a : acc) s += a;
  return s;
}
}  // namespace

// Calls f(run) for each run of a bucket's parameters in its flat buffer (grad_layout.h: a layer's parameters are
// one run; those outside the layers, the embedding and the final LayerNorm / LM head at either end of the parameter
// list, are two).
template <class F>
void Trainer::for_bucket_runs(int layer, schedule::Bucket b, F&& f) {
  const bool expert = b == schedule::Bucket::expert;
  for (const GradRun& r : layout_.runs())
    if (r.layer == layer && r.expert == expert) f(r);
}

// The step Plan's grad_pack: the bucket's gradients into the flat buffer of its reduction.
void Trainer::pack_bucket(int layer, schedule::Bucket b) {
  auto& ps = model_.params();
  Tensor& buf = b == schedule::Bucket::dense ? dense_buf_ : expert_buf_;
  for (size_t i : b == schedule::Bucket::dense ? dense_idx_ : expert_idx_)
    if (layer_of_[i] == layer)
      std::memcpy(buf.data<float>() + layout_.offset(i), ps[i].grad.data<float>(), size_t(ps[i].grad.numel()) * 4);
}

// The step Plan's grad_reduce: the bucket's all-reduce (dense over dp x cp, expert over the expert-data-parallel
// group), one per run; with the distributed optimizer its reduce-scatter into this rank's own block of the run, in
// place (grad_layout.h: where this rank's shard of the run lies in the flat buffer). Every rank runs the
// same step Plan, so the groups see identical collective sequences.
void Trainer::reduce_bucket(int layer, schedule::Bucket b) {
  const bool dense = b == schedule::Bucket::dense;
  const comm::Group& grp = dense ? g_.dp_cp : g_.edp;
  Tensor& buf = dense ? dense_buf_ : expert_buf_;
  for_bucket_runs(layer, b, [&](const GradRun& r) {
    const std::string tag = fmt::format("{}.L{}.{}", dense ? "grad.dense" : "grad.expert", layer, r.begin);
    if (r.sharded)
      pending_.push_back(comm::reduce_scatter(grp, buf.rows(r.begin, r.padded_end),
                                              buf.rows(r.owned_begin(), r.owned_end()),
                                              comm::Reduce::sum, tag));
    else
      pending_.push_back(comm::all_reduce(grp, buf.rows(r.begin, r.end), comm::Reduce::sum, tag));
  });
}

// The distributed optimizer's gather of one sharded run: this rank's shard packed in place, into its own block of
// the run in the flat buffer (src(k): piece k's values), and all-gathered over the run, its event added to `into`.
// param_gather: the updated parameters of a bucket's runs; a checkpoint: the moments of every run.
template <class Src>
void Trainer::gather_run(const GradRun& r, Src&& src, const char* what, std::vector<comm::Event>& into) {
  if (!r.sharded) return;
  Tensor& buf = r.expert ? expert_buf_ : dense_buf_;
  const auto& pieces = layout_.pieces();
  for (size_t k = 0; k < pieces.size(); ++k) {
    const GradPiece& p = pieces[k];
    const int64_t at = layout_.offset(p.seg.param) + p.seg.begin;  // in the flat buffer
    if (p.expert != r.expert || p.shard_at < 0 || at < r.owned_begin() || at >= r.owned_end()) continue;
    std::memcpy(buf.data<float>() + at, src(k), size_t(p.seg.end - p.seg.begin) * 4);
  }
  into.push_back(comm::all_gather(r.expert ? g_.edp : g_.dp_cp, buf.rows(r.owned_begin(), r.owned_end()),
                                  buf.rows(r.begin, r.padded_end),
                                  fmt::format("{}.{}.L{}.{}", what, r.expert ? "expert" : "dense", r.layer, r.begin)));
}

// The step Plan of one iteration (schedule/step_plan.h) for this rank: the stack's layer Plans, K micro-batches,
// the buckets of this rank's gradients, the sizes of the work outside the layers.
void Trainer::plan_step() {
  const model::LayerConfig& l = cfg_.layer;
  schedule::LayerStack& stack = model_.stack();
  schedule::StepConfig c;
  c.layers = stack.step_plan().config.layers;
  c.recompute = stack.step_plan().config.recompute;
  c.micro_batches = int(K_);
  c.tokens = s_ * b_ / l.cp();
  c.hidden = l.hidden_size;
  c.head_vocab = cfg_.padded_vocab_size;
  c.sp_tp = l.sp() ? l.tp() : 1;
  const int n = stack.num_layers();
  c.layer_dense_bytes.assign(size_t(n), 0);
  c.layer_expert_bytes.assign(size_t(n), 0);
  for (size_t i = 0; i < model_.params().size(); ++i) {
    const NamedParam& p = model_.params()[i];
    const double bytes = 4.0 * double(p.grad.numel());
    c.params += double(p.param.numel());
    if (l.bf16 && layer_of_[i] >= 0 && p.param.dim() >= 2) c.bf16_weights += double(p.param.numel());
    if (layer_of_[i] < 0)
      c.outer_dense_bytes += bytes;
    else
      (p.expert ? c.layer_expert_bytes : c.layer_dense_bytes)[size_t(layer_of_[i])] += bytes;
  }
  c.dense_group_size = g_.dp_cp.size();
  c.expert_group_size = g_.edp.size();
  c.distributed_optimizer = cfg_.use_distributed_optimizer;
  c.overlap_param_gather = cfg_.overlap_param_gather;
  c.optimizer_params = double(layout_.owned_elements());
  const PipelineStage& stage = model_.stage();
  c.pp_size = stage.size;
  c.pp_rank = stage.rank;
  c.chunks = stage.chunks;
  c.microbatch_group = cfg_.microbatch_group_size_per_vp_stage;
  c.pp_bytes = 4.0 * double(shape_numel(model_.stage_activation_shape()));
  if (model_.tied_weight().defined()) c.tied_bytes = double(model_.tied_weight().nbytes());
  step_ = schedule::build_step_plan(std::move(c));
  gathers_params_ = step_.index_of(schedule::StepOp::param_unpack, model::Dir::fwd, -1, -1) >= 0;
  step_generation_ = stack.generation();
}

void Trainer::reduce_gradients() {
  comm::wait_all(pending_);
  pending_.clear();
  const float inv = 1.0f / float(G_ / b_);
  auto& ps = model_.params();
  const model::LayerConfig& lc = cfg_.layer;
  double tp_sharded_sq = 0;    // dense tp shards: a different part of the tensor on every tp rank
  double expert_whole_sq = 0;  // expert tensors that are not cut over tp: the same on every tp rank
  // Each optimizer piece (grad_layout.h): a whole parameter of an unsharded buffer, or this rank's slice of one in a
  // sharded buffer (its reduce-scattered elements, copied into the parameter's gradient where AdamW reads them).
  auto unpack = [&](bool expert, const Tensor& buf, const comm::Group& grp) {
    double sq = 0;
    for (const GradPiece& pc : layout_.pieces()) {
      if (pc.expert != expert) continue;
      NamedParam& p = ps[pc.seg.param];
      Tensor gv = p.grad.view({p.grad.numel()}).rows(pc.seg.begin, pc.seg.end);
      float* g = gv.data<float>();
      const int64_t n = pc.seg.end - pc.seg.begin;
      const float* src = pc.shard_at >= 0   ? buf.data<float>() + layout_.offset(pc.seg.param) + pc.seg.begin
                         : grp.size() > 1 ? buf.data<float>() + layout_.offset(pc.seg.param)
                                          : g;
      for (int64_t k = 0; k < n; ++k) g[k] = src[k] * inv;
      // Sequence parallel: LayerNorm and gate gradients cover this tp rank's rows; their sum over tp is the
      // gradient (the data-parallel sum above commutes with it). The tp ranks hold the same pieces.
      if (p.tp_partial_grad(lc)) comm::all_reduce_sync(g_.tp, gv, comm::Reduce::sum, "grad.tp." + p.name);
      const double s = sum_squares(g, n);
      const bool sharded = p.tp_sharded(lc);
      (p.expert ? (sharded || g_.tp.size() == 1 ? sq : expert_whole_sq) : (sharded ? tp_sharded_sq : sq)) += s;
    }
    return sq;
  };
  dense_sumsq_ = unpack(false, dense_buf_, g_.dp_cp);
  expert_sumsq_ = unpack(true, expert_buf_, g_.edp);
  tp_sharded_sumsq_ = tp_sharded_sq;
  expert_whole_sumsq_ = expert_whole_sq;
}

// Each parameter once: dense gradients are identical on every rank after the reduction (tp shards: summed over the
// tp group); expert shards are summed over the EP group and, cut over tp, over the tp group too (those every tp rank
// holds whole, once).
// With the distributed optimizer each rank's sums cover its shard: summed over the group first.
double Trainer::grad_norm() {
  auto over_group = [&](const comm::Group& grp, double& a, double& b, const char* tag) {
    Tensor t = scalars_.rows(0, 2);
    t.data<float>()[0] = float(a);
    t.data<float>()[1] = float(b);
    comm::all_reduce_sync(grp, t, comm::Reduce::sum, tag);
    a = t.get(0);
    b = t.get(1);
  };
  if (layout_.sharded(false)) over_group(g_.dp_cp, dense_sumsq_, tp_sharded_sumsq_, "grad.norm.dp");
  if (layout_.sharded(true)) over_group(g_.edp, expert_sumsq_, expert_whole_sumsq_, "grad.norm.edp");
  double expert = expert_sumsq_, sharded = tp_sharded_sumsq_;
  if (g_.tp.size() > 1) {
    Tensor t = scalars_.rows(0, 2);
    t.data<float>()[0] = float(expert);
    t.data<float>()[1] = float(sharded);
    comm::all_reduce_sync(g_.tp, t, comm::Reduce::sum, "grad.norm.tp");
    expert = t.get(0);
    sharded = t.get(1);
  }
  expert += expert_whole_sumsq_;
  if (g_.ep.size() > 1) {
    Tensor t = scalars_.rows(0, 1);
    t.fill(float(expert));
    comm::all_reduce_sync(g_.ep, t, comm::Reduce::sum, "grad.norm");
    expert = t.get(0);
  }
  double total = dense_sumsq_ + sharded + expert;
  if (g_.pp.size() > 1) {  // every stage's parameters (the tied LM-head copy is not one)
    Tensor t = scalars_.rows(0, 1);
    t.fill(float(total));
    comm::all_reduce_sync(g_.pp, t, comm::Reduce::sum, "grad.norm.pp");
    total = t.get(0);
  }
  return std::sqrt(total);
}

// The expert choices (token, k) of the last forward's gates that found their expert full, over every layer and
// chunk of this rank's tokens.
void Trainer::count_drops(double& dropped, double& choices) {
  schedule::LayerStack& stack = model_.stack();
  for (int i = stack.chunk_layers().first; i < stack.chunk_layers().second; ++i)
    for (int c = 0; c < stack.degree(); ++c)
      for (int32_t slot : stack.layer(i).gate_ctx(c).routing.slot) {
        dropped += slot < 0;
        choices += 1;
      }
}

// The kept choices per expert (GateRouting::expert_count, filled by the gate's slot assignment) and, counted
// separately, the dropped ones (slot -1) and all choices of the last forward, every layer and chunk.
void Trainer::count_expert_loads() {
  schedule::LayerStack& stack = model_.stack();
  const size_t E = size_t(cfg_.layer.num_experts);
  for (int i = stack.chunk_layers().first; i < stack.chunk_layers().second; ++i) {
    if (stack.layer(i).config().dense()) continue;  // no router: its counts stay 0
    int64_t* c = moe_counts_.data() + size_t(model_.stage().global(i)) * (E + 2);
    for (int ch = 0; ch < stack.degree(); ++ch) {
      const model::GateRouting& r = stack.layer(i).gate_ctx(ch).routing;
      AMPIPE_CHECK(r.expert_count.size() == E, "gate routing of layer {} has {} expert counts, expected {}", i,
                   r.expert_count.size(), E);
      for (size_t e = 0; e < E; ++e) c[e] += r.expert_count[e];
      for (int32_t slot : r.slot) c[E] += slot < 0;
      c[E + 1] += int64_t(r.slot.size());
    }
  }
}

// One all-reduce over the world of the window's counts. fp32 is the reduction type, exact only below 2^24, so
// each count travels as its low 12 bits and the rest: both sums stay exact up to 2^36 per rank and 4096 ranks.
// Without sequence parallelism the tp ranks of a group routed the same tokens: their sum is tp x the count.
MoeLog Trainer::reduce_expert_loads(int64_t iteration) {
  const size_t n = moe_counts_.size(), E = size_t(cfg_.layer.num_experts);
  if (g_.world.size() > 1) {
    float* b = moe_buf_.data<float>();
    for (size_t i = 0; i < n; ++i) {
      b[i] = float(moe_counts_[i] & 4095);
      b[n + i] = float(moe_counts_[i] >> 12);
    }
    comm::all_reduce_sync(g_.world, moe_buf_, comm::Reduce::sum, "moe.expert_loads");
    const int64_t copies = cfg_.layer.sp() ? 1 : g_.tp.size();
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = int64_t(b[n + i]) * 4096 + int64_t(b[i]);
      AMPIPE_CHECK(v % copies == 0, "expert load {} is not a multiple of the {} tp ranks that count it", v, copies);
      moe_counts_[i] = v / copies;
    }
  }
  MoeLog log;
  log.iteration = iteration;
  for (size_t i = 0; i < n / (E + 2); ++i) {
    const int64_t* c = moe_counts_.data() + i * (E + 2);
    MoeLayerStats l;
    l.tokens.assign(c, c + E);
    l.dropped = c[E];
    l.choices = c[E + 1];
    log.layers.push_back(std::move(l));
  }
  std::fill(moe_counts_.begin(), moe_counts_.end(), 0);
  return log;
}

// One task of the step Plan (the whole iteration: every micro-batch's embedding, layers, head and loss, the
// bucketed gradient reduction, the optimizer step), in the Plan's order.
void Trainer::run_step_task(const schedule::StepTask& t, StepState& s) {
  using schedule::StepOp;
  const bool fwd = t.dir == model::Dir::fwd;
  switch (t.op) {
    case StepOp::embedding:
      if (fwd) {
        const int64_t first = first_sample(t.micro_batch);
        {
          comm::TraceScope trace(comm::Lane::compute, "data");
          fill_batch(first, Split::train);
        }
        model_.embedding_forward(tokens_, targets_, uint64_t(first * s_), t.micro_batch);
      } else {
        if (model_.stage().size > 1) {  // 1F1B: later forwards took other micro-batches' tokens since
          fill_batch(first_sample(t.micro_batch), Split::train);
          model_.take_batch(tokens_, targets_);
        }
        model_.embedding_backward();
        s.st.flops += model_.flops_per_micro_batch();
      }
      return;
    case StepOp::layer:
    case StepOp::recompute: return model_.run_layer(t);
    case StepOp::pp_recv: return pp_recv(t);
    case StepOp::pp_wait: return pp_wait(t);
    case StepOp::pp_send: return pp_send(t, s);
    case StepOp::tied_grad: return exchange_tied(true);
    case StepOp::tied_param: return exchange_tied(false);
    case StepOp::sp_gather: return model_.sp_gather(t.dir);
    case StepOp::head:
      if (fwd) {
        s.loss_sum += model_.head_forward();
        after_forward(s);
      } else {
        model_.head_backward(1.0f, float(cfg_.moe_aux_loss_coeff));
      }
      return;
    case StepOp::grad_pack: return pack_bucket(t.layer, t.bucket);
    case StepOp::grad_reduce: return reduce_bucket(t.layer, t.bucket);
    case StepOp::grad_finish: return finish_gradients(s);
    case StepOp::optimizer: return optimizer_step(s);
    case StepOp::param_gather: return param_gather(t.layer, t.bucket);
    case StepOp::param_unpack: return param_unpack(t.layer, s);
  }
}

// grad_finish: the reductions waited for, the gradients scaled, the losses summed over the ranks, the global norm;
// a loss or norm that is not finite stops the run here, before the optimizer writes anything.
void Trainer::finish_gradients(StepState& s) {
  IterationStats& st = s.st;
  s.t_opt = Clock::now();
  {
    comm::TraceScope trace(comm::Lane::compute, "grad.reduce (wait, scale, sums of squares)");
    reduce_gradients();
  }
  for (std::vector<comm::Event>* evs : {&pp_out_ev_, &pp_grad_out_ev_})  // the pipeline's last sends
    for (comm::Event& e : *evs)
      if (e.state()) comm::wait_all({std::exchange(e, comm::Event{})});
  Tensor losses = scalars_;
  losses.set(0, float(s.loss_sum));
  losses.set(1, float(s.aux_sum));
  losses.set(2, float(s.dropped));
  losses.set(3, float(s.choices));
  losses.set(4, float(s.z_sum));
  if (g_.dp_cp.size() > 1) comm::all_reduce_sync(g_.dp_cp, losses, comm::Reduce::sum, "loss");
  // pipeline: the lm loss is the last stage's, the routers' sums each stage's own
  if (g_.pp.size() > 1) comm::all_reduce_sync(g_.pp, losses, comm::Reduce::sum, "loss.pp");
  // Context parallel: the lm loss of a micro-batch is split over its cp ranks (each returns its tokens' share), but
  // every cp rank's aux loss is the whole sequence's (the layer reduces its routing statistics over cp), so the sum
  // over dp x cp counts it cp times.
  st.lm_loss = losses.get(0) / double(G_ / b_);
  st.aux_loss = losses.get(1) / double(G_ / b_) / double(g_.cp.size());
  st.z_loss = losses.get(4) / double(G_ / b_) / double(g_.cp.size());  // also whole-sequence statistics
  st.drop_fraction = losses.get(3) > 0 ? losses.get(2) / losses.get(3) : 0.0;
  st.reduce_ms = ms_since(s.t_opt);
  {
    comm::TraceScope trace(comm::Lane::compute, "grad.norm");
    st.grad_norm = grad_norm();
  }
  // Megatron's --check-for-nan-in-loss-and-grad (on by default): the loss and the gradient norm are all-reduced, so
  // every rank takes this branch together, before the optimizer writes anything.
  if (!std::isfinite(st.lm_loss) || !std::isfinite(st.aux_loss) || !std::isfinite(st.grad_norm))
    throw NumericError(fmt::format("iteration {}: the {} is {} (lm loss {}, aux loss {}, grad norm {}); stopping "
                                   "before the optimizer step, nothing saved (lower --lr, check the data)",
                                   iteration_ + 1,
                                   std::isfinite(st.lm_loss) && std::isfinite(st.aux_loss) ? "gradient norm" : "loss",
                                   "not finite", st.lm_loss, st.aux_loss, st.grad_norm));
  // The router's expert bias (--moe-router-enable-expert-bias): its step, from the tokens every rank routed
  // (Megatron updates it in finalize_model_grads, before the optimizer; every rank takes the same step).
  if (cfg_.layer.moe_router_enable_expert_bias) {
    comm::TraceScope trace(comm::Lane::compute, "router expert bias");
    model_.stack().update_expert_bias(g_.stage, cfg_.layer.moe_router_bias_update_rate);
  }
}

// The distributed optimizer's state whole: every parameter's moments in its local shape, the sharded ones gathered
// over their groups (collective). Checkpoints hold whole tensors, so they load with or without the distributed
// optimizer and at any data-parallel size.
AdamW Trainer::whole_optimizer_state() {
  auto& ps = model_.params();
  AdamW whole(ps);
  whole.set_steps(opt_.steps());
  const auto& pieces = layout_.pieces();
  for (int moment = 0; moment < 2; ++moment) {
    auto mine = [&](size_t k) -> Tensor& { return moment == 0 ? opt_.exp_avg(k) : opt_.exp_avg_sq(k); };
    auto theirs = [&](size_t i) -> Tensor& { return moment == 0 ? whole.exp_avg(i) : whole.exp_avg_sq(i); };
    for (size_t k = 0; k < pieces.size(); ++k)
      if (pieces[k].shard_at < 0) std::memcpy(theirs(pieces[k].seg.param).raw(), mine(k).raw(), mine(k).nbytes());
    std::vector<comm::Event> gathers;
    for (const GradRun& r : layout_.runs())
      gather_run(r, [&](size_t k) { return mine(k).data<float>(); }, moment == 0 ? "ckpt.m" : "ckpt.v", gathers);
    comm::wait_all(gathers);
    for (size_t i = 0; i < ps.size(); ++i)  // every parameter of a sharded buffer, out of it
      if (layout_.sharded(ps[i].expert))
        std::memcpy(theirs(i).raw(), (ps[i].expert ? expert_buf_ : dense_buf_).data<float>() + layout_.offset(i),
                    theirs(i).nbytes());
  }
  return whole;
}

// The reverse: this rank's pieces of a whole state (every rank holds it whole after a load).
void Trainer::take_optimizer_state(AdamW& whole) {
  opt_.set_steps(whole.steps());
  const auto& pieces = layout_.pieces();
  for (size_t k = 0; k < pieces.size(); ++k) {
    const AdamWSegment& sg = pieces[k].seg;
    const size_t bytes = size_t(sg.end - sg.begin) * 4;
    std::memcpy(opt_.exp_avg(k).raw(), whole.exp_avg(sg.param).data<float>() + sg.begin, bytes);
    std::memcpy(opt_.exp_avg_sq(k).raw(), whole.exp_avg_sq(sg.param).data<float>() + sg.begin, bytes);
  }
}

void Trainer::optimizer_step(StepState& s) {
  IterationStats& st = s.st;
  float clip = 1.0f;
  if (cfg_.clip_grad > 0 && st.grad_norm > cfg_.clip_grad) clip = float(cfg_.clip_grad / (st.grad_norm + 1e-6));
  {
    comm::TraceScope trace(comm::Lane::compute, "optimizer (clip, AdamW)");
    opt_.step(model_.params(), st.lr, cfg_.weight_decay, cfg_.adam_beta1, cfg_.adam_beta2, cfg_.adam_eps, clip);
  }
  // the distributed optimizer updated this rank's shard of every sharded bucket: the others' parts are stale here
  for (const GradRun& r : layout_.runs())
    if (r.sharded) stale_.insert({r.layer, r.expert});
  // the bf16 weight copies: once per optimizer step (the distributed optimizer: once the parameters are gathered)
  if (!gathers_params_) {
    model_.stack().weights_changed();
    st.optim_ms = ms_since(s.t_opt);
  }
}

// The distributed optimizer after its step: every rank's updated shard gathered (param_gather per bucket, right
// after the step, or with --overlap-param-gather the layers' at the start of the next), then the parameters copied
// out of the flat buffers (param_unpack: all at once, or each layer's before its first forward).
void Trainer::param_gather(int layer, schedule::Bucket b) {
  const bool expert = b == schedule::Bucket::expert;
  if (stale_.erase({layer, expert}) == 0) return;  // the first step, or gathered since (sync_params)
  const auto& pieces = layout_.pieces();
  auto& ps = model_.params();
  std::vector<comm::Event>& into = param_gathers_[{layer, expert}];
  for (const GradRun& r : layout_.runs())
    if (r.layer == layer && r.expert == expert)
      gather_run(r, [&](size_t k) { return ps[pieces[k].seg.param].param.data<float>() + pieces[k].seg.begin; },
                 "param.gather", into);
}

void Trainer::unpack_params(int layer) {
  auto& ps = model_.params();
  for (auto it = param_gathers_.begin(); it != param_gathers_.end();) {
    const auto [l, expert] = it->first;
    if (layer >= 0 && l != layer) {
      ++it;
      continue;
    }
    comm::wait_all(it->second);
    const Tensor& buf = expert ? expert_buf_ : dense_buf_;
    for (size_t i = 0; i < ps.size(); ++i)
      if (layer_of_[i] == l && ps[i].expert == expert)
        std::memcpy(ps[i].param.raw(), buf.data<float>() + layout_.offset(i), ps[i].param.nbytes());
    if (l >= 0) model_.stack().params(l);  // the layer's bf16 copies refreshed as it next runs
    it = param_gathers_.erase(it);
  }
}

void Trainer::param_unpack(int layer, StepState& s) {
  {
    comm::TraceScope trace(comm::Lane::compute, layer >= 0 ? "param.unpack (the layer's gathers)"
                                                           : "param.unpack (wait for the gathers, copy)");
    unpack_params(layer);
  }
  if (layer >= 0) return;
  model_.stack().weights_changed();
  s.st.optim_ms = ms_since(s.t_opt);
}

void Trainer::sync_params() {
  if (stale_.empty() && param_gathers_.empty()) return;
  for (const auto& [layer, expert] : std::set<std::pair<int, bool>>(stale_))
    param_gather(layer, expert ? schedule::Bucket::expert : schedule::Bucket::dense);
  unpack_params(-1);
  model_.stack().weights_changed();
}

IterationStats Trainer::train_step() {
  StepState s;
  IterationStats& st = s.st;
  const auto t_iter = Clock::now();
  model_.times() = {};
  model_.stack().executor().reset_stats();
  st.lr = learning_rate(cfg_, iteration_);
  model_.zero_grads();
  if (step_generation_ != model_.stack().generation()) plan_step();  // the layers were re-planned
  for (const schedule::StepTask& t : step_.tasks) run_step_task(t, s);
  consumed_ += G_;
  ++iteration_;
  st.iteration = iteration_;
  st.iter_ms = ms_since(t_iter);
  st.layers_ms = double(model_.times().layers_us) / 1e3;
  st.head_ms = double(model_.times().head_us) / 1e3;
  // Communication of this iteration from the op trace (cleared before each iteration).
  for (const comm::TraceRecord& r : comm::Trace::snapshot()) {
    if (r.cat == "wait") st.exposed_comm_ms += double(r.blocked_us) / 1e3;
    if (r.cat == "all_to_all") st.a2a_ms += double(r.end_us - r.start_us) / 1e3;
  }
  st.a2a_exposed_ms = double(model_.stack().executor().stats().blocked_us) / 1e3;
  return st;
}

int64_t Trainer::test_eval_iters() const { return std::min(cfg_.eval_iters, data_->test_samples() / G_); }

double Trainer::evaluate(bool test) {
  const int64_t iters = test ? test_eval_iters() : cfg_.eval_iters;
  AMPIPE_CHECK(iters > 0, "evaluate: no global batch to evaluate");
  sync_params();
  if (g_.pp.size() > 1) return evaluate_pipeline(test, iters);
  double sum = 0;
  for (int64_t e = 0; e < iters; ++e)
    for (int64_t j = 0; j < K_; ++j) {
      const int64_t first = e * G_ + (dp_rank_ * K_ + j) * b_;
      fill_batch(first, test ? Split::test : Split::valid);
      sum += model_.evaluate(tokens_, targets_, uint64_t(first * s_));
    }
  Tensor t = scalars_.rows(0, 1);
  t.fill(float(sum));
  if (g_.dp_cp.size() > 1) comm::all_reduce_sync(g_.dp_cp, t, comm::Reduce::sum, test ? "test.loss" : "eval.loss");
  return t.get(0) / double(iters * (G_ / b_));
}

std::map<std::string, Tensor> Trainer::full_params() {
  sync_params();
  std::map<std::string, Tensor> out;
  for (NamedParam& p : model_.params()) out[p.name] = full_tensor(p.param, p, cfg_.layer, g_, "full." + p.name).clone();
  for (const auto& [name, t] : model_.buffers()) out[name] = t.clone();  // whole on every rank
  share_over_group(g_.pp, out, "full.pp");                                 // every stage's
  return out;
}

int64_t Trainer::maybe_load() {
  if (cfg_.load.empty()) return 0;
  const bool optim = !(cfg_.no_load_optim || cfg_.finetune);
  CheckpointMeta meta;
  if (cfg_.use_distributed_optimizer && optim) {  // the whole state read, this rank's shard kept
    AdamW whole(model_.params());
    meta = load_checkpoint(cfg_.load, cfg_, model_, whole, g_, true);
    take_optimizer_state(whole);
  } else {
    meta = load_checkpoint(cfg_.load, cfg_, model_, opt_, g_, optim);
  }
  model_.stack().weights_changed();
  if (model_.tied_weight().defined()) exchange_tied(false);  // the last stage's LM head: the loaded embedding
  // --finetune (Megatron): the loaded model starts a new run, from iteration 0 and the first sample.
  iteration_ = cfg_.finetune ? 0 : meta.iteration;
  consumed_ = cfg_.finetune ? 0 : meta.consumed_samples;
  return iteration_;
}

void Trainer::save(int64_t iteration) {
  sync_params();
  CheckpointMeta meta;
  meta.iteration = iteration;
  meta.consumed_samples = consumed_;
  nlohmann::json& j = meta.json;
  j["format"] = "ampipe train checkpoint";
  j["version"] = 1;
  j["iteration"] = iteration;
  j["consumed_samples"] = consumed_;
  j["optimizer_steps"] = opt_.steps();
  j["config"] = to_json(cfg_);
  j["data"] = {{"source", data_->source()},
               {"train_samples", data_->train_samples()},
               {"consumed_samples", consumed_},
               {"order", data_->order()}};
  j["rng"] = {{"seed", cfg_.layer.seed},
              {"scheme", "Philox-4x32-10 keyed by (seed, layer, purpose, global token index, feature); no other "
                         "random state"}};
  j["saved_with"] = {{"ampipe_degree", cfg_.ampipe_degree},
                     {"expert_model_parallel_size", cfg_.layer.expert_model_parallel_size},
                     {"context_parallel_size", cfg_.layer.context_parallel_size},
                     {"pipeline_model_parallel_size", cfg_.pipeline_model_parallel_size},
                     {"world_size", g_.world.size()}};
  if (cfg_.use_distributed_optimizer) {
    AdamW whole = whole_optimizer_state();
    save_checkpoint(cfg_.save, meta, cfg_, model_, whole, g_, save_opts_);
  } else {
    save_checkpoint(cfg_.save, meta, cfg_, model_, opt_, g_, save_opts_);
  }
}

// ---- pipeline parallelism: the step Plan's pp tasks (schedule/step_plan.h) ----

// The stage's share of the step's statistics, after each forward (the last stage: after its head).
void Trainer::after_forward(StepState& s) {
  s.aux_sum += model_.aux_loss();
  s.z_sum += model_.z_loss();
  count_drops(s.dropped, s.choices);
  count_expert_loads();
}

namespace {
comm::Issue on_lane(bool fwd) {
  comm::Issue how;
  how.lane = fwd ? comm::Lane::pp_fwd : comm::Lane::pp_bwd;
  return how;
}
}  // namespace

// The peers of this stage's pipeline messages: activations come from the previous rank and go to the next, gradients
// the other way; with model chunks the first and the last rank are neighbours too (chunk c's output on the last rank
// is chunk c + 1's input on the first).
namespace {
int pp_peer(const comm::Group& pp, bool from_previous) {
  const int P = pp.size();
  return (pp.rank() + (from_previous ? P - 1 : 1)) % P;
}
}  // namespace

void Trainer::pp_recv(const schedule::StepTask& t) {
  const bool fwd = t.dir == model::Dir::fwd;
  const int m = t.micro_batch;
  const std::vector<Tensor>& ring = pp_in_[size_t(t.chunk)];
  Tensor buf = fwd ? ring[size_t(m) % ring.size()] : pp_grad_in_[size_t(pp_grads_received_++) % pp_grad_in_.size()];
  const std::string tag = fmt::format("pp.{}.mb{}.c{}", fwd ? "activation" : "grad", m, t.chunk);
  pp_recv_ev_[{m, t.chunk, fwd}] = {comm::recv(g_.pp, buf, pp_peer(g_.pp, fwd), tag, on_lane(fwd)), buf};
}

void Trainer::pp_wait(const schedule::StepTask& t) {
  const bool fwd = t.dir == model::Dir::fwd;
  const int m = t.micro_batch;
  const auto it = pp_recv_ev_.find({m, t.chunk, fwd});
  AMPIPE_CHECK(it != pp_recv_ev_.end(), "{}: no receive posted", t.name());
  {
    comm::TraceScope trace(comm::Lane::compute, fwd ? "pp.wait (activation)" : "pp.wait (gradient)");
    comm::wait_all({it->second.ev});
  }
  const Tensor buf = it->second.buf;
  pp_recv_ev_.erase(it);
  if (!fwd) return model_.set_stage_output_grad(buf, float(cfg_.moe_aux_loss_coeff));
  const int64_t first = first_sample(m);
  if (model_.stage().last() && t.chunk == model_.stage().chunks - 1) {  // the head's targets
    fill_batch(first, Split::train);
    model_.take_batch(tokens_, targets_);
  }
  model_.set_stage_input(buf, uint64_t(first * s_));
}

void Trainer::pp_send(const schedule::StepTask& t, StepState& s) {
  const bool fwd = t.dir == model::Dir::fwd;
  const int m = t.micro_batch;
  if (fwd)
    after_forward(s);
  else
    s.st.flops += model_.flops_per_micro_batch();
  std::vector<Tensor>& bufs = fwd ? pp_out_ : pp_grad_out_;
  std::vector<comm::Event>& evs = fwd ? pp_out_ev_ : pp_grad_out_ev_;
  const size_t k = size_t(pp_sent_[fwd]++) % bufs.size();
  if (evs[k].state()) comm::wait_all({evs[k]});  // the slot's previous send
  bufs[k].copy_from(fwd ? model_.stage_output() : model_.stage_input_grad());
  evs[k] = comm::send(g_.pp, bufs[k], pp_peer(g_.pp, !fwd),
                      fmt::format("pp.{}.mb{}.c{}", fwd ? "activation" : "grad", m, t.chunk), on_lane(fwd));
}

// Tied embeddings over the stages (Megatron's embedding group): the last stage's LM-head gradient is added to the
// first stage's embedding gradient before it is reduced and clipped (grad), and the updated embedding goes back to
// the last stage after the optimizer (and after a checkpoint load) (param).
void Trainer::exchange_tied(bool grad) {
  const PipelineStage& st = model_.stage();
  if (!(st.first() || st.last()) || !model_.tied_weight().defined()) return;
  const int last = g_.pp.size() - 1;
  if (!grad) {
    Tensor w = model_.tied_weight();
    comm::wait_all({st.first() ? comm::send(g_.pp, w, last, "pp.tied_param", on_lane(true))
                               : comm::recv(g_.pp, w, 0, "pp.tied_param", on_lane(true))});
    return;
  }
  Tensor dw = model_.tied_grad();
  if (st.last()) return comm::wait_all({comm::send(g_.pp, dw, 0, "pp.tied_grad", on_lane(false))});
  if (!tied_buf_.defined()) tied_buf_ = Tensor::empty(dw.shape());
  comm::wait_all({comm::recv(g_.pp, tied_buf_, last, "pp.tied_grad", on_lane(false))});
  float* d = dw.data<float>();
  const float* r = tied_buf_.data<float>();
  for (int64_t i = 0; i < dw.numel(); ++i) d[i] += r[i];
}

// Evaluation through the stages: each micro-batch's forward goes down the pipeline, one at a time; the loss is the
// last stage's, summed over the data-parallel ranks and handed to every stage.
double Trainer::evaluate_pipeline(bool test, int64_t iters) {
  const PipelineStage& st = model_.stage();
  double sum = 0;
  model_.stack().set_training(false);  // no dropout, no gate noise
  for (int64_t e = 0; e < iters; ++e)
    for (int64_t j = 0; j < K_; ++j) {
      const int64_t first = e * G_ + (dp_rank_ * K_ + j) * b_;
      const uint64_t base = uint64_t(first * s_);
      fill_batch(first, test ? Split::test : Split::valid);
      for (int c = 0; c < st.chunks; ++c) {  // the micro-batch's path: chunk 0 on every stage, then chunk 1, ...
        if (st.first() && c == 0) {
          model_.embedding_forward(tokens_, targets_, base);
        } else {
          Tensor in = pp_in_[0][0];
          comm::wait_all({comm::recv(g_.pp, in, pp_peer(g_.pp, true), "eval.pp.activation", on_lane(true))});
          model_.take_batch(tokens_, targets_);
          model_.set_stage_input(in, base);
        }
        model_.forward_layers(c);
        if (st.last() && c == st.chunks - 1) {
          if (cfg_.layer.sp()) model_.sp_gather(model::Dir::fwd);
          sum += model_.head_forward();
        } else {
          pp_out_[0].copy_from(model_.stage_output());
          comm::wait_all(
              {comm::send(g_.pp, pp_out_[0], pp_peer(g_.pp, false), "eval.pp.activation", on_lane(true))});
        }
      }
    }
  model_.stack().set_training(true);
  Tensor t = scalars_.rows(0, 1);
  t.fill(float(sum));
  if (g_.dp_cp.size() > 1) comm::all_reduce_sync(g_.dp_cp, t, comm::Reduce::sum, test ? "test.loss" : "eval.loss");
  comm::all_reduce_sync(g_.pp, t, comm::Reduce::sum, test ? "test.loss.pp" : "eval.loss.pp");
  return t.get(0) / double(iters * (G_ / b_));
}

void Trainer::evaluate_test(TrainResult& res, const std::function<void(const std::string&)>& say) {
  if (test_eval_iters() == 0) return;
  const double tl = evaluate(true);
  res.tests.push_back({iteration_, tl});
  write_eval_scalars(iteration_, tl, "test");
  say(fmt::format(" test loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.4E} |", iteration_, tl,
                  std::exp(tl)));
}

// Megatron's tags: "lm loss validation", "lm loss validation ppl" (and "lm loss test" ... for the test split), each
// also " vs samples".
void Trainer::write_eval_scalars(int64_t iteration, double loss, const char* split) {
  if (!tb_) return;
  const double ppl = std::exp(std::min(loss, 20.0));
  tb_->add_scalars(iteration, {{fmt::format("lm loss {}", split), loss}, {fmt::format("lm loss {} ppl", split), ppl}});
  tb_->add_scalars(consumed_, {{fmt::format("lm loss {} vs samples", split), loss},
                               {fmt::format("lm loss {} ppl vs samples", split), ppl}});
  tb_->flush();
}

int64_t Trainer::end_iteration(int64_t max_iterations) const {
  // --exit-interval E (Megatron's): stop at the first iteration divisible by E, counted from iteration 0.
  int64_t end = cfg_.train_iters;
  if (cfg_.exit_interval > 0) end = std::min(end, (iteration_ / cfg_.exit_interval + 1) * cfg_.exit_interval);
  if (max_iterations > 0) end = std::min(end, iteration_ + max_iterations);
  if (cfg_.skip_train) end = iteration_;
  return std::max(end, iteration_);
}

// Megatron's log line for the iterations of `window` (st the last of them), the per-layer MoE lines and the
// TensorBoard scalars; returns the window's expert loads (collective: every rank calls it).
MoeLog Trainer::log_window(const std::vector<IterationStats>& window, const IterationStats& st, bool tty,
                           const std::function<void(const std::string&)>& say) {
  IterationStats a{};
  for (const IterationStats& w : window) {
    a.lm_loss += w.lm_loss;
    a.aux_loss += w.aux_loss;
    a.z_loss += w.z_loss;
    a.drop_fraction += w.drop_fraction;
    a.iter_ms += w.iter_ms;
    a.flops += w.flops;
    a.exposed_comm_ms += w.exposed_comm_ms;
    a.a2a_ms += w.a2a_ms;
    a.a2a_exposed_ms += w.a2a_exposed_ms;
  }
  const double n = double(window.size());
  const double ms = a.iter_ms / n;
  // Exposed times first (what the step waited for); the hidden share only where it means something.
  std::string a2a = g_.ep.size() > 1 ? fmt::format(" a2a exposed (ms): {:.2f} |", a.a2a_exposed_ms / n) : "";
  if (g_.ep.size() > 1 && report_a2a_hidden_ && a.a2a_ms > 0)
    a2a += fmt::format(" a2a hidden: {:.1f}% |", 100.0 * std::clamp(1.0 - a.a2a_exposed_ms / a.a2a_ms, 0.0, 1.0));
  // Expert loads of the window (collective): the layer with the largest max / mean load and the one with the
  // largest drop share (kept counts are capped by the capacity, so a skewed router shows in both).
  const MoeLog moe = reduce_expert_loads(st.iteration);
  size_t worst = 0, most_dropped = 0;
  for (size_t i = 1; i < moe.layers.size(); ++i) {
    if (moe.layers[i].load_imbalance() > moe.layers[worst].load_imbalance()) worst = i;
    if (moe.layers[i].dropped_fraction() > moe.layers[most_dropped].dropped_fraction()) most_dropped = i;
  }
  const std::string z_loss =
      cfg_.layer.moe_z_loss_coeff > 0 ? fmt::format(" z loss: {:.4E} |", a.z_loss / n) : std::string();
  const std::string moe_summary =
      moe.layers.empty()
          ? std::string()
          : fmt::format(" expert load max/mean: {:.3f} (layer {}) | most dropped: {:.2f}% (layer {}) |",
                        moe.layers[worst].load_imbalance(), worst,
                        100.0 * moe.layers[most_dropped].dropped_fraction(), most_dropped);
  const double tokens_per_s = double(G_ * s_) / (ms / 1e3), tflops = a.flops / (a.iter_ms / 1e3) / 1e12;
  if (tty) std::fputs("\r\033[K", stdout);
  // Megatron's log line, key for key in its order (megatron/training/training.py, training_log): bf16 has no
  // loss scale (1.0), and no iteration is skipped or NaN here (a NaN or Inf stops the run on every rank). This
  // engine's fields follow.
  say(fmt::format(" [{}] iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per iteration (ms): {:.1f} "
                  "| throughput per GPU (TFLOP/s/GPU): {:.3f} | learning rate: {:.6E} | global batch size: {:5d} | "
                  "lm loss: {:.6E} | loss scale: 1.0 | grad norm: {:.4f} | number of skipped iterations: {:3d} | "
                  "number of nan iterations: {:3d} | tokens/s: {:.0f} | aux loss: {:.4E} | token drops: {:.2f}% | "
                  "exposed comm (ms): {:.2f} |{}{}{}",
                  log_timestamp(), st.iteration, cfg_.train_iters, consumed_, ms, tflops, st.lr, G_, a.lm_loss / n,
                  st.grad_norm, 0, 0, tokens_per_s, a.aux_loss / n, 100.0 * a.drop_fraction / n,
                  a.exposed_comm_ms / n, a2a, z_loss, moe_summary));
  if (cfg_.moe_per_layer_logging)
    for (size_t i = 0; i < moe.layers.size(); ++i) {
      const MoeLayerStats& l = moe.layers[i];
      say(fmt::format(" moe layer {}: max/mean load: {:.3f} | dropped: {:.2f}% of {} choices | tokens per "
                      "expert: {} |",
                      i, l.load_imbalance(), 100.0 * l.dropped_fraction(), l.choices, fmt::join(l.tokens, " ")));
    }
  if (tb_) {
    // Megatron's tags, each also " vs samples" (the consumed samples as the step), then this engine's.
    const std::vector<std::pair<std::string, double>> megatron = {
        {"learning-rate", st.lr}, {"batch-size", double(G_)}, {"lm loss", a.lm_loss / n},
        {"loss-scale", 1.0},      {"grad-norm", st.grad_norm}};
    std::vector<std::pair<std::string, double>> vs_samples;
    for (const auto& [tag, v] : megatron) vs_samples.emplace_back(tag + " vs samples", v);
    tb_->add_scalars(consumed_, vs_samples);
    std::vector<std::pair<std::string, double>> sc = megatron;
    sc.insert(sc.end(), {{"iteration-time", ms / 1e3},
                         {"throughput", tflops},
                         {"aux loss", a.aux_loss / n},
                         {"z loss", a.z_loss / n},
                         {"tokens/s", tokens_per_s},
                         {"exposed communication ms", a.exposed_comm_ms / n},
                         {"moe/dropped_fraction", a.drop_fraction / n}});
    if (g_.ep.size() > 1) sc.emplace_back("a2a exposed ms", a.a2a_exposed_ms / n);
    if (g_.ep.size() > 1 && report_a2a_hidden_ && a.a2a_ms > 0)
      sc.emplace_back("a2a hidden fraction", std::clamp(1.0 - a.a2a_exposed_ms / a.a2a_ms, 0.0, 1.0));
    for (size_t i = 0; i < moe.layers.size(); ++i) {
      const MoeLayerStats& l = moe.layers[i];
      sc.emplace_back(fmt::format("moe/layer{}/load_imbalance", i), l.load_imbalance());
      sc.emplace_back(fmt::format("moe/layer{}/dropped_fraction", i), l.dropped_fraction());
      for (size_t e = 0; e < l.tokens.size(); ++e)
        sc.emplace_back(fmt::format("moe/layer{}/expert{}_tokens", i, e), double(l.tokens[e]));
    }
    tb_->add_scalars(st.iteration, sc);
    tb_->flush();
  }
  return moe;
}

TrainResult Trainer::train(const std::function<void(const std::string&)>& print, int64_t max_iterations) {
  TrainResult res;
  res.start_iteration = iteration_;
  const bool rank0 = g_.world.rank() == 0;
  auto say = [&](const std::string& line) {
    if (rank0 && print) print(line);
  };
  // A progress bar only on a terminal, and not under mpirun (whose output forwarding looks like a terminal).
  const bool tty = rank0 && print && isatty(STDOUT_FILENO) && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr &&
                   std::getenv("PMI_SIZE") == nullptr;
  const int64_t end = end_iteration(max_iterations);
  const int64_t trace_at = iteration_ + cfg_.trace_iteration;  // the K-th iteration of this run
  const bool tracing = !cfg_.trace.empty();
  if (rank0 && !cfg_.tensorboard_dir.empty() && !tb_) tb_ = std::make_unique<EventWriter>(cfg_.tensorboard_dir);
  comm::Trace::set_enabled(true);
  const auto t_start = Clock::now();
  std::vector<IterationStats> window;
  while (iteration_ < end) {
    comm::Trace::clear();
    IterationStats st = train_step();
    res.iterations.push_back(st);
    window.push_back(st);
    if (tracing && st.iteration == trace_at) {
      comm::Trace::write_chrome_trace(cfg_.trace);
      say(fmt::format(" trace of iteration {} written to {}", st.iteration, cfg_.trace));
    }
    if (st.iteration % cfg_.log_interval == 0 || st.iteration == end) {
      res.moe.push_back(log_window(window, st, tty, say));
      window.clear();
    } else if (tty) {
      const int width = 30, done = int(width * (st.iteration - res.start_iteration) / std::max<int64_t>(1, end - res.start_iteration));
      std::printf("\r [%s%s] %lld/%lld", std::string(size_t(done), '#').c_str(),
                  std::string(size_t(width - done), '.').c_str(), (long long)st.iteration, (long long)end);
      std::fflush(stdout);
    }
    // SIGTERM / SIGINT (stop_signal.h): every rank learns here whether any rank got one, so all stop together,
    // after this iteration, saving it as the end of a run is saved (but without its evaluation).
    res.stop_signal = stop_agreed(g_.world);
    const bool last = st.iteration == end || res.stop_signal != 0;
    if (cfg_.eval_iters > 0 && cfg_.eval_interval > 0 &&
        (st.iteration % cfg_.eval_interval == 0 || st.iteration == end)) {
      const double vl = evaluate();
      res.evals.push_back({st.iteration, vl});
      write_eval_scalars(st.iteration, vl, "validation");
      if (tty) std::fputs("\r\033[K", stdout);
      say(fmt::format(" validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.4E} |", st.iteration,
                      vl, std::exp(vl)));
      if (last) evaluate_test(res, say);
    }
    if (!cfg_.save.empty() && ((cfg_.save_interval > 0 && st.iteration % cfg_.save_interval == 0) || last)) {
      save(st.iteration);
      say(fmt::format(" saved checkpoint at iteration {} to {}/{}", st.iteration, cfg_.save,
                      checkpoint_subdir(st.iteration)));
    }
    if (res.stop_signal != 0) break;
  }
  // Nothing to train (--skip-train, or a checkpoint already at --train-iters): the evaluation of the end of a
  // run still runs, as in Megatron.
  if (res.iterations.empty() && cfg_.evaluates()) {
    const double vl = evaluate();
    res.evals.push_back({iteration_, vl});
    write_eval_scalars(iteration_, vl, "validation");
    say(fmt::format(" validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.4E} |", iteration_, vl,
                    std::exp(vl)));
    evaluate_test(res, say);
  }
  sync_params();  // the model whole for whoever reads it next
  if (tb_) tb_->flush();
  comm::Trace::clear();
  comm::Trace::set_enabled(false);
  res.wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  return res;
}

}  // namespace ampipe::train
