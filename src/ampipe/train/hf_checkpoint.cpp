#include "ampipe/train/hf_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/core/json.h"
#include "ampipe/core/safetensors.h"
#include "ampipe/train/adamw.h"
#include "ampipe/train/checkpoint.h"
#include "ampipe/train/checkpoint_args.h"
#include "ampipe/train/gpt_model.h"
#include "ampipe/train/vocab_size.h"

namespace ampipe::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

enum class Arch { mixtral, qwen3_moe };
constexpr const char* kMixtral = "MixtralForCausalLM";
constexpr const char* kQwen3Moe = "Qwen3MoeForCausalLM";
const char* arch_name(Arch a) { return a == Arch::mixtral ? kMixtral : kQwen3Moe; }

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(fmt::format("{}: {} cannot be read (a Hugging Face model directory holds it)", path, what));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json_file(const std::string& path) {
  try {
    json j = core::parse_json(read_file(path, fs::path(path).filename().string()));
    if (!j.is_object()) throw ConfigError(fmt::format("{}: not a JSON object", path));
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

// config.json's keys, each named with the file in its error.
struct HfConfig {
  json j;
  std::string path;

  const json& need(const std::string& key) const {
    if (!j.contains(key) || j[key].is_null())
      throw ConfigError(fmt::format("{}: key \"{}\" is missing", path, key));
    return j[key];
  }
  int64_t integer(const std::string& key) const {
    const json& v = need(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      throw ConfigError(fmt::format("{}: \"{}\" is {}: it must be a positive integer", path, key, v.dump()));
    return v.get<int64_t>();
  }
  double number(const std::string& key, double fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number())
      throw ConfigError(fmt::format("{}: \"{}\" is {}: it must be a number", path, key, j[key].dump()));
    return j[key].get<double>();
  }
  bool flag(const std::string& key, bool fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean())
      throw ConfigError(fmt::format("{}: \"{}\" is {}: it must be true or false", path, key, j[key].dump()));
    return j[key].get<bool>();
  }
  // A key ampipe can only run with one value (absent or null counts as `ok` when null_ok).
  void require(const std::string& key, const json& ok, const std::string& rule, bool null_ok = true) const {
    if (!j.contains(key) || (null_ok && j[key].is_null())) return;
    if (j[key] != ok) throw ConfigError(fmt::format("{}: \"{}\" is {}: {}", path, key, j[key].dump(), rule));
  }
};

Arch arch_of(const HfConfig& hc) {
  const json& a = hc.need("architectures");
  if (!a.is_array() || a.size() != 1 || !a[0].is_string())
    throw ConfigError(fmt::format("{}: \"architectures\" is {}: it must name one model ({} or {})", hc.path, a.dump(),
                                  kMixtral, kQwen3Moe));
  const std::string name = a[0].get<std::string>();
  if (name == kMixtral) return Arch::mixtral;
  if (name == kQwen3Moe) return Arch::qwen3_moe;
  throw ConfigError(fmt::format("{}: \"architectures\" is [\"{}\"]: ampipe convert reads {} and {} only", hc.path, name,
                                kMixtral, kQwen3Moe));
}

// The values of config.json that ampipe's model cannot express: one line each, naming the key and the value.
void refuse_unsupported(const HfConfig& hc) {
  hc.require("hidden_act", "silu", "the experts here are SwiGLU (SiLU gate), so it must be \"silu\"");
  hc.require("rope_scaling", json(), "RoPE scaling of Hugging Face's kinds is not converted (it must be null)");
  hc.require("sliding_window", json(), "sliding-window attention is not implemented (it must be null)");
  hc.require("use_sliding_window", false, "sliding-window attention is not implemented (it must be false)");
  hc.require("attention_bias", false, "the attention here has no biases (it must be false)");
  hc.require("mlp_bias", false, "the experts here have no biases (it must be false)");
  hc.require("router_jitter_noise", 0.0, "Megatron-Core's router here has no jitter (it must be 0)");
  hc.require("decoder_sparse_step", 1, "every layer here is an MoE layer (it must be 1)");
  hc.require("mlp_only_layers", json::array(), "every layer here is an MoE layer (it must be [])");
  for (const char* key : {"torch_dtype", "dtype"})  // transformers 5 writes "dtype"
    if (hc.j.contains(key) && hc.j[key] == "float16")
      throw ConfigError(
          fmt::format("{}: \"{}\" is \"float16\": ampipe converts float32 and bfloat16 tensors", hc.path, key));
  if (hc.j.contains("layer_types") && hc.j["layer_types"].is_array())
    for (const json& t : hc.j["layer_types"])
      if (t != "full_attention")
        throw ConfigError(fmt::format("{}: \"layer_types\" holds {}: every layer here has full attention", hc.path,
                                      t.dump()));
  if (hc.j.contains("rope_parameters") && hc.j["rope_parameters"].is_object()) {  // transformers 5's RoPE keys
    const json& rp = hc.j["rope_parameters"];
    if (rp.contains("rope_type") && rp["rope_type"] != "default")
      throw ConfigError(fmt::format("{}: \"rope_parameters\".\"rope_type\" is {}: RoPE scaling of Hugging Face's kinds "
                                    "is not converted (it must be \"default\")",
                                    hc.path, rp["rope_type"].dump()));
  }
  if (hc.j.contains("head_dim") && !hc.j["head_dim"].is_null() &&
      hc.j["head_dim"] != hc.integer("hidden_size") / hc.integer("num_attention_heads"))
    throw ConfigError(fmt::format("{}: \"head_dim\" is {}: the head dim here is hidden_size / num_attention_heads = {}",
                                  hc.path, hc.j["head_dim"].dump(),
                                  hc.integer("hidden_size") / hc.integer("num_attention_heads")));
}

// The ampipe training configuration of a Hugging Face model (docs/training.md, "Converting").
TrainConfig config_from_hf(const HfConfig& hc, Arch arch, const HfConvertOptions& opts) {
  TrainConfig c;
  model::LayerConfig& l = c.layer;
  c.num_layers = int(hc.integer("num_hidden_layers"));
  l.hidden_size = hc.integer("hidden_size");
  l.num_attention_heads = hc.integer("num_attention_heads");
  if (l.hidden_size % l.num_attention_heads != 0)
    throw ConfigError(fmt::format("{}: \"hidden_size\" {} is not divisible by \"num_attention_heads\" {}", hc.path,
                                  l.hidden_size, l.num_attention_heads));
  const int64_t kv = hc.j.contains("num_key_value_heads") ? hc.integer("num_key_value_heads") : l.num_attention_heads;
  if (l.num_attention_heads % kv != 0)
    throw ConfigError(fmt::format("{}: \"num_key_value_heads\" {} does not divide \"num_attention_heads\" {}", hc.path,
                                  kv, l.num_attention_heads));
  if (kv != l.num_attention_heads) l.num_query_groups = kv;
  l.ffn_hidden_size = hc.integer(arch == Arch::mixtral ? "intermediate_size" : "moe_intermediate_size");
  l.num_experts = hc.integer(arch == Arch::mixtral ? "num_local_experts" : "num_experts");
  l.moe_router_topk = int(hc.integer("num_experts_per_tok"));
  l.moe_router = model::Router::megatron;
  // Mixtral renormalises the top-k softmax weights; Qwen3-MoE only with norm_topk_prob (else the probabilities
  // themselves: Megatron's pre-softmax). Megatron's softmax over the chosen logits is that renormalisation.
  l.moe_router_pre_softmax = arch == Arch::qwen3_moe && !hc.flag("norm_topk_prob", false);
  l.expert = model::ExpertKind::swiglu;
  l.normalization = model::Normalization::rmsnorm;
  l.layernorm_epsilon = float(hc.number("rms_norm_eps", 1e-6));
  l.position_embedding = model::PositionEmbedding::rope;
  l.rotary_base = hc.number("rope_theta", 10000.0);
  if (!hc.j.contains("rope_theta") && hc.j.contains("rope_parameters") && hc.j["rope_parameters"].is_object() &&
      hc.j["rope_parameters"].contains("rope_theta") && hc.j["rope_parameters"]["rope_theta"].is_number())
    l.rotary_base = hc.j["rope_parameters"]["rope_theta"].get<double>();
  if (l.rotary_base != std::floor(l.rotary_base) || l.rotary_base < 1)
    throw ConfigError(fmt::format("{}: \"rope_theta\" is {}: --rotary-base here is a positive integer", hc.path,
                                  hc.j["rope_theta"].dump()));
  l.qk_layernorm = arch == Arch::qwen3_moe;
  l.attention_dropout = hc.number("attention_dropout", 0.0);
  l.init_method_std = hc.number("initializer_range", 0.02);
  c.moe_aux_loss_coeff = hc.number("router_aux_loss_coef", c.moe_aux_loss_coeff);
  c.untie_embeddings_and_output_weights = !hc.flag("tie_word_embeddings", false);
  const int64_t positions = hc.j.contains("max_position_embeddings") ? hc.integer("max_position_embeddings") : 4096;
  l.seq_length = opts.seq_length > 0 ? opts.seq_length : std::min<int64_t>(positions, 4096);
  c.max_position_embeddings = std::max(positions, l.seq_length);
  c.vocab_size = hc.integer("vocab_size");
  c.make_vocab_size_divisible_by = opts.make_vocab_size_divisible_by;
  c.padded_vocab_size = pad_vocab_size(c.vocab_size, c.make_vocab_size_divisible_by, 1);
  c.global_batch_size = l.micro_batch_size;
  return c;
}

// ------------------------------------------------------------------------------------------- tensor names

// The Hugging Face names of layer i's tensors.
struct HfLayerNames {
  std::string ln1, q, k, v, o, q_norm, k_norm, ln2, gate;
  std::string expert(int64_t e, int which) const {  // which: 1 the SiLU branch, 3 the linear one, 2 the down-projection
    static const char* const kMixtral[] = {"", "w1", "w2", "w3"};
    static const char* const kQwen[] = {"", "gate_proj", "down_proj", "up_proj"};
    return fmt::format("{}.experts.{}.{}.weight", moe, e, (mixtral ? kMixtral : kQwen)[which]);
  }
  std::string moe;
  bool mixtral = true;
};
HfLayerNames hf_layer_names(Arch arch, int i) {
  const std::string p = fmt::format("model.layers.{}.", i);
  HfLayerNames n;
  n.mixtral = arch == Arch::mixtral;
  n.ln1 = p + "input_layernorm.weight";
  n.q = p + "self_attn.q_proj.weight";
  n.k = p + "self_attn.k_proj.weight";
  n.v = p + "self_attn.v_proj.weight";
  n.o = p + "self_attn.o_proj.weight";
  n.q_norm = p + "self_attn.q_norm.weight";
  n.k_norm = p + "self_attn.k_norm.weight";
  n.ln2 = p + "post_attention_layernorm.weight";
  n.moe = p + (n.mixtral ? "block_sparse_moe" : "mlp");
  n.gate = n.moe + ".gate.weight";
  return n;
}

// ------------------------------------------------------------------------------------------ HF -> ampipe

// Every tensor of the directory, from model.safetensors or the shards model.safetensors.index.json names.
struct HfTensors {
  core::TensorMap map;
  std::map<std::string, std::string> file;  // the file each tensor came from (for the error lines)
  std::set<std::string> used;
  std::string dtype;  // "F32" or "BF16": every tensor's

  Tensor take(const std::string& name, const Shape& want) {
    auto it = map.find(name);
    if (it == map.end())
      throw ConfigError(fmt::format("{}: tensor {} is missing (the config.json model needs it)",
                                    file.empty() ? std::string("model.safetensors") : file.begin()->second, name));
    if (it->second.shape() != want)
      throw ConfigError(fmt::format("{}: tensor {} is {}, config.json's model needs {}", file[name], name,
                                    shape_str(it->second.shape()), shape_str(want)));
    used.insert(name);
    return it->second;
  }
};

HfTensors read_hf_tensors(const std::string& dir) {
  HfTensors t;
  std::vector<std::string> files;
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (fs::exists(single)) {
    files.push_back("model.safetensors");
  } else if (fs::exists(index)) {
    const json ij = read_json_file(index);
    if (!ij.contains("weight_map") || !ij["weight_map"].is_object())
      throw ConfigError(fmt::format("{}: \"weight_map\" is missing or not an object", index));
    std::set<std::string> seen;
    for (const auto& [name, f] : ij["weight_map"].items()) {
      if (!f.is_string()) throw ConfigError(fmt::format("{}: \"weight_map\".\"{}\" is not a file name", index, name));
      const std::string fn = f.get<std::string>();
      if (fn.find('/') != std::string::npos || fn.empty())
        throw ConfigError(fmt::format("{}: \"weight_map\".\"{}\" is \"{}\": a file of the directory", index, name, fn));
      if (seen.insert(fn).second) files.push_back(fn);
    }
  } else {
    throw ConfigError(fmt::format("{}: neither model.safetensors nor model.safetensors.index.json is there", dir));
  }
  for (const std::string& fn : files) {
    for (auto& [name, tensor] : core::load_safetensors(dir + "/" + fn)) {
      const std::string dt = tensor.dtype() == DType::bf16 ? "BF16" : "F32";
      if (t.dtype.empty()) t.dtype = dt;
      if (dt != t.dtype)
        throw ConfigError(fmt::format("{}/{}: tensor {} is {} while others are {}: one dtype for every tensor", dir, fn,
                                      name, dt, t.dtype));
      if (!t.map.emplace(name, tensor).second)
        throw ConfigError(fmt::format("{}/{}: tensor {} is also in {}", dir, fn, name, t.file[name]));
      t.file[name] = dir + "/" + fn;
    }
  }
  return t;
}

// One layer's ampipe tensors from the Hugging Face ones (full tensors, fp32).
void layer_from_hf(const TrainConfig& c, Arch arch, int i, HfTensors& hf, std::map<std::string, Tensor>& out) {
  const model::LayerConfig& l = c.layer;
  const int64_t h = l.hidden_size, d = l.head_dim(), n = l.num_attention_heads, g = l.query_groups(),
                F = l.ffn_hidden_size, E = l.num_experts;
  const HfLayerNames nm = hf_layer_names(arch, i);
  const std::string p = fmt::format("layers.{}.", i);
  out[p + "ln1.weight"] = hf.take(nm.ln1, {h});
  Tensor qkv = Tensor::empty({(n + 2 * g) * d, h});
  qkv.rows(0, n * d).copy_from(hf.take(nm.q, {n * d, h}));
  qkv.rows(n * d, (n + g) * d).copy_from(hf.take(nm.k, {g * d, h}));
  qkv.rows((n + g) * d, (n + 2 * g) * d).copy_from(hf.take(nm.v, {g * d, h}));
  out[p + "attn.qkv.weight"] = qkv;
  if (l.qk_layernorm) {
    out[p + "attn.q_layernorm.weight"] = hf.take(nm.q_norm, {d});
    out[p + "attn.k_layernorm.weight"] = hf.take(nm.k_norm, {d});
  }
  out[p + "attn.proj.weight"] = hf.take(nm.o, {h, n * d});
  out[p + "ln2.weight"] = hf.take(nm.ln2, {h});
  out[p + "moe.gate.weight"] = hf.take(nm.gate, {E, h});
  Tensor fc1 = Tensor::empty({E, 2 * F, h}), fc2 = Tensor::empty({E, h, F});
  for (int64_t e = 0; e < E; ++e) {
    Tensor up = fc1.rows(e, e + 1).view({2 * F, h});
    up.rows(0, F).copy_from(hf.take(nm.expert(e, 1), {F, h}));
    up.rows(F, 2 * F).copy_from(hf.take(nm.expert(e, 3), {F, h}));
    fc2.rows(e, e + 1).view({h, F}).copy_from(hf.take(nm.expert(e, 2), {h, F}));
  }
  out[p + "moe.experts.fc1.weight"] = fc1;
  out[p + "moe.experts.fc2.weight"] = fc2;
}

// Every ampipe tensor, by name, from the Hugging Face ones; refuses a tensor the model has no place for.
std::map<std::string, Tensor> ampipe_tensors(const TrainConfig& c, Arch arch, HfTensors& hf, bool& lm_head_stored) {
  const int64_t h = c.layer.hidden_size, V = c.vocab_size, Vp = c.padded_vocab_size;
  std::map<std::string, Tensor> out;
  auto padded = [&](const Tensor& t) {  // [V, h] -> [V', h], the padding rows zero (Megatron's)
    Tensor p = Tensor::zeros({Vp, h});
    p.rows(0, V).copy_from(t);
    return p;
  };
  out["embedding.word_embeddings.weight"] = padded(hf.take("model.embed_tokens.weight", {V, h}));
  for (int i = 0; i < c.num_layers; ++i) layer_from_hf(c, arch, i, hf, out);
  out["final_layernorm.weight"] = hf.take("model.norm.weight", {h});
  lm_head_stored = hf.map.count("lm_head.weight") > 0;
  if (c.untie_embeddings_and_output_weights) {
    out["output_layer.weight"] = padded(hf.take("lm_head.weight", {V, h}));
  } else if (lm_head_stored) {  // tied, but stored anyway (some exports do): it must be the embedding
    const Tensor lm = hf.take("lm_head.weight", {V, h}), emb = hf.map["model.embed_tokens.weight"];
    if (std::memcmp(lm.raw(), emb.raw(), emb.nbytes()) != 0)
      throw ConfigError(fmt::format("{}: tensor lm_head.weight differs from model.embed_tokens.weight while "
                                    "config.json's \"tie_word_embeddings\" is true",
                                    hf.file["lm_head.weight"]));
  }
  for (const auto& [name, t] : hf.map) {
    if (hf.used.count(name) || name.ends_with(".rotary_emb.inv_freq")) continue;  // old exports' RoPE buffers
    throw ConfigError(fmt::format("{}: tensor {} has no place in the {} model config.json describes", hf.file[name],
                                  name, arch_name(arch)));
  }
  return out;
}

// ------------------------------------------------------------------------------------------ ampipe -> HF

// The architecture a checkpoint's model is, or one line saying which flag Hugging Face's two cannot express.
Arch hf_arch_of(const TrainConfig& c, const std::string& where) {
  const model::LayerConfig& l = c.layer;
  auto refuse = [&](const std::string& what) {
    throw ConfigError(
        fmt::format("{}: {}: Hugging Face's {} and {} cannot express it", where, what, kMixtral, kQwen3Moe));
  };
  if (!l.rmsnorm()) refuse("--normalization LayerNorm (they use RMSNorm)");
  if (l.expert != model::ExpertKind::swiglu) refuse("GeLU experts (they use SwiGLU: --swiglu)");
  if (!l.rope())
    refuse(fmt::format("--position-embedding-type {} (they use rope)",
                       model::position_embedding_name(l.position_embedding)));
  if (l.rotary_percent != 1.0) refuse(fmt::format("--rotary-percent {} (they rotate every channel)", l.rotary_percent));
  if (l.rotary_interleaved) refuse("--rotary-interleaved (they rotate halves)");
  if (l.use_rope_scaling || l.rotary_interpolation_factor > 0) refuse("RoPE scaling or interpolation");
  if (!l.megatron_router()) refuse("--moe-model-type deepspeed_moe (they route as --moe-model-type megatron_moe)");
  if (l.moe_router_score_function != model::ScoreFunction::softmax) refuse("--moe-router-score-function sigmoid");
  if (l.moe_router_num_groups > 0) refuse("group-limited routing (--moe-router-num-groups)");
  if (l.moe_router_enable_expert_bias) refuse("--moe-router-enable-expert-bias");
  if (l.add_qkv_bias) refuse("--add-qkv-bias (their attention projections have no biases)");
  if (l.moe_shared_expert_gate) refuse("--moe-shared-expert-gate (their experts have no gated shared expert)");
  if (l.moe_router_topk_scaling_factor != 0 && l.moe_router_topk_scaling_factor != 1)
    refuse(fmt::format("--moe-router-topk-scaling-factor {}", l.moe_router_topk_scaling_factor));
  if (l.qk_layernorm) return Arch::qwen3_moe;
  if (l.moe_router_pre_softmax) return Arch::qwen3_moe;  // norm_topk_prob false
  return Arch::mixtral;
}

// config.json: the stored one (a converted model) or a new one, with the model's keys set from `c`.
json hf_config_json(const TrainConfig& c, Arch arch, const json& stored, const std::string& dtype) {
  const model::LayerConfig& l = c.layer;
  json j = stored.is_object() ? stored : json::object();
  auto put = [&](const char* key, const json& v) { j[key] = v; };
  auto put_default = [&](const char* key, const json& v) {
    if (!j.contains(key)) j[key] = v;
  };
  put("architectures", json::array({arch_name(arch)}));
  put("model_type", arch == Arch::mixtral ? "mixtral" : "qwen3_moe");
  put("hidden_size", l.hidden_size);
  put("num_hidden_layers", c.num_layers);
  put("num_attention_heads", l.num_attention_heads);
  put("num_key_value_heads", l.query_groups());
  put(arch == Arch::mixtral ? "intermediate_size" : "moe_intermediate_size", l.ffn_hidden_size);
  put(arch == Arch::mixtral ? "num_local_experts" : "num_experts", l.num_experts);
  put("num_experts_per_tok", l.moe_router_topk);
  put("hidden_act", "silu");
  put("tie_word_embeddings", !c.untie_embeddings_and_output_weights);
  // float values kept as stored when they are the same number in ampipe's precision (1e-6 is not a float)
  if (!(j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number() &&
        float(j["rms_norm_eps"].get<double>()) == l.layernorm_epsilon))
    put("rms_norm_eps", double(l.layernorm_epsilon));
  if (!(j.contains("rope_theta") && j["rope_theta"].is_number() && j["rope_theta"].get<double>() == l.rotary_base))
    put("rope_theta", l.rotary_base);
  put_default("vocab_size", c.padded_vocab_size);
  put_default("max_position_embeddings", std::max(c.max_position_embeddings, l.seq_length));
  put_default("initializer_range", l.init_method_std);
  put_default("attention_dropout", l.attention_dropout);
  put_default("router_aux_loss_coef", c.moe_aux_loss_coeff);
  put_default("output_router_logits", false);
  put_default("use_cache", true);
  put_default("rope_scaling", nullptr);
  put_default("sliding_window", nullptr);
  put_default("torch_dtype", dtype == "BF16" ? "bfloat16" : "float32");
  if (arch == Arch::mixtral) {
    put_default("router_jitter_noise", 0.0);
  } else {
    put("head_dim", l.head_dim());
    put("norm_topk_prob", !l.moe_router_pre_softmax);
    put_default("intermediate_size", l.ffn_hidden_size);
    put_default("attention_bias", false);
    put_default("use_sliding_window", false);
    put_default("max_window_layers", c.num_layers);
    put_default("decoder_sparse_step", 1);
    put_default("mlp_only_layers", json::array());
  }
  return j;
}

// The Hugging Face tensors of a model's full fp32 parameters (by ampipe name), in `dtype`.
core::TensorMap hf_tensors(const TrainConfig& c, Arch arch, std::map<std::string, Tensor>& p, int64_t V,
                           DType dtype, bool lm_head_stored) {
  const model::LayerConfig& l = c.layer;
  const int64_t d = l.head_dim(), n = l.num_attention_heads, g = l.query_groups(), F = l.ffn_hidden_size;
  core::TensorMap out;
  auto put = [&](const std::string& name, const Tensor& t) { out[name] = t.to(dtype); };
  put("model.embed_tokens.weight", p["embedding.word_embeddings.weight"].rows(0, V));
  for (int i = 0; i < c.num_layers; ++i) {
    const HfLayerNames nm = hf_layer_names(arch, i);
    const std::string q = fmt::format("layers.{}.", i);
    const Tensor qkv = p[q + "attn.qkv.weight"];
    put(nm.ln1, p[q + "ln1.weight"]);
    put(nm.q, qkv.rows(0, n * d));
    put(nm.k, qkv.rows(n * d, (n + g) * d));
    put(nm.v, qkv.rows((n + g) * d, (n + 2 * g) * d));
    if (l.qk_layernorm) {
      put(nm.q_norm, p[q + "attn.q_layernorm.weight"]);
      put(nm.k_norm, p[q + "attn.k_layernorm.weight"]);
    }
    put(nm.o, p[q + "attn.proj.weight"]);
    put(nm.ln2, p[q + "ln2.weight"]);
    put(nm.gate, p[q + "moe.gate.weight"]);
    const Tensor fc1 = p[q + "moe.experts.fc1.weight"], fc2 = p[q + "moe.experts.fc2.weight"];
    for (int64_t e = 0; e < l.num_experts; ++e) {
      const Tensor up = fc1.rows(e, e + 1).view({2 * F, l.hidden_size});
      put(nm.expert(e, 1), up.rows(0, F));
      put(nm.expert(e, 3), up.rows(F, 2 * F));
      put(nm.expert(e, 2), fc2.rows(e, e + 1).view({l.hidden_size, F}));
    }
  }
  put("model.norm.weight", p["final_layernorm.weight"]);
  if (c.untie_embeddings_and_output_weights) put("lm_head.weight", p["output_layer.weight"].rows(0, V));
  else if (lm_head_stored) put("lm_head.weight", p["embedding.word_embeddings.weight"].rows(0, V));
  return out;
}

void write_hf_dir(const std::string& dir, const json& config, const core::TensorMap& tensors) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ConfigError(fmt::format("--save-dir {}: the directory cannot be created: {}", dir, ec.message()));
  core::save_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) {
    index["weight_map"][name] = "model.safetensors";
    total += t.nbytes();
  }
  index["metadata"]["total_size"] = total;
  core::write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  core::write_file_atomic(dir + "/config.json", config.dump(2) + "\n");
}

}  // namespace

bool is_hf_dir(const std::string& dir) { return fs::exists(dir + "/config.json"); }

std::string hf_to_ampipe(const std::string& hf_dir, const std::string& out_dir, const HfConvertOptions& opts,
                         const comm::Groups& groups) {
  HfConfig hc{read_json_file(hf_dir + "/config.json"), hf_dir + "/config.json"};
  const Arch arch = arch_of(hc);
  refuse_unsupported(hc);
  TrainConfig c = config_from_hf(hc, arch, opts);
  try {
    c.validate(groups.world.size());
  } catch (const ConfigError& e) {  // a value within Hugging Face's range that ampipe's rules refuse
    throw ConfigError(fmt::format("{}: the model cannot run here: {}", hc.path, e.what()));
  }
  HfTensors hf = read_hf_tensors(hf_dir);
  bool lm_head_stored = false;
  std::map<std::string, Tensor> tensors = ampipe_tensors(c, arch, hf, lm_head_stored);
  check_writable_dir("--save-dir", out_dir, groups.world);
  GptModel model(c, 0, &groups);
  for (NamedParam& p : model.params()) {
    auto it = tensors.find(p.name);
    AMPIPE_CHECK(it != tensors.end() && it->second.numel() == p.param.numel(), "convert: no tensor for {}", p.name);
    p.param.copy_from(it->second.view(p.param.shape()));
  }
  AdamW opt(model.params());
  CheckpointMeta meta;
  json& j = meta.json;
  j["format"] = kCheckpointFormat;
  j["iteration"] = 0;
  j["consumed_samples"] = 0;
  j["optimizer_steps"] = 0;
  j["config"] = to_json(c);
  j["rng"] = {{"seed", c.layer.seed}};
  j["saved_with"] = {{"world_size", groups.world.size()}};
  j["hf"] = {{"config", hc.j}, {"dtype", hf.dtype}, {"vocab_size", c.vocab_size}, {"lm_head_stored", lm_head_stored}};
  save_checkpoint(out_dir, meta, c, model, opt, groups);
  return fmt::format("ampipe convert: {} {} ({} layers, {} experts, top-{}, {} tensors, {}) -> ampipe checkpoint {} "
                     "(iteration 0, vocabulary {} padded to {})",
                     arch_name(arch), hf_dir, c.num_layers, c.layer.num_experts, c.layer.moe_router_topk,
                     hf.map.size(), hf.dtype, out_dir, c.vocab_size, c.padded_vocab_size);
}

std::string ampipe_to_hf(const std::string& ckpt_dir, const std::string& out_dir, const comm::Groups& groups) {
  const std::optional<CheckpointInfo> info = read_checkpoint_info(ckpt_dir, /*required=*/true);
  TrainConfig c;
  apply_checkpoint_model_args(c, info->config);
  if (info->config.contains("moe_aux_loss_coeff"))
    c.moe_aux_loss_coeff = info->config["moe_aux_loss_coeff"].get<double>();
  if (c.padded_vocab_size == 0)
    throw ConfigError(fmt::format("--load-dir {}: the checkpoint records no padded_vocab_size", ckpt_dir));
  c.global_batch_size = c.layer.micro_batch_size;
  const Arch arch = hf_arch_of(c, "--load-dir " + ckpt_dir);
  c.validate(groups.world.size());
  GptModel model(c, 0, &groups);
  AdamW opt(model.params());
  const CheckpointMeta meta = load_checkpoint(ckpt_dir, c, model, opt, groups, /*load_optim=*/false);
  const json hf = meta.json.contains("hf") && meta.json["hf"].is_object() ? meta.json["hf"] : json::object();
  const std::string dtype = hf.value("dtype", std::string("F32"));
  int64_t V = hf.value("vocab_size", c.padded_vocab_size);
  if (V < 1 || V > c.padded_vocab_size) V = c.padded_vocab_size;
  std::map<std::string, Tensor> params;
  for (const NamedParam& p : model.params())
    params[p.name] = full_tensor(p.param, p, c.layer, groups, "convert." + p.name);
  const json config = hf_config_json(c, arch, hf.value("config", json()), dtype);
  const core::TensorMap tensors =
      hf_tensors(c, arch, params, V, dtype == "BF16" ? DType::bf16 : DType::f32, hf.value("lm_head_stored", false));
  if (groups.world.rank() == 0) write_hf_dir(out_dir, config, tensors);
  return fmt::format("ampipe convert: ampipe checkpoint {} (iteration {}) -> {} {} ({} tensors, {})", ckpt_dir,
                     meta.iteration, arch_name(arch), out_dir, tensors.size(), dtype);
}

}  // namespace ampipe::train
