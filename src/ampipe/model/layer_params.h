// Parameters of one MoE block, named and shaped as in docs/layer.md. Names and full shapes never depend on how the
// work is split (AMPipe degree, EP size, TP size): an EP rank holds rows [r*L, (r+1)*L) of the expert tensors
// (dim 0 = global expert), a TP rank its Megatron shard of the GEMM weights (tp_split below), and exports and
// checkpoints gather them back to the full tensors.
//
//   ln1.weight [h]  ln1.bias [h] (LayerNorm only; RMSNorm has no biases)
//   attn.qkv.weight  [3h, h]   y = x W^T; output columns [q | k | v], head i = columns [i*d, (i+1)*d) of each;
//                              grouped-query attention: [(n + 2g)d, h], k and v of g heads
//   attn.qkv.bias    [3h]      (--add-qkv-bias) y = x W^T + b, the same [q | k | v] layout and tp cut as the rows
//   attn.q_layernorm.weight [d]  attn.q_layernorm.bias [d]  (--qk-layernorm; bias with LayerNorm only)
//   attn.k_layernorm.weight [d]  attn.k_layernorm.bias [d]  (shared by all heads: every tp rank holds them whole)
//   attn.proj.weight [h, h]
//   attn.proj.bias [h]         (--add-bias-linear, as every bias below) added after the tp reduction, before dropout
//   ln2.weight [h]  ln2.bias [h]
//   moe.gate.weight  [E, h]    fp32 logits = x W^T
//   moe.experts.fc1.weight [E, F, h] (GeLU) or [E, 2F, h] (SwiGLU: rows [0, F) gate branch a, [F, 2F) value g)
//   moe.experts.fc2.weight [E, h, F]
//   moe.experts.fc1.bias [E, F] or [E, 2F]   moe.experts.fc2.bias [E, h]   (biases initialised to 0, as Megatron's)
//   mlp.fc1.weight [F_m, h] or [2F_m, h] (SwiGLU, as the experts')   the dense MLP (a shared expert, or a dense
//   mlp.fc2.weight [h, F_m]                                          layer's FFN; LayerConfig::mlp_ffn_hidden_size)
//   mlp.fc1.bias [F_m] or [2F_m]   mlp.fc2.bias [h]                    (a dense layer's MLP only: Megatron-Core's
//                                                                    shared expert has no biases)
//   mlp.gate.weight [1, h]     --moe-shared-expert-gate: the shared expert's output times sigmoid(x2 g^T)
// A dense layer (LayerConfig::dense) has no moe.* tensors.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ampipe/core/tensor.h"
#include "ampipe/model/layer_config.h"

namespace ampipe::model {

struct LayerParams {
  Tensor ln1_w, ln1_b;  // [h]
  Tensor qkv_w;         // [3h, h] ([(n + 2g)d, h] with grouped-query attention)
  Tensor qkv_b;         // [3h] ([(n + 2g)d]) --add-qkv-bias (undefined without)
  Tensor qn_w, qn_b;    // [d] --qk-layernorm: the norm of q (bias with LayerNorm only)
  Tensor kn_w, kn_b;    // [d] the norm of k
  Tensor proj_w;        // [h, h]
  Tensor proj_b;        // [h] --add-bias-linear (undefined without; so are the four biases below)
  Tensor ln2_w, ln2_b;  // [h]
  Tensor gate_w;        // [E, h]
  Tensor fc1_w;         // [L, F or 2F, h]: this rank's experts
  Tensor fc2_w;         // [L, h, F]
  Tensor fc1_b;         // [L, F or 2F]: this rank's experts' fc1 biases (tp: the rows of its fc1 shard)
  Tensor fc2_b;         // [L, h] (every tp rank holds it whole; tp rank 0 adds it before the partial sums' reduce)
  Tensor mlp_fc1_w;     // [F1_m, h]: the dense MLP (undefined without one)
  Tensor mlp_fc2_w;     // [h, F_m]
  Tensor mlp_fc1_b;     // [F1_m] (tp: the rows of the fc1 shard)
  Tensor mlp_fc2_b;     // [h] added after the tp reduction
  Tensor mlp_gate_w;    // [1, h] --moe-shared-expert-gate: the shared expert's gate (every tp rank holds it whole)
  // --moe-router-enable-expert-bias (model/gate.h): router state that is not trained and not in named(). In the
  // parameters: the bias [E] fp32 (moe.gate.expert_bias in checkpoints, every rank the same); in the gradients:
  // the tokens routed to each expert [E] fp32 so far this step, which the bias update reads and zeroes.
  Tensor expert_bias;

  // (name, tensor) pairs in a fixed order; the tensors are views (writes go to the parameters). With RMSNorm the
  // biases are undefined and not listed.
  std::vector<std::pair<std::string, Tensor>> named();
  // The parameter's id (its index in the LayerNorm block's list above): the initialisation's Philox token.
  static int id(const std::string& name);
  // True for parameters that are sharded over EP (the experts').
  static bool is_expert(const std::string& name);
  // True for parameters that every TP rank holds whole and that see only the rank's rows with sequence
  // parallelism (LayerNorms and the gate): their gradients are summed over the tp group.
  static bool is_sequence_parallel(const std::string& name);
  // True for the q and k norms (--qk-layernorm): every tp rank holds them whole but sees only its heads, so their
  // gradients are summed over the tp group whenever tp > 1 (Megatron-Core's finalize_model_grads).
  static bool is_qk_norm(const std::string& name);
  // True for --add-bias-linear's biases (attn.proj, the experts' and the dense MLP's fc1 and fc2).
  static bool is_linear_bias(const std::string& name);
  // The gradient of `name` on a tp rank is a partial sum over the tp group (sequence-parallel rows or local heads).
  static bool tp_partial_grad(const LayerConfig& cfg, const std::string& name);
};

// How a TP rank's shard is cut from the (EP-local) tensor: viewed as `view`, dim `dim` is split into t equal
// blocks and rank r keeps block r (dim -1: not sharded, every rank holds it whole).
//   attn.qkv.weight [(n + 2g)d, h], dim 0 as segments q (n*d rows), k (g*d), v (g*d): the q rows of the local heads
//                   and the k, v rows of their local query groups, local layout [q|k|v]
//   attn.proj.weight [h, h], dim 1: the local heads' input columns (row-parallel)
//   moe.experts.fc1.weight [L, F, h], dim 1 (SwiGLU [L, 2, F, h], dim 2: the same F/t rows of both branches)
//   moe.experts.fc2.weight [L, h, F], dim 2 (row-parallel)
//   mlp.fc1.weight [F_m, h], dim 0 (SwiGLU [2, F_m, h], dim 1); mlp.fc2.weight [h, F_m], dim 1
//   the fc1 biases as their weights' rows: moe.experts.fc1.bias [L, F] dim 1 (SwiGLU [L, 2, F] dim 2),
//   mlp.fc1.bias [F_m] dim 0 (SwiGLU [2, F_m] dim 1); the row-parallel layers' biases are not sharded
struct TpSplit {
  Shape view;
  int dim = -1;
  // When set, dim `dim` is these segments one after the other (their sum), and each is cut into t blocks: rank r
  // keeps block r of every segment (attn.qkv.weight: q, k, v).
  std::vector<int64_t> segments;
};
TpSplit tp_split(const LayerConfig& cfg, const std::string& name);
// Rank r's shard of `whole` (the EP-local tensor), shaped as the local parameter.
Tensor tp_take(const LayerConfig& cfg, const std::string& name, const Tensor& whole, int r);
// The EP-local tensor from every rank's shard, `shards` = [t, shard numel] in tp-rank order (an all-gather).
Tensor tp_join(const LayerConfig& cfg, const std::string& name, const Tensor& shards, const Shape& whole_shape);

// The block's parameter names for `cfg`, in named() order (the LayerNorm biases only with LayerNorm).
std::vector<std::string> param_names(const LayerConfig& cfg);

// Zero-filled parameters (or gradients) of the local shapes for `cfg` (EP shard, TP shard).
LayerParams zeros_like_params(const LayerConfig& cfg);

// Initialises the full weights from the seed and keeps EP rank `ep_rank`'s shard (docs/design.md, "Numerics and determinism": same
// seed, same weights, whatever the layout). LayerNorm weights 1, biases 0; every matrix element
// init_method_std * philox_normal(key = (seed, layer, init), token = parameter id, feature = flat index in the
// FULL tensor), parameter ids in the order of named(): qkv 2, proj 3, gate 6, fc1 7, fc2 8, mlp.fc1 9, mlp.fc2 10.
// With tp > 1 each rank initialises its EP-local tensors whole and keeps its TP shard.
LayerParams init_params(const LayerConfig& cfg, int ep_rank, int tp_rank = 0);

// Shape of a full (unsharded) parameter.
Shape full_shape(const LayerConfig& cfg, const std::string& name);

}  // namespace ampipe::model
