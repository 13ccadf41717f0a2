#include "ampipe/model/size_check.h"

#include <algorithm>
#include <string>

#include "ampipe/core/error.h"

namespace ampipe::model {

int64_t checked_elements(const char* what, std::initializer_list<SizeFactor> factors, int64_t elem_bytes) {
  int64_t n = 1;
  bool overflow = false;
  for (const SizeFactor& f : factors) overflow |= __builtin_mul_overflow(n, f.value, &n);
  int64_t bytes = 0;
  overflow |= __builtin_mul_overflow(n, elem_bytes, &bytes);
  if (!overflow && bytes <= kMaxTensorBytes) return n;
  const SizeFactor* blame = nullptr;
  std::string product;
  for (const SizeFactor& f : factors) {
    if (f.flag != nullptr && (blame == nullptr || f.value > blame->value)) blame = &f;
    product += (product.empty() ? "" : " x ") +
               (f.flag != nullptr ? fmt::format("{} {}", f.flag, f.value) : std::to_string(f.value));
  }
  const std::string head = blame != nullptr ? fmt::format("{} {} is too large", blame->flag, blame->value)
                                            : std::string("the configuration is too large");
  throw ConfigError(fmt::format("{}: {} would have {} elements of {} bytes, {} (a tensor must stay within 2^56 "
                                "bytes, so that size arithmetic cannot overflow 64 bits)",
                                head, what, product, elem_bytes,
                                overflow ? "which overflows 64-bit arithmetic" : "more than 2^56 bytes"));
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    throw ConfigError(fmt::format("the configuration is too large: {} overflows 64-bit arithmetic", what));
  return r;
}

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw ConfigError(fmt::format("the configuration is too large: {} overflows 64-bit arithmetic", what));
  return r;
}

void check_layer_sizes(const LayerConfig& c) {
  const SizeFactor s{"--seq-length", c.seq_length}, b{"--micro-batch-size", c.micro_batch_size},
      h{"--hidden-size", c.hidden_size}, E{"--num-experts", c.num_experts},
      F1{"--ffn-hidden-size", c.ffn_hidden_size}, two{nullptr, c.expert == ExpertKind::swiglu ? 2 : 1};
  checked_elements("the [T, h] activation (T = s x b tokens)", {s, b, h});
  checked_elements("the [T, 3h] QKV activation", {s, b, {nullptr, 3}, h});
  checked_elements("the [3h, h] QKV weight", {{nullptr, 3}, h, h});
  checked_elements("the [S_c, E] gate probabilities", {s, b, E});
  checked_elements("the [E, F1, h] expert weight", {E, two, F1, h});
  // An expert slot per routed token at most (C <= S_c, summed over the M chunks: <= T), on every EP rank:
  // [E, C, h] per chunk is at most E x T x h over a step, [L, M*R, F1] at most E x T x F1.
  checked_elements("the [E, C, h] all-to-all buffers at one slot per token", {E, s, b, h});
  checked_elements("the [L, M*R, F1] expert activations at one slot per token", {E, s, b, two, F1});
  const SizeFactor Fm{c.dense() ? "--ffn-hidden-size" : "--moe-shared-expert-intermediate-size", c.mlp_ffn_hidden_size};
  checked_elements("the [F1_m, h] dense MLP weight", {two, Fm, h});
  checked_elements("the [T, F1_m] dense MLP activation", {s, b, two, Fm});
}

int64_t check_plan_size(const LayerConfig& c, int M, int64_t num_layers) {
  const int64_t L = c.local_experts();
  int64_t P = 0;  // expert pieces per chunk
  if (c.use_pipe_experts)
    P = checked_mul(L, std::max<int64_t>(1, c.pipe_experts_multi_data / std::max(M, 1)), "the pieces of a chunk");
  else if (c.ampipe_tp_sp_comm_overlap && c.tp() > 1)
    P = L;
  int64_t groups = 0;
  if (__builtin_mul_overflow(int64_t(M), P + 1, &groups) || groups > kMaxPlanGroups) {
    if (P == 0 || int64_t(M) * 2 > kMaxPlanGroups)  // the degree alone is too large
      throw ConfigError(fmt::format("--ampipe-degree {} is too large: a layer's Plan has tasks for each of its {} "
                                    "chunks, and at most {} chunks are planned",
                                    M, M, kMaxPlanGroups));
    const std::string what =
        c.use_pipe_experts ? fmt::format("--pipe-experts-multi-data {} with {} local experts", c.pipe_experts_multi_data, L)
                           : fmt::format("--ampipe-tp-sp-comm-overlap with {} local experts", L);
    throw ConfigError(fmt::format("{} (--num-experts / --expert-model-parallel-size) is too large: {} expert pieces "
                                  "per chunk, and a layer's Plan has tasks for each chunk and piece, --ampipe-degree "
                                  "{} x (1 + {}), at most {}",
                                  what, P, M, P, kMaxPlanGroups));
  }
  int64_t all = 0;
  if (__builtin_mul_overflow(groups, num_layers, &all) || all > kMaxStackPlanGroups)
    throw ConfigError(fmt::format("--num-layers {} is too large: one Plan per layer of {} task groups (M x (1 + "
                                  "pieces per chunk)) is {} x {}, and at most {} are planned for a stack",
                                  num_layers, groups, num_layers, groups, kMaxStackPlanGroups));
  return groups;
}

}  // namespace ampipe::model
