// Flags that describe one MoE layer (Megatron / MindSpeed names), shared by layer-check, bench-layer, plan and train.
// The flags themselves (names, help, defaults' display) are declared in flag_registry.cpp; these are their fields.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ampipe/comm/group.h"
#include "ampipe/model/layer_config.h"

namespace ampipe::cli {

struct LayerFlags {
  LayerFlags() { cfg.ffn_hidden_size = 0; }  // 0: not given, Megatron's rule (megatron_ffn_hidden_size)
  model::LayerConfig cfg;
  std::string noisy_gate_policy = "None";
  bool no_use_rts = false;
  bool swiglu = false;
  bool add_bias_linear = false;      // --add-bias-linear
  bool disable_bias_linear = false;  // --disable-bias-linear (Megatron's flag: add_bias_linear off)
  std::string normalization = "LayerNorm";  // --normalization: LayerNorm or RMSNorm (Megatron's spelling)
  double norm_epsilon = 1e-5;               // --norm-epsilon (Megatron's default)
  bool group_query_attention = false;       // --group-query-attention: --num-query-groups K, V heads
  int64_t num_query_groups = 1;             // Megatron's default (read only with --group-query-attention)
  std::string position_embedding_type = "learned_absolute";  // learned_absolute, rope or none
  bool use_rotary_position_embeddings = false;  // Megatron's older spelling of rope
  bool no_position_embedding = false;           // deprecated in Megatron: accepted with rope only
  int64_t rotary_base = 10000;                  // --rotary-base (an integer in Megatron)
  std::string moe_model_type = "megatron_moe";  // --moe-model-type: MindSpeed's default (Megatron-Core's MoE layer)
  std::vector<std::string> moe_router_load_balancing_type = {"aux_loss"};  // Megatron's default (a list there)
  std::string moe_router_score_function = "softmax";                       // softmax or sigmoid
  std::string moe_token_drop_policy = "probs";                             // probs or position (Megatron's default)
  double moe_aux_loss_coeff = 0.01;  // the layer tools' default (their loss includes the aux loss); train: Megatron's 0
  // Megatron's sizes of the experts and the attention heads (0: not given). --moe-ffn-hidden-size is the experts' F
  // (every block here is an MoE block, so it replaces --ffn-hidden-size; MindSpeed-LLM's deprecated
  // --moe-intermediate-size is the same); --kv-channels and --expert-tensor-parallel-size are accepted when they are
  // what this engine computes: head dim h / n, experts sharded over --tensor-model-parallel-size.
  int64_t moe_ffn_hidden_size = 0;
  int64_t moe_intermediate_size = 0;
  // MindSpeed-LLM's deprecated spellings of --moe-router-num-groups, --moe-router-group-topk and
  // --moe-router-topk-scaling-factor (--n-group, --topk-group, --routed-scaling-factor): as there, each sets its
  // Megatron flag when that is not given (0: not given).
  int64_t n_group = 0;
  int64_t topk_group = 0;
  double routed_scaling_factor = 0;
  // Shared experts (model/mlp_block.h): Megatron-Core's --moe-shared-expert-intermediate-size (the shared MLP's F),
  // or MindSpeed-LLM's --n-shared-experts K (K x the experts' F). 0: none.
  int64_t moe_shared_expert_intermediate_size = 0;
  int64_t n_shared_experts = 0;
  // Set by finish(): Megatron's --ffn-hidden-size (as given, or its rule), the FFN of the dense layers; the experts'
  // F is cfg.ffn_hidden_size (--moe-ffn-hidden-size when given).
  int64_t dense_ffn_hidden_size = 0;
  int64_t kv_channels = 0;
  int64_t expert_tensor_parallel_size = 0;
  std::vector<std::string> notices;  // said once at start-up by rank 0 (flags that are accepted but adjusted)

  // Converts the parsed strings and validates (throws ConfigError naming the flag).
  model::LayerConfig finish();
  // The attention flags into cfg: grouped queries, the position embedding and RoPE's settings (ConfigError).
  void finish_attention();
  // The router flags into cfg: --moe-model-type and Megatron-Core's router options (ConfigError).
  void finish_router();
  // The shared-expert sizes into cfg.mlp_ffn_hidden_size; --num-experts 0 makes the block dense (ConfigError).
  void finish_shared_experts();
  // After the subcommand's own checks of its AMPipe degrees: the pipe-experts rules for every degree it runs
  // (model::LayerConfig::check_pipe_experts; throws ConfigError). When the feature has nothing to pipeline (which
  // does not depend on the degree) it is turned off in `c` and in `cfg`, and the reason joins `notices` once.
  void check_pipe_experts(model::LayerConfig& c, const std::vector<int>& degrees);
  // One AMPipe degree against the sequence (ConfigError: "--ampipe-degree M is invalid" or "--seq-length s is not
  // divisible by --ampipe-degree M").
  // Also the size of the Plans of a stack of `num_layers` layers (model::check_plan_size).
  static void check_degree(const model::LayerConfig& c, int M, int64_t num_layers = 1);
  // The layer flags as JSON (the "config" object of bench-layer's and plan's --json): the train::config_keys() with
  // train::kKeyLayer.
  nlohmann::json to_json(const model::LayerConfig& c) const;
};

// Megatron's --ffn-hidden-size when it is not given: 4h, or with --swiglu 4h * 2/3 rounded down to a multiple of 64
// (so SwiGLU's three matrices hold about the parameters of GeLU's two).
int64_t megatron_ffn_hidden_size(int64_t hidden_size, bool swiglu);

// The degrees of `candidates` that divide the sequence length s (what `auto` considers).
std::vector<int> auto_degree_candidates(int64_t s, const std::vector<int>& candidates);

// Every rank compares its configuration (the subcommand's flags as JSON, after --config) with rank 0's before the
// first collective of the run, and all refuse together, naming the first setting that differs: ranks started with
// different flags would otherwise reach MPI's truncation errors or train silently apart. Collective over `world`.
void check_ranks_agree(const nlohmann::json& config, const comm::Group& world);

// An output file the run writes later (--trace, --json): its directory is created and probed now, on rank 0, and
// every rank refuses together when it cannot be written (not at the end of the run). Collective over `world`.
void check_output_file(const std::string& flag, const std::string& path, const comm::Group& world);

// Runtime flags shared by every multi-rank subcommand.
struct CommFlags {
  bool check_collectives = false;
  double comm_timeout_s = 300;
  double startup_timeout_s = 30;  // --startup-timeout: waits before the first step (comm::RuntimeOptions)
  // A wait longer than this is a timeout whatever --comm-timeout says (a week: the deadline arithmetic of the
  // steady clock stays far from overflow).
  static constexpr double kMaxTimeoutS = 7 * 24 * 3600.0;
  // Checks --comm-timeout and --startup-timeout (finite, > 0; values above kMaxTimeoutS are clamped to it) and sets
  // them and --check-collectives on the runtime.
  void apply() const;
};

}  // namespace ampipe::cli
