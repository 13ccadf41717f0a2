// What every rank of `ampipe train` must agree on before the first collective of the run (check_ranks_agree in
// layer_flags.h compares it with rank 0's and names the first differing setting): every field of the training
// configuration (to_json's model and optimizer settings plus parallelism, data, checkpoint, evaluation and output
// settings), the runtime flags (--check-collectives, --comm-timeout), the identity of the data the rank read
// (TextData::fingerprint: its token count and XXH64s, as "data_path contents"), and the iteration of the checkpoint
// it resumes from (-1: none) with the XXH64 of its manifest.json (train/checkpoint.h): ranks that read different files under one path, or were given different flags or
// --config files, would otherwise train apart silently or fail later inside MPI.
#pragma once

#include <nlohmann/json.hpp>

#include "ampipe/cli/train_flags.h"
#include "ampipe/train/text_data.h"

namespace ampipe::cli {

nlohmann::json train_agreement(const train::TrainConfig& cfg, const TrainFlags& flags, const train::TextData& data,
                                int64_t checkpoint_iteration, const std::string& checkpoint_manifest = "none");

}  // namespace ampipe::cli
