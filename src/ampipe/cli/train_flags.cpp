#include "ampipe/cli/train_flags.h"
#include "ampipe/cli/flag_help.h"

#include "ampipe/cli/config_keys.h"

#include <algorithm>
#include <array>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/train/checkpoint.h"
#include "ampipe/train/megatron_args.h"

namespace ampipe::cli {

TrainFlags::TrainFlags() {
  model::LayerConfig& l = layer.cfg;
  l.seq_length = 128;
  l.micro_batch_size = 4;
  l.hidden_size = 128;
  l.ffn_hidden_size = 256;
  l.num_attention_heads = 4;
  l.num_experts = 4;
  l.moe_router_topk = 2;
  l.moe_train_capacity_factor = 1.25;
  l.hidden_dropout = 0.0;
  l.init_method_std = 0.02;
  l.seed = 1234;
}

void TrainFlags::add_to(CLI::App& a) {
  app = &a;
  a.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  layer.add_to(a);
  comm.add_to(a);
  memory.add_to(a);
  train::TrainConfig& c = cfg;
  a.add_option("--config", config_file, "JSON file of flags (keys: flag names); command-line flags override it");
  // Model.
  a.add_option("--num-layers", c.num_layers, "MoE blocks L")->capture_default_str();
  a.add_flag("--untie-embeddings-and-output-weights", c.untie_embeddings_and_output_weights,
             "separate LM-head matrix instead of the token embedding");
  a.add_option("--moe-model-type", c.moe_model_type, "deepspeed_moe (the MoE layer of this engine) or megatron_moe")
      ->capture_default_str();
  a.add_flag("--use-flash-attn", c.use_flash_attn,
             "flash attention (this engine's only attention kernel; required with --ampipe-degree > 1)");
  a.add_flag("--add-bias-linear", c.add_bias_linear, "biases in linear layers (not supported)");
  a.add_option("--max-position-embeddings", c.max_position_embeddings,
               "Megatron's position-embedding size: must be >= --seq-length (the embedding has --seq-length rows, "
               "the only positions a sequence uses)");
  a.add_option("--attention-dropout", c.attention_dropout,
               "dropout on the attention probabilities: only 0 (the fused attention has none)")
      ->capture_default_str();
  a.add_option("--distributed-backend", c.distributed_backend,
               "mpi only: this engine communicates over MPI (nccl and gloo are refused)")
      ->capture_default_str();
  // Parallelism.
  ampipe_degree = std::to_string(c.ampipe_degree);
  a.add_option("--ampipe-degree", ampipe_degree,
               "AMPipe degree M: chunks the sequence is cut into, or auto (the degree the simulator predicts fastest "
               "on --sim-profile, else on a self-calibration at start-up)")
      ->capture_default_str();
  a.add_option("--sim-profile", sim_profile, "hardware profile for --ampipe-degree auto (ampipe calibrate --out)");
  // --context-parallel-size, --context-parallel-algo: layer flags (LayerFlags).
  // --tensor-model-parallel-size, --sequence-parallel, --ampipe-tp-sp-comm-overlap: layer flags (LayerFlags).
  // --use-pipe-experts, --pipe-experts-multi-data, --pipe-experts-multi-stream: layer flags (LayerFlags).
  a.add_flag("--use-ascend-mc2", c.use_ascend_mc2, "(incompatible with AMPipe)");
  a.add_flag("--overlap-grad-reduce", c.overlap_grad_reduce, "(incompatible with AMPipe)");
  a.add_flag("--overlap-param-gather", c.overlap_param_gather, "(incompatible with AMPipe)");
  a.add_flag("--use-nanopipe", c.use_nanopipe, "(incompatible with AMPipe)");
  a.add_flag("--recompute-in-bubble", c.recompute_in_bubble, "(incompatible with AMPipe)");
  a.add_flag("--recompute-in-advance", c.recompute_in_advance, "(incompatible with AMPipe)");
  a.add_flag("--adaptive-recompute-device-swap", c.adaptive_recompute_device_swap, "(incompatible with AMPipe)");
  a.add_option("--adaptive-recompute-device-size", c.adaptive_recompute_device_size, "(incompatible with AMPipe)");
  a.add_flag("--adaptive-memory-optimization", c.adaptive_memory_optimization, "(incompatible with AMPipe)");
  a.add_option("--recompute-granularity", c.recompute_granularity,
               "full: recompute whole layers in the backward; selective: recompute every layer's attention core only");
  a.add_flag("--recompute-activations", recompute_activations,
             "Megatron's spelling of --recompute-granularity selective");
  a.add_option("--recompute-method", c.recompute_method,
               "with full: uniform (every layer) or block (the first --recompute-num-layers layers)");
  a.add_option("--recompute-num-layers", c.recompute_num_layers,
               "block: layers recomputed; uniform: Megatron's layers per group (every layer is recomputed here)")
      ->capture_default_str();
  // Optimizer and schedule.
  a.add_option("--global-batch-size", c.global_batch_size,
               "sequences per iteration (default: micro-batch size x data-parallel size)");
  a.add_option("--train-iters", c.train_iters, "iterations")->capture_default_str();
  a.add_option("--train-samples", c.train_samples,
               "train for this many sequences instead: --train-iters = samples / global batch (Megatron's meaning)");
  a.add_option("--exit-interval", c.exit_interval,
               "stop at the first iteration divisible by N, counted from iteration 0 as in Megatron (0: never)")
      ->capture_default_str();
  a.add_flag("--skip-train", c.skip_train, "no training: evaluate the model (--load) on the validation and test splits");
  a.add_option("--lr", c.lr, "peak learning rate")->capture_default_str();
  a.add_option("--min-lr", c.min_lr, "learning rate at the end of the decay")->capture_default_str();
  a.add_option("--lr-warmup-iters", c.lr_warmup_iters, "linear warm-up iterations")->capture_default_str();
  a.add_option("--lr-decay-style", c.lr_decay_style, "after the warm-up: constant, linear or cosine (to --min-lr)")
      ->capture_default_str();
  a.add_option("--lr-decay-iters", c.lr_decay_iters,
               "iteration at which the decay reaches --min-lr (0: --train-iters)")
      ->capture_default_str();
  a.add_option("--weight-decay", c.weight_decay, "AdamW decoupled weight decay (matrices only)")
      ->capture_default_str();
  a.add_option("--adam-beta1", c.adam_beta1, "AdamW beta1")->capture_default_str();
  a.add_option("--adam-beta2", c.adam_beta2, "AdamW beta2")->capture_default_str();
  a.add_option("--adam-eps", c.adam_eps, "AdamW epsilon")->capture_default_str();
  a.add_option("--clip-grad", c.clip_grad, "clip the global gradient norm to this (0: off)")->capture_default_str();
  // Data.
  a.add_option("--data-path", c.data_path, "training data: a plain-text file, or a pre-tokenized llm.c token file (default: the bundled corpus)");
  a.add_option("--tokenizer-type", c.tokenizer_type,
               "SentencePieceTokenizer (with --tokenizer-model); default: bytes of plain text, ids of a token file");
  a.add_option("--tokenizer-model", c.tokenizer_model,
               "SentencePiece model (e.g. from ampipe preprocess): tokenizes a plain-text --data-path at load, and "
               "gives the vocabulary size");
  a.add_option("--valid-fraction", c.valid_fraction, "tail of the text held out for validation (the split 1-f,f,0)")
      ->capture_default_str();
  a.add_option("--split", c.split,
               "train,valid,test weights of the token stream, in that order, e.g. 969,30,1 (instead of "
               "--valid-fraction)");
  a.add_option("--eval-interval", c.eval_interval, "evaluate every N iterations (0: never)")->capture_default_str();
  a.add_option("--eval-iters", c.eval_iters, "global batches per evaluation")->capture_default_str();
  // Checkpoints.
  a.add_option("--save", c.save, "checkpoint directory to write");
  a.add_option("--load", c.load, "checkpoint directory to resume from");
  a.add_option("--save-interval", c.save_interval, "save every N iterations (0: only at the end)")
      ->capture_default_str();
  a.add_flag("--no-load-optim", c.no_load_optim, "--load the model only: a fresh optimizer, the iteration continues");
  a.add_flag("--finetune", c.finetune,
             "--load the model only and start a new run: iteration 0, first sample, fresh optimizer");
  a.add_flag("--use-checkpoint-args", c.use_checkpoint_args,
             "take the model flags (layers, sizes, heads, experts, top-k, ...) from the --load checkpoint");
  a.add_flag("--exit-signal-handler", exit_signal_handler,
             "on SIGTERM or SIGINT finish the iteration on every rank, save (with --save) and exit (always on)");
  // Output.
  a.add_option("--log-interval", c.log_interval, "log line every N iterations")->capture_default_str();
  a.add_option("--trace", c.trace, "write a Chrome trace (Perfetto) of one iteration to this file");
  a.add_option("--loss-plot", c.loss_plot,
               "write the loss curves (training per iteration, validation per evaluation) as a PNG at the end");
  a.add_option("--trace-iteration", c.trace_iteration,
               "which iteration of this run --trace records (1-based; after a resume at R: iteration R + K)")
      ->capture_default_str();
  a.add_option("--tensorboard-dir", c.tensorboard_dir,
               "rank 0 writes TensorBoard event files here: the log line's scalars and the expert loads, every "
               "--log-interval iterations, and each evaluation");
  a.add_option("--tensorboard-log-interval", tensorboard_log_interval,
               "accepted for Megatron launch scripts: --log-interval governs the TensorBoard scalars (the means "
               "over each log interval)");
  a.add_flag("--moe-per-layer-logging", c.moe_per_layer_logging,
             "one log line per MoE layer: tokens kept per expert, max/mean load, dropped share");
  refused.add_to(a, "Megatron flags this engine refuses (each says why)");  // the group name of flag_help.cpp
}

namespace {

// Flags that say the same thing in two ways: give one (on the command line, or in --config).
constexpr std::pair<const char*, const char*> kAlternativeFlags[] = {{"--train-iters", "--train-samples"},
                                                                     {"--valid-fraction", "--split"}};

std::string json_to_arg(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number()) return v.dump();
  if (v.is_array()) {
    std::string s;
    for (const auto& e : v) s += (s.empty() ? "" : ",") + json_to_arg(e);
    return s;
  }
  throw ConfigError("unsupported value");
}

}  // namespace

train::TrainConfig TrainFlags::finish() {
  if (!config_file.empty()) {
    std::ifstream in(config_file);
    if (!in) throw ConfigError(fmt::format("--config {}: the file cannot be read", config_file));
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("--config {}: not valid JSON ({})", config_file, e.what()));
    }
    if (!j.is_object())
      throw ConfigError(fmt::format("--config {}: expected a JSON object of flag names to values", config_file));
    check_config_keys_once(ss.str(), j, config_file, *app);
    // A checkpoint's metadata.json: its "config" object holds this run's flags.
    if (j.contains("format") && j["format"] == train::kCheckpointFormat && j.contains("config") &&
        j["config"].is_object()) {
      const nlohmann::json inner = j["config"];
      j = inner;
    }
    // A flag given on the command line also overrides the file's way of saying the same thing (--train-samples
    // on the command line and train_iters in a checkpoint's metadata.json).
    std::vector<std::string> alternatives_given;
    for (const auto& [a, b] : kAlternativeFlags)
      for (const auto& [given, other] : {std::pair{a, b}, std::pair{b, a}})
        if (const CLI::Option* o = app->get_option_no_throw(given); o != nullptr && o->count() > 0)
          alternatives_given.push_back(other);
    for (const auto& item : j.items()) {
      std::string key = item.key();
      nlohmann::json value = item.value();
      // Keys of checkpoints written before every config key was a flag: use_rts (true/false) and
      // noisy_gate_policy as an enum number.
      if (key == "use_rts" && value.is_boolean()) {
        key = "no_use_rts";
        value = !value.get<bool>();
      }
      if (key == "noisy_gate_policy" && value.is_number_integer() && value.get<int>() >= 0 && value.get<int>() < 3)
        value = std::array<const char*, 3>{"None", "Jitter", "RSample"}[size_t(value.get<int>())];
      if (value.is_string() && value.get<std::string>().empty()) continue;  // "": the default (as a checkpoint's
                                                                             // data_path of the bundled corpus)
      std::string flag = key.rfind("--", 0) == 0 ? key : "--" + key;
      for (char& ch : flag)
        if (ch == '_') ch = '-';
      CLI::Option* opt = flag == "--config" ? nullptr : app->get_option_no_throw(flag);
      if (opt == nullptr)
        throw ConfigError(fmt::format("--config {}: unknown key \"{}\" (no flag {}{})", config_file, key, flag,
                                      closest_flag(*app, flag).empty() ? std::string()
                                                                       : "; did you mean " + closest_flag(*app, flag) + "?"));
      if (opt->count() > 0) continue;  // the command line wins
      if (std::find(alternatives_given.begin(), alternatives_given.end(), flag) != alternatives_given.end()) continue;
      std::string arg;
      try {
        arg = json_to_arg(value);
      } catch (const ConfigError&) {
        throw ConfigError(fmt::format("--config {}: key \"{}\" has an unsupported value {}", config_file, key,
                                      value.dump()));
      }
      if (value.is_boolean() && opt->get_type_size() == 0 && !value.get<bool>()) continue;  // flag off
      try {
        opt->add_result(arg);
        opt->run_callback();
      } catch (const CLI::Error& e) {
        throw ConfigError(fmt::format("--config {}: key \"{}\" = {}: {}", config_file, key, value.dump(), e.what()));
      }
    }
  }
  refused.check();
  if (!cfg.tokenizer_type.empty() && cfg.tokenizer_type != "SentencePieceTokenizer")
    throw ConfigError(fmt::format("--tokenizer-type {} is not supported: {}", cfg.tokenizer_type,
                                  RefusedFlags::kTokenizerReason));
  if (cfg.tokenizer_type == "SentencePieceTokenizer" && cfg.tokenizer_model.empty())
    throw ConfigError("--tokenizer-type SentencePieceTokenizer needs --tokenizer-model FILE (a SentencePiece model, "
                      "e.g. PREFIX.model from ampipe preprocess)");
  if (!cfg.tokenizer_model.empty() && cfg.tokenizer_type != "SentencePieceTokenizer")
    throw ConfigError(fmt::format("--tokenizer-model {} needs --tokenizer-type SentencePieceTokenizer (the only "
                                  "tokenizer type that takes a model here)",
                                  cfg.tokenizer_model));
  auto given = [&](const char* flag) {
    const CLI::Option* o = app ? app->get_option_no_throw(flag) : nullptr;
    return o != nullptr && o->count() > 0;
  };
  for (const auto& [a, b] : kAlternativeFlags)
    if (given(a) && given(b))
      throw ConfigError(fmt::format("{} and {} are both given: they say the same thing in two ways; give one", a, b));
  // The warm-up default adapts to short runs (a default never makes a valid command invalid); a given value is
  // checked as it is.
  if (!given("--lr-warmup-iters")) cfg.lr_warmup_iters = std::min(cfg.lr_warmup_iters, cfg.train_iters);
  if (given("--tensorboard-log-interval")) {
    if (tensorboard_log_interval < 1)
      throw ConfigError(fmt::format("--tensorboard-log-interval {} is invalid: it must be >= 1",
                                    tensorboard_log_interval));
    if (tensorboard_log_interval != cfg.log_interval)
      layer.notices.push_back(fmt::format("--tensorboard-log-interval {} has no effect: --log-interval {} governs the "
                                          "TensorBoard scalars (the means over each log interval)",
                                          tensorboard_log_interval, cfg.log_interval));
  }
  auto_degree = ampipe_degree == "auto";
  if (auto_degree) {
    cfg.ampipe_degree = 1;  // until run_train has asked the simulator
  } else {
    size_t used = 0;
    try {
      cfg.ampipe_degree = std::stoi(ampipe_degree, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != ampipe_degree.size())
      throw ConfigError(fmt::format("--ampipe-degree {} is invalid: give an integer or auto", ampipe_degree));
  }
  cfg.layer = layer.finish();
  if (recompute_activations) {
    if (!cfg.recompute_granularity.empty() && cfg.recompute_granularity != "selective")
      throw ConfigError(fmt::format("--recompute-activations (selective) contradicts --recompute-granularity {}",
                                    cfg.recompute_granularity));
    cfg.recompute_granularity = "selective";
  }
  // selective: every layer recomputes its attention core (the layer's buffers plan attn and lse as transient)
  cfg.layer.recompute_attention = cfg.recompute_granularity == "selective";
  cfg.moe_aux_loss_coeff = layer.moe_aux_loss_coeff;
  // After validate (which run_train calls next) has passed, rank 0 prints layer.notices.
  if (std::string notice = cfg.drop_idle_pipe_experts(); !notice.empty()) {
    layer.cfg.use_pipe_experts = false;
    layer.notices.push_back(notice);
  }
  return cfg;
}

void TrainFlags::resolve(train::TrainConfig& c, int world) const {
  if (c.train_samples <= 0) return;
  train::resolve_train_samples(c, world);
  const CLI::Option* w = app ? app->get_option_no_throw("--lr-warmup-iters") : nullptr;
  static const train::TrainConfig defaults;
  if (w == nullptr || w->count() == 0) c.lr_warmup_iters = std::min(defaults.lr_warmup_iters, c.train_iters);
}

}  // namespace ampipe::cli
