#include "ampipe/schedule/layer_stack.h"

#include "ampipe/comm/collectives.h"
#include "ampipe/model/gate.h"

namespace ampipe::schedule {

LayerStack::LayerStack(const model::LayerConfig& cfg, int num_layers, int M, int ep_rank, const comm::Groups* groups,
                       int first_layer, std::shared_ptr<model::Arena> arena)
    : LayerStack(std::vector<model::LayerConfig>(size_t(std::max(num_layers, 0)), cfg), M, ep_rank, groups, first_layer,
                 std::move(arena)) {}

LayerStack::LayerStack(std::vector<model::LayerConfig> cfgs, int M, int ep_rank, const comm::Groups* groups,
                       int first_layer, std::shared_ptr<model::Arena> arena)
    : M_(M), ep_rank_(ep_rank), arena_(arena ? std::move(arena) : std::make_shared<model::Arena>()), ex_(groups) {
  const model::LayerConfig cfg = cfgs.empty() ? model::LayerConfig{} : cfgs.front();
  const int tp_size = groups && groups->tp.valid() ? groups->tp.size() : 1;
  AMPIPE_CHECK(tp_size == cfg.tp(), "--tensor-model-parallel-size {} but the tp group has {} ranks", cfg.tp(), tp_size);
  tp_rank_ = tp_size > 1 ? groups->tp.rank() : 0;
  const int cp_size = groups && groups->cp.valid() ? groups->cp.size() : 1;
  AMPIPE_CHECK(cp_size == cfg.cp(), "context-parallel size {} but the cp group has {} ranks", cfg.cp(), cp_size);
  cp_rank_ = cp_size > 1 ? groups->cp.rank() : 0;
  for (size_t i = 0; i < cfgs.size(); ++i) {
    auto e = std::make_unique<Entry>();
    e->cfg = cfgs[i];
    if (first_layer >= 0) e->cfg.layer_index = first_layer + int(i);
    e->params = model::init_params(e->cfg, ep_rank, tp_rank_);
    e->grads = model::zeros_like_params(e->cfg);
    layers_.push_back(std::move(e));
  }
  build(M);
}

void LayerStack::build(int M) {
  M_ = M;
  size_t saved = 0, shared = 0;
  std::vector<Plan> plans;
  std::vector<bool> recompute;
  for (auto& e : layers_) {
    e->layers.clear();
    plans.push_back(build_layer_plan(e->cfg, M));
    recompute.push_back(e->cfg.recompute);
    saved += plans.back().memory.saved_bytes;
    shared = std::max(shared, plans.back().memory.shared_bytes);
  }
  step_ = build_layers_step_plan(std::move(plans), recompute);
  ++generation_;
  // An arena of our own fits this plan exactly (a re-plan may need less, e.g. with recomputation); one shared with
  // other stacks only grows.
  // [slot 0: layer 0 saved | layer 1 saved | ...][slot 1: ...] ... [shared]
  const size_t all_saved = saved * size_t(slots_);
  if (arena_.use_count() == 1)
    arena_->resize(all_saved + shared);
  else
    arena_->reserve(all_saved + shared);
  size_t base = 0;
  for (int w = 0; w < slots_; ++w)
    for (size_t i = 0; i < layers_.size(); ++i) {
      Entry& e = *layers_[i];
      const Plan& plan = step_.layer(int(i));
      e.layers.push_back(std::make_unique<model::Layer>(e.cfg, M, ep_rank_, tp_rank_, cp_rank_, e.params, e.grads,
                                                        e.weights, plan.memory, *arena_, base, all_saved, *ctx_));
      e.input.resize(size_t(slots_));
      e.token_base.resize(size_t(slots_));
      base += plan.memory.saved_bytes;
    }
  slot_ = 0;
}

void LayerStack::set_slots(int n) {
  AMPIPE_CHECK(n >= 1, "set_slots: {} slots", n);
  if (n == slots_) return;
  slots_ = n;
  build(M_);
}

void LayerStack::set_chunks(int v) {
  AMPIPE_CHECK(v >= 1 && num_layers() % v == 0, "set_chunks: {} layers in {} chunks", num_layers(), v);
  chunks_ = v;
  chunk_ = 0;
}

void LayerStack::set_degree(int M) {
  if (layers_.empty()) {
    M_ = M;
    return;
  }
  int n = 0;  // the same pipe-experts setting (the MoE layers')
  for (const auto& e : layers_)
    if (e->cfg.use_pipe_experts) n = e->cfg.pipe_experts_multi_data;
  replan(M, n);
}

void LayerStack::replan(int M, int pipe_experts_n, int tp_overlap) {
  bool changed = M != M_;
  for (auto& e : layers_) {
    const bool on = pipe_experts_n > 0 && !e->cfg.dense();  // a dense layer has no experts to pipeline
    const int n = on ? pipe_experts_n : 1;
    changed |= e->cfg.use_pipe_experts != on || e->cfg.pipe_experts_multi_data != n;
    e->cfg.use_pipe_experts = on;
    e->cfg.pipe_experts_multi_data = n;
    if (tp_overlap >= 0) {
      changed |= e->cfg.ampipe_tp_sp_comm_overlap != (tp_overlap > 0);
      e->cfg.ampipe_tp_sp_comm_overlap = tp_overlap > 0;
    }
  }
  if (changed) build(M);
}

void LayerStack::set_recompute(const std::vector<bool>& layers) {
  AMPIPE_CHECK(layers.size() == layers_.size(), "set_recompute: {} flags for {} layers", layers.size(),
               layers_.size());
  bool changed = false;
  for (size_t i = 0; i < layers_.size(); ++i) {
    changed |= layers_[i]->cfg.recompute != layers[i];
    layers_[i]->cfg.recompute = layers[i];
  }
  if (changed) build(M_);
}

void LayerStack::set_training(bool on) {
  for (auto& e : layers_) {
    e->cfg.training = on;
    for (auto& l : e->layers) l->set_training(on);
  }
}

void LayerStack::weights_changed() {
  for (auto& e : layers_)
    for (auto& l : e->layers) l->weights_changed();
}

model::LayerParams& LayerStack::params(int i) {
  for (auto& l : layers_[size_t(i)]->layers) l->weights_changed();  // the caller may write them
  return layers_[size_t(i)]->params;
}

void LayerStack::set_input(const Tensor& x, uint64_t token_base) {
  x_ = x;
  token_base_ = token_base;
}

void LayerStack::set_output_grad(const Tensor& dy, float d_aux) {
  dy_ = dy;
  d_aux_ = d_aux;
}

void LayerStack::run(const StepTask& t) {
  AMPIPE_CHECK(t.is_layer() && t.layer >= 0 && t.layer < num_layers(), "LayerStack::run: {} is not a layer task of "
               "this stack's {} layers", t.name(), num_layers());
  const size_t i = size_t(t.layer);
  Entry& e = *layers_[i];
  const Plan& plan = step_.layer(t.layer);
  slot_ = t.micro_batch > 0 ? t.micro_batch % slots_ : 0;  // the micro-batch's copy of the saved activations
  chunk_ = t.layer / (num_layers() / chunks_);
  const auto [first, end] = chunk_range(chunk_);
  const size_t w = size_t(slot_);
  model::Layer& layer = e.at(slot_);
  if (t.op == StepOp::recompute) {  // refill what the backward reads: the same forward, the same random numbers
    AMPIPE_CHECK(e.cfg.recompute, "{}: layer {} is not recomputed", t.name(), t.layer);
    layer.begin_forward(e.input[w], e.token_base[w], /*recompute=*/true);
    ex_.run(plan, Dir::fwd, layer);
  } else if (t.dir == Dir::fwd) {
    e.input[w] = int(i) == first ? x_ : layers_[i - 1]->at(slot_).output();
    e.token_base[w] = token_base_;
    layer.begin_forward(e.input[w], e.token_base[w]);
    ex_.run(plan, Dir::fwd, layer);
  } else {
    layer.begin_backward(int(i) + 1 == end ? dy_ : layers_[i + 1]->at(slot_).input_grad(), d_aux_);
    ex_.run(plan, Dir::bwd, layer);
  }
}

Tensor LayerStack::forward(const Tensor& x, uint64_t token_base) {
  set_input(x, token_base);
  for (const StepTask& t : step_.tasks)
    if (t.op == StepOp::layer && t.dir == Dir::fwd) run(t);
  return output();
}

Tensor LayerStack::backward(const Tensor& dy, float d_aux, const std::function<void(int)>& after_layer) {
  set_output_grad(dy, d_aux);
  for (const StepTask& t : step_.tasks) {
    if (!t.is_layer() || (t.op == StepOp::layer && t.dir == Dir::fwd)) continue;
    run(t);
    if (after_layer && t.op == StepOp::layer) after_layer(t.layer);
  }
  return input_grad();
}

double LayerStack::z_loss() const {
  double z = 0;
  for (int i = chunk_layers().first; i < chunk_layers().second; ++i) z += layer(i).z_loss_value();
  return z;
}

double LayerStack::aux_loss() const {
  double a = 0;
  for (int i = chunk_layers().first; i < chunk_layers().second; ++i) a += layer(i).aux_loss_value();
  return a;
}

double LayerStack::flops() const {
  double f = 0;
  for (int i = chunk_layers().first; i < chunk_layers().second; ++i) f += layer(i).flops();
  return f;
}

size_t LayerStack::planned_bytes() const {
  size_t saved = 0, shared = 0;
  for (const Plan& p : step_.config.layers) {
    saved += p.memory.saved_bytes;
    shared = std::max(shared, p.memory.shared_bytes);
  }
  return saved * size_t(slots_) + shared;
}

void LayerStack::zero_grads() {
  for (auto& e : layers_)
    for (auto& [name, g] : e->grads.named()) g.zero();
}

bool LayerStack::has_expert_bias() const {
  for (const auto& e : layers_)
    if (e->params.expert_bias.defined()) return true;
  return false;
}

void LayerStack::update_expert_bias(const comm::Group& all, double rate) {
  std::vector<Entry*> biased;
  for (auto& e : layers_)
    if (e->params.expert_bias.defined()) biased.push_back(e.get());
  if (biased.empty()) return;
  const int64_t E = biased.front()->cfg.num_experts;
  if (!bias_counts_.defined()) bias_counts_ = Tensor::empty({int64_t(biased.size()), E});  // one all-reduce, every layer
  Tensor& counts = bias_counts_;
  for (size_t i = 0; i < biased.size(); ++i)
    std::copy_n(biased[i]->grads.expert_bias.data<float>(), E, counts.data<float>() + int64_t(i) * E);
  if (all.size() > 1) comm::all_reduce_sync(all, counts, comm::Reduce::sum, "expert_bias.counts");
  for (size_t i = 0; i < biased.size(); ++i) {
    const float* n = counts.data<float>() + int64_t(i) * E;
    model::update_expert_bias({biased[i]->params.expert_bias.data<float>(), size_t(E)}, {n, size_t(E)}, rate);
    biased[i]->grads.expert_bias.zero();
  }
}

}  // namespace ampipe::schedule
