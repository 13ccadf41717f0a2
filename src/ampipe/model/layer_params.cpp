#include "ampipe/model/layer_params.h"

#include "ampipe/core/philox.h"

namespace ampipe::model {

std::vector<std::pair<std::string, Tensor>> LayerParams::named() {
  return {{"ln1.weight", ln1_w},       {"ln1.bias", ln1_b},   {"attn.qkv.weight", qkv_w},
          {"attn.proj.weight", proj_w}, {"ln2.weight", ln2_w}, {"ln2.bias", ln2_b},
          {"moe.gate.weight", gate_w},  {"moe.experts.fc1.weight", fc1_w}, {"moe.experts.fc2.weight", fc2_w}};
}

bool LayerParams::is_expert(const std::string& name) { return name.rfind("moe.experts.", 0) == 0; }

Shape full_shape(const LayerConfig& cfg, const std::string& name) {
  const int64_t h = cfg.hidden_size, F = cfg.ffn_hidden_size, E = cfg.num_experts;
  const int64_t fc1_rows = cfg.expert == ExpertKind::swiglu ? 2 * F : F;
  if (name == "ln1.weight" || name == "ln1.bias" || name == "ln2.weight" || name == "ln2.bias") return {h};
  if (name == "attn.qkv.weight") return {3 * h, h};
  if (name == "attn.proj.weight") return {h, h};
  if (name == "moe.gate.weight") return {E, h};
  if (name == "moe.experts.fc1.weight") return {E, fc1_rows, h};
  if (name == "moe.experts.fc2.weight") return {E, h, F};
  AMPIPE_CHECK(false, "unknown parameter {}", name);
}

LayerParams zeros_like_params(const LayerConfig& cfg) {
  LayerParams p;
  auto local = [&](const std::string& name) {
    Shape s = full_shape(cfg, name);
    if (LayerParams::is_expert(name)) s[0] = cfg.local_experts();
    return Tensor::zeros(s);
  };
  p.ln1_w = local("ln1.weight");
  p.ln1_b = local("ln1.bias");
  p.qkv_w = local("attn.qkv.weight");
  p.proj_w = local("attn.proj.weight");
  p.ln2_w = local("ln2.weight");
  p.ln2_b = local("ln2.bias");
  p.gate_w = local("moe.gate.weight");
  p.fc1_w = local("moe.experts.fc1.weight");
  p.fc2_w = local("moe.experts.fc2.weight");
  return p;
}

LayerParams init_params(const LayerConfig& cfg, int ep_rank) {
  LayerParams p = zeros_like_params(cfg);
  const core::PhiloxKey key{cfg.seed, uint32_t(cfg.layer_index), core::RngPurpose::init};
  uint64_t id = 0;
  for (auto& [name, t] : p.named()) {
    if (name == "ln1.weight" || name == "ln2.weight") {
      t.fill(1.0f);
    } else if (name == "ln1.bias" || name == "ln2.bias") {
      t.fill(0.0f);
    } else {
      // Element i of the local shard is element base + i of the full tensor.
      const int64_t base = LayerParams::is_expert(name) ? int64_t(ep_rank) * t.numel() : 0;
      float* w = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i)
        w[i] = float(cfg.init_method_std) * core::philox_normal(key, id, uint64_t(base + i));
    }
    ++id;
  }
  return p;
}

}  // namespace ampipe::model
