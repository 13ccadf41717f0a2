// What a resume does with the configuration a checkpoint was trained with (metadata.json's "config"), apart from
// loading the tensors (checkpoint.h): --use-checkpoint-args takes the model flags from it, and a resume states every
// other setting that differs from this run (docs/training.md, "Checkpoints").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ampipe/train/train_config.h"

namespace ampipe::train {

struct CheckpointInfo {
  int64_t iteration = 0;
  nlohmann::json config;  // the "config" object (empty object when the metadata has none)
  // The XXH64 of the iteration's manifest.json ("none" without one: a version 2 checkpoint): with the iteration,
  // what the ranks compare, so ranks whose copies of one iteration differ do not resume from different states.
  std::string manifest_checksum = "none";
};

// The newest complete checkpoint of `dir` (the marker's iteration) and its configuration. Reads files only (every
// rank may call it). When there is none or it cannot be read: ConfigError naming --load and the file (with
// load_checkpoint's words) if `required`, else nullopt (load_checkpoint then reports what is wrong). When `required`
// (the configuration is used: --use-checkpoint-args), the manifest (version 3) is verified and metadata.json
// checked against it first, so an edited metadata.json never shapes the run.
std::optional<CheckpointInfo> read_checkpoint_info(const std::string& dir, bool required);

// Whether `dir` holds a checkpoint: its marker file (kLatestMarker) exists, whatever it says. Megatron starts from
// scratch when it does not (--load of a run's first launch).
bool checkpoint_exists(const std::string& dir);

// The iteration that the marker file (kLatestMarker) `text` names, or -1 when it is not an iteration number in
// [0, kMaxCheckpointIteration]. The one parser of the marker (read_checkpoint_info and load_checkpoint).
int64_t parse_latest_marker(const std::string& text);

// The flags that make the model's shape (what load_checkpoint requires to match), as config keys: the keys of
// config_keys() (train_config.h) with ModelArg::shape, in that order.
const std::vector<std::string>& model_arg_keys();

// --use-checkpoint-args: the model flags of `ckpt` (model_arg_keys, then the keys with ModelArg::taken: the router's
// top-k and --max-position-embeddings) replace this run's.
// Returns one line per flag that changed ("--hidden-size 128 -> 64").
std::vector<std::string> apply_checkpoint_model_args(TrainConfig& c, const nlohmann::json& ckpt);

// Megatron's --use-checkpoint-opt-param-scheduler: the learning-rate schedule of `ckpt` (--lr, --min-lr,
// --lr-warmup-iters, --lr-decay-iters, --lr-decay-style, --weight-decay: Megatron's OptimizerParamScheduler state)
// replaces this run's; a decay over the checkpoint's --train-iters (--lr-decay-iters 0) keeps that length. Returns
// one line per flag that changed ("--lr 0.001 -> 0.0003").
std::vector<std::string> apply_checkpoint_schedule(TrainConfig& c, const nlohmann::json& ckpt);

// Every setting outside the model's shape whose value in `run` differs from the checkpoint's `ckpt` (both as
// to_json writes them): one line each, "--global-batch-size 8 -> 16". Keys a checkpoint does not have are skipped.
std::vector<std::string> describe_resume_changes(const nlohmann::json& ckpt, const nlohmann::json& run);

}  // namespace ampipe::train
