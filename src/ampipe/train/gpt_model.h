// The GPT-MoE model: token + learned position embedding, num_layers MoE blocks (schedule::LayerStack, each block run
// through its own AMPipe Plan), final LayerNorm, LM head (tied to the token embedding unless
// --untie-embeddings-and-output-weights), softmax cross-entropy.
//
// Notation: s sequence, b micro-batch, T = s*b tokens (token t = s_index*b + b_index, the [s, b] layout), h hidden,
// V vocabulary, num_layers blocks (--num-layers; not L, which is the local expert count in docs/design.md).
//
// Context parallelism (cp = --context-parallel-size > 1): every cp rank runs the embedding, the final LayerNorm, the
// LM head and the loss on its own s/cp positions only, in the layer's row order (model/context_parallel.h: blocks r
// and 2cp-1-r, chunk by chunk [A_c ; B_c] at the stack's current degree), so nothing is gathered over cp and the
// logits are [T/cp, V]. forward / evaluate return this rank's share of the micro-batch's mean (its tokens' cross-
// entropy summed, divided by the whole T): the sum over the cp ranks is the mean. The embedding and head gradients
// are this rank's tokens' part likewise; the trainer sums every dense gradient over dp x cp. The per-token values
// do not depend on cp (a token's embedding, LayerNorm and logits use its row only), so this is exact up to the
// order of the sums.
//
// Parameter names (independent of AMPipe degree and EP size; expert tensors are sharded over EP by rows of dim 0):
//   embedding.word_embeddings.weight      [V, h]
//   embedding.position_embeddings.weight  [s, h]
//   layers.{i}.<model::LayerParams name>  (ln1.weight, attn.qkv.weight, moe.experts.fc1.weight, ...)
//   final_layernorm.weight, final_layernorm.bias  [h]
//   output_layer.weight                   [V, h]   only when untied
// Initialisation: LayerNorms 1 / 0; layers as model::init_params; the embedding-level matrices
// init_method_std * philox_normal(key = (seed, layer 0xFFFFFF, init), token = id, feature = flat index), ids
// word 1, position 2, output 3.
#pragma once

#include <functional>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ampipe/comm/group.h"
#include "ampipe/core/tensor.h"
#include "ampipe/schedule/layer_stack.h"
#include "ampipe/train/train_config.h"

namespace ampipe::train {

struct NamedParam {
  std::string name;
  Tensor param, grad;  // local shard (expert tensors: this EP rank's experts; tp > 1: this tp rank's shard)
  bool expert = false;
  bool decay = false;  // weight decay applies (matrices), not to LayerNorm weights and biases
  std::string layer_param;  // the model::LayerParams name of a layer parameter ("ln1.weight", ...); "" otherwise
  // A layer parameter's block config (blocks differ: dense and MoE, schedule::LayerStack::config); null otherwise.
  const model::LayerConfig* block = nullptr;
  // The config that shapes this tensor: its block's, or the model's `cfg` for the others.
  const model::LayerConfig& shaped_by(const model::LayerConfig& cfg) const { return block ? *block : cfg; }
  // The tensor is cut over the tp ranks (model::tp_split): each rank holds a different part.
  bool tp_sharded(const model::LayerConfig& cfg) const {
    return cfg.tp() > 1 && !layer_param.empty() && model::tp_split(shaped_by(cfg), layer_param).dim >= 0;
  }
  // Sequence parallel: each tp rank's gradient covers its rows only; the q, k norms: its heads only. So the
  // gradients are summed over tp.
  bool tp_partial_grad(const model::LayerConfig& cfg) const {
    return !layer_param.empty() && model::LayerParams::tp_partial_grad(cfg, layer_param);
  }
};

struct StepTimes {  // microseconds, accumulated over calls
  int64_t layers_us = 0;  // inside LayerStack forward / backward
  int64_t head_us = 0;    // embedding, final LayerNorm, LM head, cross-entropy
};

// This rank's pipeline stage (--pipeline-model-parallel-size): its layers of the model (model-wide indices, chunk by
// chunk with virtual stages: TrainConfig::stage_layers); the first stage holds the embedding, the last the final
// norm, LM head and loss. One stage: the whole model.
struct PipelineStage {
  int rank = 0, size = 1;
  int chunks = 1;           // model chunks (virtual stages) on this rank
  std::vector<int> layers;  // stage layer i -> model layer
  bool first() const { return rank == 0; }
  bool last() const { return rank == size - 1; }
  int global(int i) const { return layers[size_t(i)]; }
  int local(int model_layer) const;  // -1: not on this stage
};

class GptModel {
 public:
  // groups: this rank's groups (null: one rank); the stage is groups->layout's pipeline coordinate.
  GptModel(const TrainConfig& cfg, int ep_rank, const comm::Groups* groups);
  const PipelineStage& stage() const { return stage_; }

  // tokens, targets: [s, b] int32 (T each, the whole micro-batch on every rank). Runs the forward and returns the
  // mean cross-entropy over the T tokens; context parallel: this rank's share of it (the sum of its s/cp positions'
  // cross-entropy / T; the sum over the cp ranks is the mean). token_base: global index of token 0 (keys dropout
  // and gate noise; the same on every cp rank).
  double forward(std::span<const int32_t> tokens, std::span<const int32_t> targets, uint64_t token_base);
  // Sum of the layers' aux losses of the last forward.
  double aux_loss() const { return stack_.aux_loss(); }
  double z_loss() const { return stack_.z_loss(); }
  // Backward of loss_scale * mean cross-entropy + d_aux * aux loss; gradients accumulate (+=). after_layer(i):
  // see schedule::LayerStack::backward (the gradients of "layers.{i}.*" are complete when it runs).
  void backward(float loss_scale, float d_aux, const std::function<void(int)>& after_layer = nullptr);
  // Forward only (evaluation): mean cross-entropy (context parallel: this rank's share, as forward).
  double evaluate(std::span<const int32_t> tokens, std::span<const int32_t> targets, uint64_t token_base);

  // The parts of a micro-batch, as the tasks of the trainer's step Plan run them (schedule/step_plan.h); forward,
  // backward and evaluate are these in the step Plan's order. embedding_forward: this rank's rows of the tokens and
  // targets, the embedding, the layers' input. run_layer: a layer task. sp_gather (sequence parallel): fwd: the
  // last layer's rows of every tp rank for the head; bwd: the first layer's input gradient for the embedding.
  // head_forward: final LayerNorm, LM head, cross-entropy (returns what forward returns). head_backward: their
  // backward, the layers' output gradient. embedding_backward: the embedding gradients (accumulated).
  // micro_batch: with pipeline stages (the stack's slots), whose copy of the layers' input it fills.
  void embedding_forward(std::span<const int32_t> tokens, std::span<const int32_t> targets, uint64_t token_base,
                         int micro_batch = 0);
  void run_layer(const schedule::StepTask& t);
  void sp_gather(model::Dir d);
  double head_forward();
  void head_backward(float loss_scale, float d_aux);
  void embedding_backward();
  // Pipeline stages: take_batch picks this rank's rows of a micro-batch's tokens and targets (a stage without the
  // embedding: the head's targets); the layers' input (a stage after the first: the received activation, [rows, b, h]
  // as stage_output() gives it), their output and its gradient (a stage before the last: the received one), and the
  // gradient of their input (sent to the previous stage).
  void take_batch(std::span<const int32_t> tokens, std::span<const int32_t> targets);
  void set_stage_input(const Tensor& x, uint64_t token_base) { stack_.set_input(x, token_base); }
  Tensor stage_output() const { return stack_.output(); }
  void set_stage_output_grad(const Tensor& dy, float d_aux) { stack_.set_output_grad(dy, d_aux); }
  Tensor stage_input_grad() const { return stack_.input_grad(); }
  Shape stage_activation_shape() const;  // [rows, b, h]: what stages send each other
  // The layers' forward alone, in the stack's order (evaluation of a stage): model chunk `chunk`'s layers.
  void forward_layers(int chunk = 0);
  // Tied embeddings across stages: the first stage's word embedding and its gradient; on the last stage the LM
  // head's copy of it (trained as one: its gradient is added to the first stage's, the updated weight copied back).
  // Undefined elsewhere, and with one stage or untied weights.
  Tensor tied_weight() const;
  Tensor tied_grad() const;

  std::vector<NamedParam>& params() { return params_; }
  // State that is not trained but is saved with the weights, every rank holding it whole and the same: the routers'
  // expert biases ("layers.{i}.moe.gate.expert_bias" [E] fp32, --moe-router-enable-expert-bias; Megatron's
  // persistent buffer). Views: loading writes them.
  std::vector<std::pair<std::string, Tensor>> buffers();
  void zero_grads();
  void set_degree(int M) { stack_.set_degree(M); }
  // FLOPs of the last micro-batch's forward + backward: model::Layer::flops of every layer + the LM head's three
  // GEMMs 3 x 2 T h V (docs/training.md).
  double flops_per_micro_batch() const;
  StepTimes& times() { return times_; }
  schedule::LayerStack& stack() { return stack_; }

 private:
  // Picks this rank's rows of tokens and targets ([s, b], natural order) into tokens_, targets_ (local order).
  void take_rows(std::span<const int32_t> tokens, std::span<const int32_t> targets);
  void embed();

  TrainConfig cfg_;
  PipelineStage stage_;
  int64_t s_, b_, T_, h_, V_;
  int cp_;         // context-parallel size (cp; C is the capacity)
  int64_t sl_, Tl_;  // this rank's positions s/cp and tokens sl*b (cp = 1: s, T)
  std::vector<int64_t> pos_;  // [sl] global position of local row i (context_parallel.h's order at degree pos_M_)
  int pos_M_ = 0;
  schedule::LayerStack stack_;
  // parameters ([V,h], [s,h], [h], [h], [V,h] or undefined; those of this stage); wout_ on the last of several stages
  // with tied embeddings: the copy of the first stage's wte_ (not among params_)
  Tensor wte_, wpe_, lnf_w_, lnf_b_, wout_;
  Tensor dwte_, dwpe_, dlnf_w_, dlnf_b_, dwout_;  // gradients
  std::vector<NamedParam> params_;

  // Sequence parallel: between the embedding / head (every row of this cp rank, on every tp rank) and the layers
  // (this tp rank's rows of them).
  Tensor to_layers(const Tensor& full, Tensor& local);   // this rank's rows of `full` (no SP: `full` itself)
  Tensor from_layers(const Tensor& local, Tensor& full);  // every tp rank's rows, cp-local order (no SP: `local`)

  const comm::Groups* groups_;
  // Saved state of the micro-batch in flight.
  // Below, s and T are this cp rank's sl and Tl (C = 1: the whole micro-batch), rows in the layer's order.
  std::vector<int32_t> tokens_, targets_;  // [T] this rank's tokens and targets
  Tensor x0_;                    // [s, b, h] embedding output (layer 0 input, kept until the backward)
  Tensor xn_, lnf_mean_, lnf_rstd_, logits_, ce_loss_, lse_;  // [T, h], [T], [T], [T, V], [T], [T]
  Tensor dloss_, dxn_, dy_;      // [T], [T, h], [s, b, h]
  Tensor y_;                     // [s, b, h] the last layer's output, every row of this cp rank
  Tensor x_local_, dy_local_;    // sequence parallel: [s/t, b, h] this tp rank's rows of x0_ and dy_
  std::vector<Tensor> x_in_;     // pipeline stages: the layers' input of each micro-batch in flight (slots)
  Tensor dx0_;                   // [s, b, h] the embedding's output gradient (the layers' input gradient)
  Tensor gathered_, y_full_, dx_full_;  // sequence parallel: [s, b, h] all-gather target (rank order), cp-local order
  StepTimes times_;
};

// Stage `stage` of cfg's pipeline: its layers (TrainConfig::stage_layers).
PipelineStage pipeline_stage(const TrainConfig& cfg, int stage);

}  // namespace ampipe::train
