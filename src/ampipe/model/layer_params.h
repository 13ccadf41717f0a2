// Parameters of one MoE block, named and shaped as in docs/layer.md. Names and shapes never depend on how the
// work is split (AMPipe degree, EP size): an EP rank holds rows [r*L, (r+1)*L) of the expert tensors (dim 0 =
// global expert), and exports gather them back to the full tensor.
//
//   ln1.weight [h]  ln1.bias [h]
//   attn.qkv.weight  [3h, h]   y = x W^T; output columns [q | k | v], head i = columns [i*d, (i+1)*d) of each
//   attn.proj.weight [h, h]
//   ln2.weight [h]  ln2.bias [h]
//   moe.gate.weight  [E, h]    fp32 logits = x W^T
//   moe.experts.fc1.weight [E, F, h] (GeLU) or [E, 2F, h] (SwiGLU: rows [0, F) gate branch a, [F, 2F) value g)
//   moe.experts.fc2.weight [E, h, F]
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ampipe/core/tensor.h"
#include "ampipe/model/layer_config.h"

namespace ampipe::model {

struct LayerParams {
  Tensor ln1_w, ln1_b;  // [h]
  Tensor qkv_w;         // [3h, h]
  Tensor proj_w;        // [h, h]
  Tensor ln2_w, ln2_b;  // [h]
  Tensor gate_w;        // [E, h]
  Tensor fc1_w;         // [L, F or 2F, h]: this rank's experts
  Tensor fc2_w;         // [L, h, F]

  // (name, tensor) pairs in a fixed order; the tensors are views (writes go to the parameters).
  std::vector<std::pair<std::string, Tensor>> named();
  // True for parameters that are sharded over EP (the experts').
  static bool is_expert(const std::string& name);
};

// Zero-filled parameters (or gradients) of the local shapes for `cfg` on EP rank `ep_rank`.
LayerParams zeros_like_params(const LayerConfig& cfg);

// Initialises the full weights from the seed and keeps EP rank `ep_rank`'s shard (docs/design.md, "Numerics and determinism": same
// seed, same weights, whatever the layout). LayerNorm weights 1, biases 0; every matrix element
// init_method_std * philox_normal(key = (seed, layer, init), token = parameter id, feature = flat index in the
// FULL tensor), parameter ids in the order of named(): qkv 2, proj 3, gate 6, fc1 7, fc2 8.
LayerParams init_params(const LayerConfig& cfg, int ep_rank);

// Shape of a full (unsharded) parameter.
Shape full_shape(const LayerConfig& cfg, const std::string& name);

}  // namespace ampipe::model
