#include "ampipe/schedule/memory_estimate.h"

#include <algorithm>

#include "ampipe/core/error.h"
#include "ampipe/core/host_memory.h"
#include "ampipe/model/layer_params.h"
#include "ampipe/model/size_check.h"
#include "ampipe/schedule/plan.h"

namespace ampipe::schedule {

int64_t MemoryEstimate::total() const {
  int64_t t = 0;
  for (const Part& p : parts) t = model::checked_add(t, p.bytes, "the estimated memory");
  return t;
}

int64_t MemoryEstimate::bytes(const std::string& name) const {
  for (const Part& p : parts)
    if (p.name == name) return p.bytes;
  return 0;
}

void MemoryEstimate::add(const std::string& name, int64_t bytes) {
  for (Part& p : parts)
    if (p.name == name) {
      p.bytes = model::checked_add(p.bytes, bytes, "the estimated memory");
      return;
    }
  parts.push_back({name, bytes});
}

std::string MemoryEstimate::describe() const {
  std::vector<const Part*> order;
  for (const Part& p : parts)
    if (p.bytes > 0) order.push_back(&p);
  std::stable_sort(order.begin(), order.end(), [](const Part* a, const Part* b) { return a->bytes > b->bytes; });
  std::string list;
  for (const Part* p : order)
    list += fmt::format("{}{} {}", list.empty() ? "" : ", ", p->name, core::format_bytes(double(p->bytes)));
  return fmt::format("{} ({})", core::format_bytes(double(total())), list);
}

LayerParamCounts layer_param_counts(const model::LayerConfig& cfg) {
  // The parameters of model::LayerParams (docs/layer.md); a test checks this list against a LayerStack's tensors.
  LayerParamCounts n;
  for (const std::string& name : model::param_names(cfg)) {
    int64_t e = 1;
    for (int64_t d : model::full_shape(cfg, name)) e = model::checked_mul(e, d, "a layer parameter's size");
    if (model::LayerParams::is_expert(name)) e /= cfg.expert_model_parallel_size;  // this EP rank's experts
    if (cfg.tp() > 1 && model::tp_split(cfg, name).dim >= 0) e /= cfg.tp();         // this tp rank's shard
    n.params = model::checked_add(n.params, e, "a layer's parameter count");
    const std::string& s = name;
    if (s == "attn.qkv.weight" || s == "attn.proj.weight" || s == "moe.experts.fc1.weight" ||
        s == "moe.experts.fc2.weight" || s == "mlp.fc1.weight" || s == "mlp.fc2.weight")
      n.bf16_copies += e;
  }
  return n;
}

MemoryEstimate estimate_layer_stack(const model::LayerConfig& cfg, int num_layers, int M,
                                    const std::vector<bool>& recompute) {
  return estimate_layer_stack(std::vector<model::LayerConfig>(size_t(std::max(num_layers, 0)), cfg), M, recompute);
}

MemoryEstimate estimate_layer_stack(const std::vector<model::LayerConfig>& layers, int M,
                                    const std::vector<bool>& recompute, int slots) {
  // As LayerStack carves its arena: every layer's saved region, then the largest shared region (without
  // recomputation Plan::planned_bytes summed over the layers), in checked arithmetic. The layers differ only in
  // being dense or MoE and recomputed or not: one Plan per kind.
  struct Kind {
    bool dense = false, recompute = false;
    int64_t params = 0, bf16_copies = 0, saved = 0, shared = 0;
  };
  std::vector<Kind> kinds;
  int64_t params = 0, bf16_copies = 0, saved = 0, shared = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    model::LayerConfig c = layers[i];
    c.recompute = i < recompute.size() && recompute[i];
    auto k = std::find_if(kinds.begin(), kinds.end(),
                          [&](const Kind& x) { return x.dense == c.dense() && x.recompute == c.recompute; });
    if (k == kinds.end()) {
      const LayerParamCounts n = layer_param_counts(c);
      const Plan p = build_layer_plan(c, M);
      kinds.push_back({c.dense(), c.recompute, n.params, n.bf16_copies, int64_t(p.memory.saved_bytes),
                       int64_t(p.memory.shared_bytes)});
      k = kinds.end() - 1;
    }
    params = model::checked_add(params, model::checked_mul(k->params, 4, "a layer's parameter bytes"),
                                "--num-layers x a layer's parameter bytes");
    bf16_copies = model::checked_add(bf16_copies, model::checked_mul(k->bf16_copies, 2, "bf16 copies"), "bf16 copies");
    saved = model::checked_add(saved, k->saved, "--num-layers x a layer's saved buffers");
    shared = std::max(shared, k->shared);
  }
  MemoryEstimate e;
  e.add("parameters", params);
  e.add("gradients", params);
  if (!layers.empty() && layers.front().bf16) e.add("bf16 weight copies", bf16_copies);
  saved = model::checked_mul(saved, std::max(1, slots), "the saved buffers of the micro-batches in flight");
  e.add("activations + communication (planned)", model::checked_add(saved, shared, "the planned buffers"));
  return e;
}

std::string memory_fit_error(const MemoryEstimate& estimate, int64_t in_use_bytes, int64_t limit_bytes,
                             int ranks_on_host) {
  if (limit_bytes == 0) return "";
  const int64_t total = estimate.total();
  if (limit_bytes > 0) {
    if (total <= limit_bytes) return "";
    return fmt::format("the estimated peak memory of this rank, {}, exceeds --memory-limit {} ({} bytes): use "
                       "smaller sizes, more ranks, or a larger --memory-limit (0 turns the check off)",
                       estimate.describe(), core::format_bytes(double(limit_bytes)), limit_bytes);
  }
  const core::HostMemory host = core::available_memory();
  if (host.bytes < 0) return "";  // nothing to compare with (no /proc): the run goes ahead
  const int r = std::max(ranks_on_host, 1);
  const int64_t share = host.bytes / r;
  const int64_t to_allocate = std::max<int64_t>(total - std::max<int64_t>(in_use_bytes, 0), 0);
  if (to_allocate <= share) return "";
  return fmt::format("the estimated peak memory of this rank, {}, does not fit: {} of it is still to be allocated, "
                     "and {} is available ({} {}{}): use smaller sizes or more hosts, or pass --memory-limit BYTES "
                     "(0 turns the check off)",
                     estimate.describe(), core::format_bytes(double(to_allocate)), core::format_bytes(double(share)),
                     host.source, core::format_bytes(double(host.bytes)),
                     r > 1 ? fmt::format(" / {} ranks on this host", r) : std::string());
}

}  // namespace ampipe::schedule
