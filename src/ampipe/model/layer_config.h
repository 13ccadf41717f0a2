// Shape and options of one pre-LN GPT block with an MoE FFN (docs/layer.md has every rule).
//
// Notation (docs/design.md, "Notation and names"): s sequence length, b micro-batch, h hidden, F FFN hidden, n heads, d = h/n head dim,
// E experts, k router top-k, ep expert-parallel size, L = E/ep local experts, M AMPipe degree,
// S_c = s/M * b tokens of one chunk, C_c the chunk's expert capacity.
#pragma once

#include <cstdint>
#include <string>

#include "ampipe/core/dtype.h"
#include "ampipe/kernels/rope.h"
#include "ampipe/model/gate.h"

namespace ampipe::model {

enum class ExpertKind : uint8_t { gelu, swiglu };

// The block's normalisation (Megatron's --normalization): LayerNorm (weight and bias) or RMSNorm (weight only;
// the block then has no ln1.bias, ln2.bias, nor the model final_layernorm.bias).
enum class Normalization { layernorm, rmsnorm };

// How the model knows positions (Megatron's --position-embedding-type): a learned [max positions, h] table added to
// the token embeddings (learned_absolute), rotary embeddings of q and k in every block (rope), or nothing (none).
enum class PositionEmbedding { learned_absolute, rope, none };
const char* position_embedding_name(PositionEmbedding p);  // Megatron's spelling
// From Megatron's spelling (ConfigError for another).
PositionEmbedding position_embedding_from_name(const std::string& name);

struct LayerConfig {
  int64_t seq_length = 64;        // s
  int64_t micro_batch_size = 1;   // b
  int64_t hidden_size = 64;       // h
  int64_t ffn_hidden_size = 256;  // F
  int64_t num_attention_heads = 4;  // n
  // Grouped-query attention (--group-query-attention --num-query-groups g): g K, V heads, each shared by n/g
  // consecutive query heads. 0: g = n (multi-head attention).
  int64_t num_query_groups = 0;
  PositionEmbedding position_embedding = PositionEmbedding::learned_absolute;
  // Rotary embeddings (position_embedding rope; kernels/rope.h): --rotary-base, --rotary-percent (rotated share of
  // each head's channels), --rotary-interleaved, --rotary-seq-len-interpolation-factor (0: none), --use-rope-scaling
  // with --rope-scaling-factor (Llama 3).
  double rotary_base = 10000;
  double rotary_percent = 1.0;
  bool rotary_interleaved = false;
  int64_t rotary_interpolation_factor = 0;
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0;
  int64_t num_experts = 4;          // E; 0: a dense layer (no router, no experts: the dense MLP below is its FFN)
  // The block's dense MLP (model/mlp_block.h), of F_m = mlp_ffn_hidden_size (0: none): beside the routed experts
  // Megatron-Core's shared expert (--moe-shared-expert-intermediate-size), every token through it and its output
  // added to theirs; in a dense layer (num_experts 0: --moe-layer-freq, --first-k-dense-replace, or a GPT without
  // --num-experts) the layer's FFN (--ffn-hidden-size). Same activation as the experts (--swiglu).
  int64_t mlp_ffn_hidden_size = 0;
  int moe_router_topk = 2;          // k
  double moe_train_capacity_factor = 1.0;
  int64_t moe_min_capacity = 4;
  bool moe_no_drop = false;
  // --moe-model-type: DeepSpeed-MoE's gate (deepspeed_moe) or Megatron-Core's dropless top-k router (megatron_moe,
  // model/gate.h Router) with --moe-router-pre-softmax, --moe-router-topk-scaling-factor (0: none) and
  // --moe-router-load-balancing-type aux_loss, seq_aux_loss, sinkhorn or none, --moe-router-score-function, group-limited
  // routing (--moe-router-num-groups, --moe-router-group-topk; 0: none) and the expert bias
  // (--moe-router-enable-expert-bias, updated by --moe-router-bias-update-rate after each step).
  Router moe_router = Router::deepspeed;
  bool moe_router_pre_softmax = false;
  double moe_router_topk_scaling_factor = 0;
  Balancing moe_router_load_balancing = Balancing::aux_loss;
  ScoreFunction moe_router_score_function = ScoreFunction::softmax;
  int moe_router_num_groups = 0, moe_router_group_topk = 0;
  bool moe_router_enable_expert_bias = false;
  // Megatron-Core's expert capacity (megatron_moe; model/gate.h): --moe-expert-capacity-factor f (< 0, Megatron's
  // None: no capacity, the router is dropless), each chunk's S tokens giving every expert min(S, ceil(S k / E * f))
  // slots; --moe-pad-expert-input-to-capacity (every expert's input padded to the capacity: a fixed capacity, as
  // pipe-experts needs); --moe-token-drop-policy (probs: the lowest routing weights are dropped; position: the last
  // tokens).
  double moe_expert_capacity_factor = -1;
  bool moe_pad_expert_input_to_capacity = false;
  DropPolicy moe_token_drop_policy = DropPolicy::probs;
  double moe_router_bias_update_rate = 1e-3;
  double moe_z_loss_coeff = 0.0;  // --moe-z-loss-coeff (megatron_moe; model/gate.h GateConfig::z_loss_coeff)
  bool use_rts = true;  // random token selection, top-1 only
  NoisyGatePolicy noisy_gate_policy = NoisyGatePolicy::none;
  ExpertKind expert = ExpertKind::gelu;  // --swiglu selects SwiGLU experts
  // --moe-grouped-gemm: the local experts' GEMMs of a chunk (forward) and their deferred weight gradients as one
  // batched GEMM call each (kernels::gemm_batched) instead of one call per expert; the same products.
  bool moe_grouped_gemm = false;
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;  // on the attention probabilities (kernels::AttentionDropout)
  float layernorm_epsilon = 1e-5f;  // --norm-epsilon, for either normalisation
  Normalization normalization = Normalization::layernorm;  // --normalization LayerNorm | RMSNorm
  // --qk-layernorm: q and k of every head normalised over its d channels (the block's normalisation, weights [d]
  // shared by the heads) after the QKV projection, before RoPE (Megatron-Core's q_layernorm / k_layernorm).
  bool qk_layernorm = false;
  bool add_qkv_bias = false;
  // --add-bias-linear (Megatron's add_bias_linear; --disable-bias-linear turns it off): biases in the out-projection,
  // the experts' fc1 and fc2 and a dense layer's MLP (docs/layer.md §2, §6, §7), and in QKV (add_qkv_bias is set
  // with it, as Megatron's QKV bias is add_bias_linear or add_qkv_bias). Megatron-Core's shared expert has none.
  bool add_bias_linear = false;
  // --moe-shared-expert-gate: the shared expert's output scaled per token by sigmoid(x2 . g), g = mlp.gate.weight
  // [1, h] (Megatron-Core's SharedExpertMLP gate, Qwen2-MoE's shared_expert_gate); MoE blocks with a shared expert
  bool moe_shared_expert_gate = false;  // --add-qkv-bias: the QKV projection has a bias (Qwen2's); the other linears none
  double init_method_std = 0.02;
  uint64_t seed = 1234;
  int layer_index = 0;      // part of every random key
  bool bf16 = false;        // bf16 GEMM inputs, fp32 accumulation, fp32 master weights
  bool training = true;     // false (evaluation): no dropout, no gate noise (Jitter/RSample); RTS still applies
  int expert_model_parallel_size = 1;  // ep
  // pipe-experts (docs/ampipe.md, "pipe-experts"): the MoE MLP of each chunk is cut into pieces, one per (local
  // expert, capacity slice), each with its own dispatch and combine all-to-all, so that one piece's all-to-all
  // overlaps another's expert GEMMs. N = pipe_experts_multi_data slices per expert over the layer step (N / M per
  // AMPipe chunk).
  bool use_pipe_experts = false;
  int pipe_experts_multi_data = 1;  // N
  bool pipe_experts_multi_stream = false;  // with --sequence-parallel: the pieces' tensor-parallel collectives overlap
  // Tensor parallelism (docs/ampipe.md, "Tensor and sequence parallelism"): Megatron's column/row-parallel
  // attention and experts over the tp ranks of one layer; with sequence_parallel the residual-stream regions
  // (LayerNorms, dropout, residual, gate, weighted sum) hold s/tp rows per rank (in AMPipe's permuted order: every
  // chunk is spread over all tp ranks). ampipe_tp_sp_comm_overlap: the experts' tp collectives run per (chunk,
  // local expert) piece, overlapped with other pieces' expert GEMMs.
  int tensor_model_parallel_size = 1;  // t
  bool sequence_parallel = false;
  bool ampipe_tp_sp_comm_overlap = false;
  // Context parallelism (docs/ampipe.md §6): the sequence is spread over the cp ranks (two load-balanced halves
  // each, model/context_parallel.h) and attention runs as a ring over them. seq_length stays the whole sequence;
  // the layer runs on seq_length / cp rows per rank.
  int context_parallel_size = 1;  // C
  std::string context_parallel_algo = "megatron_cp_algo";
  // Activation recomputation of this layer (set per layer by the stack driver from --recompute-granularity full,
  // schedule::LayerStack::set_recompute): the layer keeps only its output and input gradient between steps of its
  // own; everything else its backward reads is in the stack's shared memory, refilled by re-running its forward
  // (the same Plan, the same random numbers) just before its backward.
  bool recompute = false;
  // Selective recomputation (--recompute-granularity selective, Megatron's "core attention" recompute): the
  // attention output and its log-sum-exp are not kept for the backward; each chunk's attention forward re-runs
  // just before its attention backward (Stage::attention_recompute).
  bool recompute_attention = false;

  bool rmsnorm() const { return normalization == Normalization::rmsnorm; }
  bool qkv_bias() const { return add_qkv_bias || add_bias_linear; }  // Megatron's: add_bias_linear or add_qkv_bias
  bool dense() const { return num_experts == 0; }
  bool has_mlp() const { return mlp_ffn_hidden_size > 0; }
  // This block as a dense layer of the same model: no experts, the dense MLP of F_m = ffn (the model's
  // --ffn-hidden-size), the MoE-only options (pipe-experts) off.
  LayerConfig as_dense(int64_t ffn) const;
  bool megatron_router() const { return moe_router == Router::megatron; }
  // Megatron-Core's router with a capacity (--moe-expert-capacity-factor >= 0).
  bool megatron_capacity() const { return megatron_router() && moe_expert_capacity_factor >= 0; }
  // No token is ever dropped: --moe-no-drop, or Megatron-Core's router without a capacity factor.
  bool dropless() const { return moe_no_drop || (megatron_router() && !megatron_capacity()); }
  // Every chunk's expert capacity is the planned one (DeepSpeed-MoE's capacity, or Megatron's padded to it); else it
  // is known after routing, at most the planned one (dropless, or Megatron's capacity without padding).
  bool fixed_capacity() const {
    return !dropless() && !(megatron_capacity() && !moe_pad_expert_input_to_capacity);
  }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  bool rope() const { return position_embedding == PositionEmbedding::rope; }
  // The rotation of q and k (rot_dim = int(d * rotary_percent), Megatron's; 0 without rope).
  kernels::RopeSpec rope_spec() const;
  int64_t tokens() const { return seq_length * micro_batch_size; }
  int64_t local_experts() const { return num_experts / expert_model_parallel_size; }
  int tp() const { return tensor_model_parallel_size; }
  bool sp() const { return sequence_parallel && tensor_model_parallel_size > 1; }
  int cp() const { return context_parallel_size; }
  DType compute_dtype() const { return bf16 ? DType::bf16 : DType::f32; }
  float dropout_p() const { return training ? float(hidden_dropout) : 0.0f; }
  float attention_dropout_p() const { return training ? float(attention_dropout) : 0.0f; }

  // Throws ConfigError naming the flag, value and rule for a config that cannot work.
  void validate() const;
  void validate_shapes() const;    // the parts of validate()
  void validate_rope() const;
  void validate_router() const;
  void validate_parallel() const;
  // The pipe-experts rules that need the AMPipe degree M (MindSpeed's AMPipe rules and pipe-experts checks, as errors
  // where MindSpeed silently switched the feature off): N divisible by M and N > M, N / M slices per chunk at most
  // the chunk's expert capacity, not with --moe-no-drop. Throws ConfigError. Returns a notice (one line) when the
  // feature has nothing to pipeline (one local expert and N = 1, MindSpeed's warning case) and is run without it;
  // the caller then sets use_pipe_experts = false. Returns "" otherwise.
  std::string check_pipe_experts(int M) const;
  // The tensor- and context-parallel rules that need the AMPipe degree M: with --sequence-parallel the sequence
  // divisible by M x tp (every chunk spread evenly over the tp ranks); --ampipe-tp-sp-comm-overlap needs M > 1 and
  // tp > 1; with cp > 1 the sequence divisible by 2 x cp x M (x tp with --sequence-parallel). Throws ConfigError.
  void check_tensor_parallel(int M) const;
  // The context-parallel part of it alone (every command checks it for each degree it runs).
  void check_context_parallel(int M) const;
  // --moe-aux-loss-coeff against the router: >= 0, and 0 with sinkhorn balancing (Megatron asserts it: sinkhorn
  // routing has no aux loss). Throws ConfigError.
  void check_aux_loss_coeff(double coeff) const;
};

}  // namespace ampipe::model
