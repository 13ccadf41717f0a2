#include "ampipe/model/context_parallel.h"

#include <cstring>

#include "ampipe/core/error.h"
#include "ampipe/model/sequence_shard.h"

namespace ampipe::model {

CpLayout CpLayout::make(int64_t s, int C, int r, int M) {
  AMPIPE_CHECK(C >= 1 && r >= 0 && r < C && M >= 1 && s % (2 * int64_t(C) * M) == 0,
               "context-parallel layout: s {} C {} r {} M {}", s, C, r, M);
  CpLayout l;
  l.s = s, l.C = C, l.r = r, l.M = M;
  l.sb = s / (2 * int64_t(C));
  l.len = l.sb / M;
  return l;
}

int64_t CpLayout::position(int64_t i) const {
  const int64_t c = i / (2 * len), in = i % (2 * len);
  return in < len ? a0() + c * len + in : b0() + c * len + (in - len);
}

TokenMap CpLayout::tokens(int64_t row0, int64_t rows, int64_t b, uint64_t base) const {
  const int64_t in = row0 % (2 * len);  // offset inside the chunk's [A_c ; B_c]
  const uint64_t first = base + uint64_t(position(row0) * b);
  if (in >= len || in + rows <= len) return TokenMap(first);  // inside one sub-block
  return TokenMap(TokenMap::Span{(len - in) * b, first}, TokenMap::Span{INT64_MAX, base + uint64_t(position(row0 + len - in) * b)});
}

namespace {
void move_rows(const Tensor& src, Tensor& dst, const CpLayout& l, bool to_shard) {
  const int64_t row = src.numel() / src.size(0);  // b*h per position
  const float* from = src.data<float>();
  float* to = dst.data<float>();
  for (int64_t i = 0; i < l.local_rows(); ++i) {
    const int64_t g = l.position(i), a = to_shard ? g : i, b = to_shard ? i : g;
    std::memcpy(to + b * row, from + a * row, size_t(row) * sizeof(float));
  }
}
}  // namespace

Tensor context_shard(const Tensor& full, int M, int C, int r) {
  AMPIPE_CHECK(full.dim() == 3 && full.dtype() == DType::f32 && full.is_contiguous(), "context_shard of {}",
               shape_str(full.shape()));
  const CpLayout l = CpLayout::make(full.size(0), C, r, M);
  Tensor out = Tensor::empty({l.local_rows(), full.size(1), full.size(2)});
  move_rows(full, out, l, /*to_shard=*/true);
  return out;
}

Tensor context_unshard(const Tensor& shards, int M, int C) {
  AMPIPE_CHECK(shards.dim() == 3 && shards.dtype() == DType::f32 && shards.is_contiguous(), "context_unshard of {}",
               shape_str(shards.shape()));
  Tensor out = Tensor::empty(shards.shape());
  const int64_t per = shards.size(0) / C;
  for (int r = 0; r < C; ++r) {
    const CpLayout l = CpLayout::make(shards.size(0), C, r, M);
    move_rows(shards.rows(r * per, (r + 1) * per), out, l, /*to_shard=*/false);
  }
  return out;
}

Tensor layer_rows(const Tensor& full, int64_t cp, int64_t tp, bool sp, int M, int cp_rank, int tp_rank) {
  Tensor x = cp > 1 ? context_shard(full, M, int(cp), cp_rank) : full;
  return sp && tp > 1 ? sequence_shard(x, M, int(tp), tp_rank) : x;
}

std::vector<CpAttentionCall> cp_attention_calls(const CpLayout& cp, int c, int t, int64_t b, int64_t nl, int64_t d,
                                                int64_t n_kv) {
  const int64_t len = cp.len, sb = cp.sb;
  const int64_t qa = cp.a0() + c * len, qb = cp.b0() + c * len;  // positions of the chunk's two sub-blocks
  auto call = [&](int q_half, int k_half, int64_t k_rows, int64_t k_offset, bool merge) {
    CpAttentionCall x;
    x.q_half = q_half, x.k_half = k_half, x.k_rows = k_rows;
    x.shape = {len, k_rows, b, nl, d, q_half == 0 ? qa : qb};
    x.shape.k_offset = k_offset;
    x.shape.n_kv = n_kv;
    x.shape.merge = merge;
    return x;
  };
  std::vector<CpAttentionCall> calls;
  const int64_t seen = (int64_t(c) + 1) * len;  // own keys of the same half a causal sub-block sees
  if (t == 0) {
    calls.push_back(call(0, 0, seen, cp.a0(), false));  // qA x own A, causal
    calls.push_back(call(1, 0, sb, cp.a0(), false));    // qB x own A, full
    calls.push_back(call(1, 1, seen, cp.b0(), true));   // qB x own B, causal
    return calls;
  }
  const int j = (cp.r - t + cp.C) % cp.C;
  const int64_t ja = int64_t(j) * sb, jb = int64_t(2 * cp.C - 1 - j) * sb;
  if (j < cp.r) calls.push_back(call(0, 0, sb, ja, true));
  calls.push_back(call(1, 0, sb, ja, true));
  if (j > cp.r) calls.push_back(call(1, 1, sb, jb, true));
  return calls;
}

}  // namespace ampipe::model
