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

enum class Arch { mixtral, qwen2_moe, qwen3_moe };
constexpr const char* kMixtral = "MixtralForCausalLM";
constexpr const char* kQwen2Moe = "Qwen2MoeForCausalLM";
constexpr const char* kQwen3Moe = "Qwen3MoeForCausalLM";
const char* arch_name(Arch a) { return a == Arch::mixtral ? kMixtral : a == Arch::qwen2_moe ? kQwen2Moe : kQwen3Moe; }
const char* model_type(Arch a) {
  return a == Arch::mixtral ? "mixtral" : a == Arch::qwen2_moe ? "qwen2_moe" : "qwen3_moe";
}
// The three, for the error lines.
const std::string kArchs = fmt::format("{}, {} and {}", kMixtral, kQwen2Moe, kQwen3Moe);

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
    throw ConfigError(fmt::format("{}: \"architectures\" is {}: it must name one model ({})", hc.path, a.dump(),
                                  kArchs));
  const std::string name = a[0].get<std::string>();
  if (name == kMixtral) return Arch::mixtral;
  if (name == kQwen2Moe) return Arch::qwen2_moe;
  if (name == kQwen3Moe) return Arch::qwen3_moe;
  throw ConfigError(
      fmt::format("{}: \"architectures\" is [\"{}\"]: ampipe convert reads {} only", hc.path, name, kArchs));
}

// Which layers of a Qwen2-MoE / Qwen3-MoE have experts (one flag per layer): layer i does unless it is in
// mlp_only_layers or (i + 1) % decoder_sparse_step != 0 (Hugging Face's rule; the others are dense, their MLP of
// intermediate_size). Mixtral's layers all have experts.
std::vector<bool> qwen_moe_layers(const HfConfig& hc, int num_layers) {
  const int64_t step = hc.j.contains("decoder_sparse_step") && !hc.j["decoder_sparse_step"].is_null()
                           ? hc.integer("decoder_sparse_step")
                           : 1;
  std::vector<bool> moe(size_t(num_layers), true);
  for (int i = 0; i < num_layers; ++i) moe[size_t(i)] = (i + 1) % step == 0;
  if (hc.j.contains("mlp_only_layers") && !hc.j["mlp_only_layers"].is_null()) {
    const json& only = hc.j["mlp_only_layers"];
    if (!only.is_array())
      throw ConfigError(fmt::format("{}: \"mlp_only_layers\" is {}: it must be a list of layer indices", hc.path,
                                    only.dump()));
    for (const json& v : only) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= num_layers)
        throw ConfigError(fmt::format("{}: \"mlp_only_layers\" holds {}: a layer index in [0, num_hidden_layers {})",
                                      hc.path, v.dump(), num_layers));
      moe[size_t(v.get<int64_t>())] = false;
    }
  }
  if (std::find(moe.begin(), moe.end(), true) == moe.end())
    throw ConfigError(fmt::format("{}: \"decoder_sparse_step\" {} and \"mlp_only_layers\" {} leave no layer with "
                                  "experts: ampipe convert reads MoE models",
                                  hc.path, step, hc.j.value("mlp_only_layers", json::array()).dump()));
  return moe;
}

// The values of config.json that ampipe's model cannot express: one line each, naming the key and the value.
void refuse_unsupported(const HfConfig& hc, Arch arch) {
  hc.require("hidden_act", "silu", "the experts here are SwiGLU (SiLU gate), so it must be \"silu\"");
  hc.require("rope_scaling", json(), "RoPE scaling of Hugging Face's kinds is not converted (it must be null)");
  // Qwen's models read sliding_window only with use_sliding_window (their configs often hold a size with false)
  if (arch == Arch::mixtral)
    hc.require("sliding_window", json(), "sliding-window attention is not implemented (it must be null)");
  hc.require("use_sliding_window", false, "sliding-window attention is not implemented (it must be false)");
  // Qwen2-MoE's q/k/v biases are its own key (qkv_bias, config_from_hf); attention_bias is not one of its keys
  if (arch != Arch::qwen2_moe)
    hc.require("attention_bias", false, "the attention here has no biases (it must be false)");
  hc.require("mlp_bias", false, "the experts here have no biases (it must be false)");
  hc.require("router_jitter_noise", 0.0, "Megatron-Core's router here has no jitter (it must be 0)");
  if (arch == Arch::mixtral) {  // Qwen's dense layers: qwen_moe_layers
    hc.require("decoder_sparse_step", 1, "every layer of a Mixtral here is an MoE layer (it must be 1)");
    hc.require("mlp_only_layers", json::array(), "every layer of a Mixtral here is an MoE layer (it must be [])");
  }
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
  // Mixtral renormalises the top-k softmax weights; Qwen2-MoE and Qwen3-MoE only with norm_topk_prob (else the
  // probabilities themselves: Megatron's pre-softmax). Megatron's softmax over the chosen logits is that
  // renormalisation.
  l.moe_router_pre_softmax = arch != Arch::mixtral && !hc.flag("norm_topk_prob", false);
  if (arch == Arch::qwen2_moe) {
    // Qwen2-MoE's shared expert (SwiGLU of shared_expert_intermediate_size, every token) is always gated:
    // sigmoid(x . shared_expert_gate) times its output, added to the routed experts' (docs/layer.md §6.11).
    l.mlp_ffn_hidden_size = hc.integer("shared_expert_intermediate_size");
    l.moe_shared_expert_gate = true;
    // q/k/v_proj have biases (o_proj none); newer transformers name it qkv_bias, older ones always have them
    l.add_qkv_bias = hc.flag("qkv_bias", true);
  }
  if (arch != Arch::mixtral) {  // dense layers (intermediate_size) where Hugging Face's rule puts them
    const std::vector<bool> moe = qwen_moe_layers(hc, c.num_layers);
    if (std::find(moe.begin(), moe.end(), false) != moe.end()) {
      std::string freq = "[";  // --moe-layer-freq as a list: Megatron's integer form counts from layer 0
      for (size_t i = 0; i < moe.size(); ++i) freq += fmt::format("{}{}", i ? "," : "", moe[i] ? 1 : 0);
      c.moe_layer_freq = freq + "]";
      c.dense_ffn_hidden_size = hc.integer("intermediate_size");
    }
  }
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
  std::string q_bias, k_bias, v_bias;             // Qwen2-MoE
  std::string dense, shared_expert, shared_gate;  // the dense layer's MLP, Qwen2-MoE's shared expert and its gate
  // which: 1 the SiLU branch, 3 the linear one, 2 the down-projection
  std::string expert(int64_t e, int which) const {
    static const char* const kMixtral[] = {"", "w1", "w2", "w3"};
    return mixtral ? fmt::format("{}.experts.{}.{}.weight", moe, e, kMixtral[which])
                   : mlp(fmt::format("{}.experts.{}", moe, e), which);
  }
  // A Qwen SwiGLU MLP's tensors under `prefix` (an expert, the shared expert, a dense layer's MLP).
  static std::string mlp(const std::string& prefix, int which) {
    static const char* const kQwen[] = {"", "gate_proj", "down_proj", "up_proj"};
    return fmt::format("{}.{}.weight", prefix, kQwen[which]);
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
  n.q_bias = p + "self_attn.q_proj.bias";
  n.k_bias = p + "self_attn.k_proj.bias";
  n.v_bias = p + "self_attn.v_proj.bias";
  n.ln2 = p + "post_attention_layernorm.weight";
  n.moe = p + (n.mixtral ? "block_sparse_moe" : "mlp");
  n.gate = n.moe + ".gate.weight";
  n.dense = p + "mlp";
  n.shared_expert = n.moe + ".shared_expert";
  n.shared_gate = n.moe + ".shared_expert_gate.weight";
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
  const model::LayerConfig l = c.layer_config(i);  // a dense layer's, or the MoE layers'
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
  if (l.add_qkv_bias) {  // the bias's rows as the weight's
    Tensor b = Tensor::empty({(n + 2 * g) * d});
    b.rows(0, n * d).copy_from(hf.take(nm.q_bias, {n * d}));
    b.rows(n * d, (n + g) * d).copy_from(hf.take(nm.k_bias, {g * d}));
    b.rows((n + g) * d, (n + 2 * g) * d).copy_from(hf.take(nm.v_bias, {g * d}));
    out[p + "attn.qkv.bias"] = b;
  }
  if (l.qk_layernorm) {
    out[p + "attn.q_layernorm.weight"] = hf.take(nm.q_norm, {d});
    out[p + "attn.k_layernorm.weight"] = hf.take(nm.k_norm, {d});
  }
  out[p + "attn.proj.weight"] = hf.take(nm.o, {h, n * d});
  out[p + "ln2.weight"] = hf.take(nm.ln2, {h});
  // The dense MLP (a dense layer's, or the shared expert): fc1 rows [gate_proj (SiLU branch) | up_proj], as the
  // experts' (docs/layer.md §6.11)
  auto dense_mlp = [&](const std::string& prefix) {
    const int64_t Fm = l.mlp_ffn_hidden_size;
    Tensor fc1 = Tensor::empty({2 * Fm, h});
    fc1.rows(0, Fm).copy_from(hf.take(HfLayerNames::mlp(prefix, 1), {Fm, h}));
    fc1.rows(Fm, 2 * Fm).copy_from(hf.take(HfLayerNames::mlp(prefix, 3), {Fm, h}));
    out[p + "mlp.fc1.weight"] = fc1;
    out[p + "mlp.fc2.weight"] = hf.take(HfLayerNames::mlp(prefix, 2), {h, Fm});
  };
  if (l.dense()) {
    dense_mlp(nm.dense);
    return;
  }
  if (l.has_mlp()) {
    dense_mlp(nm.shared_expert);
    out[p + "mlp.gate.weight"] = hf.take(nm.shared_gate, {1, h});
  }
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

// The architecture a checkpoint's model is, or one line saying which flag Hugging Face's three cannot express.
Arch hf_arch_of(const TrainConfig& c, const std::string& where) {
  const model::LayerConfig& l = c.layer;
  auto refuse = [&](const std::string& what) {
    throw ConfigError(fmt::format("{}: {}: Hugging Face's {} cannot express it", where, what, kArchs));
  };
  if (c.dense || l.dense()) refuse("a dense GPT (no --num-experts; they are MoE models)");
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
  if (l.add_bias_linear) refuse("--add-bias-linear (their linear layers have no biases but Qwen2-MoE's q/k/v)");
  if (l.moe_router_topk_scaling_factor != 0 && l.moe_router_topk_scaling_factor != 1)
    refuse(fmt::format("--moe-router-topk-scaling-factor {}", l.moe_router_topk_scaling_factor));
  const std::vector<bool> moe = c.moe_layers();
  const bool dense_layers = std::find(moe.begin(), moe.end(), false) != moe.end();
  // Qwen2-MoE: a shared expert, always gated, q/k/v biases (or none: qkv_bias false), no q/k norms
  if (l.has_mlp()) {
    if (!l.moe_shared_expert_gate)
      refuse("a shared expert without --moe-shared-expert-gate (Qwen2-MoE's shared expert is gated)");
    if (l.qk_layernorm) refuse("--qk-layernorm with a shared expert (Qwen2-MoE has no q/k norms, Qwen3-MoE no shared "
                               "expert)");
    return Arch::qwen2_moe;
  }
  if (l.add_qkv_bias)
    refuse("--add-qkv-bias without a gated shared expert (Qwen2-MoE has both, the others' q/k/v have no biases)");
  // Qwen3-MoE: q/k norms (it always has them)
  if (l.qk_layernorm) return Arch::qwen3_moe;
  // Mixtral: every layer MoE, the top-k weights renormalised
  if (dense_layers)
    refuse("dense blocks (--moe-layer-freq, --first-k-dense-replace) without --qk-layernorm or a gated shared expert "
           "(Mixtral has none; Qwen3-MoE has q/k norms, Qwen2-MoE a shared expert)");
  if (l.moe_router_pre_softmax)
    refuse("--moe-router-pre-softmax (norm_topk_prob false) without --qk-layernorm or a gated shared expert "
           "(Mixtral renormalises; Qwen3-MoE has q/k norms, Qwen2-MoE a shared expert)");
  return Arch::mixtral;
}

// Whether a stored config.json's decoder_sparse_step and mlp_only_layers give these layers experts.
bool same_moe_layers(const json& j, const std::vector<bool>& moe) {
  try {
    return qwen_moe_layers(HfConfig{j, "config.json"}, int(moe.size())) == moe;
  } catch (const ConfigError&) {
    return false;
  }
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
  put("model_type", model_type(arch));
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
    return j;
  }
  put("norm_topk_prob", !l.moe_router_pre_softmax);
  if (arch == Arch::qwen3_moe) {
    put("head_dim", l.head_dim());
    put_default("attention_bias", false);
  } else {
    put("shared_expert_intermediate_size", l.mlp_ffn_hidden_size);
    put("qkv_bias", l.add_qkv_bias);
  }
  put_default("use_sliding_window", false);
  put_default("max_window_layers", c.num_layers);
  // The dense layers: the stored keys when they give the same layers, else mlp_only_layers lists them
  const std::vector<bool> moe = c.moe_layers();
  if (!same_moe_layers(j, moe)) {
    json only = json::array();
    for (size_t i = 0; i < moe.size(); ++i)
      if (!moe[i]) only.push_back(i);
    put("decoder_sparse_step", 1);
    put("mlp_only_layers", only);
  }
  put_default("decoder_sparse_step", 1);  // (a config.json built from the flags says it too)
  put_default("mlp_only_layers", json::array());
  const int64_t dense_F = c.dense_ffn_hidden_size > 0 ? c.dense_ffn_hidden_size : l.ffn_hidden_size;
  if (std::find(moe.begin(), moe.end(), false) != moe.end()) put("intermediate_size", dense_F);
  else put_default("intermediate_size", arch == Arch::qwen2_moe ? l.mlp_ffn_hidden_size : dense_F);
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
    const model::LayerConfig li = c.layer_config(i);
    const HfLayerNames nm = hf_layer_names(arch, i);
    const std::string q = fmt::format("layers.{}.", i);
    const Tensor qkv = p[q + "attn.qkv.weight"];
    put(nm.ln1, p[q + "ln1.weight"]);
    put(nm.q, qkv.rows(0, n * d));
    put(nm.k, qkv.rows(n * d, (n + g) * d));
    put(nm.v, qkv.rows((n + g) * d, (n + 2 * g) * d));
    if (l.add_qkv_bias) {
      const Tensor b = p[q + "attn.qkv.bias"];
      put(nm.q_bias, b.rows(0, n * d));
      put(nm.k_bias, b.rows(n * d, (n + g) * d));
      put(nm.v_bias, b.rows((n + g) * d, (n + 2 * g) * d));
    }
    if (l.qk_layernorm) {
      put(nm.q_norm, p[q + "attn.q_layernorm.weight"]);
      put(nm.k_norm, p[q + "attn.k_layernorm.weight"]);
    }
    put(nm.o, p[q + "attn.proj.weight"]);
    put(nm.ln2, p[q + "ln2.weight"]);
    auto dense_mlp = [&](const std::string& prefix) {  // fc1 rows [gate_proj | up_proj]
      const int64_t Fm = li.mlp_ffn_hidden_size;
      const Tensor fc1 = p[q + "mlp.fc1.weight"];
      put(HfLayerNames::mlp(prefix, 1), fc1.rows(0, Fm));
      put(HfLayerNames::mlp(prefix, 3), fc1.rows(Fm, 2 * Fm));
      put(HfLayerNames::mlp(prefix, 2), p[q + "mlp.fc2.weight"]);
    };
    if (li.dense()) {
      dense_mlp(nm.dense);
      continue;
    }
    if (li.has_mlp()) {
      dense_mlp(nm.shared_expert);
      put(nm.shared_gate, p[q + "mlp.gate.weight"]);
    }
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
  refuse_unsupported(hc, arch);
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
