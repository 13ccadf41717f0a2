#include "ampipe/cli/train_agreement.h"

#include "ampipe/cli/flag_registry.h"

namespace ampipe::cli {

nlohmann::json train_agreement(const train::TrainConfig& cfg, const TrainFlags& flags, const train::TextData& data,
                                int64_t checkpoint_iteration, const std::string& checkpoint_manifest) {
  // The training configuration (train::config_keys()), then the flags whose value as given counts (--ampipe-degree
  // as an integer or auto, --sim-profile, the runtime flags: kAgree in flag_registry.cpp).
  nlohmann::json j = train::train_config_json(cfg, train::kKeyAgree);
  const FlagTargets t = const_cast<TrainFlags&>(flags).targets();  // read only
  for (const FlagSpec* s : flags_of(kTrain))
    if (s->attrs & kAgree) j[s->config_key()] = flag_value(*s, t);
  j["data_path contents"] = data.fingerprint();
  // The checkpoint each rank resumes from (its marker's iteration): ranks whose --load copies differ would otherwise
  // each resume their own iteration and all-reduce together.
  j["checkpoint iteration"] = checkpoint_iteration < 0 ? nlohmann::json("none") : nlohmann::json(checkpoint_iteration);
  // ... and the manifest of that iteration (its files' checksums): copies of one iteration that differ.
  j["checkpoint manifest"] = checkpoint_iteration < 0 ? std::string("none") : checkpoint_manifest;
  return j;
}

}  // namespace ampipe::cli
