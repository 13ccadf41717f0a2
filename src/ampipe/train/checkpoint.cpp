#include "ampipe/train/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/ranges.h>

#include "ampipe/core/checksum.h"
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

std::string manifest_self_checksum(const nlohmann::json& manifest) {
  nlohmann::json j = manifest;
  j.erase("checksum");
  const std::string text = j.dump();
  return core::checksum_string(core::xxh64(text.data(), text.size()));
}

CheckpointManifest read_manifest(const std::string& sub, int64_t iteration) {
  CheckpointManifest m;
  const std::string path = sub + "/" + kManifestFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return m;
  const std::string text = read_text(path, kManifestFile);
  m.present = true;
  m.file_checksum = core::checksum_string(core::xxh64(text.data(), text.size()));
  nlohmann::json j;
  try {
    j = core::parse_json(text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("--load {}: corrupt manifest: {}", path, e.what()));
  }
  if (!j.is_object() || j.value("format", nlohmann::json()) != kManifestFormat)
    throw ConfigError(fmt::format("--load {}: not the manifest of an ampipe train checkpoint (\"format\" must be "
                                  "\"{}\")",
                                  path, kManifestFormat));
  const nlohmann::json recorded = j.value("checksum", nlohmann::json());
  const std::string found = manifest_self_checksum(j);
  if (!recorded.is_string() || recorded.get<std::string>() != found)
    throw ConfigError(fmt::format("--load {}: the manifest does not match its own checksum: expected {} (recorded), "
                                  "found {}: the manifest was edited or is corrupt",
                                  path, recorded.is_string() ? recorded.get<std::string>() : recorded.dump(), found));
  if (j.value("iteration", nlohmann::json()) != iteration)
    throw ConfigError(fmt::format("--load {}: the manifest says iteration {}, its directory and {} say {} (a "
                                  "manifest of another checkpoint)",
                                  path, j.value("iteration", nlohmann::json()).dump(), kLatestMarker, iteration));
  if (!j.contains("files") || !j["files"].is_object())
    throw ConfigError(fmt::format("--load {}: \"files\" (every file's size and checksum) is missing", path));
  m.files = j["files"];
  return m;
}

void check_manifest_entry(const CheckpointManifest& m, const std::string& path, const std::string& name,
                          uint64_t bytes, const std::string& checksum) {
  const nlohmann::json rec = m.files.contains(name) ? m.files[name] : nlohmann::json();
  if (!rec.is_object())
    throw ConfigError(fmt::format("--load {}: {} records no such file (expected an entry for {})", path,
                                  kManifestFile, name));
  const nlohmann::json want_bytes = rec.value("bytes", nlohmann::json()), want_sum = rec.value("xxh64", nlohmann::json());
  if (want_bytes != bytes || want_sum != checksum)
    throw ConfigError(fmt::format("--load {}: the file does not match {}: expected {} bytes, {}; found {} bytes, {} "
                                  "(changed after the save)",
                                  path, kManifestFile, want_bytes.dump(),
                                  want_sum.is_string() ? want_sum.get<std::string>() : want_sum.dump(), bytes, checksum));
}

std::vector<std::pair<std::string, Shape>> checkpoint_tensor_shapes(const TrainConfig& cfg) {
  const model::LayerConfig& l = cfg.layer;
  const int64_t V = cfg.padded_vocab_size, h = l.hidden_size;
  std::vector<std::pair<std::string, Shape>> out;
  out.push_back({"embedding.word_embeddings.weight", {V, h}});
  if (l.position_embedding == model::PositionEmbedding::learned_absolute)
    out.push_back({"embedding.position_embeddings.weight", {l.seq_length, h}});
  const std::vector<model::LayerConfig> layers = cfg.layer_configs();
  for (size_t i = 0; i < layers.size(); ++i) {
    for (const std::string& name : model::param_names(layers[i]))
      out.push_back({fmt::format("layers.{}.{}", i, name), model::full_shape(layers[i], name)});
    if (!layers[i].dense() && layers[i].moe_router_enable_expert_bias)  // GptModel::buffers
      out.push_back({fmt::format("layers.{}.moe.gate.expert_bias", i), {layers[i].num_experts}});
  }
  out.push_back({"final_layernorm.weight", {h}});
  if (!l.rmsnorm()) out.push_back({"final_layernorm.bias", {h}});
  if (cfg.untie_embeddings_and_output_weights) out.push_back({"output_layer.weight", {V, h}});
  return out;
}

namespace {

// The checkpoint flags (config keys) that shape the tensor `name`, for the error that names them.
std::vector<std::string> shaping_keys(const std::string& name) {
  const std::string p = name.starts_with("layers.") ? name.substr(name.find('.', 7) + 1) : name;
  if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight")
    return {"padded_vocab_size", "hidden_size"};
  if (name == "embedding.position_embeddings.weight") return {"seq_length", "hidden_size", "position_embedding_type"};
  if (p == "attn.qkv.weight") return {"hidden_size", "num_attention_heads", "num_query_groups"};
  if (p.starts_with("attn.q_layernorm") || p.starts_with("attn.k_layernorm"))
    return {"hidden_size", "num_attention_heads", "qk_layernorm"};
  if (p == "moe.gate.weight") return {"num_experts", "hidden_size"};
  if (p == "moe.gate.expert_bias") return {"num_experts", "moe_router_enable_expert_bias"};
  if (p.starts_with("moe.experts.")) return {"num_experts", "moe_ffn_hidden_size", "swiglu", "hidden_size"};
  if (p.starts_with("mlp."))
    return {"ffn_hidden_size", "moe_shared_expert_intermediate_size", "swiglu", "hidden_size", "moe_layer_freq",
            "first_k_dense_replace"};
  if (p == "attn.qkv.bias")
    return {"add_qkv_bias", "add_bias_linear", "hidden_size", "num_attention_heads", "num_query_groups"};
  if (p == "moe.experts.fc1.bias") return {"add_bias_linear", "num_experts", "moe_ffn_hidden_size", "swiglu"};
  if (p == "mlp.fc1.bias") return {"add_bias_linear", "ffn_hidden_size", "swiglu", "moe_layer_freq"};
  if (model::LayerParams::is_linear_bias(p)) return {"add_bias_linear", "hidden_size", "num_experts"};
  if (p.ends_with(".bias")) return {"normalization", "hidden_size"};
  return {"hidden_size"};
}

}  // namespace

void check_checkpoint_shapes(const std::string& model_path, const TrainConfig& cfg) {
  const nlohmann::json header = core::read_safetensors_header(model_path);
  const nlohmann::json flags = to_json(cfg);
  auto named_flags = [&](const std::string& tensor) {
    std::string out;
    for (const std::string& k : shaping_keys(tensor)) {
      if (!flags.contains(k)) continue;
      std::string f = "--" + k;
      std::replace(f.begin(), f.end(), '_', '-');
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ", f, flags[k].dump());
    }
    return out;
  };
  std::set<std::string> expected;
  for (const auto& [name, shape] : checkpoint_tensor_shapes(cfg)) {
    expected.insert(name);
    if (!header.contains(name))
      throw ConfigError(fmt::format("--use-checkpoint-args: --load {}: tensor {} is missing, but the model its "
                                    "metadata.json describes has it, shaped {} ({}): the metadata and the weights "
                                    "disagree",
                                    model_path, name, shape_str(shape), named_flags(name)));
    Shape got;
    try {
      got = header[name].at("shape").get<Shape>();
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("--load {}: bad entry for tensor '{}': {}", model_path, name, e.what()));
    }
    if (got != shape)
      throw ConfigError(fmt::format("--use-checkpoint-args: --load {}: tensor {} is {}, but the model its "
                                    "metadata.json describes needs {} ({}): the metadata and the weights disagree",
                                    model_path, name, shape_str(got), shape_str(shape), named_flags(name)));
  }
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__" || expected.count(name)) continue;
    std::string shape = "?";
    if (v.is_object() && v.contains("shape") && v["shape"].is_array()) {
      try {
        shape = shape_str(v["shape"].get<Shape>());
      } catch (const nlohmann::json::exception&) {
      }
    }
    // a layer beyond the model's: --num-layers (and the block pattern) first
    const std::string flags_of = name.starts_with("layers.")
                                     ? fmt::format("--num-layers {}, {}", cfg.num_layers, named_flags(name))
                                     : named_flags(name);
    throw ConfigError(fmt::format("--use-checkpoint-args: --load {}: tensor {} {} is not a tensor of the model its "
                                  "metadata.json describes ({}): the metadata and the weights disagree",
                                  model_path, name, shape, flags_of));
  }
}

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

void share_over_group(const comm::Group& g, core::TensorMap& m, const std::string& tag) {
  if (g.size() == 1) return;
  std::string mine;  // "name dim0,dim1,...\n" per tensor
  for (const auto& [name, t] : m) {
    AMPIPE_CHECK(t.dtype() == DType::f32 && name.find_first_of(" \n") == std::string::npos,
                 "share_over_group: tensor {} is not an fp32 tensor with a plain name", name);
    mine += name + " " + fmt::format("{}", fmt::join(t.shape(), ",")) + "\n";
  }
  const std::vector<std::string> all = comm::all_gather_strings(g, mine, tag + ".names");
  for (int q = 0; q < g.size(); ++q) {
    std::vector<comm::Event> evs;
    std::istringstream lines(all[size_t(q)]);
    std::string line;
    while (std::getline(lines, line)) {
      const size_t sp = line.find(' ');
      const std::string name = line.substr(0, sp);
      if (q == g.rank()) {
        for (int dst = 0; dst < g.size(); ++dst)
          if (dst != q) evs.push_back(comm::send(g, m.at(name), dst, tag + "." + name));
        continue;
      }
      Shape shape;
      std::istringstream dims(line.substr(sp + 1));
      for (std::string d; std::getline(dims, d, ',');) shape.push_back(std::stoll(d));
      AMPIPE_CHECK(!m.count(name), "share_over_group: tensor {} is held by two members", name);
      Tensor t = Tensor::empty(shape);
      m[name] = t;
      evs.push_back(comm::recv(g, t, q, tag + "." + name));
    }
    comm::wait_all(evs);
  }
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
  for (const auto& [name, t] : model.buffers()) model_map[name] = t;  // whole and the same on every rank
  share_over_group(groups.pp, model_map, "ckpt.pp.model");               // every pipeline stage's tensors
  share_over_group(groups.pp, opt_map, "ckpt.pp.optimizer");
  int64_t failed = 0;
  std::string why;
  if (groups.world.rank() == 0) {
    try {
      const std::string sub = dir + "/" + checkpoint_subdir(meta.iteration);
      std::error_code ec;
      fs::create_directories(sub, ec);
      if (ec) throw ConfigError(fmt::format("--save {}: cannot create {}: {}", dir, sub, ec.message()));
      // The tensor files say their checkpoint version: one of version 3 whose manifest was removed (and its
      // metadata.json relabelled version 2) is refused, not loaded unverified.
      const std::map<std::string, std::string> st_meta{{"format", kCheckpointFormat},
                                                       {"iteration", std::to_string(meta.iteration)},
                                                       {"checkpoint_version", std::to_string(kCheckpointVersion)}};
      const core::SafetensorsInfo mi = core::save_safetensors(sub + "/model.safetensors", model_map, st_meta);
      const core::SafetensorsInfo oi = core::save_safetensors(sub + "/optimizer.safetensors", opt_map, st_meta);
      // metadata.json, written after the tensor files, ties them to itself: their sizes and header checksums.
      nlohmann::json mj = meta.json;
      mj["version"] = kCheckpointVersion;
      mj["files"] = {{"model.safetensors", {{"bytes", mi.file_bytes}, {"header_checksum", mi.header_checksum}}},
                     {"optimizer.safetensors", {{"bytes", oi.file_bytes}, {"header_checksum", oi.header_checksum}}}};
      const std::string meta_text = mj.dump(2) + "\n";
      core::write_file_atomic(sub + "/metadata.json", meta_text);
      // manifest.json, written last of the iteration: every file's size and XXH64, and its own checksum.
      auto entry = [](uint64_t bytes, const std::string& sum) { return nlohmann::json{{"bytes", bytes}, {"xxh64", sum}}; };
      nlohmann::json man = {{"format", kManifestFormat},
                            {"iteration", meta.iteration},
                            {"files",
                             {{"model.safetensors", entry(mi.file_bytes, mi.file_checksum)},
                              {"optimizer.safetensors", entry(oi.file_bytes, oi.file_checksum)},
                              {"metadata.json",
                               entry(meta_text.size(),
                                     core::checksum_string(core::xxh64(meta_text.data(), meta_text.size())))}}}};
      man["checksum"] = manifest_self_checksum(man);
      core::write_file_atomic(sub + "/" + kManifestFile, man.dump(2) + "\n");
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
                             const nlohmann::json& meta, const std::string& meta_path,
                             const CheckpointManifest& manifest) {
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
  if (manifest.present) {
    check_manifest_entry(manifest, path, file, info.file_bytes, info.file_checksum);
  } else if (const auto v = st_meta.find("checkpoint_version"); v != st_meta.end() && v->second != "2") {
    throw ConfigError(fmt::format("--load {}/{}: the file is missing, but {} says checkpoint version {}, whose "
                                  "manifest records every file's checksum: the manifest was removed",
                                  fs::path(path).parent_path().string(), kManifestFile, path, v->second));
  }
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
  const std::string meta_text = read_text(meta_path, "metadata.json");
  try {
    meta.json = core::parse_json(meta_text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("--load {}: corrupt metadata: {}", meta_path, e.what()));
  }
  const nlohmann::json& mj = meta.json;
  if (!mj.is_object() || mj.value("format", nlohmann::json()) != kCheckpointFormat)
    throw ConfigError(fmt::format("--load {}: not the metadata of an ampipe train checkpoint (\"format\" must be "
                                  "\"{}\")",
                                  meta_path, kCheckpointFormat));
  const nlohmann::json version = mj.value("version", nlohmann::json());
  if (!version.is_number_integer() || version.get<int64_t>() < kOldestLoadableVersion ||
      version.get<int64_t>() > kCheckpointVersion)
    throw ConfigError(fmt::format("--load {}: checkpoint version {} cannot be loaded: this ampipe reads versions {} "
                                  "to {} (version 1 recorded no checksums, so its files cannot be verified)",
                                  meta_path, version.dump(), kOldestLoadableVersion, kCheckpointVersion));
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
  // Version 3: the manifest (verified against its own checksum) records metadata.json: an edited metadata.json is
  // refused here, before any of its settings is compared or used.
  const CheckpointManifest manifest = read_manifest(sub, iteration);
  if (!manifest.present && version.get<int64_t>() >= 3)
    throw ConfigError(fmt::format("--load {}/{}: the file is missing, but {} says checkpoint version {}, whose "
                                  "manifest records every file's checksum",
                                  sub, kManifestFile, meta_path, version.get<int64_t>()));
  if (manifest.present)
    check_manifest_entry(manifest, meta_path, "metadata.json", meta_text.size(),
                         core::checksum_string(core::xxh64(meta_text.data(), meta_text.size())));
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
  const core::TensorMap mm = load_checked(model_path, "model.safetensors", iteration, mj, meta_path, manifest);
  const core::TensorMap om = load_optim ? load_checked(opt_path, "optimizer.safetensors", iteration, mj, meta_path,
                                                       manifest)
                                        : core::TensorMap{};
  auto& params = model.params();
  for (size_t i = 0; i < params.size(); ++i) {
    NamedParam& p = params[i];
    take_shard(mm, p.name, p.param, p, cfg.layer, groups, model_path);
    if (!load_optim) continue;
    take_shard(om, "exp_avg." + p.name, opt.exp_avg(i), p, cfg.layer, groups, opt_path);
    take_shard(om, "exp_avg_sq." + p.name, opt.exp_avg_sq(i), p, cfg.layer, groups, opt_path);
  }
  for (auto& [name, t] : model.buffers()) {
    const auto it = mm.find(name);
    if (it == mm.end())
      throw ConfigError(fmt::format("--load {}: tensor {} is missing: the checkpoint was saved without "
                                    "--moe-router-enable-expert-bias, which this run has",
                                    model_path, name));
    if (it->second.shape() != t.shape() || it->second.dtype() != t.dtype())
      throw ConfigError(fmt::format("--load {}: tensor {} is {}, this run's is {} fp32", model_path, name,
                                    shape_str(it->second.shape()), shape_str(t.shape())));
    std::memcpy(t.raw(), it->second.raw(), t.nbytes());
  }
  return meta;
}

}  // namespace ampipe::train
