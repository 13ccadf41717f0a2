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

void sequence_shard_into(const Tensor& full, Tensor& out, int M, int t, int r) {
  AMPIPE_CHECK(full.dim() == 3 && full.size(0) % (int64_t(M) * t) == 0 && full.dtype() == DType::f32 &&
                   out.shape() == (Shape{full.size(0) / t, full.size(1), full.size(2)}) && out.is_contiguous(),
               "sequence_shard of {} into {} for M {} t {}", shape_str(full.shape()), shape_str(out.shape()), M, t);
  move_blocks(full, out, M, t, r, /*to_shard=*/true);
}

Tensor sequence_shard(const Tensor& full, int M, int t, int r) {
  Tensor out = Tensor::empty({full.size(0) / t, full.size(1), full.size(2)});
  sequence_shard_into(full, out, M, t, r);
  return out;
}

void sequence_unshard_into(const Tensor& shards, Tensor& out, int M, int t) {
  AMPIPE_CHECK(shards.dim() == 3 && shards.size(0) % (int64_t(M) * t) == 0 && shards.dtype() == DType::f32 &&
                   out.shape() == shards.shape() && out.is_contiguous(),
               "sequence_unshard of {} into {} for M {} t {}", shape_str(shards.shape()), shape_str(out.shape()), M, t);
  const int64_t per = shards.size(0) / t;
  for (int r = 0; r < t; ++r) move_blocks(shards.rows(r * per, (r + 1) * per), out, M, t, r, /*to_shard=*/false);
}

Tensor sequence_unshard(const Tensor& shards, int M, int t) {
  Tensor out = Tensor::empty(shards.shape());
  sequence_unshard_into(shards, out, M, t);
  return out;
}

}  // namespace ampipe::model
