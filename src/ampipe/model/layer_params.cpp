#include "ampipe/model/layer_params.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "ampipe/core/parallel.h"
#include "ampipe/core/philox.h"

namespace ampipe::model {

std::vector<std::pair<std::string, Tensor>> LayerParams::named() {
  std::vector<std::pair<std::string, Tensor>> all = {
      {"ln1.weight", ln1_w},       {"ln1.bias", ln1_b},   {"attn.qkv.weight", qkv_w}, {"attn.qkv.bias", qkv_b},
      {"attn.q_layernorm.weight", qn_w}, {"attn.q_layernorm.bias", qn_b},
      {"attn.k_layernorm.weight", kn_w}, {"attn.k_layernorm.bias", kn_b},
      {"attn.proj.weight", proj_w}, {"attn.proj.bias", proj_b}, {"ln2.weight", ln2_w}, {"ln2.bias", ln2_b},
      {"moe.gate.weight", gate_w},  {"moe.experts.fc1.weight", fc1_w}, {"moe.experts.fc1.bias", fc1_b},
      {"moe.experts.fc2.weight", fc2_w}, {"moe.experts.fc2.bias", fc2_b},
      {"mlp.fc1.weight", mlp_fc1_w}, {"mlp.fc1.bias", mlp_fc1_b}, {"mlp.fc2.weight", mlp_fc2_w},
      {"mlp.fc2.bias", mlp_fc2_b}, {"mlp.gate.weight", mlp_gate_w}};
  // RMSNorm: no biases; no qk norms; a dense layer: no router and experts; no dense MLP beside the experts
  std::erase_if(all, [](const auto& p) { return !p.second.defined(); });
  return all;
}

namespace {
constexpr const char* kQkNorms[] = {"attn.q_layernorm.weight", "attn.q_layernorm.bias", "attn.k_layernorm.weight",
                                    "attn.k_layernorm.bias"};
// --add-bias-linear's biases (ids 17..21), each right after its weight in named() and param_names()
constexpr const char* kLinearBiases[] = {"attn.proj.bias", "moe.experts.fc1.bias", "moe.experts.fc2.bias",
                                         "mlp.fc1.bias", "mlp.fc2.bias"};
// The norms' biases (LayerNorm only), not the linear layers'.
bool is_norm_bias(const std::string& n) {
  return n == "ln1.bias" || n == "ln2.bias" || n == "attn.q_layernorm.bias" || n == "attn.k_layernorm.bias";
}
}  // namespace

bool LayerParams::is_linear_bias(const std::string& name) {
  return std::find(std::begin(kLinearBiases), std::end(kLinearBiases), name) != std::end(kLinearBiases);
}

std::vector<std::string> param_names(const LayerConfig& cfg) {
  std::vector<std::string> names = {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.proj.weight", "ln2.weight",
                                    "ln2.bias", "moe.gate.weight", "moe.experts.fc1.weight", "moe.experts.fc2.weight",
                                    "mlp.fc1.weight", "mlp.fc2.weight"};
  if (cfg.qk_layernorm) names.insert(names.begin() + 3, std::begin(kQkNorms), std::end(kQkNorms));
  if (cfg.qkv_bias()) names.insert(names.begin() + 3, "attn.qkv.bias");
  if (cfg.add_bias_linear)
    for (const char* b : kLinearBiases) {  // after its weight
      const std::string w = std::string(b).substr(0, std::strlen(b) - 4) + "weight";
      names.insert(std::find(names.begin(), names.end(), w) + 1, b);
    }
  if (cfg.rmsnorm())  // RMSNorm: the norms have no biases (the linear layers' own biases stay)
    std::erase_if(names, is_norm_bias);
  if (cfg.dense()) std::erase_if(names, [](const std::string& n) { return n.starts_with("moe."); });
  if (!cfg.has_mlp()) std::erase_if(names, [](const std::string& n) { return n.starts_with("mlp."); });
  if (cfg.has_mlp() && !cfg.dense() && cfg.moe_shared_expert_gate) names.push_back("mlp.gate.weight");
  return names;
}

int LayerParams::id(const std::string& name) {
  static const char* const kNames[] = {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.proj.weight", "ln2.weight",
                                       "ln2.bias", "moe.gate.weight", "moe.experts.fc1.weight",
                                       "moe.experts.fc2.weight", "mlp.fc1.weight", "mlp.fc2.weight"};
  for (int i = 0; i < int(std::size(kNames)); ++i)
    if (name == kNames[i]) return i;
  for (int i = 0; i < int(std::size(kQkNorms)); ++i)  // ids 11..14, after the block's first eleven
    if (name == kQkNorms[i]) return int(std::size(kNames)) + i;
  if (name == "attn.qkv.bias") return 15;  // (initialised to 0: its id keys nothing yet)
  if (name == "mlp.gate.weight") return 16;
  for (int i = 0; i < int(std::size(kLinearBiases)); ++i)  // (initialised to 0 as well)
    if (name == kLinearBiases[i]) return 17 + i;
  AMPIPE_CHECK(false, "unknown parameter {}", name);
}

bool LayerParams::is_expert(const std::string& name) { return name.rfind("moe.experts.", 0) == 0; }

bool LayerParams::is_sequence_parallel(const std::string& name) {
  return name == "ln1.weight" || name == "ln1.bias" || name == "ln2.weight" || name == "ln2.bias" ||
         name == "moe.gate.weight" || name == "mlp.gate.weight" || name == "attn.proj.bias" || name == "mlp.fc2.bias";
}

bool LayerParams::is_qk_norm(const std::string& name) {
  return std::find(std::begin(kQkNorms), std::end(kQkNorms), name) != std::end(kQkNorms);
}

bool LayerParams::tp_partial_grad(const LayerConfig& cfg, const std::string& name) {
  return (cfg.sp() && is_sequence_parallel(name)) || (cfg.tp() > 1 && is_qk_norm(name));
}

TpSplit tp_split(const LayerConfig& cfg, const std::string& name) {
  const int64_t h = cfg.hidden_size, F = cfg.ffn_hidden_size, L = cfg.local_experts();
  if (name == "attn.qkv.weight" || name == "attn.qkv.bias") {  // [q | k | v]: n*d, g*d, g*d rows, each cut
    const int64_t kv = cfg.query_groups() * cfg.head_dim();        // over the ranks (the bias as its rows)
    return name == "attn.qkv.weight" ? TpSplit{{h + 2 * kv, h}, 0, {h, kv, kv}} : TpSplit{{h + 2 * kv}, 0, {h, kv, kv}};
  }
  if (name == "attn.proj.weight") return {{h, h}, 1, {}};
  if (name == "moe.experts.fc1.weight")
    return cfg.expert == ExpertKind::swiglu ? TpSplit{{L, 2, F, h}, 2, {}} : TpSplit{{L, F, h}, 1, {}};
  if (name == "moe.experts.fc2.weight") return {{L, h, F}, 2, {}};
  if (name == "moe.experts.fc1.bias")
    return cfg.expert == ExpertKind::swiglu ? TpSplit{{L, 2, F}, 2, {}} : TpSplit{{L, F}, 1, {}};
  const int64_t Fm = cfg.mlp_ffn_hidden_size;
  if (name == "mlp.fc1.weight") return cfg.expert == ExpertKind::swiglu ? TpSplit{{2, Fm, h}, 1, {}} : TpSplit{{Fm, h}, 0, {}};
  if (name == "mlp.fc1.bias") return cfg.expert == ExpertKind::swiglu ? TpSplit{{2, Fm}, 1, {}} : TpSplit{{Fm}, 0, {}};
  if (name == "mlp.fc2.weight") return {{h, Fm}, 1, {}};
  return {};
}

namespace {
// (outer, mid, inner) of a split: the tensor is [outer, mid, inner] with mid the dimension cut into t blocks.
struct Blocks {
  int64_t outer = 1, mid = 1, inner = 1;
};
Blocks blocks_of(const TpSplit& sp) {
  Blocks b;
  for (int i = 0; i < int(sp.view.size()); ++i) {
    if (i < sp.dim) b.outer *= sp.view[size_t(i)];
    if (i == sp.dim) b.mid = sp.view[size_t(i)];
    if (i > sp.dim) b.inner *= sp.view[size_t(i)];
  }
  return b;
}
Shape local_shape(const LayerConfig& cfg, const std::string& name) {
  Shape s = full_shape(cfg, name);
  if (LayerParams::is_expert(name)) s[0] = cfg.local_experts();
  const int64_t t = cfg.tp();
  if (t > 1 && tp_split(cfg, name).dim >= 0) {
    if (name == "attn.qkv.bias" || name == "moe.experts.fc1.bias" || name == "mlp.fc1.bias")
      s.back() /= t;  // the rows of the weight's shard
    else if (name == "attn.qkv.weight" || name == "moe.experts.fc1.weight" || name == "mlp.fc1.weight")
      s[s.size() - 2] /= t;  // output rows
    else s.back() /= t;  // input columns (row-parallel)
  }
  return s;
}
}  // namespace

namespace {
// The segments of the split dimension, each cut into t blocks (one segment, the whole dimension, unless the split
// names several).
std::vector<int64_t> segments_of(const TpSplit& sp, const Blocks& b) {
  return sp.segments.empty() ? std::vector<int64_t>{b.mid} : sp.segments;
}
// Calls f(offset in the whole tensor, offset in rank r's shard, elements) for every contiguous piece of rank r's shard.
template <typename F>
void for_each_block(const TpSplit& sp, int64_t t, int r, F&& f) {
  const Blocks b = blocks_of(sp);
  const std::vector<int64_t> segs = segments_of(sp, b);
  int64_t local = 0;
  for (int64_t o = 0; o < b.outer; ++o) {
    int64_t seg0 = 0;
    for (const int64_t seg : segs) {
      const int64_t m = seg / t;
      f((o * b.mid + seg0 + r * m) * b.inner, local, m * b.inner);
      local += m * b.inner;
      seg0 += seg;
    }
  }
}
}  // namespace

Tensor tp_take(const LayerConfig& cfg, const std::string& name, const Tensor& whole, int r) {
  const TpSplit sp = tp_split(cfg, name);
  AMPIPE_CHECK(sp.dim >= 0 && whole.numel() == shape_numel(sp.view), "{}: no tp shard of {}", name,
               shape_str(whole.shape()));
  Tensor out = Tensor::empty(local_shape(cfg, name));
  const float* src = whole.data<float>();
  float* dst = out.data<float>();
  for_each_block(sp, cfg.tp(), r, [&](int64_t at, int64_t local, int64_t n) {
    std::memcpy(dst + local, src + at, size_t(n) * 4);
  });
  return out;
}

Tensor tp_join(const LayerConfig& cfg, const std::string& name, const Tensor& shards, const Shape& whole_shape) {
  const TpSplit sp = tp_split(cfg, name);
  const int64_t t = cfg.tp();
  AMPIPE_CHECK(sp.dim >= 0 && shards.numel() == shape_numel(sp.view) && shape_numel(whole_shape) == shards.numel(),
               "{}: {} shard elements for {}", name, shards.numel(), shape_str(whole_shape));
  Tensor out = Tensor::empty(whole_shape);
  const float* src = shards.data<float>();
  float* dst = out.data<float>();
  const int64_t per = shards.numel() / t;
  for (int r = 0; r < int(t); ++r)
    for_each_block(sp, t, r, [&](int64_t at, int64_t local, int64_t n) {
      std::memcpy(dst + at, src + r * per + local, size_t(n) * 4);
    });
  return out;
}

Shape full_shape(const LayerConfig& cfg, const std::string& name) {
  const int64_t h = cfg.hidden_size, F = cfg.ffn_hidden_size, E = cfg.num_experts;
  const int64_t fc1_rows = cfg.expert == ExpertKind::swiglu ? 2 * F : F;
  if (name == "ln1.weight" || name == "ln1.bias" || name == "ln2.weight" || name == "ln2.bias") return {h};
  if (name == "attn.qkv.weight") return {h + 2 * cfg.query_groups() * cfg.head_dim(), h};
  if (name == "attn.qkv.bias") return {h + 2 * cfg.query_groups() * cfg.head_dim()};
  if (LayerParams::is_qk_norm(name)) return {cfg.head_dim()};
  if (name == "attn.proj.weight") return {h, h};
  if (name == "attn.proj.bias" || name == "mlp.fc2.bias") return {h};
  if (name == "moe.experts.fc1.bias") return {E, fc1_rows};
  if (name == "moe.experts.fc2.bias") return {E, h};
  if (name == "mlp.fc1.bias") return {cfg.expert == ExpertKind::swiglu ? 2 * cfg.mlp_ffn_hidden_size : cfg.mlp_ffn_hidden_size};
  if (name == "moe.gate.weight") return {E, h};
  if (name == "moe.experts.fc1.weight") return {E, fc1_rows, h};
  if (name == "moe.experts.fc2.weight") return {E, h, F};
  const int64_t Fm = cfg.mlp_ffn_hidden_size;
  if (name == "mlp.fc1.weight") return {cfg.expert == ExpertKind::swiglu ? 2 * Fm : Fm, h};
  if (name == "mlp.fc2.weight") return {h, Fm};
  if (name == "mlp.gate.weight") return {1, h};
  AMPIPE_CHECK(false, "unknown parameter {}", name);
}

LayerParams zeros_like_params(const LayerConfig& cfg) {
  LayerParams p;
  auto local = [&](const std::string& name) { return Tensor::zeros(local_shape(cfg, name)); };
  p.ln1_w = local("ln1.weight");
  if (!cfg.rmsnorm()) p.ln1_b = local("ln1.bias");
  p.qkv_w = local("attn.qkv.weight");
  if (cfg.qkv_bias()) p.qkv_b = local("attn.qkv.bias");
  if (cfg.qk_layernorm) {
    p.qn_w = local("attn.q_layernorm.weight");
    p.kn_w = local("attn.k_layernorm.weight");
    if (!cfg.rmsnorm()) {
      p.qn_b = local("attn.q_layernorm.bias");
      p.kn_b = local("attn.k_layernorm.bias");
    }
  }
  p.proj_w = local("attn.proj.weight");
  if (cfg.add_bias_linear) p.proj_b = local("attn.proj.bias");
  p.ln2_w = local("ln2.weight");
  if (!cfg.rmsnorm()) p.ln2_b = local("ln2.bias");
  if (!cfg.dense()) {
    p.gate_w = local("moe.gate.weight");
    p.fc1_w = local("moe.experts.fc1.weight");
    p.fc2_w = local("moe.experts.fc2.weight");
    if (cfg.add_bias_linear) {
      p.fc1_b = local("moe.experts.fc1.bias");
      p.fc2_b = local("moe.experts.fc2.bias");
    }
    if (cfg.moe_router_enable_expert_bias) p.expert_bias = Tensor::zeros({cfg.num_experts});  // Megatron's init: 0
  }
  if (cfg.has_mlp()) {
    p.mlp_fc1_w = local("mlp.fc1.weight");
    p.mlp_fc2_w = local("mlp.fc2.weight");
    if (cfg.add_bias_linear) {  // (LayerConfig::validate: a shared expert has none)
      p.mlp_fc1_b = local("mlp.fc1.bias");
      p.mlp_fc2_b = local("mlp.fc2.bias");
    }
    if (!cfg.dense() && cfg.moe_shared_expert_gate) p.mlp_gate_w = local("mlp.gate.weight");
  }
  return p;
}

LayerParams init_params(const LayerConfig& cfg, int ep_rank, int tp_rank) {
  if (cfg.tp() > 1) {  // the EP-local tensors whole, then this rank's shard of each
    LayerConfig one = cfg;
    one.tensor_model_parallel_size = 1;
    LayerParams whole = init_params(one, ep_rank);
    LayerParams p;
    auto take = [&](const std::string& name, const Tensor& t) {
      return !t.defined() || tp_split(cfg, name).dim < 0 ? t : tp_take(cfg, name, t, tp_rank);
    };
    p.ln1_w = whole.ln1_w;
    p.ln1_b = whole.ln1_b;
    p.qkv_w = take("attn.qkv.weight", whole.qkv_w);
    p.qkv_b = take("attn.qkv.bias", whole.qkv_b);
    p.qn_w = whole.qn_w;
    p.qn_b = whole.qn_b;
    p.kn_w = whole.kn_w;
    p.kn_b = whole.kn_b;
    p.proj_w = take("attn.proj.weight", whole.proj_w);
    p.proj_b = whole.proj_b;
    p.ln2_w = whole.ln2_w;
    p.ln2_b = whole.ln2_b;
    p.gate_w = whole.gate_w;
    p.fc1_w = take("moe.experts.fc1.weight", whole.fc1_w);
    p.fc2_w = take("moe.experts.fc2.weight", whole.fc2_w);
    p.fc1_b = take("moe.experts.fc1.bias", whole.fc1_b);
    p.fc2_b = whole.fc2_b;
    p.mlp_fc1_w = take("mlp.fc1.weight", whole.mlp_fc1_w);
    p.mlp_fc2_w = take("mlp.fc2.weight", whole.mlp_fc2_w);
    p.mlp_fc1_b = take("mlp.fc1.bias", whole.mlp_fc1_b);
    p.mlp_fc2_b = whole.mlp_fc2_b;
    p.mlp_gate_w = whole.mlp_gate_w;
    p.expert_bias = whole.expert_bias;
    return p;
  }
  LayerParams p = zeros_like_params(cfg);
  const core::PhiloxKey key{cfg.seed, uint32_t(cfg.layer_index), core::RngPurpose::init};
  for (auto& [name, t] : p.named()) {
    const uint64_t id = uint64_t(LayerParams::id(name));  // fixed per name (docs/layer.md §8), with or without biases
    if (name.ends_with(".bias")) {  // every bias (the norms', the linear layers')
      t.fill(0.0f);
    } else if (t.dim() == 1) {  // the norms' gains
      t.fill(1.0f);
    } else {
      // Element i of the local shard is element base + i of the full tensor.
      const int64_t base = LayerParams::is_expert(name) ? int64_t(ep_rank) * t.numel() : 0;
      float* w = t.data<float>();
      parallel_for(t.numel(), kElementGrain, [&](int64_t i0, int64_t i1) {  // counter-based: any split
        for (int64_t i = i0; i < i1; ++i)
          w[i] = float(cfg.init_method_std) * core::philox_normal(key, id, uint64_t(base + i));
      });
    }
  }
  return p;
}

}  // namespace ampipe::model
