#include "ampipe/schedule/layer_stack.h"

namespace ampipe::schedule {

LayerStack::LayerStack(const model::LayerConfig& cfg, int num_layers, int M, int ep_rank, const comm::Groups* groups,
                       int first_layer, std::shared_ptr<model::Arena> arena)
    : M_(M), ep_rank_(ep_rank), arena_(arena ? std::move(arena) : std::make_shared<model::Arena>()), ex_(groups) {
  const int tp_size = groups && groups->tp.valid() ? groups->tp.size() : 1;
  AMPIPE_CHECK(tp_size == cfg.tp(), "--tensor-model-parallel-size {} but the tp group has {} ranks", cfg.tp(), tp_size);
  tp_rank_ = tp_size > 1 ? groups->tp.rank() : 0;
  const int cp_size = groups && groups->cp.valid() ? groups->cp.size() : 1;
  AMPIPE_CHECK(cp_size == cfg.cp(), "context-parallel size {} but the cp group has {} ranks", cfg.cp(), cp_size);
  cp_rank_ = cp_size > 1 ? groups->cp.rank() : 0;
  for (int i = 0; i < num_layers; ++i) {
    auto e = std::make_unique<Entry>();
    e->cfg = cfg;
    e->cfg.layer_index = first_layer + i;
    e->params = model::init_params(e->cfg, ep_rank, tp_rank_);
    e->grads = model::zeros_like_params(e->cfg);
    layers_.push_back(std::move(e));
  }
  build(M);
}

void LayerStack::build(int M) {
  M_ = M;
  size_t saved = 0, shared = 0;
  for (auto& e : layers_) {
    e->layer.reset();
    e->plan = build_layer_plan(e->cfg, M);
    saved += e->plan.memory.saved_bytes;
    shared = std::max(shared, e->plan.memory.shared_bytes);
  }
  // An arena of our own fits this plan exactly (a re-plan may need less, e.g. with recomputation); one shared with
  // other stacks only grows.
  if (arena_.use_count() == 1)
    arena_->resize(saved + shared);
  else
    arena_->reserve(saved + shared);
  size_t base = 0;
  for (auto& e : layers_) {
    e->layer = std::make_unique<model::Layer>(e->cfg, M, ep_rank_, tp_rank_, cp_rank_, e->params, e->grads, e->weights, e->plan.memory,
                                              *arena_, base, saved);
    base += e->plan.memory.saved_bytes;
  }
}

void LayerStack::set_degree(int M) {
  if (layers_.empty()) {
    M_ = M;
    return;
  }
  const model::LayerConfig& c = layers_.front()->cfg;
  replan(M, c.use_pipe_experts ? c.pipe_experts_multi_data : 0);  // the same pipe-experts setting
}

void LayerStack::replan(int M, int pipe_experts_n, int tp_overlap) {
  bool changed = M != M_;
  for (auto& e : layers_) {
    const bool on = pipe_experts_n > 0;
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
    e->layer->set_training(on);
  }
}

void LayerStack::weights_changed() {
  for (auto& e : layers_) e->layer->weights_changed();
}

model::LayerParams& LayerStack::params(int i) {
  layers_[size_t(i)]->layer->weights_changed();  // the caller may write them
  return layers_[size_t(i)]->params;
}

Tensor LayerStack::forward(const Tensor& x, uint64_t token_base) {
  Tensor in = x;
  for (auto& e : layers_) {
    e->input = in;
    e->token_base = token_base;
    e->layer->begin_forward(in, token_base);
    ex_.run(e->plan, Dir::fwd, *e->layer);
    in = e->layer->output();
  }
  return in;
}

Tensor LayerStack::backward(const Tensor& dy, float d_aux, const std::function<void(int)>& after_layer) {
  Tensor g = dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    Entry& e = *layers_[i];
    if (e.cfg.recompute) {  // refill what the backward reads: the same forward, the same random numbers
      e.layer->begin_forward(e.input, e.token_base, /*recompute=*/true);
      ex_.run(e.plan, Dir::fwd, *e.layer);
    }
    e.layer->begin_backward(g, d_aux);
    ex_.run(e.plan, Dir::bwd, *e.layer);
    g = e.layer->input_grad();
    if (after_layer) after_layer(int(i));
  }
  return g;
}

double LayerStack::aux_loss() const {
  double a = 0;
  for (const auto& e : layers_) a += e->layer->aux_loss_value();
  return a;
}

double LayerStack::flops() const {
  double f = 0;
  for (const auto& e : layers_) f += e->layer->flops();
  return f;
}

size_t LayerStack::planned_bytes() const {
  size_t saved = 0, shared = 0;
  for (const auto& e : layers_) {
    saved += e->plan.memory.saved_bytes;
    shared = std::max(shared, e->plan.memory.shared_bytes);
  }
  return saved + shared;
}

void LayerStack::zero_grads() {
  for (auto& e : layers_)
    for (auto& [name, g] : e->grads.named()) g.zero();
}

}  // namespace ampipe::schedule
