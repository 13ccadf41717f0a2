// Checkpoints: DIR/iter_NNNNNNN/{model.safetensors, optimizer.safetensors, metadata.json, manifest.json} and the
// marker DIR/latest_checkpointed_iteration.txt (Megatron's name), written last.
//
// Every file is written atomically (core::write_file_atomic: temporary file, fsync, rename, fsync of the
// directory), and the marker only after all four files of the iteration are complete, so a crash at any point of
// a save leaves the marker naming the previous complete checkpoint. manifest.json, written after the other three,
// records each one's size and XXH64 and carries the XXH64 of its own contents (kCheckpointVersion).
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
#include <utility>
#include <vector>

#include "ampipe/comm/group.h"
#include "ampipe/core/safetensors.h"
#include "ampipe/train/adamw.h"
#include "ampipe/train/gpt_model.h"
#include "ampipe/train/train_config.h"

namespace ampipe::train {

inline constexpr const char* kLatestMarker = "latest_checkpointed_iteration.txt";
inline constexpr const char* kCheckpointFormat = "ampipe train checkpoint";
// Version 3: iter_N/manifest.json records every other file of the iteration (metadata.json included: its size and
// the XXH64 of its bytes) and carries the XXH64 of its own contents ("checksum"), so the iteration is one verified
// state. Version 2: every tensor's checksum in its file's header, and metadata.json's "files" (each tensor file's
// size and header checksum), but metadata.json itself unprotected; still loaded (its values are range-checked, the
// tensors verified and their shapes checked against the model), since its tensor data are verifiable. Version 1
// (no checksums) is refused: its files cannot be verified.
inline constexpr int kCheckpointVersion = 3;
inline constexpr int kOldestLoadableVersion = 2;
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kManifestFormat = "ampipe train checkpoint manifest";
inline constexpr int64_t kMaxCheckpointIteration = 9'999'999'999;
std::string checkpoint_subdir(int64_t iteration);  // "iter_0000010"

struct CheckpointMeta {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  nlohmann::json json;
};

// An iteration's manifest.json (version 3 checkpoints): read and verified against its own checksum.
struct CheckpointManifest {
  bool present = false;    // false: the directory has no manifest.json (a version 2 checkpoint)
  nlohmann::json files;    // {"metadata.json": {"bytes": N, "xxh64": "xxh64:..."}, ...}
  std::string file_checksum;  // the XXH64 of manifest.json's bytes (what the ranks compare)
};
// Reads `sub`/manifest.json (sub: the iteration's directory). Throws ConfigError naming --load and the file when it
// cannot be read, is not a manifest of `iteration`, or its contents do not match its recorded checksum.
CheckpointManifest read_manifest(const std::string& sub, int64_t iteration);
// Throws ConfigError naming --load and `path` (the file `name` of the manifest's directory) when its size or XXH64
// differ from what the manifest recorded ("expected ..., found ...").
void check_manifest_entry(const CheckpointManifest& m, const std::string& path, const std::string& name,
                          uint64_t bytes, const std::string& checksum);
// The XXH64 (checksum_string) of a manifest object without its "checksum" key, as save_checkpoint records it.
std::string manifest_self_checksum(const nlohmann::json& manifest);

// The full shape of every tensor of the model `cfg` describes (the checkpoint's names: gpt_model.h), in the order
// GptModel lists its parameters; cfg.padded_vocab_size must be set.
std::vector<std::pair<std::string, Shape>> checkpoint_tensor_shapes(const TrainConfig& cfg);
// --use-checkpoint-args: compares the tensors of `model_path` (from its safetensors header only) with the shapes of
// the model `cfg` describes (the checkpoint's flags, applied), before anything is built; a missing, extra or
// differently shaped tensor is one ConfigError naming the tensor, both shapes and the flags that shape it.
void check_checkpoint_shapes(const std::string& model_path, const TrainConfig& cfg);

struct SaveOptions {
  bool skip_marker = false;  // tests: stop after the files, before the marker (a save interrupted there)
};

// Every member's tensors on every member of `g` (each adds its own, fp32, with names no other member has): how the
// pipeline stages (the pp group) put a checkpoint's or full_params' tensors together. Collective over g; a no-op for
// one rank.
void share_over_group(const comm::Group& g, core::TensorMap& m, const std::string& tag);

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
