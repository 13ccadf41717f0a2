#include "ampipe/cli/train_flags.h"
#include "ampipe/core/json.h"
#include "ampipe/cli/flag_help.h"

#include "ampipe/cli/config_keys.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/train/checkpoint.h"
#include "ampipe/train/megatron_args.h"
#include "ampipe/train/vocab_size.h"

namespace ampipe::cli {

// Defaults of `ampipe train` and `ampipe simulate`. Where Megatron-LM (or MindSpeed, for its own flags) has a default,
// it is theirs: --ffn-hidden-size 4h (LayerFlags), --hidden-dropout 0.1, --attention-dropout 0.1, no --num-experts (a dense GPT: refused,
// TrainConfig::dense), --moe-aux-loss-coeff 0, MindSpeed's deepspeed_moe capacity factor 1.0 and minimum capacity 4,
// and the optimizer, schedule, evaluation and logging defaults in TrainConfig. Where Megatron requires the flag (the
// sizes), a small model of this engine's: s 128, b 4, h 128, 4 heads, 2 layers.
TrainFlags::TrainFlags() {
  model::LayerConfig& l = layer.cfg;
  l.seq_length = 128;
  l.micro_batch_size = 4;
  l.hidden_size = 128;
  l.num_attention_heads = 4;
  l.num_experts = 0;  // not given: a dense GPT (Megatron's default)
  l.moe_router_topk = 2;
  l.moe_train_capacity_factor = 1.0;
  l.moe_min_capacity = 4;
  l.hidden_dropout = 0.1;
  l.attention_dropout = 0.1;
  l.init_method_std = 0.02;
  l.seed = 1234;
  layer.moe_aux_loss_coeff = 0.0;
}

FlagTargets TrainFlags::targets(FlagTargets t) {
  t.layer = &layer;
  t.comm = &comm;
  t.memory = &memory;
  t.train = this;
  return t;
}

void TrainFlags::add_to(CLI::App& a, Sub s, FlagTargets extra) {
  app = &a;
  sub = s;
  a.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_flags(a, sub, targets(extra));
}

namespace {

// Megatron's per-split data paths: instead of --data-path and --split.
constexpr const char* kPerSplitDataFlags[] = {"--train-data-path", "--valid-data-path", "--test-data-path"};

// Flags that say the same thing in two ways: give one (on the command line, or in --config).
constexpr std::pair<const char*, const char*> kAlternativeFlags[] = {
    {"--train-iters", "--train-samples"},         {"--valid-fraction", "--split"},
    {"--lr-warmup-iters", "--lr-warmup-fraction"}, {"--lr-warmup-iters", "--lr-warmup-samples"},
    {"--lr-warmup-fraction", "--lr-warmup-samples"}, {"--lr-decay-iters", "--lr-decay-samples"}};

// --lr-warmup-fraction f: Megatron's warm-up over f x the decay's length (lr_warmup_steps = f x lr_decay_steps),
// `decay_iters` iterations here. This engine's schedule steps once per iteration: a warm-up that is not a whole
// number of iterations is refused.
void apply_warmup_fraction(double f, double decay_iters, train::TrainConfig& c) {
  if (!(f >= 0 && f < 1))
    throw ConfigError(fmt::format("--lr-warmup-fraction {} is invalid: it must be in [0, 1) (the warm-up ends before "
                                  "the decay does)",
                                  f));
  const double w = f * decay_iters, whole = std::round(w);
  if (std::abs(w - whole) > 1e-9 * std::max(1.0, w))
    throw ConfigError(fmt::format("--lr-warmup-fraction {} of the decay's {} iterations is {} warm-up iterations: "
                                  "this engine warms up over a whole number of iterations (give --lr-warmup-iters)",
                                  f, decay_iters, w));
  c.lr_warmup_iters = int64_t(whole);
}

// Megatron's two kinds of data source: one on the command line overrides the --config file's other kind.
void add_data_source_alternatives(const CLI::App& app, std::vector<std::string>& overridden) {
  auto on_command_line = [&](const char* f) {
    const CLI::Option* o = app.get_option_no_throw(f);
    return o != nullptr && o->count() > 0;
  };
  for (const char* f : kPerSplitDataFlags)
    if (on_command_line(f)) overridden.insert(overridden.end(), {"--data-path", "--split"});
  if (on_command_line("--data-path"))
    overridden.insert(overridden.end(), std::begin(kPerSplitDataFlags), std::end(kPerSplitDataFlags));
}

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

// The learning-rate schedule's Megatron flags that need the others: the iteration- and sample-based spellings
// (Megatron's pairing), the warm-up default and --lr-warmup-fraction of an iteration-based run (with --train-samples:
// resolve), the two sources of a resumed schedule.
void finish_schedule(const TrainFlags& f, train::TrainConfig& cfg) {
  for (const char* flag : {"--lr-warmup-samples", "--lr-decay-samples"})
    if (f.given(flag) && cfg.train_samples <= 0)
      throw ConfigError(fmt::format("{} needs --train-samples: with --train-iters the schedule is in iterations "
                                    "(--lr-warmup-iters or --lr-warmup-fraction, --lr-decay-iters), as in Megatron",
                                    flag));
  if (f.use_checkpoint_opt_param_scheduler && f.override_opt_param_scheduler)
    throw ConfigError("--use-checkpoint-opt-param-scheduler and --override-opt-param-scheduler are both given: the "
                      "schedule comes from the checkpoint or from this run, not both (as in Megatron)");
  if (f.given("--lr-warmup-fraction") && cfg.train_samples <= 0)
    apply_warmup_fraction(f.lr_warmup_fraction,
                          double(cfg.lr_decay_iters > 0 ? cfg.lr_decay_iters : cfg.train_iters), cfg);
}

}  // namespace

// --config FILE: the file's keys as flags (the command line wins), a checkpoint's metadata.json read as its config.
void TrainFlags::apply_config_file() {
  std::ifstream in(config_file);
  if (!in) throw ConfigError(fmt::format("--config {}: the file cannot be read", config_file));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = core::parse_json(ss.str());
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
  add_data_source_alternatives(*app, alternatives_given);
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
    const std::string flag = config_key_flag(key);
    const FlagSpec* spec = find_flag(sub, flag);  // the registry's keys: the flags of this subcommand
    if (spec != nullptr && (spec->attrs & kNoConfig))
      throw ConfigError(fmt::format("--config {}: key \"{}\" is not a config key: {} is given on the command line "
                                    "only",
                                    config_file, key, flag));
    CLI::Option* opt = spec == nullptr ? nullptr : app->get_option_no_throw(flag);
    if (opt == nullptr) {
      const std::string near = closest_flag(*app, flag);
      throw ConfigError(fmt::format("--config {}: unknown key \"{}\" (no flag {}{})", config_file, key, flag,
                                    near.empty() ? std::string() : "; did you mean " + near + "?"));
    }
    // A list is a value only for a flag that takes several (or a comma list); an empty one gives no value at all,
    // and a list of lists none this engine reads.
    if (value.is_array()) {
      const bool takes_list = spec->grammar == Grammar::string_list || spec->grammar == Grammar::text_list ||
                              spec->grammar == Grammar::int_list || spec->grammar == Grammar::degree_list ||
                              spec->grammar == Grammar::text;
      for (const nlohmann::json& e : value)
        if (e.is_array() || e.is_object())
          throw ConfigError(fmt::format("--config {}: key \"{}\" = {}: a list of lists or objects is not a value "
                                        "of {}",
                                        config_file, key, value.dump(), flag));
      if (!takes_list)
        throw ConfigError(fmt::format("--config {}: key \"{}\" = {}: {} takes one value, not a list", config_file,
                                      key, value.dump(), flag));
      if (value.empty() && spec->grammar != Grammar::string_list)
        throw ConfigError(fmt::format("--config {}: key \"{}\" = []: an empty list gives {} no value", config_file,
                                      key, flag));
    }
    if ((spec->attrs & kUnsetZero) && value.is_number() && value == 0) continue;  // 0: not given (a checkpoint's
                                                                                  // metadata.json)
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
    const bool list = spec->grammar == Grammar::string_list && value.is_array();
    if (list && value.empty()) continue;  // no value: the default
    try {
      if (list) {  // one value per element (0.7 A 0.3 B)
        for (const nlohmann::json& e : value) opt->add_result(json_to_arg(e));
      } else {
        opt->add_result(arg);
      }
      opt->run_callback();
    } catch (const CLI::Error& e) {
      throw ConfigError(fmt::format("--config {}: key \"{}\" = {}: {}", config_file, key, value.dump(), e.what()));
    }
  }
}

train::TrainConfig TrainFlags::finish() {
  if (!config_file.empty()) apply_config_file();
  refused.check();
  {  // the flags accepted with no effect: one note (rank 0 prints layer.notices after validate)
    std::vector<std::string> extra;
    if (cfg.distributed_backend == "nccl" || cfg.distributed_backend == "gloo") {  // Megatron's choices
      extra.push_back(fmt::format("--distributed-backend {} (this engine communicates over MPI)",
                                  cfg.distributed_backend));
      cfg.distributed_backend = "mpi";
    }
    if (std::string note = refused.noop_note(extra); !note.empty()) layer.notices.push_back(note);
  }
  // The tokenizer flags (which type takes which files) are make_tokenizer's rules (train/tokenizer.h); the files are
  // read when the data are (run_train).
  for (const auto& [a, b] : kAlternativeFlags)
    if (given(a) && given(b))
      throw ConfigError(fmt::format("{} and {} are both given: they say the same thing in two ways; give one", a, b));
  check_data_sources();
  finish_schedule(*this, cfg);

  if (given("--tensorboard-log-interval")) {
    if (tensorboard_log_interval < 1)
      throw ConfigError(fmt::format("--tensorboard-log-interval {} is invalid: it must be >= 1",
                                    tensorboard_log_interval));
    if (tensorboard_log_interval != cfg.log_interval)
      layer.notices.push_back(fmt::format("--tensorboard-log-interval {} has no effect: --log-interval {} governs the "
                                          "TensorBoard scalars (the means over each log interval)",
                                          tensorboard_log_interval, cfg.log_interval));
  }
  if (sub == kTrain) {  // simulate's --ampipe-degree is its own list (run_simulate)
    const Degrees d = parse_degree(ampipe_degree, Grammar::degree_auto);
    auto_degree = d.is_auto;
    cfg.ampipe_degree = d.is_auto ? 1 : d.list.front();  // with auto: 1 until run_train has asked the simulator
  }
  // No --num-experts (or 0): Megatron's dense GPT, every block's FFN a dense MLP of --ffn-hidden-size.
  cfg.dense = layer.cfg.num_experts == 0;
  cfg.layer = layer.finish();
  cfg.dense_ffn_hidden_size = layer.dense_ffn_hidden_size;
  // --vocab-size 0 and --padded-vocab-size 0 as given (0 is their fields' "not given": train/vocab_size.h)
  train::validate_vocab_flags(cfg, given("--vocab-size"), given("--padded-vocab-size"));
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

bool TrainFlags::given(const char* flag) const {
  const CLI::Option* o = app ? app->get_option_no_throw(flag) : nullptr;
  return o != nullptr && o->count() > 0;
}

// Megatron takes one data source (arguments.py: "A single data source must be provided"): --data-path, cut by --split,
// or the per-split paths, which --split does not apply to (blended_megatron_dataset_config.py: "split and
// blend_per_split are incompatible").
void TrainFlags::check_data_sources() const {
  const char* per_split = nullptr;
  for (const char* f : kPerSplitDataFlags)
    if (per_split == nullptr && given(f)) per_split = f;
  if (per_split == nullptr) return;
  if (given("--data-path"))
    throw ConfigError(fmt::format("--data-path and {} are both given: give one data source, --data-path (cut by "
                                  "--split) or the per-split --train-data-path, --valid-data-path, --test-data-path",
                                  per_split));
  for (const char* f : {"--split", "--valid-fraction"})
    if (given(f))
      throw ConfigError(fmt::format("{} cannot be used with {}: it cuts --data-path's datasets; the per-split paths "
                                    "give each split its own data (Megatron refuses --split with them too)",
                                    f, per_split));
}

void TrainFlags::resolve(train::TrainConfig& c, int world) const {
  if (c.train_samples <= 0) return;
  train::resolve_train_samples(c, world);
  // Megatron's sample-based schedule (lr_decay_steps = --lr-decay-samples, default --train-samples; the warm-up in
  // samples or as a fraction of them), in this engine's iterations of G samples each.
  const int64_t G = c.global_batch(world);
  auto iterations = [G](const char* flag, int64_t samples) {
    if (samples < 0 || samples % G != 0)
      throw ConfigError(fmt::format("{} {} is not a multiple of the global batch ({} sequences): this engine's "
                                    "schedule steps once per iteration",
                                    flag, samples, G));
    return samples / G;
  };
  if (given("--lr-decay-samples") && lr_decay_samples < 1)
    throw ConfigError(fmt::format("--lr-decay-samples {} is invalid: it must be >= 1", lr_decay_samples));
  if (given("--lr-decay-samples")) c.lr_decay_iters = iterations("--lr-decay-samples", lr_decay_samples);
  if (given("--lr-warmup-samples")) c.lr_warmup_iters = iterations("--lr-warmup-samples", lr_warmup_samples);
  if (given("--lr-warmup-fraction"))
    apply_warmup_fraction(lr_warmup_fraction,
                          double(given("--lr-decay-samples") ? lr_decay_samples : c.train_samples) / double(G), c);
}

}  // namespace ampipe::cli
