#include "ampipe/model/layer_config.h"

#include <cmath>
#include <utility>

#include "ampipe/core/error.h"
#include "ampipe/model/gate.h"
#include "ampipe/model/size_check.h"

namespace ampipe::model {

const char* position_embedding_name(PositionEmbedding p) {
  return p == PositionEmbedding::rope ? "rope" : p == PositionEmbedding::none ? "none" : "learned_absolute";
}

PositionEmbedding position_embedding_from_name(const std::string& name) {
  for (PositionEmbedding p : {PositionEmbedding::learned_absolute, PositionEmbedding::rope, PositionEmbedding::none})
    if (name == position_embedding_name(p)) return p;
  throw ConfigError(fmt::format("position_embedding_type {} is not one of learned_absolute, rope, none", name));
}

kernels::RopeSpec LayerConfig::rope_spec() const {
  kernels::RopeSpec r;
  if (!rope()) return r;
  const int64_t d = head_dim();
  r.rot_dim = rotary_percent < 1.0 ? int64_t(double(d) * rotary_percent) : d;  // Megatron: int(d * percent)
  r.base = rotary_base;
  r.interleaved = rotary_interleaved;
  r.position_scale = rotary_interpolation_factor > 0 ? 1.0 / double(rotary_interpolation_factor) : 1.0;
  r.llama3_scaling = use_rope_scaling;
  r.scaling_factor = rope_scaling_factor;
  return r;
}

LayerConfig LayerConfig::as_dense(int64_t ffn) const {
  LayerConfig c = *this;
  c.num_experts = 0;
  c.mlp_ffn_hidden_size = ffn;
  c.moe_shared_expert_gate = false;  // the gate belongs to a shared expert beside the router
  c.use_pipe_experts = false;
  c.pipe_experts_multi_data = 1;
  c.pipe_experts_multi_stream = false;
  return c;
}

namespace {
void positive(const char* flag, int64_t v) {
  if (v <= 0) throw ConfigError(fmt::format("{} {} is invalid: it must be a positive integer", flag, v));
}
}  // namespace

void LayerConfig::validate() const {
  validate_shapes();
  validate_rope();
  validate_router();
  validate_parallel();
  check_layer_sizes(*this);  // every derived size fits in 64 bits (model/size_check.h)
}

// The sizes, the heads and their groups, the shared expert.
void LayerConfig::validate_shapes() const {
  positive("--seq-length", seq_length);
  positive("--micro-batch-size", micro_batch_size);
  positive("--hidden-size", hidden_size);
  positive("--ffn-hidden-size", ffn_hidden_size);
  positive("--num-attention-heads", num_attention_heads);
  if (num_experts < 0 || (num_experts == 0 && mlp_ffn_hidden_size <= 0))
    throw ConfigError(fmt::format("--num-experts {} is invalid: it must be a positive integer", num_experts));
  if (moe_shared_expert_gate && (dense() || mlp_ffn_hidden_size <= 0))
    throw ConfigError("--moe-shared-expert-gate needs a shared expert (--moe-shared-expert-intermediate-size): it "
                      "gates the shared expert's output");
  if (add_bias_linear && has_mlp() && !dense())
    throw ConfigError(fmt::format("biases in the linear layers (--add-bias-linear, Megatron's default) with "
                                  "--moe-shared-expert-intermediate-size {}: Megatron-Core's shared expert has no "
                                  "biases (its rule): pass --disable-bias-linear",
                                  mlp_ffn_hidden_size));
  if (mlp_ffn_hidden_size < 0)
    throw ConfigError(fmt::format("--moe-shared-expert-intermediate-size {} is invalid: it must be a positive integer",
                                  mlp_ffn_hidden_size));
  positive("--expert-model-parallel-size", expert_model_parallel_size);
  if (hidden_size % num_attention_heads != 0)
    throw ConfigError(fmt::format(
        "--num-attention-heads {} does not divide --hidden-size {}: every head needs hidden/heads columns",
        num_attention_heads, hidden_size));
  if (num_query_groups < 0 || (num_query_groups > 0 && num_attention_heads % num_query_groups != 0))
    throw ConfigError(fmt::format("--num-query-groups {} is invalid: it must be a positive divisor of "
                                  "--num-attention-heads {} (every K, V head serves the same number of query heads)",
                                  num_query_groups, num_attention_heads));
  if (num_query_groups > 0 && tensor_model_parallel_size > 0 && num_query_groups % tensor_model_parallel_size != 0)
    throw ConfigError(fmt::format("--num-query-groups {} is not divisible by --tensor-model-parallel-size {}: every "
                                  "tensor-parallel rank holds whole query groups (Megatron's rule)",
                                  query_groups(), tensor_model_parallel_size));
}

// Rotary embeddings.
void LayerConfig::validate_rope() const {
  if (rope()) {
    if (!(rotary_base > 0) || !std::isfinite(rotary_base))
      throw ConfigError(fmt::format("--rotary-base {} is invalid: it must be a positive number", rotary_base));
    if (!(rotary_percent > 0 && rotary_percent <= 1))
      throw ConfigError(fmt::format("--rotary-percent {} is invalid: it must be in (0, 1]", rotary_percent));
    const int64_t r = rope_spec().rot_dim;
    if (r < 2 || r % 2 != 0)
      throw ConfigError(fmt::format("--rotary-percent {} of head dim {} rotates {} channels: it must be an even "
                                    "number >= 2 (channels rotate in pairs)",
                                    rotary_percent, head_dim(), r));
    if (rotary_interpolation_factor < 0)
      throw ConfigError(fmt::format("--rotary-seq-len-interpolation-factor {} is invalid: it must be a positive "
                                    "integer", rotary_interpolation_factor));
    if (use_rope_scaling && !(rope_scaling_factor > 0 && std::isfinite(rope_scaling_factor)))
      throw ConfigError(fmt::format("--rope-scaling-factor {} is invalid: it must be a positive number",
                                    rope_scaling_factor));
  }
}

// The router and the experts' capacity.
void LayerConfig::validate_router() const {
  // (a dense block has no router: Megatron ignores the router flags of a dense GPT, and so does this check)
  if (!dense() && megatron_router() && (moe_router_topk < 1 || moe_router_topk > 8))
    throw ConfigError(fmt::format("--moe-router-topk {} is not supported: Megatron-Core's router takes 1 to 8 "
                                  "experts per token here",
                                  moe_router_topk));
  if (!dense() && !megatron_router() && moe_router_topk != 1 && moe_router_topk != 2)
    throw ConfigError(fmt::format("--moe-router-topk {} is not supported: only top-1 and top-2 gating exist in "
                                  "DeepSpeed-MoE's gate (--moe-model-type megatron_moe takes up to 8)",
                                  moe_router_topk));
  if (megatron_router() && noisy_gate_policy != NoisyGatePolicy::none)
    throw ConfigError("--noisy-gate-policy is DeepSpeed-MoE's (--moe-model-type deepspeed_moe): Megatron-Core's "
                      "router has no gate noise");
  if (!(moe_z_loss_coeff >= 0) || !std::isfinite(moe_z_loss_coeff))
    throw ConfigError(fmt::format("--moe-z-loss-coeff {} is invalid: it must be a finite number >= 0", moe_z_loss_coeff));
  if (moe_z_loss_coeff > 0 && !megatron_router() && !dense())
    throw ConfigError(fmt::format("--moe-z-loss-coeff {} needs --moe-model-type megatron_moe: the z-loss is Megatron-Core's "
                                  "router's (DeepSpeed-MoE's gate has none)",
                                  moe_z_loss_coeff));
  if (moe_router_enable_expert_bias && megatron_router() && moe_router_load_balancing == Balancing::sinkhorn)
    throw ConfigError("--moe-router-enable-expert-bias with --moe-router-load-balancing-type sinkhorn: sinkhorn "
                      "routing never reads the expert bias (Megatron's sinkhorn_load_balancing); use one of them");
  if (moe_router_enable_expert_bias && moe_router_score_function != ScoreFunction::sigmoid)
    throw ConfigError("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (Megatron's rule: the "
                      "bias is added to the sigmoid scores that choose the experts)");
  if (!(moe_router_bias_update_rate >= 0) || !std::isfinite(moe_router_bias_update_rate))
    throw ConfigError(fmt::format("--moe-router-bias-update-rate {} is invalid: it must be a finite number >= 0",
                                  moe_router_bias_update_rate));
  if (std::isnan(moe_expert_capacity_factor) || moe_expert_capacity_factor == 0)
    throw ConfigError(fmt::format("--moe-expert-capacity-factor {} is invalid: it must be > 0 (a negative value is "
                                  "no capacity, as in Megatron)",
                                  moe_expert_capacity_factor));
  if (moe_expert_capacity_factor >= 0 && !megatron_router() && !dense())
    throw ConfigError(fmt::format("--moe-expert-capacity-factor {} is Megatron-Core's router's (--moe-model-type "
                                  "megatron_moe): DeepSpeed-MoE's gate takes --moe-train-capacity-factor",
                                  moe_expert_capacity_factor));
  if (moe_pad_expert_input_to_capacity && moe_expert_capacity_factor < 0 && !dense())
    throw ConfigError("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (Megatron's rule: it "
                      "pads each expert's input to that capacity)");
  if ((moe_router_num_groups != 0) != (moe_router_group_topk != 0))
    throw ConfigError(fmt::format("--moe-router-num-groups {} and --moe-router-group-topk {}: group-limited routing "
                                  "needs both",
                                  moe_router_num_groups, moe_router_group_topk));
  if (!(moe_router_topk_scaling_factor >= 0) || !std::isfinite(moe_router_topk_scaling_factor))
    throw ConfigError(fmt::format("--moe-router-topk-scaling-factor {} is invalid: it must be a positive number",
                                  moe_router_topk_scaling_factor));
  if (moe_router_topk > num_experts && !dense())
    throw ConfigError(fmt::format("--moe-router-topk {} is larger than --num-experts {}: a token cannot pick more "
                                  "experts than exist",
                                  moe_router_topk, num_experts));
}

// Dropouts, init and the parallel layout.
void LayerConfig::validate_parallel() const {
  for (const auto& [flag, v] : {std::pair<const char*, double>{"--moe-train-capacity-factor", moe_train_capacity_factor},
                                {"--hidden-dropout", hidden_dropout}, {"--attention-dropout", attention_dropout},
                                {"--init-method-std", init_method_std}})
    if (!std::isfinite(v)) throw ConfigError(fmt::format("{} {} is invalid: it must be a finite number", flag, v));
  if (!(moe_train_capacity_factor > 0))
    throw ConfigError(fmt::format("--moe-train-capacity-factor {} is invalid: it must be > 0",
                                  moe_train_capacity_factor));
  if (moe_min_capacity < 0)
    throw ConfigError(fmt::format("--moe-min-capacity {} is invalid: it must be >= 0", moe_min_capacity));
  if (!(hidden_dropout >= 0 && hidden_dropout < 1))
    throw ConfigError(fmt::format("--hidden-dropout {} is invalid: it must be in [0, 1)", hidden_dropout));
  if (!(attention_dropout >= 0 && attention_dropout < 1))
    throw ConfigError(fmt::format("--attention-dropout {} is invalid: it must be in [0, 1)", attention_dropout));
  if (!(init_method_std > 0))
    throw ConfigError(fmt::format("--init-method-std {} is invalid: it must be > 0", init_method_std));
  if (num_experts % expert_model_parallel_size != 0 && !dense())
    throw ConfigError(fmt::format("--num-experts {} is not divisible by --expert-model-parallel-size {}: every EP "
                                  "rank must own the same number of experts",
                                  num_experts, expert_model_parallel_size));
  positive("--tensor-model-parallel-size", tensor_model_parallel_size);
  positive("--context-parallel-size", context_parallel_size);
  if (context_parallel_algo != "megatron_cp_algo") {
    const bool known = context_parallel_algo == "ulysses_cp_algo" || context_parallel_algo == "hybrid_cp_algo" ||
                       context_parallel_algo == "adaptive_cp_algo" || context_parallel_algo == "hybrid_adaptive_cp_algo";
    throw ConfigError(fmt::format("--context-parallel-algo {} is {}: this engine runs megatron_cp_algo (ring "
                                  "attention over load-balanced halves), the only one AMPipe supports",
                                  context_parallel_algo, known ? "not supported" : "not a context-parallel algorithm"));
  }
  if (context_parallel_size > 1 && seq_length % (2 * int64_t(context_parallel_size)) != 0)
    throw ConfigError(fmt::format("--seq-length {} is not divisible by 2 x --context-parallel-size {} (= {}): every "
                                  "context-parallel rank holds two equal blocks of the sequence",
                                  seq_length, context_parallel_size, 2 * context_parallel_size));
  const int64_t t = tensor_model_parallel_size;
  for (const auto& [flag, v] : {std::pair<const char*, int64_t>{"--num-attention-heads", num_attention_heads},
                                {"--ffn-hidden-size", ffn_hidden_size}, {"--hidden-size", hidden_size},
                                {dense() ? "--ffn-hidden-size" : "--moe-shared-expert-intermediate-size",
                                 mlp_ffn_hidden_size}})
    if (v % t != 0)
      throw ConfigError(fmt::format("{} {} is not divisible by --tensor-model-parallel-size {}: every tensor-parallel "
                                    "rank must hold the same share of it",
                                    flag, v, t));
  if (sequence_parallel && seq_length % t != 0)
    throw ConfigError(fmt::format("--seq-length {} is not divisible by --tensor-model-parallel-size {} with "
                                  "--sequence-parallel: every tensor-parallel rank holds seq-length/tp rows",
                                  seq_length, t));
  if (pipe_experts_multi_data < 1)
    throw ConfigError(fmt::format("--pipe-experts-multi-data {} is invalid: it must be >= 1",
                                  pipe_experts_multi_data));
}

std::string LayerConfig::check_pipe_experts(int M) const {
  const int N = pipe_experts_multi_data;
  if (!use_pipe_experts) {
    if (N > 1 || pipe_experts_multi_stream)
      throw ConfigError(fmt::format("{} needs --use-pipe-experts",
                                    pipe_experts_multi_stream ? std::string("--pipe-experts-multi-stream")
                                                              : fmt::format("--pipe-experts-multi-data {}", N)));
    return "";
  }
  if (pipe_experts_multi_stream && !sp())
    throw ConfigError("--pipe-experts-multi-stream can only be used with --sequence-parallel and "
                      "--tensor-model-parallel-size > 1: it overlaps the pieces' tensor-parallel collectives");
  if (!fixed_capacity())
    throw ConfigError(fmt::format("--use-pipe-experts cannot be used with {}: pipe-experts slices a fixed expert "
                                  "capacity, and {} capacity is known only after routing",
                                  moe_no_drop          ? "--moe-no-drop"
                                  : megatron_capacity() ? "--moe-expert-capacity-factor without "
                                                          "--moe-pad-expert-input-to-capacity"
                                                        : "--moe-model-type megatron_moe (dropless)",
                                  dropless() ? "a dropless" : "an unpadded"));
  if (M > 1) {
    if (N % M != 0)
      throw ConfigError(fmt::format("--pipe-experts-multi-data {} is not divisible by --ampipe-degree {}: with AMPipe "
                                    "every chunk must get the same number of expert slices",
                                    N, M));
    if (N < M || (N == M && !pipe_experts_multi_stream))
      throw ConfigError(fmt::format("--pipe-experts-multi-data {} must be > --ampipe-degree {} with --use-pipe-experts "
                                    "(each AMPipe chunk needs more than one slice to pipeline; equal is allowed "
                                    "only with --pipe-experts-multi-stream)",
                                    N, M));
  }
  const int64_t Sc = tokens() / M / (sp() ? tp() : 1), S = N / M;  // the tokens one rank routes per chunk
  const int64_t C = gate_capacity(Sc, num_experts, moe_router_topk, moe_train_capacity_factor, moe_min_capacity);
  if (S > C)
    throw ConfigError(fmt::format("--pipe-experts-multi-data {} cannot be greater than the expert capacity: {} slices "
                                  "per chunk of {} tokens, whose capacity is {} slots per expert",
                                  N, S, Sc, C));
  if (local_experts() == 1 && N == 1)
    return "--use-pipe-experts with one local expert and --pipe-experts-multi-data 1 has nothing to pipeline "
           "(MindSpeed switches it off with a warning); running without it";
  return "";
}

void LayerConfig::check_tensor_parallel(int M) const {
  check_context_parallel(M);
  const int t = tensor_model_parallel_size;
  if (sequence_parallel && seq_length % (int64_t(M) * t) != 0)
    throw ConfigError(fmt::format("--seq-length {} is not divisible by --ampipe-degree {} x "
                                  "--tensor-model-parallel-size {} (= {}) with --sequence-parallel: every chunk must "
                                  "have the same rows on every tensor-parallel rank",
                                  seq_length, M, t, int64_t(M) * t));
  if (ampipe_tp_sp_comm_overlap && M < 2)
    throw ConfigError(fmt::format("--ampipe-tp-sp-comm-overlap needs --ampipe-degree > 1 (got {}): it overlaps the "
                                  "chunks' tensor-parallel collectives",
                                  M));
  if (ampipe_tp_sp_comm_overlap && t < 2)
    throw ConfigError("--ampipe-tp-sp-comm-overlap needs --tensor-model-parallel-size > 1: without tensor "
                      "parallelism there are no tensor-parallel collectives to overlap");
}

void LayerConfig::check_context_parallel(int M) const {
  const int t = tensor_model_parallel_size, C = context_parallel_size;
  if (C > 1) {
    if (seq_length % (2 * int64_t(M) * C) != 0)
      throw ConfigError(fmt::format("--seq-length {} is not divisible by 2 x --ampipe-degree {} x "
                                    "--context-parallel-size {} (= {}): each context-parallel rank holds two "
                                    "load-balanced blocks, each cut into the same chunks",
                                    seq_length, M, C, 2 * int64_t(M) * C));
    if (sequence_parallel && t > 1 && (seq_length / (2 * int64_t(M) * C)) % t != 0)
      throw ConfigError(fmt::format("--seq-length {} is not divisible by 2 x --ampipe-degree {} x "
                                    "--context-parallel-size {} x --tensor-model-parallel-size {} (= {}) with "
                                    "--sequence-parallel: every chunk must have the same rows on every cp and tp rank",
                                    seq_length, M, C, t, 2 * int64_t(M) * C * t));
  }
}

void LayerConfig::check_aux_loss_coeff(double coeff) const {
  if (!(coeff >= 0) || !std::isfinite(coeff))
    throw ConfigError(fmt::format("--moe-aux-loss-coeff {} is invalid: it must be a finite number >= 0", coeff));
  if (coeff != 0 && !dense() && megatron_router() && moe_router_load_balancing == Balancing::sinkhorn)
    throw ConfigError(fmt::format("--moe-aux-loss-coeff {} with --moe-router-load-balancing-type sinkhorn: sinkhorn "
                                  "routing has no aux loss (Megatron asserts moe_aux_loss_coeff == 0): pass "
                                  "--moe-aux-loss-coeff 0",
                                  coeff));
}

}  // namespace ampipe::model
