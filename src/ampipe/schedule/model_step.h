// The step Plan of a GPT-MoE model from its shapes alone (closed forms, per device): what `ampipe simulate` costs
// and `ampipe plan --step` prints for a configuration that has not been launched. The trainer builds its own step
// Plan from the tensors it holds (train/trainer.cpp, Trainer::plan_step); this one counts the parameters instead:
//   dense per layer   ln1 2h + attn.qkv 3h^2/tp + attn.proj h^2/tp + ln2 2h + moe.gate E*h = 4h^2/tp + 4h + E*h
//   expert per layer  L * (fc1 F1*h + fc2 h*F) / tp, F1 = F (GeLU) or 2F (SwiGLU), L = E/ep this rank's experts
//   outside layers    word embedding V*h/tp + position s*h (none with rotary embeddings) + final LayerNorm 2h
//                     (+ output layer V*h/tp when untied)
// with the vocabulary split over tp as Megatron's vocabulary-parallel embedding and head (vocab_parallel; the
// engine itself keeps the whole vocabulary on every tp rank: vocab_parallel = false). Buckets: a layer's dense
// parameters reduced over dp x cp, its expert ones over dp x cp / ep (fp32, 4 bytes each).
#pragma once

#include <cstdint>
#include <vector>

#include "ampipe/model/layer_config.h"
#include "ampipe/schedule/step_plan.h"

namespace ampipe::schedule {

struct ModelShape {
  model::LayerConfig layer;  // layer_index is set per layer
  int num_layers = 1;
  // One config per layer where they differ (a model with dense blocks, train::TrainConfig::layer_configs); empty:
  // `layer` for every layer.
  std::vector<model::LayerConfig> layers;
  int64_t vocab = 256;
  bool untie_embeddings = false;
  bool position_embedding = true;  // learned absolute positions (false: rotary, no embedding table)
  bool vocab_parallel = true;
  int dp = 1;                      // data-parallel size
  int micro_batches = 1;           // per device per iteration
  std::vector<bool> recompute;     // per layer; empty: none
  bool distributed_optimizer = false;  // --use-distributed-optimizer: the optimizer state sharded over the groups
  bool overlap_param_gather = false;   // --overlap-param-gather: the layers' gathers under the next forward
  // pipeline stages (an even split of num_layers): the step Plan of stage pp_rank of pp, its layers only, the
  // embedding on the first, the head on the last (layers, recompute: the whole model's, one per layer)
  int pp = 1, pp_rank = 0;
  // virtual stages: the stage's layers are `chunks` model chunks (chunk c: virtual stage c pp + pp_rank), run in
  // Megatron's interleaved order with micro-batch groups of `microbatch_group` (0: pp)
  int chunks = 1, microbatch_group = 0;
};

// Parameters of one layer on this device: dense, expert.
// The attention's weights of one layer, unsharded: (h + 2g*d) * h for [q | k | v] (3h^2 without grouped queries)
// plus h^2 for the out-projection.
double attention_weights(const model::LayerConfig& l);
// The dense MLP's weights of one layer, unsharded (a shared expert, or a dense layer's FFN; 0 without).
double mlp_weights(const model::LayerConfig& l);
double dense_layer_params(const model::LayerConfig& l);
double expert_layer_params(const model::LayerConfig& l);

// The step Plan's configuration at AMPipe degree M (layer Plans built with build_layer_plan).
StepConfig model_step_config(const ModelShape& m, int M);

}  // namespace ampipe::schedule
