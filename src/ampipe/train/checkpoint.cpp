#include "ampipe/train/checkpoint.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampipe/comm/collectives.h"
#include "ampipe/core/error.h"
#include "ampipe/core/safetensors.h"

namespace ampipe::train {

namespace fs = std::filesystem;

std::string checkpoint_subdir(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

namespace {

// Full tensor of a parameter-shaped local tensor: expert tensors all-gathered over EP (dim 0), others as is.
Tensor full_tensor(const Tensor& local, bool expert, const comm::Groups& g, const std::string& tag) {
  if (!expert || g.ep.size() == 1) return local;
  Shape full = local.shape();
  full[0] *= g.ep.size();
  Tensor all = Tensor::empty(full);
  comm::all_gather_sync(g.ep, local, all, tag);
  return all;
}

// This rank's rows of a full tensor read from `path`, checked against the local shape.
void take_shard(const core::TensorMap& m, const std::string& key, Tensor& local, bool expert, const comm::Groups& g,
                const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) throw ConfigError(fmt::format("--load {}: tensor {} is missing", path, key));
  const Tensor& full = it->second;
  Shape want = local.shape();
  if (expert) want[0] *= g.ep.size();
  if (full.shape() != want || full.dtype() != DType::f32)
    throw ConfigError(fmt::format("--load {}: tensor {} is {} {}, this run needs f32 {}", path, key,
                                  dtype_name(full.dtype()), shape_str(full.shape()), shape_str(want)));
  if (expert) {
    const int64_t L = local.size(0);
    local.copy_from(full.rows(g.ep.rank() * L, (g.ep.rank() + 1) * L));
  } else {
    local.copy_from(full);
  }
}

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("--load {}: {} cannot be read ({})", path, what, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

void check_writable_dir(const std::string& flag, const std::string& dir, const comm::Group& world) {
  int64_t bad = 0;
  std::string why;
  if (world.rank() == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string probe = dir + "/.ampipe-write-test";
    std::ofstream out(probe);
    if (ec || !out) {
      bad = 1;
      why = ec ? ec.message() : std::strerror(errno);
    } else {
      out.close();
      fs::remove(probe, ec);
    }
  }
  if (comm::all_reduce_max(world, bad, "writable_dir_check") != 0)
    throw ConfigError(fmt::format("{} {}: the directory cannot be created or written{}{}", flag, dir,
                                  why.empty() ? "" : ": ", why));
}

void save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const TrainConfig& cfg, GptModel& model,
                     AdamW& opt, const comm::Groups& groups, const SaveOptions& opts) {
  core::TensorMap model_map, opt_map;
  auto& params = model.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const NamedParam& p = params[i];
    model_map[p.name] = full_tensor(p.param, p.expert, groups, "ckpt." + p.name);
    opt_map["exp_avg." + p.name] = full_tensor(opt.exp_avg(i), p.expert, groups, "ckpt.m." + p.name);
    opt_map["exp_avg_sq." + p.name] = full_tensor(opt.exp_avg_sq(i), p.expert, groups, "ckpt.v." + p.name);
  }
  int64_t failed = 0;
  std::string why;
  if (groups.world.rank() == 0) {
    try {
      const std::string sub = dir + "/" + checkpoint_subdir(meta.iteration);
      std::error_code ec;
      fs::create_directories(sub, ec);
      if (ec) throw ConfigError(fmt::format("--save {}: cannot create {}: {}", dir, sub, ec.message()));
      const std::map<std::string, std::string> st_meta{{"format", "ampipe train checkpoint"},
                                                       {"iteration", std::to_string(meta.iteration)}};
      core::save_safetensors(sub + "/model.safetensors", model_map, st_meta);
      core::save_safetensors(sub + "/optimizer.safetensors", opt_map, st_meta);
      core::write_file_atomic(sub + "/metadata.json", meta.json.dump(2) + "\n");
      if (!opts.skip_marker) core::write_file_atomic(dir + "/" + kLatestMarker, std::to_string(meta.iteration) + "\n");
    } catch (const ConfigError& e) {
      failed = 1;
      why = e.what();
    }
  }
  if (comm::all_reduce_max(groups.world, failed, "ckpt.saved") != 0)
    throw ConfigError(why.empty() ? fmt::format("--save {}: rank 0 failed to write the checkpoint", dir) : why);
}

CheckpointMeta load_checkpoint(const std::string& dir, const TrainConfig& cfg, GptModel& model, AdamW& opt,
                               const comm::Groups& groups, bool load_optim) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw ConfigError(fmt::format("--load {}: the directory does not exist", dir));
  const std::string marker = dir + "/" + kLatestMarker;
  if (!fs::exists(marker, ec))
    throw ConfigError(fmt::format("--load {}: no checkpoint there ({} is missing)", dir, kLatestMarker));
  const std::string mtext = read_text(marker, kLatestMarker);
  int64_t iteration = -1;
  try {
    size_t pos = 0;
    iteration = std::stoll(mtext, &pos);
    if (mtext.find_first_not_of(" \n\r\t", pos) != std::string::npos || iteration < 0) iteration = -1;
  } catch (const std::exception&) {
    iteration = -1;
  }
  if (iteration < 0)
    throw ConfigError(fmt::format("--load {}: {} is corrupt (expected an iteration number)", marker, kLatestMarker));
  const std::string sub = dir + "/" + checkpoint_subdir(iteration);
  CheckpointMeta meta;
  const std::string meta_path = sub + "/metadata.json";
  if (!fs::exists(meta_path, ec))
    throw ConfigError(fmt::format("--load {}: the file is missing (the marker names iteration {})", meta_path,
                                  iteration));
  try {
    meta.json = nlohmann::json::parse(read_text(meta_path, "metadata.json"));
    meta.iteration = meta.json.at("iteration").get<int64_t>();
    meta.consumed_samples = meta.json.at("consumed_samples").get<int64_t>();
    if (load_optim) opt.set_steps(meta.json.at("optimizer_steps").get<int64_t>());
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("--load {}: corrupt metadata: {}", meta_path, e.what()));
  }
  if (meta.iteration != iteration)
    throw ConfigError(fmt::format("--load {}: metadata says iteration {}, the marker {}", meta_path, meta.iteration,
                                  iteration));
  // The model must have the same shape; the split (degree, EP size, ranks) may differ.
  const nlohmann::json mine = to_json(cfg);
  const nlohmann::json& theirs = meta.json.contains("config") ? meta.json["config"] : nlohmann::json::object();
  for (const char* key : {"num_layers", "seq_length", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                          "num_experts", "swiglu", "untie_embeddings_and_output_weights"}) {
    if (!theirs.contains(key) || theirs[key] != mine[key]) {
      std::string flag = std::string("--") + key;
      for (char& c : flag)
        if (c == '_') c = '-';
      throw ConfigError(fmt::format("--load {}: the checkpoint has {} {}, this run has {} {}", dir, flag,
                                    theirs.contains(key) ? theirs[key].dump() : "(none)", flag, mine[key].dump()));
    }
  }
  const std::string model_path = sub + "/model.safetensors", opt_path = sub + "/optimizer.safetensors";
  for (const std::string& p : {model_path, opt_path})
    if ((load_optim || p == model_path) && !fs::exists(p, ec))
      throw ConfigError(fmt::format("--load {}: the file is missing (the marker names iteration {})", p, iteration));
  const core::TensorMap mm = core::load_safetensors(model_path);
  const core::TensorMap om = load_optim ? core::load_safetensors(opt_path) : core::TensorMap{};
  auto& params = model.params();
  for (size_t i = 0; i < params.size(); ++i) {
    NamedParam& p = params[i];
    take_shard(mm, p.name, p.param, p.expert, groups, model_path);
    if (!load_optim) continue;
    take_shard(om, "exp_avg." + p.name, opt.exp_avg(i), p.expert, groups, opt_path);
    take_shard(om, "exp_avg_sq." + p.name, opt.exp_avg_sq(i), p.expert, groups, opt_path);
  }
  return meta;
}

}  // namespace ampipe::train
