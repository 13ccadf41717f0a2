#include "ampipe/cli/layer_flags.h"

#include <cstdint>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include <fmt/ranges.h>
#include <utility>

#include "ampipe/cli/flag_registry.h"
#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/train/checkpoint.h"
#include "ampipe/core/error.h"
#include "ampipe/model/size_check.h"
#include "ampipe/train/train_config.h"

namespace ampipe::cli {

int64_t megatron_ffn_hidden_size(int64_t hidden_size, bool swiglu) {
  return swiglu ? (4 * hidden_size * 2 / 3) / 64 * 64 : 4 * hidden_size;
}

namespace {

// Megatron's sizes that this engine derives: a value that is not the derived one is refused.
void check_derived_sizes(const LayerFlags& f) {
  const model::LayerConfig& c = f.cfg;
  for (const auto& [flag, v] : {std::pair{"--moe-ffn-hidden-size", f.moe_ffn_hidden_size},
                                {"--moe-intermediate-size", f.moe_intermediate_size},
                                {"--kv-channels", f.kv_channels},
                                {"--expert-tensor-parallel-size", f.expert_tensor_parallel_size}})
    if (v < 0) throw ConfigError(fmt::format("{} {} is invalid: it must be >= 1", flag, v));
  if (f.kv_channels > 0 && c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0 &&
      f.kv_channels != c.hidden_size / c.num_attention_heads)
    throw ConfigError(fmt::format("--kv-channels {} is not supported: the attention heads have --hidden-size {} / "
                                  "--num-attention-heads {} = {} channels here (Megatron's default)",
                                  f.kv_channels, c.hidden_size, c.num_attention_heads,
                                  c.hidden_size / c.num_attention_heads));
  if (f.expert_tensor_parallel_size > 0 && f.expert_tensor_parallel_size != c.tensor_model_parallel_size)
    throw ConfigError(fmt::format("--expert-tensor-parallel-size {} is not supported: the experts are sharded over "
                                  "the --tensor-model-parallel-size {} ranks here (Megatron's default)",
                                  f.expert_tensor_parallel_size, c.tensor_model_parallel_size));
}

}  // namespace

model::LayerConfig LayerFlags::finish() {
  check_derived_sizes(*this);
  // The dense FFN is --ffn-hidden-size; the experts' F is Megatron's expert size when given (MindSpeed-LLM's
  // deprecated spelling sets it as MindSpeed-LLM does, over --moe-ffn-hidden-size), else the same.
  if (moe_intermediate_size > 0) moe_ffn_hidden_size = moe_intermediate_size;
  if (cfg.ffn_hidden_size == 0) {
    // (a --hidden-size too large for the rule keeps it: the size checks refuse that hidden size itself)
    cfg.ffn_hidden_size = cfg.hidden_size > INT64_MAX / 8 ? cfg.hidden_size
                                                            : megatron_ffn_hidden_size(cfg.hidden_size, swiglu);
    if (cfg.ffn_hidden_size <= 0 && cfg.hidden_size > 0)
      throw ConfigError(fmt::format("--ffn-hidden-size is not given, and Megatron's rule for it (--swiglu: 4 x "
                                    "--hidden-size {} x 2/3, rounded down to a multiple of 64) gives {}: pass "
                                    "--ffn-hidden-size",
                                    cfg.hidden_size, cfg.ffn_hidden_size));
  }
  dense_ffn_hidden_size = cfg.ffn_hidden_size;
  if (moe_ffn_hidden_size > 0) cfg.ffn_hidden_size = moe_ffn_hidden_size;
  finish_shared_experts();
  if (noisy_gate_policy == "None")
    cfg.noisy_gate_policy = model::NoisyGatePolicy::none;
  else if (noisy_gate_policy == "Jitter")
    cfg.noisy_gate_policy = model::NoisyGatePolicy::jitter;
  else if (noisy_gate_policy == "RSample")
    cfg.noisy_gate_policy = model::NoisyGatePolicy::rsample;
  else
    throw ConfigError(fmt::format("--noisy-gate-policy {} is not one of None, Jitter, RSample", noisy_gate_policy));
  cfg.use_rts = !no_use_rts;
  if (normalization != "LayerNorm" && normalization != "RMSNorm")
    throw ConfigError(fmt::format("--normalization {} is not one of LayerNorm, RMSNorm", normalization));
  cfg.normalization = normalization == "RMSNorm" ? model::Normalization::rmsnorm : model::Normalization::layernorm;
  if (!std::isfinite(norm_epsilon) || !(norm_epsilon > 0) || norm_epsilon > 1)
    throw ConfigError(fmt::format("--norm-epsilon {} is invalid: it must be in (0, 1]", norm_epsilon));
  cfg.layernorm_epsilon = float(norm_epsilon);
  cfg.expert = swiglu ? model::ExpertKind::swiglu : model::ExpertKind::gelu;
  if (add_bias_linear && disable_bias_linear)
    throw ConfigError("--add-bias-linear and --disable-bias-linear contradict each other: give one");
  cfg.add_bias_linear = !disable_bias_linear;  // Megatron's default: biases on (--add-bias-linear says it too)
  finish_attention();
  if (!cfg.dense()) finish_router();
  cfg.validate();
  if (cfg.noisy_gate_policy == model::NoisyGatePolicy::rsample && cfg.moe_router_topk == 2)
    notices.push_back("--noisy-gate-policy RSample has no effect with --moe-router-topk 2 (as in DeepSpeed-MoE, "
                      "whose top-2 gate never samples); the gate runs without noise");
  return cfg;
}

void LayerFlags::finish_shared_experts() {
  for (const auto& [flag, v] : {std::pair{"--moe-shared-expert-intermediate-size", moe_shared_expert_intermediate_size},
                                {"--n-shared-experts", n_shared_experts}})
    if (v < 0) throw ConfigError(fmt::format("{} {} is invalid: it must be a positive integer", flag, v));
  if (moe_shared_expert_intermediate_size > 0 && n_shared_experts > 0 &&
      moe_shared_expert_intermediate_size != n_shared_experts * cfg.ffn_hidden_size)
    throw ConfigError(fmt::format("--moe-shared-expert-intermediate-size {} contradicts --n-shared-experts {} x the "
                                  "experts' F {} (= {}): give one",
                                  moe_shared_expert_intermediate_size, n_shared_experts, cfg.ffn_hidden_size,
                                  n_shared_experts * cfg.ffn_hidden_size));
  const int64_t shared =
      moe_shared_expert_intermediate_size > 0 ? moe_shared_expert_intermediate_size : n_shared_experts * cfg.ffn_hidden_size;
  if (cfg.num_experts == 0) {  // a dense model (Megatron: no --num-experts): the MLP of --ffn-hidden-size
    if (shared > 0)
      throw ConfigError(fmt::format("--moe-shared-expert-intermediate-size {} needs --num-experts: a shared expert "
                                    "sits beside routed experts",
                                    shared));
    cfg = cfg.as_dense(dense_ffn_hidden_size);
    return;
  }
  cfg.mlp_ffn_hidden_size = shared;
}

void LayerFlags::finish_attention() {
  if (group_query_attention && num_query_groups < 1)
    throw ConfigError(fmt::format("--num-query-groups {} is invalid: it must be >= 1", num_query_groups));
  if (group_query_attention && num_query_groups > 0 && cfg.tensor_model_parallel_size > num_query_groups &&
      cfg.tensor_model_parallel_size % num_query_groups == 0)
    throw ConfigError(fmt::format("--num-query-groups {} is smaller than --tensor-model-parallel-size {}: Megatron "
                                  "then replicates K, V heads over the tp ranks, which this engine does not do; use "
                                  "a multiple of the tp size",
                                  num_query_groups, cfg.tensor_model_parallel_size));
  cfg.num_query_groups = group_query_attention ? num_query_groups : 0;
  if (use_rotary_position_embeddings) position_embedding_type = "rope";  // Megatron's legacy flag wins
  const bool known = position_embedding_type == "learned_absolute" || position_embedding_type == "rope" ||
                     position_embedding_type == "none";
  if (!known) {
    const bool megatrons = position_embedding_type == "yarn" || position_embedding_type == "mrope" ||
                           position_embedding_type == "relative";
    throw ConfigError(fmt::format("--position-embedding-type {} is {}: this engine has learned_absolute, rope and none",
                                  position_embedding_type,
                                  megatrons ? "not implemented" : "not a position embedding type"));
  }
  cfg.position_embedding = model::position_embedding_from_name(position_embedding_type);
  if (no_position_embedding && !cfg.rope())
    throw ConfigError(fmt::format("--no-position-embedding is deprecated and only accepted with rope (Megatron's "
                                  "rule): use --position-embedding-type none (here: {})",
                                  position_embedding_type));
  if (rotary_base < 1)
    throw ConfigError(fmt::format("--rotary-base {} is invalid: it must be a positive integer", rotary_base));
  cfg.rotary_base = double(rotary_base);
  if (!cfg.rope() && (rotary_base != 10000 || cfg.rotary_percent != 1.0 || cfg.rotary_interleaved ||
                      cfg.rotary_interpolation_factor != 0 || cfg.use_rope_scaling))
    notices.push_back(fmt::format("the rotary-embedding flags have no effect with --position-embedding-type {} "
                                  "(as in Megatron): pass --position-embedding-type rope to use them",
                                  position_embedding_type));
}

void LayerFlags::finish_router() {
  if (moe_model_type != "deepspeed_moe" && moe_model_type != "megatron_moe")
    throw ConfigError(fmt::format("--moe-model-type {} is not one of deepspeed_moe, megatron_moe", moe_model_type));
  cfg.moe_router = moe_model_type == "megatron_moe" ? model::Router::megatron : model::Router::deepspeed;
  if (cfg.megatron_router()) {  // DeepSpeed-MoE's gate options: inert with Megatron-Core's router, as in MindSpeed
    std::vector<std::string> inert;
    if (noisy_gate_policy != "None") inert.push_back("--noisy-gate-policy " + noisy_gate_policy);
    if (cfg.moe_train_capacity_factor != 1.0) inert.push_back("--moe-train-capacity-factor");
    if (cfg.moe_min_capacity != 4) inert.push_back("--moe-min-capacity");
    if (cfg.moe_no_drop) inert.push_back("--moe-no-drop");
    if (no_use_rts) inert.push_back("--no-use-rts");
    if (!inert.empty())
      notices.push_back(fmt::format("{} {} no effect with --moe-model-type megatron_moe (MindSpeed's default; as in "
                                    "MindSpeed they belong to DeepSpeed-MoE's gate, --moe-model-type deepspeed_moe)",
                                    fmt::join(inert, ", "), inert.size() == 1 ? "has" : "have"));
    cfg.noisy_gate_policy = model::NoisyGatePolicy::none;
    cfg.moe_no_drop = false;
  }
  if (moe_router_load_balancing_type.size() != 1)
    throw ConfigError(fmt::format("--moe-router-load-balancing-type {}: one load-balancing type only here (aux_loss "
                                  "or none; Megatron's combinations of several are not implemented)",
                                  fmt::join(moe_router_load_balancing_type, " ")));
  const std::string& lb = moe_router_load_balancing_type.front();
  if (lb != "aux_loss" && lb != "seq_aux_loss" && lb != "sinkhorn" && lb != "none") {
    const bool megatrons = lb == "global_aux_loss" || lb == "quantile_balancing";
    throw ConfigError(fmt::format("--moe-router-load-balancing-type {} is {}: this engine has aux_loss, seq_aux_loss, "
                                  "sinkhorn and none",
                                  lb, megatrons ? "not implemented" : "not a load-balancing type"));
  }
  cfg.moe_router_load_balancing = lb == "aux_loss"       ? model::Balancing::aux_loss
                                  : lb == "seq_aux_loss" ? model::Balancing::seq_aux_loss
                                  : lb == "sinkhorn"     ? model::Balancing::sinkhorn
                                                         : model::Balancing::none;
  if (moe_router_score_function != "softmax" && moe_router_score_function != "sigmoid")
    throw ConfigError(fmt::format("--moe-router-score-function {} is {}: this engine has softmax and sigmoid",
                                  moe_router_score_function,
                                  moe_router_score_function == "sqrtsoftplus" ? "not implemented" : "not a score function"));
  cfg.moe_router_score_function =
      moe_router_score_function == "sigmoid" ? model::ScoreFunction::sigmoid : model::ScoreFunction::softmax;
  // MindSpeed-LLM's deprecated spellings (its DeprecatedArgsFeature): the Megatron flag wins when both are given.
  for (const auto& [flag, v] : {std::pair{"--n-group", n_group}, {"--topk-group", topk_group},
                                {"--moe-router-num-groups", cfg.moe_router_num_groups},
                                {"--moe-router-group-topk", cfg.moe_router_group_topk}})
    if (v < 0) throw ConfigError(fmt::format("{} {} is invalid: it must be a positive integer", flag, v));
  if (!(routed_scaling_factor >= 0) || !std::isfinite(routed_scaling_factor))
    throw ConfigError(fmt::format("--routed-scaling-factor {} is invalid: it must be a positive number",
                                  routed_scaling_factor));
  if (cfg.moe_router_num_groups == 0) cfg.moe_router_num_groups = n_group;
  if (cfg.moe_router_group_topk == 0) cfg.moe_router_group_topk = topk_group;
  if (cfg.moe_router_topk_scaling_factor == 0) cfg.moe_router_topk_scaling_factor = routed_scaling_factor;
  if (moe_token_drop_policy != "probs" && moe_token_drop_policy != "position")
    throw ConfigError(fmt::format("--moe-token-drop-policy {} is not one of probs, position", moe_token_drop_policy));
  cfg.moe_token_drop_policy = moe_token_drop_policy == "position" ? model::DropPolicy::position : model::DropPolicy::probs;
  if (cfg.moe_token_drop_policy == model::DropPolicy::position && cfg.moe_expert_capacity_factor < 0)
    notices.push_back("--moe-token-drop-policy position has no effect without --moe-expert-capacity-factor (as in "
                      "Megatron): the router is dropless");
  std::string megatron_only;
  if (cfg.moe_router_pre_softmax) megatron_only = "--moe-router-pre-softmax";
  else if (lb != "aux_loss") megatron_only = "--moe-router-load-balancing-type " + lb;
  else if (cfg.moe_router_topk_scaling_factor != 0) megatron_only = "--moe-router-topk-scaling-factor";
  else if (moe_router_score_function != "softmax") megatron_only = "--moe-router-score-function " + moe_router_score_function;
  else if (cfg.moe_router_num_groups != 0 || cfg.moe_router_group_topk != 0) megatron_only = "--moe-router-group-topk";
  else if (cfg.moe_router_enable_expert_bias) megatron_only = "--moe-router-enable-expert-bias";
  if (!cfg.megatron_router() && !megatron_only.empty())
    throw ConfigError(fmt::format("{} is a Megatron-Core router option: it needs --moe-model-type megatron_moe "
                                  "(here: {})",
                                  megatron_only, moe_model_type));
  if (cfg.moe_router_load_balancing == model::Balancing::sinkhorn) {  // Megatron's sinkhorn_load_balancing
    std::vector<std::string> inert;
    if (cfg.moe_router_pre_softmax) inert.push_back("--moe-router-pre-softmax");
    if (cfg.moe_router_topk_scaling_factor != 0) inert.push_back("--moe-router-topk-scaling-factor");
    if (moe_router_score_function != "softmax") inert.push_back("--moe-router-score-function " + moe_router_score_function);
    if (cfg.moe_router_num_groups != 0 || cfg.moe_router_group_topk != 0)
      inert.push_back("--moe-router-num-groups/--moe-router-group-topk");
    if (!inert.empty())
      notices.push_back(fmt::format("{} {} no effect with --moe-router-load-balancing-type sinkhorn (as in Megatron, "
                                    "whose sinkhorn routing scores with sigmoid for top-1 and softmax otherwise)",
                                    fmt::join(inert, ", "), inert.size() == 1 ? "has" : "have"));
  }
  cfg.check_aux_loss_coeff(moe_aux_loss_coeff);
}

void LayerFlags::check_pipe_experts(model::LayerConfig& c, const std::vector<int>& degrees) {
  const std::string notice = train::drop_idle_pipe_experts(c, degrees);
  if (notice.empty()) return;
  cfg.use_pipe_experts = false;
  notices.push_back(notice);
}

void LayerFlags::check_degree(const model::LayerConfig& c, int M, int64_t num_layers) {
  if (M < 1) throw ConfigError(fmt::format("--ampipe-degree {} is invalid: it must be >= 1", M));
  if (c.seq_length % M != 0)
    throw ConfigError(fmt::format("--seq-length {} is not divisible by --ampipe-degree {}: every chunk must have "
                                  "the same number of rows",
                                  c.seq_length, M));
  c.check_context_parallel(M);
  model::check_plan_size(c, M, num_layers);  // the Plans' task lists (model/size_check.h)
}

nlohmann::json LayerFlags::to_json(const model::LayerConfig& c) const {
  train::TrainConfig t;
  t.layer = c;
  return train::train_config_json(t, train::kKeyLayer);
}

std::vector<int> auto_degree_candidates(int64_t s, const std::vector<int>& candidates) {
  std::vector<int> out;
  for (int M : candidates)
    if (s % M == 0) out.push_back(M);
  return out;
}

void check_ranks_agree(const nlohmann::json& config, const comm::Group& world) {
  if (world.size() == 1) return;
  const std::vector<std::string> all = comm::all_gather_strings(world, config.dump(), "config.agree");
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const nlohmann::json mine = nlohmann::json::parse(all[0]), theirs = nlohmann::json::parse(all[r]);
    // The first differing key, the flags that shape the others first (a different parallel size changes derived
    // settings such as the global batch too; the cause is what to name).
    std::vector<std::string> keys = {"tensor_model_parallel_size", "context_parallel_size",
                                     "expert_model_parallel_size", "sequence_parallel"};
    for (const auto& [key, value] : mine.items()) keys.push_back(key);
    std::string what = "their configurations";
    // The checkpoint each rank would resume from is no flag: ranks whose --load copies differ (their markers name
    // other iterations, or one has none) would each resume their own state and all-reduce together.
    const char* kCkpt = "checkpoint iteration";
    const char* kManifest = "checkpoint manifest";  // the XXH64 of the iteration's manifest.json
    bool differs_elsewhere = false;
    for (const auto& [key, value] : mine.items())
      if (key != kCkpt && key != kManifest && key != "load" && (!theirs.contains(key) || theirs[key] != value))
        differs_elsewhere = true;
    const bool iteration_differs = mine.contains(kCkpt) && theirs.contains(kCkpt) && mine[kCkpt] != theirs[kCkpt];
    const bool manifest_differs =
        mine.contains(kManifest) && theirs.contains(kManifest) && mine[kManifest] != theirs[kManifest];
    if (!differs_elsewhere && (iteration_differs || manifest_differs)) {
      comm::Runtime& rt = comm::Runtime::current();
      auto held = [&](const nlohmann::json& v) {
        return v.is_number() ? fmt::format("iteration {}", v.dump()) : std::string("no checkpoint");
      };
      if (!iteration_differs) {  // one iteration, but the copies' files differ
        auto man = [](const nlohmann::json& v) {
          return v == "none" ? std::string("no manifest.json") : fmt::format("manifest.json {}", v.get<std::string>());
        };
        throw ConfigError(fmt::format("the ranks would resume from different checkpoints: --load {} holds {} with {} on "
                                      "{} and with {} on {}: their copies of the iteration differ; every rank must "
                                      "load the same checkpoint",
                                      mine.value("load", std::string()), held(mine[kCkpt]), man(mine[kManifest]),
                                      rt.rank_name(0), man(theirs[kManifest]), rt.rank_name(int(r))));
      }
      throw ConfigError(fmt::format("the ranks would resume from different checkpoints: --load {} holds {} on {} and {} "
                                    "on {} (as their {} say); every rank must load the same checkpoint",
                                    // (a --load without a checkpoint is cleared: the run starts afresh)
                                    mine.value("load", std::string()).empty() ? theirs.value("load", std::string())
                                                                              : mine.value("load", std::string()),
                                    held(mine[kCkpt]), rt.rank_name(0),
                                    held(theirs[kCkpt]), rt.rank_name(int(r)), train::kLatestMarker));
    }
    for (const std::string& key : keys)
      if (mine.contains(key) && (!theirs.contains(key) || theirs[key] != mine[key])) {
        what = fmt::format("--{} (rank 0: {}, rank {}: {})", key, mine[key].dump(),
                           r, theirs.contains(key) ? theirs[key].dump() : "unset");
        std::replace(what.begin(), what.begin() + int(key.size()) + 2, '_', '-');
        break;
      }
    throw ConfigError(fmt::format("the ranks were started with different settings: {}; every rank must get the same "
                                  "flags and --config",
                                  what));
  }
}

void check_output_file(const std::string& flag, const std::string& path, const comm::Group& world) {
  if (path.empty()) return;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  train::check_writable_dir(flag, parent.empty() ? std::string(".") : parent.string(), world);
}

void CommFlags::apply() const {
  if (!(comm_timeout_s > 0) || !std::isfinite(comm_timeout_s))
    throw ConfigError(fmt::format("--comm-timeout {} is invalid: it must be a finite number of seconds > 0",
                                  comm_timeout_s));
  if (!(startup_timeout_s > 0) || !std::isfinite(startup_timeout_s))
    throw ConfigError(fmt::format("--startup-timeout {} is invalid: it must be a finite number of seconds > 0",
                                  startup_timeout_s));
  comm::Runtime& rt = comm::Runtime::current();
  rt.set_check_collectives(check_collectives);
  const double s = std::min(comm_timeout_s, kMaxTimeoutS), u = std::min(startup_timeout_s, kMaxTimeoutS);
  rt.set_comm_timeout(std::chrono::milliseconds(std::max<int64_t>(1, int64_t(s * 1000))));
  rt.set_startup_timeout(std::chrono::milliseconds(std::max<int64_t>(1, int64_t(u * 1000))));
}

}  // namespace ampipe::cli
