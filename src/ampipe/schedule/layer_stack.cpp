#include "ampipe/schedule/layer_stack.h"

namespace ampipe::schedule {

LayerStack::LayerStack(const model::LayerConfig& cfg, int num_layers, int M, int ep_rank, const comm::Group* ep,
                       int first_layer)
    : M_(M), ep_rank_(ep_rank), ex_(ep) {
  for (int i = 0; i < num_layers; ++i) {
    Layer l;
    l.cfg = cfg;
    l.cfg.layer_index = first_layer + i;
    l.params = model::init_params(l.cfg, ep_rank);
    l.grads = model::zeros_like_params(l.cfg);
    l.plan = build_layer_plan(l.cfg.layer_index, M, plan_options({cfg.moe_no_drop, cfg.expert_model_parallel_size}));
    layers_.push_back(std::move(l));
  }
}

void LayerStack::set_degree(int M) {
  M_ = M;
  for (Layer& l : layers_)
    l.plan = build_layer_plan(l.cfg.layer_index, M, plan_options({l.cfg.moe_no_drop, l.cfg.expert_model_parallel_size}));
}

void LayerStack::set_training(bool on) {
  for (Layer& l : layers_) l.cfg.training = on;
}

const Tensor& LayerStack::forward(const Tensor& x, uint64_t token_base) {
  const Tensor* in = &x;
  for (Layer& l : layers_) {
    l.step = std::make_unique<model::LayerStep>(l.cfg, M_, ep_rank_, l.params, l.grads, token_base);
    l.step->begin_forward(*in);
    ex_.forward(l.plan, *l.step);
    in = &l.step->output();
  }
  return *in;
}

const Tensor& LayerStack::backward(const Tensor& dy, float d_aux, const std::function<void(int)>& after_layer) {
  const Tensor* g = &dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer& l = layers_[i];
    l.step->begin_backward(*g, d_aux);
    ex_.backward(l.plan, *l.step);
    g = &l.step->input_grad();
    if (after_layer) after_layer(int(i));
  }
  return *g;
}

double LayerStack::aux_loss() const {
  double a = 0;
  for (const Layer& l : layers_) a += l.step ? l.step->aux_loss_value() : 0.0;
  return a;
}

double LayerStack::flops() const {
  double f = 0;
  for (const Layer& l : layers_) f += l.step ? l.step->flops() : 0.0;
  return f;
}

void LayerStack::release_steps() {
  for (Layer& l : layers_) l.step.reset();
}

void LayerStack::zero_grads() {
  for (Layer& l : layers_)
    for (auto& [name, g] : l.grads.named()) g.zero();
}

}  // namespace ampipe::schedule
