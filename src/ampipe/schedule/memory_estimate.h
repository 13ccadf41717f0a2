// This rank's peak memory, estimated from shapes alone before anything is allocated (docs/training.md, "Memory";
// docs/plan.md, section 5). The layer part is here, for a stack of layers as schedule::LayerStack holds it: the
// parameters and their gradients (this rank's shard: expert tensors / ep, attention and expert matrices / tp, as
// model::LayerParams holds them), the bf16 weight copies (--bf16), and the Plan's planned buffers
// (Plan::planned_bytes: every activation, saved context and communication buffer of a step). train/ adds the
// model around the stack (train/memory_estimate.h); layer-check, bench-layer and plan use this part directly.
//
// Every count is taken with overflow-checked arithmetic (model/size_check.h): a size that does not fit is a
// ConfigError, never a wrapped number.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampipe/model/layer_config.h"

namespace ampipe::schedule {

struct MemoryEstimate {
  struct Part {
    std::string name;  // "parameters", "gradients", "optimizer state", "activations + communication (planned)", ...
    int64_t bytes = 0;
  };
  std::vector<Part> parts;

  int64_t total() const;  // the sum of the parts (checked)
  int64_t bytes(const std::string& name) const;  // one part's bytes, 0 if absent
  // Adds `bytes` to the part `name` (created at the end if new); checked.
  void add(const std::string& name, int64_t bytes);
  // "1.23 GiB (parameters 10.0 MiB, gradients 10.0 MiB, ...)": the total and every non-empty part, largest first.
  std::string describe() const;
};

// Elements of this rank's shard of one layer's parameters (expert tensors / ep, tp-split matrices / tp), and the
// elements of the matrices that --bf16 keeps a bf16 copy of (qkv, proj, fc1, fc2).
struct LayerParamCounts {
  int64_t params = 0, bf16_copies = 0;
};
LayerParamCounts layer_param_counts(const model::LayerConfig& cfg);

// A stack of `num_layers` layers at degree M on one rank: "parameters", "gradients", "bf16 weight copies" (bf16
// only) and "activations + communication (planned)" = Plan::planned_bytes(num_layers) of build_layer_plan(cfg, M).
// With activation recomputation, `recompute` flags the layers that recompute (one per layer, as
// LayerStack::set_recompute takes them; empty: none): such a layer's Plan keeps only its output and input gradient
// as its own and plans the rest in the shared region, as the stack's arena does (each layer's saved bytes, plus the
// largest shared region). For several degrees sharing one stack (bench-layer), take the largest of their estimates.
MemoryEstimate estimate_layer_stack(const model::LayerConfig& cfg, int num_layers, int M,
                                    const std::vector<bool>& recompute = {});
// The same for a stack whose layers differ (dense and MoE blocks), one config per layer; `slots` copies of the saved
// buffers (a pipeline stage's micro-batches in flight, LayerStack::set_slots).
MemoryEstimate estimate_layer_stack(const std::vector<model::LayerConfig>& layers, int M,
                                    const std::vector<bool>& recompute = {}, int slots = 1);

// Where the estimate is compared with what this host can give (train, layer-check, bench-layer): refuses when
// `estimate` does not fit. limit_bytes > 0: --memory-limit (the peak this rank may use), compared with the total;
// limit_bytes == 0: no check; limit_bytes < 0: the host's available memory (core::available_memory()) shared by
// `ranks_on_host` ranks, compared with what is still to be allocated (the total minus `in_use_bytes`, what this
// process already holds and the estimate counts). Returns "" when it fits, else the one-line reason (the caller
// throws it on every rank together).
std::string memory_fit_error(const MemoryEstimate& estimate, int64_t in_use_bytes, int64_t limit_bytes,
                             int ranks_on_host);

}  // namespace ampipe::schedule
