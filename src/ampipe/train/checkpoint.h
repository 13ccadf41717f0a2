// Checkpoints: DIR/iter_NNNNNNN/{model.safetensors, optimizer.safetensors, metadata.json} and the marker
// DIR/latest_checkpointed_iteration.txt (Megatron's name), written last.
//
// Every file is written atomically (core::write_file_atomic: temporary file, fsync, rename, fsync of the
// directory), and the marker only after all three files of the iteration are complete, so a crash at any point of
// a save leaves the marker naming the previous complete checkpoint.
//
// Tensors are stored whole, under the model's parameter names (gpt_model.h): expert tensors are all-gathered over
// the EP group before rank 0 writes them, and each rank takes its rows on load. So a checkpoint does not depend on
// the AMPipe degree, the EP size or the number of ranks. optimizer.safetensors holds "exp_avg.<name>" and
// "exp_avg_sq.<name>". metadata.json holds the iteration, the consumed-samples counter (the data position: the
// sample order is a pure function of the seed and this counter), the optimizer step count, the random state (all
// random numbers are Philox keyed by (seed, layer, purpose, global token); the seed is the whole state) and the
// configuration.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "ampipe/comm/group.h"
#include "ampipe/train/adamw.h"
#include "ampipe/train/gpt_model.h"
#include "ampipe/train/train_config.h"

namespace ampipe::train {

inline constexpr const char* kLatestMarker = "latest_checkpointed_iteration.txt";
inline constexpr const char* kCheckpointFormat = "ampipe train checkpoint";
// Version 2: every tensor's checksum in its file's header, and metadata.json's "files" (each tensor file's size
// and header checksum). Version 1 (no checksums) is refused: its files cannot be verified.
inline constexpr int kCheckpointVersion = 2;
inline constexpr int64_t kMaxCheckpointIteration = 9'999'999'999;
std::string checkpoint_subdir(int64_t iteration);  // "iter_0000010"

struct CheckpointMeta {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  nlohmann::json json;
};

struct SaveOptions {
  bool skip_marker = false;  // tests: stop after the files, before the marker (a save interrupted there)
};

// Collective over groups.world (every rank calls it). Throws ConfigError naming --save and the path on failure,
// on every rank.
// The full tensor of a local tensor shaped like layer parameter `name` (model::LayerParams; the parameter, its
// gradient or its optimizer state): cut over tp, all-gathered over the tp group and joined (model::tp_join); then,
// for an expert tensor, all-gathered over EP (dim 0). Collective over the groups the parameter is split over.
Tensor full_layer_tensor(const Tensor& local, const std::string& name, const model::LayerConfig& cfg,
                         const comm::Groups& g, const std::string& tag);
// The same for any model parameter (only layer parameters are split).
Tensor full_tensor(const Tensor& local, const NamedParam& p, const model::LayerConfig& cfg, const comm::Groups& g,
                   const std::string& tag);

void save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const TrainConfig& cfg, GptModel& model,
                     AdamW& opt, const comm::Groups& groups, const SaveOptions& opts = {});

// Reads the newest complete checkpoint of `dir` into model and optimizer (each rank its shard). Throws ConfigError
// naming --load and the file for a missing marker, a missing or corrupt file, or a model that does not match.
// Verified before anything is used: the marker is an iteration; metadata.json is this format and version, its
// iteration is the marker's, consumed samples and optimizer steps are in range; each tensor file's data matches
// its checksums (core/safetensors.h: offsets in range and disjoint), says the marker's iteration, is the file
// metadata.json recorded (size, header checksum), and holds only finite values (second moments >= 0).
// load_optim false (--no-load-optim, --finetune): the optimizer file is neither read nor required, and `opt` keeps
// its fresh state.
CheckpointMeta load_checkpoint(const std::string& dir, const TrainConfig& cfg, GptModel& model, AdamW& opt,
                               const comm::Groups& groups, bool load_optim = true);

// Rank 0 creates `dir` and probes that it can write there; every rank of `world` learns the verdict, so all fail
// together with one ConfigError naming `flag` (e.g. "--save", "--export"), the directory and the reason.
void check_writable_dir(const std::string& flag, const std::string& dir, const comm::Group& world);

}  // namespace ampipe::train
