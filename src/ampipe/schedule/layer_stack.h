// The layers of a model: a stack of MoE blocks, each run through its own Plan. The order they run in is a step
// Plan's (schedule/step_plan.h): run(task) runs one layer task of it (a layer's forward, its replay, its backward)
// and is the one place that sequences begin_forward / run / begin_backward / run. forward / backward run the
// stack's own layers-only step Plan (forward layer 0..n-1, backward n-1..0 with the replays); the model (train/)
// runs its whole step Plan's layer tasks through run(); layer-check, bench-layer, the benchmarks and the tests use
// forward / backward (a single layer is a stack of one).
//
// It owns this rank's parameters and gradients (expert tensors: the local experts), one model::Layer per layer and
// the memory they use: the Plan's buffers are carved once from an Arena ([layer 0 saved | ... | shared]) and reused
// by every micro-batch and step, so a steady-state step allocates no tensor storage.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "ampipe/comm/group.h"
#include "ampipe/model/buffers.h"
#include "ampipe/model/layer.h"
#include "ampipe/model/layer_params.h"
#include "ampipe/schedule/executor.h"
#include "ampipe/schedule/plan.h"
#include "ampipe/schedule/step_plan.h"

namespace ampipe::schedule {

class LayerStack {
 public:
  // cfg.layer_index is ignored: layer i gets index first_layer + i (it keys its random numbers and names its tasks);
  // first_layer < 0 (the second form): each config's layer_index is kept (a stage of model chunks).
  // groups: this rank's process groups (null: one rank); with cfg.tp() > 1 the tp group's size must be tp, and this
  // rank keeps its tp shard of every layer. arena: memory shared with other stacks that never run at the same time
  // (null: a private one).
  LayerStack(const model::LayerConfig& cfg, int num_layers, int M, int ep_rank, const comm::Groups* groups,
             int first_layer = 0, std::shared_ptr<model::Arena> arena = nullptr);
  // One config per layer (a model that mixes dense and MoE blocks: model::LayerConfig::as_dense); they differ in
  // their FFN only (the same attention, parallel layout and options).
  LayerStack(std::vector<model::LayerConfig> cfgs, int M, int ep_rank, const comm::Groups* groups, int first_layer = 0,
             std::shared_ptr<model::Arena> arena = nullptr);

  int num_layers() const { return int(layers_.size()); }
  int degree() const { return M_; }
  int tp_rank() const { return tp_rank_; }
  int cp_rank() const { return cp_rank_; }
  // Re-plans every layer for degree M (between steps; parameters and gradients are kept).
  void set_degree(int M);
  // Re-plans for degree M and pipe-experts with N slices per expert (N = 0: without pipe-experts), and with or
  // without --ampipe-tp-sp-comm-overlap (tp_overlap -1: as configured); the caller has checked the combination
  // (LayerConfig::check_pipe_experts, check_tensor_parallel).
  void replan(int M, int pipe_experts_n, int tp_overlap = -1);
  // Activation recomputation: layer i re-runs its forward (its own Plan, the same random numbers) just before its
  // backward, and keeps only its output and input gradient in between (model::LayerConfig::recompute). Re-plans
  // the memory; parameters and gradients are kept. `layers` has one entry per layer.
  void set_recompute(const std::vector<bool>& layers);
  // Pipeline stages: n copies of every layer's saved activations, one per micro-batch in flight on this stage
  // (the parameters, gradients and bf16 weights shared), in one arena. A layer task of micro-batch m uses copy m % n,
  // and output(), input_grad(), layer(i), aux_loss() are those of the copy the last layer task used. Re-plans the
  // memory; parameters and gradients are kept.
  void set_slots(int n);
  int slots() const { return slots_; }
  // Virtual pipeline stages: the layers are v model chunks of num_layers / v consecutive layers each; a chunk's first
  // layer reads set_input's x and its last layer's backward set_output_grad's dy. output(), input_grad(),
  // aux_loss(), z_loss(), flops() and chunk_layers() are those of the chunk of the last layer task. Default: 1.
  void set_chunks(int v);
  int chunks() const { return chunks_; }
  // [first, end): the layers of the last layer task's chunk (every layer with one chunk).
  std::pair<int, int> chunk_layers() const { return chunk_range(chunk_); }
  // Evaluation mode (false): no dropout and no gate noise in the following forwards.
  void set_training(bool on);
  // The parameters changed outside the stack (optimizer step, checkpoint load): the bf16 weight copies are
  // refreshed once before the next forward. params() (non-const) calls it too.
  void weights_changed();

  // x: [s, b, h] fp32 -> output [s, b, h] (valid until the next forward); sequence parallel: this rank's rows,
  // [s/t, b, h] in AMPipe's permuted order (sp_take). token_base: global index of token 0.
  Tensor forward(const Tensor& x, uint64_t token_base);
  // dy: [s, b, h] -> dx [s, b, h]; d_aux: upstream gradient of each layer's aux loss. Gradients accumulate.
  // after_layer(i), if given, runs as soon as layer i's gradients are complete (layers L-1 .. 0), e.g. to start
  // their data-parallel reduction while the layers below still compute.
  Tensor backward(const Tensor& dy, float d_aux, const std::function<void(int)>& after_layer = nullptr);
  // One layer task of a step Plan (StepOp::layer or StepOp::recompute): layer i's forward reads layer i-1's output
  // (layer 0: set_input's x), its backward layer i+1's input gradient (the last layer: set_output_grad's dy).
  void set_input(const Tensor& x, uint64_t token_base);
  void set_output_grad(const Tensor& dy, float d_aux);
  void run(const StepTask& t);
  // the chunk's last layer's output and first layer's input gradient, [s, b, h]
  Tensor output() const { return layers_[size_t(chunk_layers().second - 1)]->at(slot_).output(); }
  Tensor input_grad() const { return layers_[size_t(chunk_layers().first)]->at(slot_).input_grad(); }
  // The stack's own step Plan: its layers alone, one micro-batch (forward, then backward with the replays).
  const StepPlan& step_plan() const { return step_; }
  // Changes whenever the layers are re-planned (degree, pipe-experts, recomputation): a step Plan built from
  // plan(i) before is stale.
  uint64_t generation() const { return generation_; }

  // Sum of the layers' aux losses of the last forward.
  double aux_loss() const;
  double z_loss() const;  // sum of the layers' router z-losses (coefficients included)
  double flops() const;  // of the last step, forward + backward

  model::LayerParams& params(int i);
  const model::LayerParams& params(int i) const { return layers_[size_t(i)]->params; }
  model::LayerParams& grads(int i) { return layers_[size_t(i)]->grads; }
  const model::Layer& layer(int i) const { return layers_[size_t(i)]->at(slot_); }
  // Layer i's config (stable for the stack's life; re-planning changes only its schedule options).
  const model::LayerConfig& config(int i) const { return layers_[size_t(i)]->cfg; }
  model::Layer& layer(int i) { return layers_[size_t(i)]->at(slot_); }
  const Plan& plan(int i) const { return step_.layer(i); }
  Executor& executor() { return ex_; }
  void zero_grads();
  // --moe-router-enable-expert-bias: the step's bias update (model::update_expert_bias), after the last micro-batch's
  // backward and before the optimizer, as Megatron's finalize_model_grads: the tokens each layer routed to each
  // expert are summed over `all` (every rank: each counts its own tokens; tp ranks without SP count the same ones,
  // which scales every count alike and leaves the sign unchanged), every layer's bias moves, the counts restart.
  // Every rank ends with the same bias. A no-op without expert bias.
  void update_expert_bias(const comm::Group& all, double rate);
  bool has_expert_bias() const;
  // Bytes of the stack's planned memory (its share of the arena).
  size_t planned_bytes() const;

  // The compute context its layers' kernels run in (and the model's head, on the same compute lane).
  kernels::ComputeContext& context() const { return *ctx_; }

 private:
  struct Entry {
    model::LayerConfig cfg;
    model::LayerParams params, grads;
    model::ComputeWeights weights;  // survives re-planning (set_degree)
    // one layer per slot (set_slots), with the last forward's input and token base (a recomputed layer re-runs it)
    std::vector<std::unique_ptr<model::Layer>> layers;
    std::vector<Tensor> input;
    std::vector<uint64_t> token_base;
    model::Layer& at(int slot) const { return *layers[size_t(slot)]; }
  };
  void build(int M);

  int M_, ep_rank_, tp_rank_ = 0, cp_rank_ = 0;
  int slots_ = 1, slot_ = 0;  // set_slots; the slot of the last layer task
  int chunks_ = 1, chunk_ = 0;  // set_chunks; the chunk of the last layer task
  std::pair<int, int> chunk_range(int c) const {
    const int n = num_layers() / chunks_;
    return {c * n, (c + 1) * n};
  }
  std::vector<std::unique_ptr<Entry>> layers_;
  StepPlan step_;  // the layers' Plans (layer i: step_.layer(i)) and their layers-only step
  uint64_t generation_ = 0;
  Tensor x_, dy_;  // set_input / set_output_grad
  uint64_t token_base_ = 0;
  float d_aux_ = 0;
  Tensor bias_counts_;  // [layers with an expert bias, E]: update_expert_bias's all-reduce, allocated once
  std::shared_ptr<model::Arena> arena_;
  // the context its layers' kernels run in: one per stack, as a stack is one compute lane (kernels/context.h)
  std::unique_ptr<kernels::ComputeContext> ctx_ = std::make_unique<kernels::ComputeContext>();
  Executor ex_;
};

}  // namespace ampipe::schedule
