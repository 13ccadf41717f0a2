#include "ampipe/model/sequence_shard.h"

#include <cstring>

#include "ampipe/core/error.h"

namespace ampipe::model {

namespace {
// Copies sub-block (c, r) of `blocks` positions between the natural order and rank r's shard.
void move_blocks(const Tensor& src, Tensor& dst, int M, int t, int r, bool to_shard) {
  const int64_t s = to_shard ? src.size(0) : dst.size(0), row = src.numel() / src.size(0);  // b*h per position
  const int64_t sub = s / (int64_t(M) * t);                                                   // positions per block
  const float* from = src.data<float>();
  float* to = dst.data<float>();
  for (int c = 0; c < M; ++c) {
    const int64_t natural = (int64_t(c) * t + r) * sub, local = int64_t(c) * sub;
    const int64_t a = to_shard ? natural : local, b = to_shard ? local : natural;
    std::memcpy(to + b * row, from + a * row, size_t(sub * row) * sizeof(float));
  }
}
}  // namespace

Tensor sequence_shard(const Tensor& full, int M, int t, int r) {
  AMPIPE_CHECK(full.dim() == 3 && full.size(0) % (int64_t(M) * t) == 0 && full.dtype() == DType::f32,
               "sequence_shard of {} for M {} t {}", shape_str(full.shape()), M, t);
  Tensor out = Tensor::empty({full.size(0) / t, full.size(1), full.size(2)});
  move_blocks(full, out, M, t, r, /*to_shard=*/true);
  return out;
}

Tensor sequence_unshard(const Tensor& shards, int M, int t) {
  AMPIPE_CHECK(shards.dim() == 3 && shards.size(0) % (int64_t(M) * t) == 0 && shards.dtype() == DType::f32,
               "sequence_unshard of {} for M {} t {}", shape_str(shards.shape()), M, t);
  const int64_t per = shards.size(0) / t;
  Tensor out = Tensor::empty(shards.shape());
  for (int r = 0; r < t; ++r) move_blocks(shards.rows(r * per, (r + 1) * per), out, M, t, r, /*to_shard=*/false);
  return out;
}

}  // namespace ampipe::model
