#include "ampipe/train/train_config.h"

#include "ampipe/train/layer_pattern.h"

#include <cmath>
#include <type_traits>
#include <utility>

#include "ampipe/core/error.h"
#include "ampipe/model/size_check.h"
#include "ampipe/schedule/pipeline.h"
#include "ampipe/train/megatron_args.h"
#include "ampipe/train/vocab_size.h"

namespace ampipe::train {

namespace {

struct Incompatible {
  const char* flag;
  bool on;
  const char* reason;
};

}  // namespace

// The MindSpeed features that do not combine with AMPipe (seed constraint 2), and why; none runs in this engine.
std::vector<Incompatible> incompatible_features(const TrainConfig& c) {
  return {
      {"--use-ascend-mc2", c.use_ascend_mc2,
       "MC2 fuses the tensor-parallel collectives into the matmuls that AMPipe cuts into chunks"},
      {"--use-nanopipe", c.use_nanopipe, "nanopipe pipelines the same block at a different granularity"},
      {"--recompute-in-bubble", c.recompute_in_bubble, "ripipe recomputation needs the unchunked layer"},
      {"--recompute-in-advance", c.recompute_in_advance, "ripipe recomputation needs the unchunked layer"},
      {"--adaptive-recompute-device-swap", c.adaptive_recompute_device_swap,
       "adaptive recomputation swaps and recomputes whole layers, not AMPipe chunks"},
      {"--adaptive-recompute-device-size", c.adaptive_recompute_device_size >= 0,
       "adaptive recomputation swaps and recomputes whole layers, not AMPipe chunks"},
      {"--adaptive-memory-optimization", c.adaptive_memory_optimization,
       "adaptive memory optimization is not compatible with ampipe"},
  };
}

// The seed's AMPipe constraints (its 限制条件), part of validate.
void TrainConfig::validate_ampipe() const {
  const int M = ampipe_degree;
  // Seed constraint 1: AMPipe needs an MoE layer whose routing it can chunk and flash attention. MindSpeed chunks only
  // the DeepSpeed-MoE layer; here Megatron-Core's dropless router (megatron_moe) is chunked too, exactly (routing
  // each token on its own, it does not depend on the chunking).
  if (M > 1 && !use_flash_attn)
    throw ConfigError(fmt::format("--ampipe-degree {} needs --use-flash-attn: AMPipe runs each sequence chunk's queries "
                                  "against the K and V of the rows before it, which only the flash attention kernel does",
                                  M));

  // Seed constraint 2: features that do not combine with AMPipe.
  const std::vector<Incompatible> incompatible = incompatible_features(*this);

  if (M > 1)
    for (const Incompatible& f : incompatible)
      if (f.on)
        throw ConfigError(fmt::format("{} cannot be used with --ampipe-degree {}: {}", f.flag, M,
                                      f.reason));

  // Seed constraint 3: every chunk has the same rows on every TP / CP rank.
  if (layer.seq_length % M != 0)
    throw ConfigError(fmt::format("--seq-length {} is not divisible by --ampipe-degree {}: every chunk must have the "
                                  "same number of rows",
                                  layer.seq_length, M));
  layer.check_tensor_parallel(M);  // with --sequence-parallel every chunk has the same rows on every TP rank
  // Context parallelism: the sequence divisible by 2 x cp x M (and x tp with SP), in check_tensor_parallel.

  // Seed constraint 4 and MindSpeed's pipe-experts rules (model::LayerConfig::check_pipe_experts). MindSpeed
  // turned pipe-experts off with a warning; we never change a flag silently, so these are errors. The one case
  // that runs without the feature (nothing to pipeline) is drop_idle_pipe_experts's, with a notice.
  if (layer.use_pipe_experts && use_ascend_mc2)
    throw ConfigError("--use-pipe-experts cannot be used with --use-ascend-mc2: mc2 is not compatible with pipe-experts");
  (void)layer.check_pipe_experts(M);
}

// Megatron's rules on the virtual stages (megatron/training/arguments.py).
void TrainConfig::validate_virtual_stages() const {
  const int P = pipeline_model_parallel_size, n = num_layers_per_virtual_pipeline_stage,
            v = num_virtual_stages_per_pipeline_rank;
  if (n < 0 || v < 0 || microbatch_group_size_per_vp_stage < 0)
    throw ConfigError(fmt::format("--{} {} is invalid: it must be >= 1",
                                  n < 0 ? "num-layers-per-virtual-pipeline-stage"
                                  : v < 0 ? "num-virtual-stages-per-pipeline-rank"
                                          : "microbatch-group-size-per-virtual-pipeline-stage",
                                  n < 0 ? n : v < 0 ? v : microbatch_group_size_per_vp_stage));
  if (n > 0 && v > 0)
    throw ConfigError("--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank are both "
                      "given: set at most one (Megatron's rule)");
  if (n == 0 && v == 0) return;
  if (n > 0) {
    if (decoder_first_pipeline_num_layers > 0 || decoder_last_pipeline_num_layers > 0)
      throw ConfigError("--num-layers-per-virtual-pipeline-stage with --decoder-first/last-pipeline-num-layers: give "
                        "the virtual stages as --num-virtual-stages-per-pipeline-rank for an uneven split (Megatron's "
                        "rule)");
    if (num_layers % P != 0)
      throw ConfigError(fmt::format("--num-layers {} is not divisible by --pipeline-model-parallel-size {}",
                                    num_layers, P));
    if ((num_layers / P) % n != 0)
      throw ConfigError(fmt::format("--num-layers-per-virtual-pipeline-stage {} does not divide the {} layers of "
                                    "each pipeline stage (--num-layers {} / --pipeline-model-parallel-size {})",
                                    n, num_layers / P, num_layers, P));
  }
  const int vs = virtual_stages();
  if (vs == 1) return;
  if (P == 1)
    throw ConfigError(fmt::format("{} needs --pipeline-model-parallel-size > 1 (the interleaved schedule runs "
                                  "virtual stages across pipeline ranks)",
                                  n > 0 ? "--num-layers-per-virtual-pipeline-stage"
                                        : "--num-virtual-stages-per-pipeline-rank"));
  if (decoder_first_pipeline_num_layers > 0 || decoder_last_pipeline_num_layers > 0)
    throw ConfigError("virtual pipeline stages with --decoder-first/last-pipeline-num-layers (an uneven interleaved "
                      "split) are not built here: the interleaved schedule needs the layers split evenly");
  if (num_layers % (P * vs) != 0)
    throw ConfigError(fmt::format("--num-layers {} is not divisible by --pipeline-model-parallel-size {} x {} virtual "
                                  "stages per rank: every virtual stage needs the same number of layers",
                                  num_layers, P, vs));
}

// Megatron's rules for the stages (megatron/training/arguments.py, transformer_config.py): the layers divide evenly
// over the stages, or over the stages between a first and a last stage of given sizes.
void TrainConfig::validate_pipeline() const {
  const int P = pipeline_model_parallel_size, first = decoder_first_pipeline_num_layers,
            last = decoder_last_pipeline_num_layers;
  if (P < 1)
    throw ConfigError(fmt::format("--pipeline-model-parallel-size {} is invalid: it must be >= 1", P));
  if (first < 0 || last < 0)
    throw ConfigError(fmt::format("--decoder-{}-pipeline-num-layers {} is invalid: it must be >= 1",
                                  first < 0 ? "first" : "last", first < 0 ? first : last));
  if ((first > 0 || last > 0) && P == 1)
    throw ConfigError(fmt::format("--decoder-{}-pipeline-num-layers needs --pipeline-model-parallel-size > 1",
                                  first > 0 ? "first" : "last"));
  validate_virtual_stages();
  if (P == 1) return;
  if (P > num_layers)
    throw ConfigError(fmt::format("--pipeline-model-parallel-size {} is more than --num-layers {}: every stage needs "
                                  "a layer", P, num_layers));
  if (first == 0 && last == 0) {
    if (num_layers % P != 0)
      throw ConfigError(fmt::format("--num-layers {} is not divisible by --pipeline-model-parallel-size {} (give "
                                    "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers for an "
                                    "uneven split)", num_layers, P));
    return;
  }
  const int middle = P - (first > 0) - (last > 0), rest = num_layers - first - last;
  if (rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && (rest < middle || rest % middle != 0)))
    throw ConfigError(fmt::format("--num-layers {} minus --decoder-first-pipeline-num-layers {} and "
                                  "--decoder-last-pipeline-num-layers {} (= {}) does not divide evenly over the {} "
                                  "other stage(s) of --pipeline-model-parallel-size {}",
                                  num_layers, first, last, rest, middle, P));
}

int TrainConfig::virtual_stages() const {
  const int P = pipeline_model_parallel_size;
  if (num_virtual_stages_per_pipeline_rank > 0) return num_virtual_stages_per_pipeline_rank;
  if (num_layers_per_virtual_pipeline_stage > 0 && P >= 1 && num_layers % P == 0)
    return std::max(1, num_layers / P / num_layers_per_virtual_pipeline_stage);
  return 1;
}

std::vector<int> TrainConfig::stage_layers(int stage) const {
  const int P = pipeline_model_parallel_size, first = decoder_first_pipeline_num_layers,
            last = decoder_last_pipeline_num_layers, v = virtual_stages();
  AMPIPE_CHECK(stage >= 0 && stage < P, "stage {} of {}", stage, P);
  std::vector<int> out;
  if (v > 1) {  // chunk c: virtual stage c P + stage
    const int n = num_layers / (P * v);
    for (int c = 0; c < v; ++c)
      for (int i = 0; i < n; ++i) out.push_back((c * P + stage) * n + i);
    return out;
  }
  const int middle = P - (first > 0) - (last > 0);
  const int per = P == 1 ? num_layers : middle > 0 ? (num_layers - first - last) / middle : 0;
  std::vector<int> sizes;
  for (int q = 0; q < P; ++q)
    sizes.push_back(P > 1 && q == 0 && first > 0 ? first : P > 1 && q == P - 1 && last > 0 ? last : per);
  int begin = 0;
  for (int q = 0; q < stage; ++q) begin += sizes[size_t(q)];
  for (int i = begin; i < begin + sizes[size_t(stage)]; ++i) out.push_back(i);
  return out;
}

std::vector<bool> TrainConfig::stage_recompute(int stage) const {
  const int v = virtual_stages();
  const int n = int(stage_layers(stage).size()) / v;
  std::vector<bool> on;
  for (int c = 0; c < v; ++c) {
    const std::vector<bool> chunk = recompute_layers(0, n);
    on.insert(on.end(), chunk.begin(), chunk.end());
  }
  return on;
}

int TrainConfig::pipeline_in_flight(int stage, int64_t K) const {
  if (pipeline_model_parallel_size == 1) return 1;
  return schedule::max_in_flight(schedule::pipeline_order(int(std::max<int64_t>(K, 1)), pipeline_model_parallel_size,
                                                          stage, virtual_stages(), microbatch_group_size_per_vp_stage));
}

void TrainConfig::validate_virtual_microbatches(int64_t K) const {
  if (virtual_stages() == 1) return;
  const int P = pipeline_model_parallel_size;
  const int64_t N = microbatch_group_size_per_vp_stage > 0 ? microbatch_group_size_per_vp_stage : P;
  // Megatron's forward_backward_pipelining_with_interleaving
  if (N < P || N > K)
    throw ConfigError(fmt::format("--microbatch-group-size-per-virtual-pipeline-stage {} must be in "
                                  "[--pipeline-model-parallel-size {}, micro-batches per rank {}] with the interleaved "
                                  "schedule{}",
                                  N, P, K, K < P ? " (fewer micro-batches than stages: raise --global-batch-size)"
                                                 : ""));
  if (K % N != 0 && K % N < P)
    throw ConfigError(fmt::format("the {} micro-batches per rank leave a last group of {} (--microbatch-group-size-"
                                  "per-virtual-pipeline-stage {}): it must be 0 or at least --pipeline-model-parallel-"
                                  "size {} (Megatron's rule: fewer stalls the interleaved schedule)",
                                  K, K % N, N, P));
  // Megatron runs a shorter last group of at least P; there a last-stage head's forward can come before the backward
  // of an earlier micro-batch's head, and this engine's head keeps one micro-batch's state (train/gpt_model.h)
  if (K % N != 0)
    throw ConfigError(fmt::format("the {} micro-batches per rank leave a last group of {} (--microbatch-group-size-per-"
                                  "virtual-pipeline-stage {}): this engine runs the interleaved schedule over whole "
                                  "groups only (make the micro-batches per rank a multiple of the group)",
                                  K, K % N, N));
}

void TrainConfig::validate(int world) const {
  layer.validate();
  const int M = ampipe_degree, tp = layer.tensor_model_parallel_size, cp = layer.context_parallel_size;
  if (num_layers < 1) throw ConfigError(fmt::format("--num-layers {} is invalid: it must be >= 1", num_layers));
  if (M < 1) throw ConfigError(fmt::format("--ampipe-degree {} is invalid: it must be >= 1 (1 = AMPipe off)", M));
  if (tp < 1)
    throw ConfigError(fmt::format("--tensor-model-parallel-size {} is invalid: it must be >= 1", tp));
  if (cp < 1) throw ConfigError(fmt::format("--context-parallel-size {} is invalid: it must be >= 1", cp));

  validate_ampipe();

  // The layout: world = tp x cp x dp x pp, and EP inside dp x cp.
  validate_pipeline();
  const int pp = pipeline_model_parallel_size;
  if (world % (tp * cp * pp) != 0)
    throw ConfigError(fmt::format("world size {} is not tp x cp x dp{}: it is not divisible by "
                                  "--tensor-model-parallel-size {} x --context-parallel-size {}{} (= {})",
                                  world, pp > 1 ? " x pp" : "", tp, cp,
                                  pp > 1 ? fmt::format(" x --pipeline-model-parallel-size {}", pp) : std::string(),
                                  tp * cp * pp));
  const int dp = world / (tp * cp * pp), ep = layer.expert_model_parallel_size;
  if ((dp * cp) % ep != 0)
    throw ConfigError(fmt::format("--expert-model-parallel-size {} does not divide data-parallel x context-parallel "
                                  "size {} (world size {}): every EP group is made of data-parallel ranks",
                                  ep, dp * cp, world));

  // Activation recomputation (Megatron's rules and meaning).
  if (!recompute_granularity.empty() && recompute_granularity != "full" && recompute_granularity != "selective")
    throw ConfigError(fmt::format("--recompute-granularity {} is not one of full, selective", recompute_granularity));
  if (recompute_granularity == "full" && recompute_method.empty())
    throw ConfigError("--recompute-granularity full needs --recompute-method uniform or block");
  if (!recompute_method.empty() && recompute_method != "uniform" && recompute_method != "block")
    throw ConfigError(fmt::format("--recompute-method {} is not one of uniform, block", recompute_method));
  if (!recompute_method.empty() && recompute_granularity != "full")
    throw ConfigError(fmt::format("--recompute-method {} needs --recompute-granularity full", recompute_method));
  if (recompute_granularity == "full" && (recompute_num_layers < 1 || recompute_num_layers > num_layers))
    throw ConfigError(fmt::format("--recompute-num-layers {} is invalid: it must be in [1, --num-layers {}]",
                                  recompute_num_layers, num_layers));

  // Parsed but not run by this engine yet: refused, never ignored.
  auto not_yet = [](const std::string& what) {
    throw ConfigError(fmt::format("{} is not supported by this engine yet (the flag is parsed so that MindSpeed "
                                  "scripts are checked, but the feature does not run)",
                                  what));
  };
  for (const Incompatible& f : incompatible_features(*this))
    if (f.on) not_yet(f.flag);

  // Training values.
  const int64_t b = layer.micro_batch_size;
  if (global_batch_size < 0)
    throw ConfigError(fmt::format("--global-batch-size {} is invalid: it must be >= 1", global_batch_size));
  if (global_batch_size > 0 && global_batch_size % (b * dp) != 0)
    throw ConfigError(fmt::format("--global-batch-size {} is not divisible by --micro-batch-size {} x data-parallel "
                                  "size {}: every rank must process the same number of micro-batches",
                                  global_batch_size, b, dp));
  validate_virtual_microbatches((global_batch_size > 0 ? global_batch_size : b * dp) / (b * dp));
  if (train_iters < 1) throw ConfigError(fmt::format("--train-iters {} is invalid: it must be >= 1", train_iters));
  if (exit_interval < 0)
    throw ConfigError(fmt::format("--exit-interval {} is invalid: it must be >= 0", exit_interval));
  for (const auto& [flag, v] : {std::pair<const char*, double>{"--lr", lr}, {"--min-lr", min_lr},
                                {"--weight-decay", weight_decay}, {"--adam-beta1", adam_beta1},
                                {"--adam-beta2", adam_beta2}, {"--adam-eps", adam_eps}, {"--clip-grad", clip_grad},
                                {"--moe-aux-loss-coeff", moe_aux_loss_coeff}, {"--valid-fraction", valid_fraction}})
    if (!std::isfinite(v)) throw ConfigError(fmt::format("{} {} is invalid: it must be a finite number", flag, v));
  if (!(lr > 0)) throw ConfigError(fmt::format("--lr {} is invalid: it must be > 0", lr));
  if (!(min_lr >= 0 && min_lr <= lr))
    throw ConfigError(fmt::format("--min-lr {} is invalid: it must be in [0, --lr {}]", min_lr, lr));
  // The warm-up ends where the decay may start at the latest (Megatron: lr_warmup_steps < lr_decay_steps): within
  // --train-iters, or within a given --lr-decay-iters, which may outlast the run (then so may the warm-up, as in
  // Megatron's own tests: --train-iters 100, --lr-decay-iters 320000, --lr-warmup-fraction 0.01).
  if (lr_warmup_iters < 0 || (lr_decay_iters <= 0 && lr_warmup_iters > train_iters))
    throw ConfigError(fmt::format("--lr-warmup-iters {} is invalid: it must be in [0, --train-iters {}] (or up to "
                                  "--lr-decay-iters, when given)",
                                  lr_warmup_iters, train_iters));
  if (lr_decay_style != "constant" && lr_decay_style != "linear" && lr_decay_style != "cosine")
    throw ConfigError(fmt::format("--lr-decay-style {} is not one of constant, linear, cosine", lr_decay_style));
  if (lr_decay_iters < 0 || (lr_decay_iters > 0 && lr_decay_iters < lr_warmup_iters))
    throw ConfigError(fmt::format("--lr-decay-iters {} is invalid: it must be >= --lr-warmup-iters {} (the decay "
                                  "starts after the warm-up; 0 = --train-iters)",
                                  lr_decay_iters, lr_warmup_iters));
  if (!(weight_decay >= 0))
    throw ConfigError(fmt::format("--weight-decay {} is invalid: it must be >= 0", weight_decay));
  if (!(adam_beta1 >= 0 && adam_beta1 < 1))
    throw ConfigError(fmt::format("--adam-beta1 {} is invalid: it must be in [0, 1)", adam_beta1));
  if (!(adam_beta2 >= 0 && adam_beta2 < 1))
    throw ConfigError(fmt::format("--adam-beta2 {} is invalid: it must be in [0, 1)", adam_beta2));
  if (!(adam_eps > 0)) throw ConfigError(fmt::format("--adam-eps {} is invalid: it must be > 0", adam_eps));
  // Megatron's rules (megatron/training/arguments.py)
  if (overlap_param_gather && !use_distributed_optimizer)
    throw ConfigError("--overlap-param-gather needs --use-distributed-optimizer: it overlaps the distributed "
                      "optimizer's parameter all-gather");
  if (overlap_param_gather && !overlap_grad_reduce)
    throw ConfigError("--overlap-param-gather needs --overlap-grad-reduce (Megatron's rule)");
  if (!(clip_grad >= 0))
    throw ConfigError(fmt::format("--clip-grad {} is invalid: it must be >= 0 (0 = no clipping)", clip_grad));
  layer.check_aux_loss_coeff(moe_aux_loss_coeff);
  if (valid_fraction != 0 && !(valid_fraction > 0 && valid_fraction <= 0.5))
    throw ConfigError(fmt::format("--valid-fraction {} is invalid: it must be in (0, 0.5]", valid_fraction));
  if (eval_interval < 0)
    throw ConfigError(fmt::format("--eval-interval {} is invalid: it must be >= 0 (0 = never)", eval_interval));
  if (eval_iters < 0)
    throw ConfigError(fmt::format("--eval-iters {} is invalid: it must be >= 0 (0 = no evaluation)", eval_iters));
  if (log_interval < 1)
    throw ConfigError(fmt::format("--log-interval {} is invalid: it must be >= 1", log_interval));
  if (save_interval < 0)
    throw ConfigError(fmt::format("--save-interval {} is invalid: it must be >= 0", save_interval));
  if (save_interval > 0 && save.empty())
    throw ConfigError(fmt::format("--save-interval {} needs --save DIR: there is nowhere to write", save_interval));
  validate_vocab_flags(*this);
  validate_megatron_args(*this);
  model::check_plan_size(layer, M, num_layers);  // the Plans' task lists (model/size_check.h)
  if (!trace.empty() && (trace_iteration < 1 || trace_iteration > train_iters))
    throw ConfigError(fmt::format("--trace-iteration {} is invalid: it must be in [1, --train-iters {}]",
                                  trace_iteration, train_iters));
}

std::string TrainConfig::drop_idle_pipe_experts() {
  if (!layer.use_pipe_experts || use_ascend_mc2 || ampipe_degree < 1) return "";  // validate refuses those
  try {
    return train::drop_idle_pipe_experts(layer, {ampipe_degree});
  } catch (const ConfigError&) {
    return "";  // validate throws it, in its order of rules
  }
}

std::vector<bool> TrainConfig::moe_layers() const {
  if (dense) return std::vector<bool>(size_t(std::max(num_layers, 0)), false);
  return moe_layer_pattern(moe_layer_freq, first_k_dense_replace, num_layers);
}

model::LayerConfig TrainConfig::layer_config(int i) const {
  const std::vector<bool> moe = moe_layers();
  model::LayerConfig c = moe.at(size_t(i)) || layer.dense()
                             ? layer
                             : layer.as_dense(dense_ffn_hidden_size > 0 ? dense_ffn_hidden_size : layer.ffn_hidden_size);
  c.layer_index = i;
  return c;
}

std::vector<model::LayerConfig> TrainConfig::layer_configs() const {
  std::vector<model::LayerConfig> v;
  for (int i = 0; i < num_layers; ++i) v.push_back(layer_config(i));
  return v;
}

std::string TrainConfig::ffn_summary() const {
  if (layer.dense()) return fmt::format(" | dense GPT (F={})", layer.mlp_ffn_hidden_size);
  std::string out;
  if (layer.has_mlp()) out += fmt::format(" | shared expert F={}", layer.mlp_ffn_hidden_size);
  std::string dense;
  const std::vector<bool> moe = moe_layers();
  for (size_t i = 0; i < moe.size(); ++i)
    if (!moe[i]) dense += fmt::format("{}{}", dense.empty() ? "" : ",", i);
  if (!dense.empty())
    out += fmt::format(" | dense blocks {} (F={})", dense,
                       dense_ffn_hidden_size > 0 ? dense_ffn_hidden_size : layer.ffn_hidden_size);
  return out;
}

std::vector<bool> TrainConfig::recompute_layers() const { return recompute_layers(0, num_layers); }

std::vector<bool> TrainConfig::recompute_layers(int first, int end) const {
  std::vector<bool> on(size_t(end - first), false);
  if (recompute_granularity != "full") return on;
  // uniform: Megatron recomputes every layer, its input kept once per group of recompute_num_layers; here every
  // layer keeps its own output (one [s, b, h] per layer). block: the first recompute_num_layers layers (of each
  // pipeline stage).
  for (int i = 0; i < end - first; ++i) on[size_t(i)] = recompute_method == "uniform" || i < recompute_num_layers;
  return on;
}

namespace {

// A key that is a field: read and written as it is. `field` is an lvalue of `c` (TrainConfig) or `l` (its layer).
#define AMPIPE_FIELD(name, uses, model_arg, field)                                          \
  ConfigKey {                                                                               \
    #name, uses, model_arg,                                                                 \
        [](const TrainConfig& c) -> nlohmann::json {                                        \
          [[maybe_unused]] const model::LayerConfig& l = c.layer;                           \
          return field;                                                                     \
        },                                                                                  \
        [](TrainConfig& c, const nlohmann::json& v) {                                       \
          [[maybe_unused]] model::LayerConfig& l = c.layer;                                 \
          field = v.get<std::decay_t<decltype(field)>>();                                   \
        }                                                                                   \
  }

// A path list (--data-path and the per-split paths): a string while it holds at most one path ("" for none), as
// checkpoints recorded --data-path before blends; an array otherwise. Read back from either.
nlohmann::json paths_json(const std::vector<std::string>& v) {
  if (v.size() <= 1) return v.empty() ? std::string() : v.front();
  return v;
}
std::vector<std::string> paths_from_json(const nlohmann::json& v) {
  if (!v.is_string()) return v.get<std::vector<std::string>>();
  const std::string one = v.get<std::string>();
  return one.empty() ? std::vector<std::string>() : std::vector<std::string>{one};
}
#define AMPIPE_PATHS(name)                                                                                \
  ConfigKey {                                                                                             \
    #name, kKeyCheckpoint | kKeyAgree, ModelArg::none,                                                    \
        [](const TrainConfig& c) -> nlohmann::json { return paths_json(c.name); },                        \
        [](TrainConfig& c, const nlohmann::json& v) { c.name = paths_from_json(v); }                      \
  }

constexpr unsigned kL = kKeyLayer, kC = kKeyCheckpoint, kA = kKeyAgree;
constexpr ModelArg kNo = ModelArg::none, kShape = ModelArg::shape, kTaken = ModelArg::taken;

// The layer's keys (in the order metadata.json lists them).
std::vector<ConfigKey> layer_config_keys() {
  return {
      AMPIPE_FIELD(num_layers, kC | kA, kShape, c.num_layers),
      AMPIPE_FIELD(seq_length, kL | kC | kA, kShape, l.seq_length),
      AMPIPE_FIELD(micro_batch_size, kL | kC | kA, kNo, l.micro_batch_size),
      AMPIPE_FIELD(hidden_size, kL | kC | kA, kShape, l.hidden_size),
      // Megatron's --ffn-hidden-size (the dense blocks' FFN) and --moe-ffn-hidden-size (the experts'), both written
      ConfigKey{"ffn_hidden_size", kL | kC | kA, kShape,
                [](const TrainConfig& c) -> nlohmann::json {
                  return c.dense_ffn_hidden_size > 0 ? c.dense_ffn_hidden_size : c.layer.ffn_hidden_size;
                },
                [](TrainConfig& c, const nlohmann::json& v) {
                  c.layer.ffn_hidden_size = c.dense_ffn_hidden_size = v.get<int64_t>();
                }},
      AMPIPE_FIELD(moe_ffn_hidden_size, kC | kA, kShape, l.ffn_hidden_size),
      ConfigKey{"moe_shared_expert_intermediate_size", kL | kC | kA, kShape,
                [](const TrainConfig& c) -> nlohmann::json {
                  return c.layer.dense() ? 0 : c.layer.mlp_ffn_hidden_size;
                },
                [](TrainConfig& c, const nlohmann::json& v) { c.layer.mlp_ffn_hidden_size = v.get<int64_t>(); }},
      AMPIPE_FIELD(moe_layer_freq, kC | kA, kShape, c.moe_layer_freq),
      AMPIPE_FIELD(first_k_dense_replace, kC | kA, kShape, c.first_k_dense_replace),
      AMPIPE_FIELD(num_attention_heads, kL | kC | kA, kShape, l.num_attention_heads),
      AMPIPE_FIELD(num_experts, kL | kC | kA, kShape, l.num_experts),
      AMPIPE_FIELD(moe_router_topk, kL | kC | kA, kTaken, l.moe_router_topk),
      AMPIPE_FIELD(moe_train_capacity_factor, kL | kC | kA, kNo, l.moe_train_capacity_factor),
      AMPIPE_FIELD(moe_min_capacity, kL | kC | kA, kNo, l.moe_min_capacity),
      AMPIPE_FIELD(moe_no_drop, kL | kC | kA, kNo, l.moe_no_drop),
      AMPIPE_FIELD(moe_grouped_gemm, kL | kC | kA, kNo, l.moe_grouped_gemm),
      AMPIPE_FIELD(moe_z_loss_coeff, kL | kC | kA, kNo, l.moe_z_loss_coeff),
      // the keys are flags: metadata.json's config is usable as --config
      ConfigKey{"no_use_rts", kC | kA, kNo, [](const TrainConfig& c) -> nlohmann::json { return !c.layer.use_rts; }},
      ConfigKey{"noisy_gate_policy", kL | kC | kA, kNo,
                [](const TrainConfig& c) -> nlohmann::json {
                  const model::NoisyGatePolicy p = c.layer.noisy_gate_policy;
                  return p == model::NoisyGatePolicy::jitter ? "Jitter"
                         : p == model::NoisyGatePolicy::rsample ? "RSample"
                                                                : "None";
                }},
      ConfigKey{"swiglu", kL | kC | kA, kShape,
                [](const TrainConfig& c) -> nlohmann::json { return c.layer.expert == model::ExpertKind::swiglu; },
                [](TrainConfig& c, const nlohmann::json& v) {
                  c.layer.expert = v.get<bool>() ? model::ExpertKind::swiglu : model::ExpertKind::gelu;
                }},
      ConfigKey{"normalization", kL | kC | kA, kShape,
                [](const TrainConfig& c) -> nlohmann::json { return c.layer.rmsnorm() ? "RMSNorm" : "LayerNorm"; },
                [](TrainConfig& c, const nlohmann::json& v) {
                  c.layer.normalization =
                      v.get<std::string>() == "RMSNorm" ? model::Normalization::rmsnorm : model::Normalization::layernorm;
                }},
      AMPIPE_FIELD(norm_epsilon, kL | kC | kA, kTaken, l.layernorm_epsilon),
      // Grouped-query attention as the two flags (so metadata.json works as --config); num_query_groups is the
      // model's shape (g = n is multi-head attention, the same model and layout).
      ConfigKey{"group_query_attention", kL | kC | kA, kNo,
                [](const TrainConfig& c) -> nlohmann::json {
                  return c.layer.query_groups() != c.layer.num_attention_heads;
                }},
      ConfigKey{"num_query_groups", kL | kC | kA, kShape,
                [](const TrainConfig& c) -> nlohmann::json { return c.layer.query_groups(); },
                [](TrainConfig& c, const nlohmann::json& v) { c.layer.num_query_groups = v.get<int64_t>(); }},
      ConfigKey{"position_embedding_type", kL | kC | kA, kShape,
                [](const TrainConfig& c) -> nlohmann::json { return model::position_embedding_name(c.layer.position_embedding); },
                [](TrainConfig& c, const nlohmann::json& v) {
                  c.layer.position_embedding = model::position_embedding_from_name(v.get<std::string>());
                }},
      ConfigKey{"rotary_base", kL | kC | kA, kTaken,
                [](const TrainConfig& c) -> nlohmann::json { return int64_t(c.layer.rotary_base); },
                [](TrainConfig& c, const nlohmann::json& v) { c.layer.rotary_base = v.get<double>(); }},
      AMPIPE_FIELD(qk_layernorm, kL | kC | kA, kShape, l.qk_layernorm),
      AMPIPE_FIELD(add_qkv_bias, kL | kC | kA, kShape, l.add_qkv_bias),
      AMPIPE_FIELD(add_bias_linear, kL | kC | kA, kShape, l.add_bias_linear),
      AMPIPE_FIELD(moe_shared_expert_gate, kL | kC | kA, kShape, l.moe_shared_expert_gate),
      AMPIPE_FIELD(rotary_percent, kL | kC | kA, kTaken, l.rotary_percent),
      AMPIPE_FIELD(rotary_interleaved, kL | kC | kA, kTaken, l.rotary_interleaved),
      AMPIPE_FIELD(rotary_seq_len_interpolation_factor, kL | kC | kA, kTaken, l.rotary_interpolation_factor),
      AMPIPE_FIELD(use_rope_scaling, kL | kC | kA, kTaken, l.use_rope_scaling),
      AMPIPE_FIELD(rope_scaling_factor, kL | kC | kA, kTaken, l.rope_scaling_factor),
      AMPIPE_FIELD(hidden_dropout, kC | kA, kNo, l.hidden_dropout),
      AMPIPE_FIELD(attention_dropout, kL | kC | kA, kNo, l.attention_dropout),
      AMPIPE_FIELD(init_method_std, kC | kA, kNo, l.init_method_std),
      AMPIPE_FIELD(seed, kC | kA, kNo, l.seed),
      AMPIPE_FIELD(bf16, kL | kC | kA, kNo, l.bf16),
      AMPIPE_FIELD(expert_model_parallel_size, kL | kC | kA, kNo, l.expert_model_parallel_size),
      AMPIPE_FIELD(use_pipe_experts, kL | kC | kA, kNo, l.use_pipe_experts),
      AMPIPE_FIELD(pipe_experts_multi_data, kL | kC | kA, kNo, l.pipe_experts_multi_data),
      AMPIPE_FIELD(pipe_experts_multi_stream, kC | kA, kNo, l.pipe_experts_multi_stream),
      AMPIPE_FIELD(layernorm_epsilon, kA, kNo, l.layernorm_epsilon),
      AMPIPE_FIELD(tensor_model_parallel_size, kL | kC | kA, kNo, l.tensor_model_parallel_size),
      AMPIPE_FIELD(sequence_parallel, kL | kC | kA, kNo, l.sequence_parallel),
      AMPIPE_FIELD(ampipe_tp_sp_comm_overlap, kL | kC | kA, kNo, l.ampipe_tp_sp_comm_overlap),
      AMPIPE_FIELD(context_parallel_size, kL | kC | kA, kNo, l.context_parallel_size),
      AMPIPE_FIELD(context_parallel_algo, kL | kC | kA, kNo, l.context_parallel_algo),
      AMPIPE_FIELD(pipeline_model_parallel_size, kC | kA, kNo, c.pipeline_model_parallel_size),
      AMPIPE_FIELD(decoder_first_pipeline_num_layers, kC | kA, kNo, c.decoder_first_pipeline_num_layers),
      AMPIPE_FIELD(decoder_last_pipeline_num_layers, kC | kA, kNo, c.decoder_last_pipeline_num_layers),
      AMPIPE_FIELD(num_layers_per_virtual_pipeline_stage, kC | kA, kNo, c.num_layers_per_virtual_pipeline_stage),
      AMPIPE_FIELD(num_virtual_stages_per_pipeline_rank, kC | kA, kNo, c.num_virtual_stages_per_pipeline_rank),
      AMPIPE_FIELD(microbatch_group_size_per_virtual_pipeline_stage, kC | kA, kNo,
                   c.microbatch_group_size_per_vp_stage),
  };
}

// The rest: the model outside the layers, the router's settings, the schedule, the data and the run.
std::vector<ConfigKey> run_config_keys() {
  return {
      AMPIPE_FIELD(untie_embeddings_and_output_weights, kC | kA, kShape, c.untie_embeddings_and_output_weights),
      AMPIPE_FIELD(moe_aux_loss_coeff, kC | kA, kNo, c.moe_aux_loss_coeff),
      ConfigKey{"moe_model_type", kL | kC | kA, kTaken,
                [](const TrainConfig& c) -> nlohmann::json {
                  return c.layer.megatron_router() ? "megatron_moe" : "deepspeed_moe";
                },
                [](TrainConfig& c, const nlohmann::json& v) {
                  c.layer.moe_router = v.get<std::string>() == "megatron_moe" ? model::Router::megatron
                                                                              : model::Router::deepspeed;
                }},
      AMPIPE_FIELD(moe_router_pre_softmax, kL | kC | kA, kTaken, l.moe_router_pre_softmax),
      AMPIPE_FIELD(moe_router_topk_scaling_factor, kL | kC | kA, kTaken, l.moe_router_topk_scaling_factor),
      ConfigKey{"moe_router_load_balancing_type", kL | kC | kA, kTaken,
                [](const TrainConfig& c) -> nlohmann::json { return model::balancing_name(c.layer.moe_router_load_balancing); },
                [](TrainConfig& c, const nlohmann::json& v) {
                  const std::string s = v.get<std::string>();
                  c.layer.moe_router_load_balancing = s == "none"           ? model::Balancing::none
                                                      : s == "seq_aux_loss" ? model::Balancing::seq_aux_loss
                                                      : s == "sinkhorn"     ? model::Balancing::sinkhorn
                                                                            : model::Balancing::aux_loss;
                }},
      ConfigKey{"moe_router_score_function", kL | kC | kA, kTaken,
                [](const TrainConfig& c) -> nlohmann::json {
                  return model::score_function_name(c.layer.moe_router_score_function);
                },
                [](TrainConfig& c, const nlohmann::json& v) {
                  c.layer.moe_router_score_function =
                      v.get<std::string>() == "sigmoid" ? model::ScoreFunction::sigmoid : model::ScoreFunction::softmax;
                }},
      AMPIPE_FIELD(moe_router_num_groups, kL | kC | kA, kTaken, l.moe_router_num_groups),
      AMPIPE_FIELD(moe_router_group_topk, kL | kC | kA, kTaken, l.moe_router_group_topk),
      AMPIPE_FIELD(moe_router_enable_expert_bias, kL | kC | kA, kTaken, l.moe_router_enable_expert_bias),
      AMPIPE_FIELD(moe_router_bias_update_rate, kL | kC | kA, kTaken, l.moe_router_bias_update_rate),
      AMPIPE_FIELD(moe_expert_capacity_factor, kL | kC | kA, kTaken, l.moe_expert_capacity_factor),
      AMPIPE_FIELD(moe_pad_expert_input_to_capacity, kL | kC | kA, kTaken, l.moe_pad_expert_input_to_capacity),
      ConfigKey{"moe_token_drop_policy", kL | kC | kA, kTaken,
                [](const TrainConfig& c) -> nlohmann::json { return model::drop_policy_name(c.layer.moe_token_drop_policy); },
                [](TrainConfig& c, const nlohmann::json& v) {
                  c.layer.moe_token_drop_policy =
                      v.get<std::string>() == "position" ? model::DropPolicy::position : model::DropPolicy::probs;
                }},
      AMPIPE_FIELD(use_flash_attn, kC | kA, kNo, c.use_flash_attn),
      AMPIPE_FIELD(ampipe_degree, kC | kA, kNo, c.ampipe_degree),
      AMPIPE_FIELD(use_ascend_mc2, kA, kNo, c.use_ascend_mc2),
      AMPIPE_FIELD(use_distributed_optimizer, kC | kA, kNo, c.use_distributed_optimizer),
      AMPIPE_FIELD(overlap_grad_reduce, kC | kA, kNo, c.overlap_grad_reduce),
      AMPIPE_FIELD(overlap_param_gather, kC | kA, kNo, c.overlap_param_gather),
      AMPIPE_FIELD(use_nanopipe, kA, kNo, c.use_nanopipe),
      AMPIPE_FIELD(recompute_in_bubble, kA, kNo, c.recompute_in_bubble),
      AMPIPE_FIELD(recompute_in_advance, kA, kNo, c.recompute_in_advance),
      AMPIPE_FIELD(adaptive_recompute_device_swap, kA, kNo, c.adaptive_recompute_device_swap),
      AMPIPE_FIELD(adaptive_recompute_device_size, kA, kNo, c.adaptive_recompute_device_size),
      AMPIPE_FIELD(adaptive_memory_optimization, kA, kNo, c.adaptive_memory_optimization),
      AMPIPE_FIELD(recompute_granularity, kC | kA, kNo, c.recompute_granularity),
      AMPIPE_FIELD(recompute_method, kC | kA, kNo, c.recompute_method),
      AMPIPE_FIELD(recompute_num_layers, kC | kA, kNo, c.recompute_num_layers),
      AMPIPE_FIELD(global_batch_size, kC | kA, kNo, c.global_batch_size),
      AMPIPE_FIELD(train_iters, kC | kA, kNo, c.train_iters),
      AMPIPE_FIELD(exit_interval, kA, kNo, c.exit_interval),
      AMPIPE_FIELD(lr, kC | kA, kNo, c.lr),
      AMPIPE_FIELD(min_lr, kC | kA, kNo, c.min_lr),
      AMPIPE_FIELD(lr_warmup_iters, kC | kA, kNo, c.lr_warmup_iters),
      AMPIPE_FIELD(lr_decay_style, kC | kA, kNo, c.lr_decay_style),
      AMPIPE_FIELD(lr_decay_iters, kC | kA, kNo, c.lr_decay_iters),
      AMPIPE_FIELD(weight_decay, kC | kA, kNo, c.weight_decay),
      AMPIPE_FIELD(apply_wd_to_qk_layernorm, kC | kA, kNo, c.apply_wd_to_qk_layernorm),
      AMPIPE_FIELD(adam_beta1, kC | kA, kNo, c.adam_beta1),
      AMPIPE_FIELD(adam_beta2, kC | kA, kNo, c.adam_beta2),
      AMPIPE_FIELD(adam_eps, kC | kA, kNo, c.adam_eps),
      AMPIPE_FIELD(clip_grad, kC | kA, kNo, c.clip_grad),
      AMPIPE_PATHS(data_path),
      AMPIPE_PATHS(train_data_path),
      AMPIPE_PATHS(valid_data_path),
      AMPIPE_PATHS(test_data_path),
      AMPIPE_FIELD(tokenizer_type, kC | kA, kNo, c.tokenizer_type),
      AMPIPE_FIELD(tokenizer_model, kC | kA, kNo, c.tokenizer_model),
      AMPIPE_FIELD(vocab_file, kC | kA, kNo, c.vocab_file),
      AMPIPE_FIELD(merge_file, kC | kA, kNo, c.merge_file),
      AMPIPE_FIELD(vocab_size, kA, kNo, c.vocab_size),
      AMPIPE_FIELD(make_vocab_size_divisible_by, kA, kNo, c.make_vocab_size_divisible_by),
      // the model's vocabulary V (a shape: a checkpoint records it, a resume must match it; Megatron's _compare
      // and --use-checkpoint-args' _set_arg of padded_vocab_size); "" (--config's "the flag's default") until the
      // data have sized it (train/vocab_size.h)
      ConfigKey{"padded_vocab_size", kC | kA, kShape,
                [](const TrainConfig& c) -> nlohmann::json {
                  return c.padded_vocab_size != 0 ? nlohmann::json(c.padded_vocab_size) : nlohmann::json("");
                },
                [](TrainConfig& c, const nlohmann::json& v) {
                  c.padded_vocab_size = v.is_string() && v.get<std::string>().empty() ? 0 : v.get<int64_t>();
                }},
      // --valid-fraction f is the split 1-f,f,0
      ConfigKey{"split", kC | kA, kNo, [](const TrainConfig& c) -> nlohmann::json { return split_str(data_split(c)); }},
      AMPIPE_FIELD(eval_interval, kC | kA, kNo, c.eval_interval),
      AMPIPE_FIELD(eval_iters, kC | kA, kNo, c.eval_iters),
      AMPIPE_FIELD(save, kA, kNo, c.save),
      AMPIPE_FIELD(load, kA, kNo, c.load),
      AMPIPE_FIELD(save_interval, kA, kNo, c.save_interval),
      AMPIPE_FIELD(log_interval, kA, kNo, c.log_interval),
      AMPIPE_FIELD(trace, kA, kNo, c.trace),
      AMPIPE_FIELD(loss_plot, kA, kNo, c.loss_plot),
      AMPIPE_FIELD(trace_iteration, kA, kNo, c.trace_iteration),
      AMPIPE_FIELD(max_position_embeddings, kC | kA, kTaken, c.max_position_embeddings),
      AMPIPE_FIELD(train_samples, kA, kNo, c.train_samples),
      AMPIPE_FIELD(distributed_backend, kA, kNo, c.distributed_backend),
      AMPIPE_FIELD(no_load_optim, kA, kNo, c.no_load_optim),
      AMPIPE_FIELD(finetune, kA, kNo, c.finetune),
      AMPIPE_FIELD(use_checkpoint_args, kA, kNo, c.use_checkpoint_args),
      AMPIPE_FIELD(skip_train, kA, kNo, c.skip_train),
  };
}

std::vector<ConfigKey> make_config_keys() {
  std::vector<ConfigKey> keys = layer_config_keys();
  for (ConfigKey& k : run_config_keys()) keys.push_back(std::move(k));
  return keys;
}

#undef AMPIPE_FIELD
#undef AMPIPE_PATHS

}  // namespace

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = make_config_keys();
  return keys;
}

nlohmann::json train_config_json(const TrainConfig& c, unsigned uses) {
  nlohmann::json j = nlohmann::json::object();
  for (const ConfigKey& k : config_keys())
    if ((k.uses & uses) != 0) j[k.key] = k.get(c);
  return j;
}

nlohmann::json to_json(const TrainConfig& c) { return train_config_json(c, kKeyCheckpoint); }

std::string drop_idle_pipe_experts(model::LayerConfig& c, const std::vector<int>& degrees) {
  std::string notice;
  for (int M : degrees)
    if (std::string n = c.check_pipe_experts(M); !n.empty()) notice = std::move(n);
  if (!notice.empty()) c.use_pipe_experts = false;
  return notice;
}

}  // namespace ampipe::train
