// Context parallelism's row layout and ring attention plan (docs/ampipe.md §6, docs/layer.md §12).
//
// C context-parallel (cp) ranks share one sequence of s positions. The sequence is cut into 2C blocks of
// sb = s/(2C) positions; cp rank r holds block r (its early half "A") and block 2C-1-r (its late half "B"), so
// every rank has the same causal attention work (Megatron's load-balanced layout). With AMPipe degree M each half
// is cut into M sub-blocks of len = sb/M positions and the rank's s/C local rows are, chunk by chunk,
// [A_c ; B_c]: chunk c holds the c-th sub-block of each half. At M = 1 that is Megatron's [A ; B]; at M > 1 every
// chunk has the same attention work on every rank too (an early and a late sub-block), so no rank holds up the
// chunk's all-to-all. With sequence parallelism the tp ranks split each chunk's rows as without cp.
//
// K and V travel around the cp ring packed per rank as [A ; B] (each half contiguous): slot t of the ring holds
// the K, V of cp rank (r - t) mod C. Chunk c's queries need:
//   slot 0 (own):  qA_c x own A [0, (c+1)len) causal; qB_c x own A (all); qB_c x own B [0, (c+1)len) causal
//   slot t > 0:    rank j = (r - t) mod C: qA_c x A_j if j < r; qB_c x A_j; qB_c x B_j if j > r (all full blocks)
// Every remote slot is two full len x sb blocks on every rank, the own slot the same causal work on every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "ampipe/core/tensor.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/model/token_map.h"

namespace ampipe::model {

struct CpLayout {
  int64_t s = 0;  // global sequence
  int C = 1, r = 0, M = 1;
  int64_t sb = 0, len = 0;  // positions per half block, per sub-block

  static CpLayout make(int64_t s, int C, int r, int M);
  int64_t a0() const { return int64_t(r) * sb; }             // first position of the early half
  int64_t b0() const { return int64_t(2 * C - 1 - r) * sb; }  // of the late half
  int64_t local_rows() const { return 2 * sb; }
  // Global position of local row i (0 <= i < s/C).
  int64_t position(int64_t i) const;
  // Global token indices of local rows [row0, row0 + rows) (rows within one chunk), b tokens per row, starting at
  // global token `base` of the micro-batch.
  TokenMap tokens(int64_t row0, int64_t rows, int64_t b, uint64_t base) const;
};

// Rank r's rows [s/C, b, h] of a natural-order activation [s, b, h], and the natural order back from every rank's
// rows ([C * s/C, b, h] in cp-rank order, an all-gather of context_shard's results).
Tensor context_shard(const Tensor& full, int M, int C, int r);
Tensor context_unshard(const Tensor& shards, int M, int C);
// The rows a rank feeds the layer from a natural-order activation [s, b, h]: its cp rows (context_shard), then of
// those its tp rows with sequence parallelism (sequence_shard); the whole tensor for cp = 1 without sequence
// parallelism. To put outputs back: all-gather over tp and sequence_unshard, then over cp and context_unshard.
Tensor layer_rows(const Tensor& full, int64_t cp, int64_t tp, bool sp, int M, int cp_rank, int tp_rank);

// One kernel call of a chunk's ring attention: query rows of one half of the chunk against one half of one
// slot's packed K, V.
struct CpAttentionCall {
  int q_half = 0;              // 0: the chunk's A sub-block (its first len rows), 1: its B sub-block
  int k_half = 0;              // 0: the slot's A half (packed rows [0, sb)), 1: its B half ([sb, 2sb))
  int64_t k_rows = 0;          // keys used: the first k_rows positions of that half
  kernels::AttentionShape shape;  // q_offset, k_offset global positions; merge set for all but each half's first
};
// The calls of chunk c against slot t (t = 0: own K, V), in the order they run. The own slot runs first (the Plan
// orders it so): its first call of each half writes the output and lse, every later call merges into them.
// b, nl, d, n_kv: micro-batch, local heads, head dim, local K, V heads (AttentionShape::n_kv).
std::vector<CpAttentionCall> cp_attention_calls(const CpLayout& cp, int c, int t, int64_t b, int64_t nl, int64_t d,
                                                int64_t n_kv);

}  // namespace ampipe::model
