#include "ampipe/cli/layer_flags.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/train/checkpoint.h"
#include "ampipe/core/error.h"
#include "ampipe/model/size_check.h"

namespace ampipe::cli {

void LayerFlags::add_to(CLI::App& app) {
  app.add_option("--seq-length", cfg.seq_length, "sequence length s")->capture_default_str();
  app.add_option("--micro-batch-size", cfg.micro_batch_size, "sequences per micro-batch b")->capture_default_str();
  app.add_option("--hidden-size", cfg.hidden_size, "hidden size h")->capture_default_str();
  app.add_option("--ffn-hidden-size", cfg.ffn_hidden_size, "expert FFN hidden size F")->capture_default_str();
  app.add_option("--num-attention-heads", cfg.num_attention_heads, "attention heads n")->capture_default_str();
  app.add_option("--num-experts", cfg.num_experts, "experts E")->capture_default_str();
  app.add_option("--moe-router-topk", cfg.moe_router_topk, "experts per token k (1 or 2)")->capture_default_str();
  app.add_option("--moe-train-capacity-factor", cfg.moe_train_capacity_factor, "expert capacity factor")
      ->capture_default_str();
  app.add_option("--moe-min-capacity", cfg.moe_min_capacity, "minimum expert capacity")->capture_default_str();
  app.add_flag("--moe-no-drop", cfg.moe_no_drop, "no capacity limit: no token is dropped");
  app.add_flag("--no-use-rts", no_use_rts, "turn off random token selection (top-1)");
  app.add_option("--noisy-gate-policy", noisy_gate_policy, "None, Jitter or RSample")->capture_default_str();
  app.add_flag("--swiglu", swiglu, "SwiGLU experts instead of GeLU");
  app.add_option("--hidden-dropout", cfg.hidden_dropout, "dropout after attention and after the MoE")
      ->capture_default_str();
  app.add_option("--init-method-std", cfg.init_method_std, "std of the normal weight init")->capture_default_str();
  app.add_option("--seed", cfg.seed, "global random seed (0 .. 2^64-1)")
      ->check(CLI::Validator(
          [](std::string& v) {
            const bool digits = !v.empty() && v.size() <= 20 &&
                                v.find_first_not_of("0123456789") == std::string::npos &&
                                (v.size() < 20 || v <= "18446744073709551615");
            return digits ? std::string() : v + " is not an integer in [0, 18446744073709551615]";
          },
          "UINT64"))
      ->capture_default_str();
  app.add_flag("--bf16", cfg.bf16, "bf16 GEMM inputs and all-to-all payloads, fp32 accumulation");
  app.add_option("--expert-model-parallel-size", cfg.expert_model_parallel_size, "expert-parallel size ep")
      ->capture_default_str();
  app.add_option("--tensor-model-parallel-size", cfg.tensor_model_parallel_size,
                 "tensor-parallel size tp (Megatron's column/row-parallel attention and experts)")
      ->capture_default_str();
  app.add_flag("--sequence-parallel", cfg.sequence_parallel,
               "Megatron sequence parallelism: LayerNorms, dropout, residual and gate on seq-length/tp rows per rank");
  app.add_option("--context-parallel-size", cfg.context_parallel_size,
                 "context-parallel size cp: ring attention over load-balanced halves of the sequence")
      ->capture_default_str();
  app.add_option("--context-parallel-algo", cfg.context_parallel_algo, "context-parallel algorithm (megatron_cp_algo)")
      ->capture_default_str();
  app.add_flag("--ampipe-tp-sp-comm-overlap", cfg.ampipe_tp_sp_comm_overlap,
               "overlap the experts' tensor-parallel collectives per (chunk, local expert) piece");
  app.add_flag("--use-pipe-experts", cfg.use_pipe_experts, "slice each expert's tokens to overlap its all-to-all");
  app.add_flag("--pipe-experts-multi-stream", cfg.pipe_experts_multi_stream, "pipe-experts multi-stream");
  app.add_option("--pipe-experts-multi-data", cfg.pipe_experts_multi_data, "pipe-experts slices N")
      ->capture_default_str();
  app.add_option("--moe-aux-loss-coeff", moe_aux_loss_coeff, "coefficient of the load-balancing loss")
      ->capture_default_str();
}

model::LayerConfig LayerFlags::finish() {
  if (noisy_gate_policy == "None")
    cfg.noisy_gate_policy = model::NoisyGatePolicy::none;
  else if (noisy_gate_policy == "Jitter")
    cfg.noisy_gate_policy = model::NoisyGatePolicy::jitter;
  else if (noisy_gate_policy == "RSample")
    cfg.noisy_gate_policy = model::NoisyGatePolicy::rsample;
  else
    throw ConfigError(fmt::format("--noisy-gate-policy {} is not one of None, Jitter, RSample", noisy_gate_policy));
  cfg.use_rts = !no_use_rts;
  cfg.expert = swiglu ? model::ExpertKind::swiglu : model::ExpertKind::gelu;
  cfg.validate();
  if (cfg.noisy_gate_policy == model::NoisyGatePolicy::rsample && cfg.moe_router_topk == 2)
    notices.push_back("--noisy-gate-policy RSample has no effect with --moe-router-topk 2 (as in DeepSpeed-MoE, "
                      "whose top-2 gate never samples); the gate runs without noise");
  return cfg;
}

void LayerFlags::check_pipe_experts(model::LayerConfig& c, const std::vector<int>& degrees) {
  std::string notice;
  for (int M : degrees) {
    const std::string n = c.check_pipe_experts(M);
    if (!n.empty()) notice = n;
  }
  if (notice.empty()) return;
  c.use_pipe_experts = false;
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
  return {{"seq_length", c.seq_length},
          {"micro_batch_size", c.micro_batch_size},
          {"hidden_size", c.hidden_size},
          {"ffn_hidden_size", c.ffn_hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"num_experts", c.num_experts},
          {"moe_router_topk", c.moe_router_topk},
          {"moe_train_capacity_factor", c.moe_train_capacity_factor},
          {"moe_min_capacity", c.moe_min_capacity},
          {"moe_no_drop", c.moe_no_drop},
          {"noisy_gate_policy", noisy_gate_policy},
          {"swiglu", c.expert == model::ExpertKind::swiglu},
          {"bf16", c.bf16},
          {"expert_model_parallel_size", c.expert_model_parallel_size},
          {"use_pipe_experts", c.use_pipe_experts},
          {"pipe_experts_multi_data", c.pipe_experts_multi_data},
          {"tensor_model_parallel_size", c.tensor_model_parallel_size},
          {"sequence_parallel", c.sequence_parallel},
          {"ampipe_tp_sp_comm_overlap", c.ampipe_tp_sp_comm_overlap},
          {"context_parallel_size", c.context_parallel_size},
          {"context_parallel_algo", c.context_parallel_algo}};
}

std::vector<int> parse_degree_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int M = 0;
    try {
      M = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || M < 1)
      throw ConfigError(fmt::format("--ampipe-degree {}: \"{}\" is not a positive integer (give a comma list of "
                                    "degrees, e.g. 1,2,4,8, or auto)",
                                    text, item));
    if (std::find(out.begin(), out.end(), M) == out.end()) out.push_back(M);
  }
  if (out.empty() || text.back() == ',')
    throw ConfigError(fmt::format("--ampipe-degree {}: give a comma list of degrees, e.g. 1,2,4,8, or auto", text));
  return out;
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
    std::string what = "their configurations";
    for (const auto& [key, value] : mine.items())
      if (!theirs.contains(key) || theirs[key] != value) {
        what = fmt::format("--{} (rank 0: {}, rank {}: {})", key, value.dump(),
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

void CommFlags::add_to(CLI::App& app) {
  app.add_flag("--check-collectives", check_collectives,
               "exchange a fingerprint of every collective and fail on every rank when ranks diverge");
  app.add_option("--comm-timeout", comm_timeout_s,
                 "seconds a wait may block before the job is aborted (at most a week; larger values are clamped)")
      ->capture_default_str();
}

void CommFlags::apply() const {
  if (!(comm_timeout_s > 0) || !std::isfinite(comm_timeout_s))
    throw ConfigError(fmt::format("--comm-timeout {} is invalid: it must be a finite number of seconds > 0",
                                  comm_timeout_s));
  comm::Runtime& rt = comm::Runtime::current();
  rt.set_check_collectives(check_collectives);
  const double s = std::min(comm_timeout_s, kMaxTimeoutS);
  rt.set_comm_timeout(std::chrono::milliseconds(std::max<int64_t>(1, int64_t(s * 1000))));
}

}  // namespace ampipe::cli
