// A stack of MoE blocks, each run through its own Plan in turn: forward layer 0..L-1, backward L-1..0. Holds
// the parameters and gradients of this rank (expert tensors: the local experts) and one LayerStep per layer for
// the micro-batch in flight. Used by bench-layer and the trainer.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "ampipe/comm/group.h"
#include "ampipe/model/layer_params.h"
#include "ampipe/model/layer_step.h"
#include "ampipe/schedule/executor.h"
#include "ampipe/schedule/plan.h"

namespace ampipe::schedule {

class LayerStack {
 public:
  // cfg.layer_index is ignored: layer i gets index first_layer + i (it keys its random numbers).
  LayerStack(const model::LayerConfig& cfg, int num_layers, int M, int ep_rank, const comm::Group* ep,
             int first_layer = 0);

  int num_layers() const { return int(layers_.size()); }
  int degree() const { return M_; }
  void set_degree(int M);
  // Evaluation mode (false): no dropout and no gate noise in the following forwards.
  void set_training(bool on);

  // x: [s, b, h] fp32 -> output [s, b, h]. token_base: global index of the micro-batch's token 0.
  const Tensor& forward(const Tensor& x, uint64_t token_base);
  // dy: [s, b, h] -> dx [s, b, h]; d_aux: upstream gradient of each layer's aux loss. Gradients accumulate.
  // after_layer(i), if given, runs as soon as layer i's gradients are complete (layers L-1 .. 0), e.g. to start
  // their data-parallel reduction while the layers below still compute.
  const Tensor& backward(const Tensor& dy, float d_aux, const std::function<void(int)>& after_layer = nullptr);
  // Sum of the layers' aux losses of the last forward.
  double aux_loss() const;
  double flops() const;  // of the last step, forward + backward

  model::LayerParams& params(int i) { return layers_[size_t(i)].params; }
  model::LayerParams& grads(int i) { return layers_[size_t(i)].grads; }
  const model::LayerStep& step(int i) const { return *layers_[size_t(i)].step; }
  const Plan& plan(int i) const { return layers_[size_t(i)].plan; }
  Executor& executor() { return ex_; }
  void zero_grads();
  // Frees the saved activations of the last step (the per-layer LayerSteps).
  void release_steps();
  model::LayerStep& mutable_step(int i) { return *layers_[size_t(i)].step; }

 private:
  struct Layer {
    model::LayerConfig cfg;
    model::LayerParams params, grads;
    Plan plan;
    std::unique_ptr<model::LayerStep> step;
  };
  int M_, ep_rank_;
  std::vector<Layer> layers_;
  Executor ex_;
};

}  // namespace ampipe::schedule
