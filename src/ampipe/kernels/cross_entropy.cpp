#include "ampipe/kernels/cross_entropy.h"
#include "ampipe/kernels/checks.h"
#include "ampipe/core/parallel.h"

#include <cmath>

namespace ampipe::kernels {
namespace {
using detail::check_f32;
void check_targets(std::span<const int32_t> targets, int64_t rows, int64_t v, const char* op) {
  AMPIPE_CHECK(int64_t(targets.size()) == rows, "{}: {} targets for {} rows", op, targets.size(), rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = targets[size_t(r)];
    AMPIPE_CHECK(t == kIgnoreIndex || (0 <= t && t < v), "{}: target {} at row {} is outside [0, V = {}) and not "
                 "the ignore index {}", op, t, r, v, kIgnoreIndex);
  }
}
}  // namespace

void cross_entropy_forward(const Tensor& logits, std::span<const int32_t> targets, Tensor& loss, Tensor& lse) {
  AMPIPE_CHECK(logits.dim() == 2, "cross_entropy_forward: logits must be 2-D [rows, V], got {}",
               shape_str(logits.shape()));
  const int64_t rows = logits.size(0), v = logits.size(1);
  AMPIPE_CHECK(v > 0, "cross_entropy_forward: V = 0");
  check_f32(logits, "cross_entropy_forward", "logits", {rows, v});
  check_f32(loss, "cross_entropy_forward", "loss", {rows});
  check_f32(lse, "cross_entropy_forward", "lse", {rows});
  check_targets(targets, rows, v, "cross_entropy_forward");
  const float* lp = logits.data<float>();
  float* lossp = loss.data<float>();
  float* lsep = lse.data<float>();
  parallel_for(rows, rows_grain(v), [&](int64_t r0_, int64_t r1_) {
    for (int64_t r = r0_; r < r1_; ++r) {
      const float* lr = lp + r * v;
      float mx = lr[0];
      for (int64_t j = 1; j < v; ++j) mx = std::fmax(mx, lr[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(lr[j] - mx);
      const float l = mx + std::log(sum);
      lsep[r] = l;
      const int32_t t = targets[size_t(r)];
      lossp[r] = t == kIgnoreIndex ? 0.0f : l - lr[t];
    }
  });
}

void cross_entropy_backward(const Tensor& dloss, const Tensor& logits, std::span<const int32_t> targets,
                            const Tensor& lse, Tensor& dlogits) {
  AMPIPE_CHECK(logits.dim() == 2, "cross_entropy_backward: logits must be 2-D [rows, V], got {}",
               shape_str(logits.shape()));
  const int64_t rows = logits.size(0), v = logits.size(1);
  check_f32(dloss, "cross_entropy_backward", "dloss", {rows});
  check_f32(logits, "cross_entropy_backward", "logits", {rows, v});
  check_f32(lse, "cross_entropy_backward", "lse", {rows});
  check_f32(dlogits, "cross_entropy_backward", "dlogits", {rows, v});
  check_targets(targets, rows, v, "cross_entropy_backward");
  const float* dlp = dloss.data<float>();
  const float* lp = logits.data<float>();
  const float* lsep = lse.data<float>();
  float* dp = dlogits.data<float>();
  parallel_for(rows, rows_grain(v), [&](int64_t r0_, int64_t r1_) {
    for (int64_t r = r0_; r < r1_; ++r) {
      const float* lr = lp + r * v;
      float* dr = dp + r * v;
      const int32_t t = targets[size_t(r)];
      if (t == kIgnoreIndex) {
        for (int64_t j = 0; j < v; ++j) dr[j] = 0.0f;
        continue;
      }
      const float l = lsep[r], g = dlp[r];
      const float lt = lr[t];  // read before the row is overwritten (dlogits may alias logits)
      for (int64_t j = 0; j < v; ++j) dr[j] = std::exp(lr[j] - l) * g;
      dr[t] = (std::exp(lt - l) - 1.0f) * g;
    }
  });
}

}  // namespace ampipe::kernels
