#include "ampipe/train/memory_estimate.h"

#include <algorithm>

#include "ampipe/model/layer_params.h"
#include "ampipe/model/size_check.h"
#include "ampipe/schedule/model_step.h"

namespace ampipe::train {

schedule::MemoryEstimate estimate_train_memory(const TrainConfig& cfg, int64_t train_samples, int world, int stage) {
  using model::checked_add;
  using model::checked_elements;
  using model::checked_mul;
  const model::LayerConfig& l = cfg.layer;
  const model::SizeFactor s{"--seq-length", l.seq_length}, b{"--micro-batch-size", l.micro_batch_size},
      h{"--hidden-size", l.hidden_size}, V{"--padded-vocab-size", cfg.padded_vocab_size};
  // The head's buffers hold this cp rank's s/C positions (gpt_model.h).
  const model::SizeFactor sl{"--seq-length / --context-parallel-size", l.seq_length / std::max(1, l.cp())};
  const int64_t T = checked_elements("the tokens of a micro-batch", {sl, b});
  const int64_t Th = checked_elements("the [T, h] activation", {sl, b, h});
  const int64_t TV = checked_elements("the [T, V] logits", {sl, b, V});
  const int64_t Vh = checked_elements("the [V, h] token embedding", {V, h});
  const int64_t sh = l.position_embedding == model::PositionEmbedding::learned_absolute
                         ? checked_elements("the [s, h] position embedding", {s, h})
                         : 0;  // rope, none: no table

  const int P = cfg.pp();
  if (stage < 0) {  // the largest stage
    schedule::MemoryEstimate best = estimate_train_memory(cfg, train_samples, world, 0);
    for (int q = 1; q < P; ++q) {
      schedule::MemoryEstimate e = estimate_train_memory(cfg, train_samples, world, q);
      if (e.total() > best.total()) best = std::move(e);
    }
    return best;
  }
  const bool first = stage == 0, last = stage == P - 1;
  const std::vector<model::LayerConfig> all = cfg.layer_configs();
  std::vector<model::LayerConfig> layers;
  for (int i : cfg.stage_layers(stage)) layers.push_back(all[size_t(i)]);
  // 1F1B: min(P - stage, K) micro-batches in flight (interleaved: the most of any chunk), each with its copy of the
  // layers' saved buffers
  const int64_t K =
      std::max<int64_t>(1, cfg.global_batch(world) / (l.micro_batch_size * cfg.data_parallel_size(world)));
  const int in_flight = cfg.pipeline_in_flight(stage, K);
  schedule::MemoryEstimate e =
      schedule::estimate_layer_stack(layers, cfg.ampipe_degree, cfg.stage_recompute(stage), in_flight);
  // Local parameter elements: the layers' (each block's: dense and MoE blocks differ) and the embedding-level ones.
  int64_t layer_params = 0;
  for (const model::LayerConfig& lc : layers)
    layer_params = checked_add(layer_params, schedule::layer_param_counts(lc).params, "the layers' parameters");
  // the embedding (first stage), the final LayerNorm and the output layer or, tied on another stage, its copy (last)
  int64_t head = first ? checked_add(Vh, sh, "the embedding sizes") : 0;
  if (last) head = checked_add(head, 2 * l.hidden_size, "the embedding sizes");  // final LayerNorm weight and bias
  if (last && (cfg.untie_embeddings_and_output_weights || !first))
    head = checked_add(head, Vh, "the output layer's size");
  const int64_t head_bytes = checked_mul(head, 4, "the embedding bytes");
  e.add("parameters", head_bytes);
  e.add("gradients", head_bytes);
  const int64_t params =
      checked_add(layer_params, head, "the parameter count");
  const int64_t param_bytes = checked_mul(params, 4, "the parameter bytes");
  int64_t state = checked_mul(param_bytes, 2, "the optimizer state");
  if (cfg.use_distributed_optimizer) {  // this rank's shard of each group's parameters
    int64_t expert = 0;
    for (const model::LayerConfig& lc : layers) expert += int64_t(schedule::expert_layer_params(lc));
    const int64_t dense_group = std::max<int64_t>(1, int64_t(cfg.data_parallel_size(world)) * l.cp());
    const int64_t expert_group = std::max<int64_t>(1, dense_group / std::max(1, l.expert_model_parallel_size));
    // (the gradients are reduce-scattered and the parameters gathered in place, in the flat reduction buffers)
    state = 8 * ((params - expert + dense_group - 1) / dense_group + (expert + expert_group - 1) / expert_group);
  }
  e.add("optimizer state (AdamW, 2 fp32 moments)", state);
  e.add("gradient all-reduce buffers", param_bytes);

  // GptModel's buffers (T: this cp rank's tokens): x0, xn, dxn, dy [T, h]; logits [T, V]; five [T] vectors
  // (LayerNorm statistics, per-token loss and log-sum-exp, loss gradient); sequence parallelism: two [T/t, h] local
  // row sets and three [T, h] gathers.
  int64_t act = first ? Th : 0;  // x0
  if (last) {
    act = checked_add(act, checked_add(checked_mul(Th, 3, "[T, h] buffers"), TV, "the head's buffers"), "head");
    act = checked_add(act, checked_mul(T, 5, "[T] buffers"), "the head's buffers");
  }
  if (l.sp()) act = checked_add(act, checked_add(checked_mul(Th, 3, "sp"), 2 * (Th / l.tp()), "sp"), "sp");
  e.add("embedding + LM head buffers", checked_mul(act, 4, "the head's buffer bytes"));
  if (P > 1) {  // the received activations kept per micro-batch in flight (+1) of each model chunk, two gradient and
               // four send slots
    const int64_t slots = int64_t(cfg.virtual_stages()) * (in_flight + 1) + 6;
    e.add("pipeline stage buffers", checked_mul(checked_mul(Th / (l.sp() ? l.tp() : 1), slots, "slots"), 4, "slots"));
  }
  if (train_samples > 0) e.add("data order", checked_mul(train_samples, 8, "the data order"));

  if (!cfg.save.empty() || !cfg.load.empty()) {
    // Checkpoints hold full tensors, and core/safetensors builds (save) or reads (load) a whole file in one buffer.
    // Save: every sharded matrix and both its moments gathered whole, plus the optimizer file's buffer (two moments
    // of every full tensor, the larger file). Load: the optimizer file read whole plus its parsed tensors. The
    // larger of the two, on top of the steady state (a save runs between steps, a load before the first).
    int64_t full_layer = 0, sharded = 0;
    for (const std::string& name : model::param_names(l)) {
      int64_t n = 1;
      for (int64_t d : model::full_shape(l, name)) n = checked_mul(n, d, "a parameter's size");
      full_layer = checked_add(full_layer, n, "the checkpoint's size");
      const bool expert = model::LayerParams::is_expert(name);
      if ((expert && l.expert_model_parallel_size > 1) || (l.tp() > 1 && model::tp_split(l, name).dim >= 0))
        sharded = checked_add(sharded, n, "the checkpoint's size");
    }
    const int64_t full = checked_add(checked_mul(full_layer, cfg.num_layers, "the checkpoint's size"), head,
                                     "the checkpoint's size");
    const int64_t opt_file = checked_mul(full, 8, "the optimizer file");  // two fp32 moments
    const int64_t save = cfg.save.empty()
                             ? 0
                             : checked_add(checked_mul(checked_mul(sharded, 12, "the checkpoint's size"),
                                                       cfg.num_layers, "the checkpoint's size"),
                                           opt_file, "the checkpoint's size");
    const int64_t load = cfg.load.empty() ? 0 : checked_mul(opt_file, 2, "the checkpoint's size");
    e.add("checkpoint buffers (--save / --load)", std::max(save, load));
  }
  return e;
}

}  // namespace ampipe::train
