// Shape and options of one pre-LN GPT block with an MoE FFN (docs/layer.md has every rule).
//
// Notation (docs/design.md, "Notation and names"): s sequence length, b micro-batch, h hidden, F FFN hidden, n heads, d = h/n head dim,
// E experts, k router top-k, ep expert-parallel size, L = E/ep local experts, M AMPipe degree,
// S_c = s/M * b tokens of one chunk, C_c the chunk's expert capacity.
#pragma once

#include <cstdint>
#include <string>

#include "ampipe/core/dtype.h"
#include "ampipe/model/gate.h"

namespace ampipe::model {

enum class ExpertKind : uint8_t { gelu, swiglu };

struct LayerConfig {
  int64_t seq_length = 64;        // s
  int64_t micro_batch_size = 1;   // b
  int64_t hidden_size = 64;       // h
  int64_t ffn_hidden_size = 256;  // F
  int64_t num_attention_heads = 4;  // n
  int64_t num_experts = 4;          // E
  int moe_router_topk = 2;          // k
  double moe_train_capacity_factor = 1.0;
  int64_t moe_min_capacity = 4;
  bool moe_no_drop = false;
  bool use_rts = true;  // random token selection, top-1 only
  NoisyGatePolicy noisy_gate_policy = NoisyGatePolicy::none;
  ExpertKind expert = ExpertKind::gelu;  // --swiglu selects SwiGLU experts
  double hidden_dropout = 0.0;
  float layernorm_epsilon = 1e-5f;
  double init_method_std = 0.02;
  uint64_t seed = 1234;
  int layer_index = 0;      // part of every random key
  bool bf16 = false;        // bf16 GEMM inputs, fp32 accumulation, fp32 master weights
  bool training = true;     // false (evaluation): no dropout, no gate noise (Jitter/RSample); RTS still applies
  int expert_model_parallel_size = 1;  // ep

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t tokens() const { return seq_length * micro_batch_size; }
  int64_t local_experts() const { return num_experts / expert_model_parallel_size; }
  DType compute_dtype() const { return bf16 ? DType::bf16 : DType::f32; }
  float dropout_p() const { return training ? float(hidden_dropout) : 0.0f; }

  // Throws ConfigError naming the flag, value and rule for a config that cannot work.
  void validate() const;
};

}  // namespace ampipe::model
