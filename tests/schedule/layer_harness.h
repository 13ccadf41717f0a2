// Test harness: runs one layer forward + backward through the step driver (a one-layer schedule::LayerStack, the
// Plan executor inside) and returns every output and gradient by name ("y", "aux_loss", "grad.x",
// "grad.<parameter>").
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ampipe/core/philox.h"
#include "ampipe/model/layer_params.h"
#include "ampipe/schedule/layer_stack.h"

namespace ampipe::testing {

inline Tensor seeded_normal(Shape shape, uint64_t seed, uint64_t id, float scale = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape));
  const core::PhiloxKey key{seed, 0, core::RngPurpose::data};
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * core::philox_normal(key, id, uint64_t(i));
  return t;
}

struct LayerRun {
  std::map<std::string, Tensor> tensors;
  double aux = 0;
};

// One rank, all experts local (ep = 1), degree M; loss = <dy, y> + aux_coeff * l_aux.
// dy_scale scales the upstream gradient of y (0: the loss is the aux loss alone).
inline LayerRun run_layer(const model::LayerConfig& cfg, int M, float aux_coeff = 0.01f,
                          const model::LayerParams* given = nullptr, float dy_scale = 1.0f) {
  schedule::LayerStack stack(cfg, 1, M, 0, nullptr, cfg.layer_index);
  if (given) stack.params(0) = *given;
  const Shape act{cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size};
  const Tensor x = seeded_normal(act, cfg.seed, 0), dy = seeded_normal(act, cfg.seed, 1, dy_scale);
  LayerRun r;
  r.tensors["y"] = stack.forward(x, 0).clone();
  r.aux = stack.aux_loss();
  r.tensors["grad.x"] = stack.backward(dy, aux_coeff).clone();
  for (auto& [name, g] : stack.grads(0).named()) r.tensors["grad." + name] = g.clone();
  return r;
}

// A stack's outputs over two micro-batches (x, dy drawn from the seed; the gradients accumulate): each
// micro-batch's y and input gradient, and every layer's parameter gradients by name.
struct StackRun {
  std::vector<Tensor> ys, dxs;
  std::vector<std::map<std::string, Tensor>> grads;  // per layer
};
inline StackRun run_two_micro_batches(schedule::LayerStack& stack, const model::LayerConfig& cfg) {
  StackRun r;
  const Shape act{cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size};
  for (uint64_t m = 0; m < 2; ++m) {
    const Tensor x = seeded_normal(act, cfg.seed, 2 * m), dy = seeded_normal(act, cfg.seed, 2 * m + 1);
    r.ys.push_back(stack.forward(x, m * uint64_t(cfg.tokens())).clone());
    r.dxs.push_back(stack.backward(dy, 0.01f).clone());
  }
  for (int i = 0; i < stack.num_layers(); ++i) {
    std::map<std::string, Tensor> g;
    for (auto& [name, t] : stack.grads(i).named()) g[name] = t.clone();
    r.grads.push_back(g);
  }
  return r;
}

// max |a - b| / max(max |b|, tiny): a relative error over the whole tensor.
inline double rel_err(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num = std::max(num, double(std::abs(a.get(i) - b.get(i))));
    den = std::max(den, double(std::abs(b.get(i))));
  }
  return num / std::max(den, 1e-30);
}

}  // namespace ampipe::testing
