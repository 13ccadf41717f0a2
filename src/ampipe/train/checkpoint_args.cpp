#include "ampipe/train/checkpoint_args.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "ampipe/core/checksum.h"
#include "ampipe/core/json.h"
#include "ampipe/core/error.h"
#include "ampipe/train/checkpoint.h"

namespace ampipe::train {

namespace {

std::string flag_of(const std::string& key) {
  std::string f = "--" + key;
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

std::string value_str(const std::string& key, const nlohmann::json& v) {
  if (key == "data_path" && v.is_string() && v.get<std::string>().empty()) return "(the bundled corpus)";
  if (key.ends_with("_data_path") && v.is_string() && v.get<std::string>().empty()) return "(none)";
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// The file's contents, or nullopt when it cannot be read.
std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

bool checkpoint_exists(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(dir) / kLatestMarker, ec);
}

std::optional<CheckpointInfo> read_checkpoint_info(const std::string& dir, bool required) {
  // The messages are load_checkpoint's for the same faults (it verifies much more, later).
  auto fail = [&](const std::string& msg) -> std::optional<CheckpointInfo> {
    if (required) throw ConfigError(msg);
    return std::nullopt;
  };
  const std::string marker = dir + "/" + kLatestMarker;
  const std::optional<std::string> mtext = read_file(marker);
  if (!mtext) return fail(fmt::format("--load {}: no checkpoint there ({} is missing)", dir, kLatestMarker));
  CheckpointInfo info;
  info.iteration = parse_latest_marker(*mtext);
  if (info.iteration < 0)
    return fail(fmt::format("--load {}: {} is corrupt (expected an iteration number in [0, {}])", marker,
                            kLatestMarker, kMaxCheckpointIteration));
  const std::string sub = dir + "/" + checkpoint_subdir(info.iteration);
  const std::string meta = sub + "/metadata.json";
  const std::optional<std::string> mj = read_file(meta);
  if (!mj)
    return fail(fmt::format("--load {}: the file is missing (the marker names iteration {})", meta, info.iteration));
  if (const std::optional<std::string> man = read_file(sub + "/" + kManifestFile))
    info.manifest_checksum = core::checksum_string(core::xxh64(man->data(), man->size()));
  if (required) {
    const CheckpointManifest m = read_manifest(sub, info.iteration);
    if (m.present)
      check_manifest_entry(m, meta, "metadata.json", mj->size(), core::checksum_string(core::xxh64(mj->data(), mj->size())));
  }
  try {
    const nlohmann::json j = core::parse_json(*mj);
    info.config = j.is_object() && j.contains("config") && j["config"].is_object() ? j["config"]
                                                                                    : nlohmann::json::object();
  } catch (const nlohmann::json::exception& e) {
    return fail(fmt::format("--load {}: corrupt metadata: {}", meta, e.what()));
  }
  return info;
}

int64_t parse_latest_marker(const std::string& text) {
  int64_t iteration = -1;
  try {
    size_t used = 0;
    iteration = std::stoll(text, &used);
    if (text.find_first_not_of(" \n\r\t", used) != std::string::npos) iteration = -1;
  } catch (const std::exception&) {
    iteration = -1;
  }
  return iteration < 0 || iteration > kMaxCheckpointIteration ? -1 : iteration;
}

const std::vector<std::string>& model_arg_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const ConfigKey& c : config_keys())
      if (c.model == ModelArg::shape) k.push_back(c.key);
    return k;
  }();
  return keys;
}

std::vector<std::string> apply_checkpoint_model_args(TrainConfig& c, const nlohmann::json& ckpt) {
  std::vector<std::string> changed;
  const nlohmann::json mine = to_json(c);
  for (const ModelArg role : {ModelArg::shape, ModelArg::taken})
    for (const ConfigKey& key : config_keys()) {
      const std::string k = key.key;
      if (key.model != role || !ckpt.contains(k) || ckpt[k] == mine[k]) continue;
      const nlohmann::json& v = ckpt[k];
      try {
        key.set(c, v);
      } catch (const nlohmann::json::exception&) {
        throw ConfigError(fmt::format("--use-checkpoint-args: the checkpoint's {} is {}, not a value of that flag",
                                      flag_of(k), v.dump()));
      }
      // (--padded-vocab-size not given: "" until the data are read, train/vocab_size.h)
      const bool unsized = k == "padded_vocab_size" && mine[k] == "";
      const std::string from = unsized ? "(padded from the vocabulary)" : mine[k].dump();
      changed.push_back(fmt::format("{} {} -> {}", flag_of(k), from, v.dump()));
    }
  if (ckpt.contains("num_experts") && ckpt["num_experts"].is_number_integer()) {
    // dense or MoE as the checkpoint's model: a dense GPT's block is its MLP of --ffn-hidden-size; an MoE block's
    // dense MLP is its shared expert (none in a checkpoint that does not record one)
    c.dense = ckpt["num_experts"].get<int64_t>() == 0;
    if (c.dense) {
      c.layer = c.layer.as_dense(c.dense_ffn_hidden_size > 0 ? c.dense_ffn_hidden_size : c.layer.ffn_hidden_size);
    } else {
      const auto& shared = ckpt.contains("moe_shared_expert_intermediate_size") ? ckpt["moe_shared_expert_intermediate_size"]
                                                                                : nlohmann::json(0);
      c.layer.mlp_ffn_hidden_size = shared.is_number_integer() ? shared.get<int64_t>() : 0;
    }
  }
  return changed;
}

std::vector<std::string> apply_checkpoint_schedule(TrainConfig& c, const nlohmann::json& ckpt) {
  nlohmann::json schedule = nlohmann::json::object();
  for (const char* k : {"lr", "min_lr", "lr_warmup_iters", "lr_decay_iters", "lr_decay_style", "weight_decay"})
    if (ckpt.contains(k)) schedule[k] = ckpt[k];
  // lr_decay_iters 0 is "over --train-iters": the checkpoint's run's length, whatever this run's is
  if (schedule.contains("lr_decay_iters") && schedule["lr_decay_iters"] == 0 && ckpt.contains("train_iters"))
    schedule["lr_decay_iters"] = ckpt["train_iters"];
  std::vector<std::string> changed;
  const nlohmann::json mine = to_json(c);
  for (const ConfigKey& key : config_keys()) {
    const std::string k = key.key;
    if (key.set == nullptr || !schedule.contains(k) || (mine.contains(k) && schedule[k] == mine[k])) continue;
    try {
      key.set(c, schedule[k]);
    } catch (const nlohmann::json::exception&) {
      throw ConfigError(fmt::format("--use-checkpoint-opt-param-scheduler: the checkpoint's {} is {}, not a value of "
                                    "that flag",
                                    flag_of(k), schedule[k].dump()));
    }
    changed.push_back(fmt::format("{} {} -> {}", flag_of(k), mine.contains(k) ? value_str(k, mine[k]) : "?",
                                  value_str(k, schedule[k])));
  }
  return changed;
}

std::vector<std::string> describe_resume_changes(const nlohmann::json& ckpt, const nlohmann::json& run) {
  std::vector<std::string> out;
  const auto& model = model_arg_keys();
  for (const auto& [key, value] : run.items()) {
    if (std::find(model.begin(), model.end(), key) != model.end()) continue;  // load_checkpoint refuses those
    if (!ckpt.contains(key) || ckpt[key] == value) continue;
    out.push_back(fmt::format("{} {} -> {}", flag_of(key), value_str(key, ckpt[key]), value_str(key, value)));
  }
  return out;
}

}  // namespace ampipe::train
