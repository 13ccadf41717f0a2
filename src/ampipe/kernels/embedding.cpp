#include "ampipe/kernels/embedding.h"

#include "ampipe/core/error.h"
#include "ampipe/core/parallel.h"

namespace ampipe::kernels {

void embedding_forward(const Tensor& wte, const Tensor& wpe, std::span<const int32_t> tokens,
                       std::span<const int64_t> pos, int64_t b, Tensor& x) {
  const int64_t T = int64_t(tokens.size()), V = wte.size(0), h = wte.size(1);
  AMPIPE_CHECK(x.numel() == T * h && int64_t(pos.size()) * b == T, "embedding_forward: x {} elements, {} tokens, "
               "{} positions x b {}", x.numel(), T, pos.size(), b);
  const float* e = wte.data<float>();
  const float* pe = wpe.defined() ? wpe.data<float>() : nullptr;  // no table: token embeddings only
  float* xp = x.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    const int32_t tok = tokens[size_t(t)];
    AMPIPE_CHECK(tok >= 0 && tok < V, "token {} at {} outside [0, {})", tok, t, V);
  }
  parallel_for(T, rows_grain(h), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t tok = tokens[size_t(t)];
      const float* er = e + int64_t(tok) * h;
      float* xr = xp + t * h;
      if (pe == nullptr) {
        for (int64_t j = 0; j < h; ++j) xr[j] = er[j];
        continue;
      }
      const float* pr = pe + pos[size_t(t / b)] * h;
      for (int64_t j = 0; j < h; ++j) xr[j] = er[j] + pr[j];
    }
  });
}

void embedding_backward(const Tensor& dx, std::span<const int32_t> tokens, std::span<const int64_t> pos, int64_t b,
                        Tensor& dwte_accum, Tensor& dwpe_accum) {
  const int64_t T = int64_t(tokens.size()), h = dwte_accum.size(1);
  AMPIPE_CHECK(dx.numel() == T * h && int64_t(pos.size()) * b == T, "embedding_backward: dx {} elements, {} tokens, "
               "{} positions x b {}", dx.numel(), T, pos.size(), b);
  const float* g = dx.data<float>();
  float* de = dwte_accum.data<float>();
  float* dp = dwpe_accum.defined() ? dwpe_accum.data<float>() : nullptr;
  // Rows of the tables repeat (a token seen twice), so the columns are spread over the threads and every column
  // sums its tokens in token order: the same sums at any thread count.
  parallel_for(h, kColumnGrain, [&](int64_t j0, int64_t j1) {
    for (int64_t t = 0; t < T; ++t) {
      const float* gr = g + t * h;
      float* er = de + int64_t(tokens[size_t(t)]) * h;
      for (int64_t j = j0; j < j1; ++j) er[j] += gr[j];
      if (dp == nullptr) continue;
      float* pr = dp + pos[size_t(t / b)] * h;
      for (int64_t j = j0; j < j1; ++j) pr[j] += gr[j];
    }
  });
}

}  // namespace ampipe::kernels
