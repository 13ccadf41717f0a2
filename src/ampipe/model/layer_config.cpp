#include "ampipe/model/layer_config.h"

#include "ampipe/core/error.h"

namespace ampipe::model {

void LayerConfig::validate() const {
  auto positive = [](const char* flag, int64_t v) {
    if (v <= 0) throw ConfigError(fmt::format("{} {} is invalid: it must be a positive integer", flag, v));
  };
  positive("--seq-length", seq_length);
  positive("--micro-batch-size", micro_batch_size);
  positive("--hidden-size", hidden_size);
  positive("--ffn-hidden-size", ffn_hidden_size);
  positive("--num-attention-heads", num_attention_heads);
  positive("--num-experts", num_experts);
  positive("--expert-model-parallel-size", expert_model_parallel_size);
  if (hidden_size % num_attention_heads != 0)
    throw ConfigError(fmt::format(
        "--num-attention-heads {} does not divide --hidden-size {}: every head needs hidden/heads columns",
        num_attention_heads, hidden_size));
  if (moe_router_topk != 1 && moe_router_topk != 2)
    throw ConfigError(fmt::format("--moe-router-topk {} is not supported: only top-1 and top-2 gating exist",
                                  moe_router_topk));
  if (moe_router_topk > num_experts)
    throw ConfigError(fmt::format("--moe-router-topk {} is larger than --num-experts {}: a token cannot pick more "
                                  "experts than exist",
                                  moe_router_topk, num_experts));
  if (!(moe_train_capacity_factor > 0))
    throw ConfigError(fmt::format("--moe-train-capacity-factor {} is invalid: it must be > 0",
                                  moe_train_capacity_factor));
  if (moe_min_capacity < 0)
    throw ConfigError(fmt::format("--moe-min-capacity {} is invalid: it must be >= 0", moe_min_capacity));
  if (!(hidden_dropout >= 0 && hidden_dropout < 1))
    throw ConfigError(fmt::format("--hidden-dropout {} is invalid: it must be in [0, 1)", hidden_dropout));
  if (!(init_method_std > 0))
    throw ConfigError(fmt::format("--init-method-std {} is invalid: it must be > 0", init_method_std));
  if (num_experts % expert_model_parallel_size != 0)
    throw ConfigError(fmt::format("--num-experts {} is not divisible by --expert-model-parallel-size {}: every EP "
                                  "rank must own the same number of experts",
                                  num_experts, expert_model_parallel_size));
}

}  // namespace ampipe::model
