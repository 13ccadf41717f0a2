// Flags of `ampipe train` (Megatron-LM / MindSpeed spellings; the config field is the flag with underscores) and
// --config FILE: a JSON object whose keys are flag names (with underscores or dashes, without "--"); flags given
// on the command line override it.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "ampipe/cli/flag_registry.h"
#include "ampipe/cli/layer_flags.h"
#include "ampipe/cli/memory_check.h"
#include "ampipe/cli/megatron_flags.h"
#include "ampipe/train/train_config.h"

namespace ampipe::cli {

struct TrainFlags {
  TrainFlags();  // the embedded default: a small GPT-MoE for the bundled corpus
  LayerFlags layer;
  CommFlags comm;
  MemoryFlags memory;  // --memory-limit
  train::TrainConfig cfg;
  std::string config_file;
  std::string ampipe_degree = "1";  // --ampipe-degree as given: an integer, or `auto`
  bool auto_degree = false;   // --ampipe-degree auto: run_train asks the simulator (auto_degree.h)
  std::string sim_profile;    // --sim-profile FILE for it
  bool recompute_activations = false;  // Megatron's --recompute-activations: --recompute-granularity selective
  RefusedFlags refused;        // Megatron flags parsed only to be refused with their reason
  int64_t tensorboard_log_interval = 0;  // Megatron's flag: accepted; --log-interval governs TensorBoard (a note)
  bool exit_signal_handler = true;  // Megatron's --exit-signal-handler: accepted; this engine always does it
  // Megatron's warm-up and decay in other units, turned into cfg's iterations (finish, resolve): a fraction of the
  // decay iterations, and with --train-samples samples (0: not given).
  double lr_warmup_fraction = 0;
  int64_t lr_warmup_samples = 0;
  int64_t lr_decay_samples = 0;
  // Megatron's loading flags kept here (run_train): exit when --load holds no checkpoint; take the learning-rate
  // schedule from the checkpoint, or (Megatron's --override-opt-param-scheduler, always so here) from this run.
  bool exit_on_missing_checkpoint = false;
  bool use_checkpoint_opt_param_scheduler = false;
  bool override_opt_param_scheduler = false;
  CLI::App* app = nullptr;
  Sub sub = kTrain;  // the subcommand whose flags these are (simulate takes train's)

  // The flags of `sub` (flag_registry.cpp); `extra`: the targets of that subcommand's own flags.
  void add_to(CLI::App& app, Sub sub = kTrain, FlagTargets extra = {});
  FlagTargets targets(FlagTargets extra = {});
  // Applies --config (options not given on the command line), converts the layer flags. Validation of the whole
  // configuration is TrainConfig::validate. Throws ConfigError naming the flag or file.
  train::TrainConfig finish();
  // What needs the number of ranks: --train-samples becomes --train-iters (Megatron's samples / global batch),
  // --lr-warmup-samples and --lr-decay-samples become iterations. run_train
  // calls it after finish, before validate.
  void resolve(train::TrainConfig& c, int world) const;
  // Whether `flag` was given, on the command line or in --config (else it has its default).
  bool given(const char* flag) const;
  // --data-path and the per-split data paths: one kind only, and --split (or --valid-fraction) with --data-path only.
  void check_data_sources() const;

 private:
  void apply_config_file();  // finish()'s first part: --config's keys as flags
};

}  // namespace ampipe::cli
