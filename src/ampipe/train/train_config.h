// Configuration of `ampipe train`: the model (one model::LayerConfig for every block plus the GPT parts), the
// optimizer, the data, checkpoints, output, and the parallel layout. Field names are the Megatron / MindSpeed flag
// names with underscores (docs/design.md, "Notation and names"), so grepping either finds the other; --config FILE
// uses the same keys.
//
// validate(world) applies every rule before any rank starts work (docs/design.md, "Errors"): the constraints of
// MindSpeed's --ampipe-degree feature (its 限制条件; the rule table in docs/training.md), the sizes that must divide
// each other, and the features the parser knows but this engine does not run yet. Each throws ConfigError naming
// the flag, the value and the rule.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ampipe/model/layer_config.h"

namespace ampipe::train {

struct TrainConfig {
  // ---- model ----
  model::LayerConfig layer;  // seq_length, micro_batch_size, hidden_size, ... (shared layer flags)
  int num_layers = 2;
  bool untie_embeddings_and_output_weights = false;
  double moe_aux_loss_coeff = 0.0;  // Megatron's default: no load-balancing loss
  bool use_flash_attn = false;                   // see docs/training.md: the chunked causal attention kernel
  // No --num-experts (or 0): Megatron's dense GPT, every block's FFN a dense MLP (layer.dense()).
  bool dense = false;
  // Dense blocks in an MoE model (Megatron's --moe-layer-freq: an integer k, every k-th block from block 0 has
  // experts, or a Python list expression of one 0/1 per block such as "([0]+[1]*23)"; MindSpeed-LLM's
  // --first-k-dense-replace K: the first K blocks dense). A dense block's MLP has --ffn-hidden-size
  // (dense_ffn_hidden_size); the experts' F is layer.ffn_hidden_size (--moe-ffn-hidden-size when given).
  std::string moe_layer_freq = "1";
  int first_k_dense_replace = 0;
  int64_t dense_ffn_hidden_size = 0;  // 0: layer.ffn_hidden_size
  // Which blocks have experts, one flag per block (ConfigError naming the flag for a pattern that does not fit).
  std::vector<bool> moe_layers() const;
  // Block i's config: `layer`, or for a dense block layer.as_dense(dense F); layer_index i.
  model::LayerConfig layer_config(int i) const;
  std::vector<model::LayerConfig> layer_configs() const;
  // The FFN beyond the routed experts, for the start-up lines: "" for an MoE-only model, else e.g.
  // " | shared expert F=1024 | dense blocks 0 (F=2816)" or " | dense GPT (F=2816)".
  std::string ffn_summary() const;

  // ---- parallelism ----
  int ampipe_degree = 1;
  // --pipeline-model-parallel-size P: the layers split into P consecutive stages (Megatron's 1F1B schedule,
  // docs/training.md "Pipeline parallelism"); --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers
  // (0: not given) give the first / last stage that many layers and split the rest evenly over the others.
  int pipeline_model_parallel_size = 1;
  int decoder_first_pipeline_num_layers = 0, decoder_last_pipeline_num_layers = 0;
  // Virtual stages (Megatron's interleaved schedule, schedule::pipeline_order): --num-layers-per-virtual-pipeline-stage
  // n (v = num_layers / P / n) or --num-virtual-stages-per-pipeline-rank v (0: not given; v = 1: no interleaving);
  // --microbatch-group-size-per-virtual-pipeline-stage (0: P, Megatron's default).
  int num_layers_per_virtual_pipeline_stage = 0;
  int num_virtual_stages_per_pipeline_rank = 0;
  int microbatch_group_size_per_vp_stage = 0;
  // v: model chunks per pipeline rank (1: the plain 1F1B schedule; after validate).
  int virtual_stages() const;
  // Stage `stage`'s layers, model-wide indices (after validate): [first, end) without virtual stages; with v of them,
  // chunk by chunk, chunk c being virtual stage c P + stage's num_layers / (P v) layers.
  std::vector<int> stage_layers(int stage) const;
  // Which of them recompute (recompute_layers counted per model chunk, as Megatron's TransformerBlock does).
  std::vector<bool> stage_recompute(int stage) const;
  int pp() const { return pipeline_model_parallel_size; }
  // The most micro-batches in flight on stage `stage` (between a chunk's forward and its backward) over K
  // micro-batches per rank: the copies of its layers' saved activations it keeps (1 without stages).
  int pipeline_in_flight(int stage, int64_t micro_batches) const;
  // Megatron's rules on the micro-batches of the interleaved schedule (K of them per rank).
  void validate_virtual_microbatches(int64_t micro_batches) const;
  // --tensor-model-parallel-size, --sequence-parallel, --ampipe-tp-sp-comm-overlap are layer options:
  // layer.tensor_model_parallel_size, layer.sequence_parallel, layer.ampipe_tp_sp_comm_overlap.
  // --context-parallel-size, --context-parallel-algo: layer flags (layer.context_parallel_size, _algo).
  // pipe-experts (--use-pipe-experts, --pipe-experts-multi-data, --pipe-experts-multi-stream) is a layer option:
  // layer.use_pipe_experts, layer.pipe_experts_multi_data, layer.pipe_experts_multi_stream.
  // --use-distributed-optimizer (ZeRO-1, train/grad_layout.h): the gradients reduce-scattered over each data-parallel
  // group, AdamW's state and update sharded, the parameters all-gathered after the step.
  bool use_distributed_optimizer = false;
  // --overlap-grad-reduce: each layer's gradient reduction overlaps the backward of the layers below it, as the
  // engine always does (the seed lists it as incompatible with AMPipe; here it is exact at any degree).
  bool overlap_grad_reduce = false;
  // --overlap-param-gather (needs the distributed optimizer and --overlap-grad-reduce, Megatron's rules).
  bool overlap_param_gather = false;
  // Features the seed lists as incompatible with AMPipe (and that this engine does not run at all).
  bool use_ascend_mc2 = false;
  bool use_nanopipe = false;
  bool recompute_in_bubble = false;
  bool recompute_in_advance = false;
  bool adaptive_recompute_device_swap = false;
  int64_t adaptive_recompute_device_size = -1;
  bool adaptive_memory_optimization = false;
  // Activation recomputation (Megatron's flags): granularity "" (none) or "full"; with full, method "uniform" (every
  // layer) or "block" (the first recompute_num_layers layers). Each recomputed layer keeps only its output between
  // its forward and its backward and re-runs its forward before the backward (schedule::LayerStack::set_recompute).
  std::string recompute_granularity;
  std::string recompute_method;
  int recompute_num_layers = 1;
  // Which layers recompute (after validate): one flag per layer.
  std::vector<bool> recompute_layers() const;
  // The same for the layers [first, end) of one pipeline stage (Megatron counts --recompute-num-layers per stage
  // with --recompute-method block).
  std::vector<bool> recompute_layers(int first, int end) const;

  // ---- optimizer and schedule ----
  int64_t global_batch_size = 0;  // 0: micro-batch size x data-parallel size
  int64_t train_iters = 300;
  int64_t exit_interval = 0;  // stop at the first iteration divisible by it (Megatron's; as if interrupted)
  double lr = 1.5e-3;
  // Megatron's defaults where Megatron has one (megatron/training/arguments.py); --lr has none there (required).
  double min_lr = 0.0;
  int64_t lr_warmup_iters = 0;
  std::string lr_decay_style = "linear";  // after the warm-up: constant, linear or cosine (Megatron's styles)
  int64_t lr_decay_iters = 0;             // the decay reaches --min-lr here; 0: --train-iters
  double weight_decay = 0.01;
  // --apply-wd-to-qk-layernorm: weight decay on the q, k norms' weights and biases too (Megatron's; off: they are
  // norm parameters, which never decay)
  bool apply_wd_to_qk_layernorm = false;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;  // 0: no clipping

  // ---- data ----
  // --data-path: one file (plain text, llm.c tokens) or Megatron's prefix / blend (train/megatron_data.h); empty:
  // the bundled corpus. --train-data-path, --valid-data-path, --test-data-path: Megatron's per-split blends.
  std::vector<std::string> data_path, train_data_path, valid_data_path, test_data_path;
  std::string tokenizer_type;   // empty: byte-level (text) or the token file's ids; or SentencePieceTokenizer
  std::string tokenizer_model;  // SentencePieceTokenizer's model, HuggingFaceTokenizer's tokenizer.json (or its dir)
  std::string vocab_file, merge_file;  // GPT2BPETokenizer's vocab.json and merges.txt (train::make_tokenizer)
  // The vocabulary (train/vocab_size.h), Megatron's three flags: --vocab-size (0: not given: the tokenizer's or the
  // data's ids), --make-vocab-size-divisible-by, --padded-vocab-size (0: not given: Megatron's padding of the
  // vocabulary). size_vocabulary then sets padded_vocab_size to the model's V, the rows of the token embedding and
  // the LM head, as Megatron sets args.padded_vocab_size; a TrainConfig built in code sets it itself.
  int64_t vocab_size = 0;
  int64_t make_vocab_size_divisible_by = 128;
  int64_t padded_vocab_size = 0;
  double valid_fraction = 0;     // > 0 (--valid-fraction): the split 1-f, f, 0 instead of --split
  int64_t eval_interval = 1000;  // 0: no evaluation during training
  int64_t eval_iters = 100;      // 0: no evaluation (Megatron's meaning)
  // Whether the run evaluates: every --eval-interval iterations and at the end, or once with --skip-train; never
  // with --eval-iters 0.
  bool evaluates() const { return eval_iters > 0 && (eval_interval > 0 || skip_train); }

  // ---- checkpoints ----
  std::string save, load;
  int64_t save_interval = 0;  // 0: only at the end (when --save is given)

  // ---- output ----
  int64_t log_interval = 100;
  std::string trace;
  std::string loss_plot;  // --loss-plot FILE: the loss curves as a PNG at the end (train/loss_plot.h)
  int64_t trace_iteration = 2;  // the K-th iteration of this run (after a resume: resume point + K)
  std::string tensorboard_dir;  // rank 0 writes TensorBoard event files here (train/tensorboard.h); empty: none
  bool moe_per_layer_logging = false;  // one log line per layer with the expert loads (Megatron's flag)

  // ---- Megatron launch-script flags (train/megatron_args.h; docs/training.md, "Megatron launch scripts") ----
  int64_t max_position_embeddings = 0;  // 0: --seq-length; must be >= it
  int64_t train_samples = 0;            // > 0: train_iters = train_samples / global batch (resolve_train_samples)
  std::string split = "969,30,1";       // train / valid / test weights (Megatron's default with --data-path)
  std::string distributed_backend = "mpi";  // mpi only (Megatron's nccl and gloo become mpi, with a note)
  bool no_load_optim = false;        // --load: the model only, a fresh optimizer (the iteration continues)
  bool finetune = false;             // --load: the model only, a fresh optimizer, from iteration 0 and sample 0
  bool use_checkpoint_args = false;  // --load: the model flags come from the checkpoint (train/checkpoint_args.h)
  bool skip_train = false;           // no training: evaluate (validation, test) and stop

  // Every rule; world = number of ranks. Throws ConfigError (one line naming flag, value, rule).
  void validate(int world) const;
  void validate_ampipe() const;  // the seed's four AMPipe constraints (part of validate)
  void validate_pipeline() const;  // the stages (part of validate)
  void validate_virtual_stages() const;  // of validate_pipeline
  // pipe-experts with nothing to pipeline (model::LayerConfig::check_pipe_experts's notice: one local expert and
  // --pipe-experts-multi-data 1) runs without it: turns layer.use_pipe_experts off and returns the notice, for rank 0
  // to print. Returns "" otherwise, also when the pipe-experts rules fail (validate reports those).
  // TrainFlags::finish calls it before validate.
  std::string drop_idle_pipe_experts();
  // Data-parallel size and global batch size for `world` ranks (after validate).
  int data_parallel_size(int world) const { return world / (layer.tp() * layer.cp() * pp()); }
  int64_t global_batch(int world) const {
    return global_batch_size > 0 ? global_batch_size : layer.micro_batch_size * data_parallel_size(world);
  }
};

// The configuration's keys: one entry per setting, named as its flag with underscores (the --config key), with
// where it is written and how it is read back. The one list behind to_json (a checkpoint's metadata.json "config"
// and the resume notes), the rank-agreement JSON of `ampipe train` (cli/train_agreement.cpp), the "config" object
// of bench-layer's and plan's --json (cli::LayerFlags::to_json) and the checkpoint's model arguments
// (checkpoint_args.h). The flags themselves (spellings, help, grammar) are cli/flag_registry.cpp's.
enum ConfigKeyUse : unsigned {
  kKeyLayer = 1,       // the layer's settings (cli::LayerFlags::to_json)
  kKeyCheckpoint = 2,  // to_json: checkpoint metadata, resume notes, --config of a later run
  kKeyAgree = 4,       // every rank must agree on it (train_config_json(c, kKeyAgree))
};
enum class ModelArg {
  none,
  shape,  // the model's shape: load_checkpoint requires it to match; --use-checkpoint-args takes it
  taken,  // --use-checkpoint-args takes it too, but a checkpoint may differ (the router's top-k, positions)
};
struct ConfigKey {
  const char* key;
  unsigned uses;  // ConfigKeyUse bits
  ModelArg model = ModelArg::none;
  nlohmann::json (*get)(const TrainConfig&) = nullptr;
  void (*set)(TrainConfig&, const nlohmann::json&) = nullptr;  // nullptr: derived from other settings
};
const std::vector<ConfigKey>& config_keys();
// The keys of `c` with any of the `uses` bits, as JSON.
nlohmann::json train_config_json(const TrainConfig& c, unsigned uses);

// JSON with the flag names as keys (underscores): train_config_json(c, kKeyCheckpoint).
nlohmann::json to_json(const TrainConfig& c);

// pipe-experts with nothing to pipeline (model::LayerConfig::check_pipe_experts's notice, which does not depend on
// the degree) at any of `degrees`: turns `c.use_pipe_experts` off and returns the notice; "" otherwise. Throws the
// pipe-experts rules' ConfigError. The one place the feature is switched off (TrainConfig::drop_idle_pipe_experts,
// cli's layer flags, --ampipe-degree auto and bench-layer's sweep call it).
std::string drop_idle_pipe_experts(model::LayerConfig& c, const std::vector<int>& degrees);

}  // namespace ampipe::train
