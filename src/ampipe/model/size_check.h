// Overflow-checked sizes: every size a layer (or the model around it) derives from a user's numbers is checked here,
// before any Plan or tensor is built, so shape arithmetic elsewhere cannot overflow (docs/training.md, "Memory").
//
// A size is a product of factors, each a flag's value or a constant; the product is taken with
// __builtin_mul_overflow, and its bytes must stay at most kMaxTensorBytes. That bound (64 PiB, far beyond any
// machine) leaves room for the sums the memory plan and the estimate take over a few hundred such tensors and for
// the per-layer multiples, all in int64 / size_t. A size beyond it is refused with a ConfigError naming the flag
// with the largest value among the factors, every factor and the rule.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "ampipe/model/layer_config.h"

namespace ampipe::model {

inline constexpr int64_t kMaxTensorBytes = int64_t(1) << 56;

// One factor of a size: `flag` and its value, or (flag nullptr) a constant.
struct SizeFactor {
  const char* flag = nullptr;
  int64_t value = 1;
};

// The product of `factors` (each >= 0) in elements, checked: throws ConfigError when it overflows int64 or its
// `elem_bytes`-byte elements exceed kMaxTensorBytes. `what` names the tensor ("the [T, 3h] QKV activation").
int64_t checked_elements(const char* what, std::initializer_list<SizeFactor> factors, int64_t elem_bytes = 4);

// Checked a + b and a * b of byte counts already within bounds; throw ConfigError with `what` on overflow.
int64_t checked_add(int64_t a, int64_t b, const char* what);
int64_t checked_mul(int64_t a, int64_t b, const char* what);

// The layer's sizes (called by LayerConfig::validate after the per-flag rules): tokens T = s*b, the [T, h] and
// [T, 3h] activations, the [E, C, h] all-to-all buffers and the [L, M*R, F1] expert buffers at their bound (an
// expert slot per routed token), the gate's [S_c, E], the weights [3h, h] and [E, F1, h]. Independent of the AMPipe
// degree: those bounds do not grow with it.
void check_layer_sizes(const LayerConfig& cfg);

// The size of the Plans themselves (their task lists): a layer's Plan has a few tasks per chunk and per expert piece
// of a chunk, so about M x (1 + P) groups of tasks, P = pieces per chunk (pipe-experts: L x N/M; tp overlap: L;
// else 0). At most kMaxPlanGroups per layer and kMaxStackPlanGroups for `num_layers` layers (the stacks of train and
// simulate build one Plan per layer): far beyond any useful degree (a degree of 16 with 1024 pieces is 16400), and
// small enough that the task lists cannot exhaust memory before the memory check. Throws ConfigError naming
// --ampipe-degree (or --pipe-experts-multi-data, --num-layers). Returns the groups of one layer.
inline constexpr int64_t kMaxPlanGroups = int64_t(1) << 16;
inline constexpr int64_t kMaxStackPlanGroups = int64_t(1) << 20;
int64_t check_plan_size(const LayerConfig& cfg, int M, int64_t num_layers = 1);

}  // namespace ampipe::model
