#include "ampipe/train/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampipe/core/json.h"
#include "ampipe/comm/collectives.h"
#include "ampipe/core/error.h"
#include "ampipe/core/safetensors.h"
#include "ampipe/train/checkpoint_args.h"

namespace ampipe::train {

namespace fs = std::filesystem;

std::string checkpoint_subdir(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

Tensor full_layer_tensor(const Tensor& local, const std::string& name, const model::LayerConfig& cfg,
                         const comm::Groups& g, const std::string& tag) {
  const bool expert = model::LayerParams::is_expert(name);
  Tensor t = local;
  if (cfg.tp() > 1 && model::tp_split(cfg, name).dim >= 0) {  // the tp shards joined into this EP rank's tensor
    Tensor all = Tensor::empty({int64_t(g.tp.size()) * local.numel()});
    comm::all_gather_sync(g.tp, local.view({local.numel()}), all, tag + ".tp");
    Shape whole = model::full_shape(cfg, name);
    if (expert) whole[0] = cfg.local_experts();
    t = model::tp_join(cfg, name, all, whole);
  }
  if (!expert || g.ep.size() == 1) return t;
  Shape full = t.shape();
  full[0] *= g.ep.size();
  Tensor all = Tensor::empty(full);
  comm::all_gather_sync(g.ep, t, all, tag);
  return all;
}

Tensor full_tensor(const Tensor& local, const NamedParam& p, const model::LayerConfig& cfg, const comm::Groups& g,
                   const std::string& tag) {
  // Only layer parameters are split (the embeddings, final LayerNorm and LM head are whole on every rank).
  return p.layer_param.empty() ? local : full_layer_tensor(local, p.layer_param, p.shaped_by(cfg), g, tag);
}

namespace {

// This rank's part of a full tensor read from `path`, checked against the full shape: the EP rows of an expert
// tensor, then the tp shard of a tensor cut over tp.
void take_shard(const core::TensorMap& m, const std::string& key, Tensor& local, const NamedParam& p,
                const model::LayerConfig& model_cfg, const comm::Groups& g, const std::string& path) {
  const model::LayerConfig& cfg = p.shaped_by(model_cfg);
  auto it = m.find(key);
  if (it == m.end()) throw ConfigError(fmt::format("--load {}: tensor {} is missing", path, key));
  const Tensor& full = it->second;
  const Shape want = p.layer_param.empty() ? local.shape() : model::full_shape(cfg, p.layer_param);
  if (full.shape() != want || full.dtype() != DType::f32)
    throw ConfigError(fmt::format("--load {}: tensor {} is {} {}, this run needs f32 {}", path, key,
                                  dtype_name(full.dtype()), shape_str(full.shape()), shape_str(want)));
  Tensor mine = full;
  if (p.expert) {
    const int64_t L = cfg.local_experts();
    mine = full.rows(g.ep.rank() * L, (g.ep.rank() + 1) * L);
  }
  if (p.tp_sharded(cfg)) mine = model::tp_take(cfg, p.layer_param, mine.clone(), g.tp.rank());
  local.copy_from(mine);
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
    model_map[p.name] = full_tensor(p.param, p, cfg.layer, groups, "ckpt." + p.name);
    opt_map["exp_avg." + p.name] = full_tensor(opt.exp_avg(i), p, cfg.layer, groups, "ckpt.m." + p.name);
    opt_map["exp_avg_sq." + p.name] = full_tensor(opt.exp_avg_sq(i), p, cfg.layer, groups, "ckpt.v." + p.name);
  }
  int64_t failed = 0;
  std::string why;
  if (groups.world.rank() == 0) {
    try {
      const std::string sub = dir + "/" + checkpoint_subdir(meta.iteration);
      std::error_code ec;
      fs::create_directories(sub, ec);
      if (ec) throw ConfigError(fmt::format("--save {}: cannot create {}: {}", dir, sub, ec.message()));
      const std::map<std::string, std::string> st_meta{{"format", kCheckpointFormat},
                                                       {"iteration", std::to_string(meta.iteration)}};
      const core::SafetensorsInfo mi = core::save_safetensors(sub + "/model.safetensors", model_map, st_meta);
      const core::SafetensorsInfo oi = core::save_safetensors(sub + "/optimizer.safetensors", opt_map, st_meta);
      // metadata.json, written after the tensor files, ties them to itself: their sizes and header checksums.
      nlohmann::json mj = meta.json;
      mj["version"] = kCheckpointVersion;
      mj["files"] = {{"model.safetensors", {{"bytes", mi.file_bytes}, {"header_checksum", mi.header_checksum}}},
                     {"optimizer.safetensors", {{"bytes", oi.file_bytes}, {"header_checksum", oi.header_checksum}}}};
      core::write_file_atomic(sub + "/metadata.json", mj.dump(2) + "\n");
      if (!opts.skip_marker) core::write_file_atomic(dir + "/" + kLatestMarker, std::to_string(meta.iteration) + "\n");
    } catch (const ConfigError& e) {
      failed = 1;
      why = e.what();
    }
  }
  if (comm::all_reduce_max(groups.world, failed, "ckpt.saved") != 0)
    throw ConfigError(why.empty() ? fmt::format("--save {}: rank 0 failed to write the checkpoint", dir) : why);
}

namespace {

// An integer field of metadata.json in [lo, hi], or one ConfigError naming the file, the field and the rule.
int64_t meta_int(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi, const std::string& path,
                 const std::string& rule) {
  if (!j.contains(key)) throw ConfigError(fmt::format("--load {}: \"{}\" is missing", path, key));
  const nlohmann::json& v = j[key];
  if (!v.is_number_integer())
    throw ConfigError(fmt::format("--load {}: \"{}\" is {}, not an integer", path, key, v.dump()));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    throw ConfigError(fmt::format("--load {}: \"{}\" {} is out of range: {}", path, key, v.dump(), rule));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) throw ConfigError(fmt::format("--load {}: \"{}\" {} is out of range: {}", path, key, x, rule));
  return x;
}

// The first element of `t` that is not finite (or, for the second moments, negative), as a message; "" when none.
std::string first_bad_value(const Tensor& t, bool non_negative) {
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  // Fast path: one branch-free pass over the bits (an all-ones exponent is an infinity or a NaN; a set sign bit with
  // a non-zero magnitude is a negative number, -0 is not).
  uint32_t non_finite = 0, negative = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, p + i, 4);
    non_finite |= uint32_t((b & 0x7f800000u) == 0x7f800000u);
    negative |= uint32_t(b > 0x80000000u);
  }
  if (!non_finite && (!non_negative || !negative)) return "";
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]) || (non_negative && p[i] < 0))
      return fmt::format("element {} is {}", i, p[i]);
  return "";
}

// Reads one tensor file of the checkpoint and checks that it is the one metadata.json recorded (size and header
// checksum), that it says the marker's iteration, and that every value is finite.
core::TensorMap load_checked(const std::string& path, const std::string& file, int64_t iteration,
                             const nlohmann::json& meta, const std::string& meta_path) {
  std::map<std::string, std::string> st_meta;
  core::SafetensorsInfo info;
  core::TensorMap m;
  try {
    m = core::load_safetensors(path, {.require_checksums = true}, &st_meta, &info);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("--load {}", e.what()));  // "--load <path>: <what is wrong>"
  }
  const auto it = st_meta.find("iteration");
  if (it == st_meta.end() || it->second != std::to_string(iteration))
    throw ConfigError(fmt::format("--load {}: the file says iteration {}, its directory and {} say {} (a file of "
                                  "another checkpoint)",
                                  path, it == st_meta.end() ? "(none)" : it->second, kLatestMarker, iteration));
  const nlohmann::json& files = meta["files"];  // an object (load_checkpoint checked)
  const nlohmann::json rec = files.contains(file) ? files[file] : nlohmann::json();
  if (!rec.is_object() || rec.value("bytes", nlohmann::json()) != info.file_bytes ||
      rec.value("header_checksum", nlohmann::json()) != info.header_checksum)
    throw ConfigError(fmt::format("--load {}: the file is not the one {} recorded at save ({} bytes, header {}; "
                                  "recorded {}): replaced or rewritten after the save",
                                  path, meta_path, info.file_bytes, info.header_checksum, rec.dump()));
  const bool optimizer = file == "optimizer.safetensors";
  for (const auto& [name, t] : m) {
    if (t.dtype() != DType::f32) continue;  // take_shard refuses it, naming the tensor
    const std::string bad = first_bad_value(t, optimizer && name.rfind("exp_avg_sq.", 0) == 0);
    if (!bad.empty())
      throw ConfigError(fmt::format("--load {}: tensor {}: {}; a checkpoint must hold finite values{}", path, name,
                                    bad, optimizer ? " (and second moments >= 0)" : ""));
  }
  return m;
}

}  // namespace

CheckpointMeta load_checkpoint(const std::string& dir, const TrainConfig& cfg, GptModel& model, AdamW& opt,
                               const comm::Groups& groups, bool load_optim) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw ConfigError(fmt::format("--load {}: {}", dir,
                                  fs::exists(dir, ec) ? "not a directory: --load names a checkpoint directory"
                                                      : "the directory does not exist"));
  const std::string marker = dir + "/" + kLatestMarker;
  if (!fs::exists(marker, ec))
    throw ConfigError(fmt::format("--load {}: no checkpoint there ({} is missing)", dir, kLatestMarker));
  const std::string mtext = read_text(marker, kLatestMarker);
  const int64_t iteration = parse_latest_marker(mtext);
  if (iteration < 0)
    throw ConfigError(fmt::format("--load {}: {} is corrupt (expected an iteration number in [0, {}])", marker,
                                  kLatestMarker, kMaxCheckpointIteration));
  const std::string sub = dir + "/" + checkpoint_subdir(iteration);
  CheckpointMeta meta;
  const std::string meta_path = sub + "/metadata.json";
  if (!fs::exists(meta_path, ec))
    throw ConfigError(fmt::format("--load {}: the file is missing (the marker names iteration {})", meta_path,
                                  iteration));
  try {
    meta.json = core::parse_json(read_text(meta_path, "metadata.json"));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("--load {}: corrupt metadata: {}", meta_path, e.what()));
  }
  const nlohmann::json& mj = meta.json;
  if (!mj.is_object() || mj.value("format", nlohmann::json()) != kCheckpointFormat)
    throw ConfigError(fmt::format("--load {}: not the metadata of an ampipe train checkpoint (\"format\" must be "
                                  "\"{}\")",
                                  meta_path, kCheckpointFormat));
  if (mj.value("version", nlohmann::json()) != kCheckpointVersion)
    throw ConfigError(fmt::format("--load {}: checkpoint version {} cannot be loaded: this ampipe reads version {} "
                                  "(version 1 recorded no checksums, so its files cannot be verified)",
                                  meta_path, mj.value("version", nlohmann::json()).dump(), kCheckpointVersion));
  // The values the run continues from, each in the range a real run can produce. Every iteration consumes at least
  // one sample, and sample indices times s (the global token index that keys the random numbers) stay below 2^62.
  const int64_t s = std::max<int64_t>(1, cfg.layer.seq_length);
  meta.iteration = meta_int(mj, "iteration", iteration, iteration, meta_path,
                            fmt::format("it must equal the iteration of its directory and of {}, {}", kLatestMarker,
                                        iteration));
  const int64_t max_samples = (int64_t(1) << 62) / s;
  meta.consumed_samples = meta_int(mj, "consumed_samples", iteration, max_samples, meta_path,
                                   fmt::format("it must be in [iteration {}, 2^62 / --seq-length {} = {}] (every "
                                               "iteration consumes at least one sample)",
                                               iteration, s, max_samples));
  if (mj.contains("data") && mj["data"].is_object() && mj["data"].contains("consumed_samples") &&
      mj["data"]["consumed_samples"] != meta.consumed_samples)
    throw ConfigError(fmt::format("--load {}: \"data\".\"consumed_samples\" {} differs from \"consumed_samples\" {}",
                                  meta_path, mj["data"]["consumed_samples"].dump(), meta.consumed_samples));
  const int64_t steps = meta_int(mj, "optimizer_steps", 0, iteration, meta_path,
                                 fmt::format("it must be in [0, iteration {}]", iteration));
  if (load_optim) opt.set_steps(steps);
  if (!mj.contains("files") || !mj["files"].is_object())
    throw ConfigError(fmt::format("--load {}: \"files\" (the sizes and header checksums of the tensor files) is "
                                  "missing",
                                  meta_path));
  // The model must have the same shape; the split (degree, EP size, ranks) may differ.
  const nlohmann::json mine = to_json(cfg);
  const nlohmann::json theirs =
      mj.contains("config") && mj["config"].is_object() ? mj["config"] : nlohmann::json::object();
  for (const std::string& key : model_arg_keys()) {
    // A checkpoint of an ampipe before padded_vocab_size (qk_layernorm) was recorded: its tensors' shapes (names)
    // say it (take_shard).
    if ((key == "padded_vocab_size" || key == "qk_layernorm") && !theirs.contains(key)) continue;
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
  const core::TensorMap mm = load_checked(model_path, "model.safetensors", iteration, mj, meta_path);
  const core::TensorMap om =
      load_optim ? load_checked(opt_path, "optimizer.safetensors", iteration, mj, meta_path) : core::TensorMap{};
  auto& params = model.params();
  for (size_t i = 0; i < params.size(); ++i) {
    NamedParam& p = params[i];
    take_shard(mm, p.name, p.param, p, cfg.layer, groups, model_path);
    if (!load_optim) continue;
    take_shard(om, "exp_avg." + p.name, opt.exp_avg(i), p, cfg.layer, groups, opt_path);
    take_shard(om, "exp_avg_sq." + p.name, opt.exp_avg_sq(i), p, cfg.layer, groups, opt_path);
  }
  return meta;
}

}  // namespace ampipe::train
