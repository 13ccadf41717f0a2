// Causal multi-head self-attention, flash-attention style, for one block of query rows (an AMPipe chunk)
// against the key/value rows [0, skv) of the sequence prefix.
//
// Notation (docs/design.md, "Notation and names"): s sequence, b micro-batch, n heads, d head dim, h = n*d.
//   sq       query rows in this call (s/M for chunk c)
//   skv      key/value rows: the model passes (c+1)*s/M for chunk c, the rows its causal queries can see (their
//            K, V come from the QKV of chunks 0..c, so chunk c's attention needs no later chunk); s for M = 1
//   q_offset position of local query row 0 in the sequence (c*s/M); key j is visible to local query i
//            iff j <= q_offset + i (and j < skv). Row 0 always sees key 0, so no row is empty.
//
// Strided [s, b, n*d] operands: a matrix X with row stride `ld` (elements, >= n*d) holds element
// (token i, batch bb, head hh, dd) at X[(i*b + bb)*ld + hh*d + dd]. So q, k, v may be column ranges of one
// fused qkv buffer [s*b, 3h] (ld = 3h) without a copy: q = qkv, k = qkv + h, v = qkv + 2h. With grouped-query
// attention (AttentionShape::n_kv = g < n) k and v are [s, b, g*d] (fused: [s*b, (n + 2g)*d]) and dk, dv sum the
// gradients of every query head of the group.
//
// Softmax scale 1/sqrt(d). Work is done in query blocks x key blocks with an online softmax: no sq x skv
// matrix is held, and key blocks entirely above the diagonal are skipped (causal FLOPs only). Block
// matmuls go through kernels::gemm (oneDNN); scratch is kept in the compute context (context.h),
// one per OpenMP thread, and reused between calls (it only grows).
// Threads (kernels/parallel.h): one unit of work per (batch, K/V head), each on one thread with single-threaded
// block GEMMs; units write disjoint outputs, so the result is the same bits at any thread count.
//
// dtype `in` is the type of q, k and v (all three the same): f32 or bf16. In bf16 mode every block GEMM
// takes bf16 inputs (the probabilities P and dS, and dout, are rounded to bf16 before the GEMMs that consume
// them) with fp32 accumulation; softmax statistics and lse are fp32; out, dq, dk, dv are always fp32.
#pragma once

#include <cstdint>

#include "ampipe/core/dtype.h"
#include "ampipe/core/philox.h"
#include "ampipe/core/tensor.h"
#include "ampipe/kernels/context.h"

namespace ampipe::kernels {

// Dropout on the attention probabilities (Megatron's --attention-dropout): each P_ij is kept with probability 1 - p
// and then scaled by 1 / (1 - p) (out = sum_j P_ij m_ij V_j; lse and the softmax normalisation use the undropped
// P). The keep decision is kernels/dropout.h's rule, keyed by
//   token   = token_base + (q_offset + i) * b + batch   the query's global token index (as the hidden dropout's)
//   feature = (head0 + head) * seq + (k_offset + j)     the key's sequence position, per global head
// so it depends neither on how the queries are chunked, nor on context parallelism's key blocks, nor on which
// tensor-parallel rank holds the head. The backward regenerates the mask. p = 0: no dropout (no Philox).
struct AttentionDropout {
  float p = 0.0f;
  core::PhiloxKey key{};
  uint64_t token_base = 0;  // global token index of the micro-batch's position 0, batch 0
  int64_t head0 = 0;        // global index of local head 0 (tp rank x local heads)
  int64_t seq = 0;          // positions per head in the feature index (the whole sequence length s)
};

struct AttentionShape {
  int64_t sq = 0;        // query rows in this chunk
  int64_t skv = 0;       // key/value rows [0, skv): (c+1)*s/M for chunk c
  int64_t b = 0;         // micro-batch
  int64_t n = 0;         // heads
  int64_t d = 0;         // head dim
  int64_t q_offset = 0;  // sequence position of local query row 0
  // Context parallelism (partial attention over one block of keys, docs/layer.md §12):
  int64_t k_offset = 0;  // sequence position of key row 0: key j is visible to query i iff k_offset + j <=
                         // q_offset + i. Must be <= q_offset (key row 0 is visible to every query row).
  bool merge = false;    // forward: out and lse already hold the normalised result of other key blocks; this
                         // call's result is merged into them by log-sum-exp (online softmax across calls)
  bool accumulate_dq = false;  // backward: dq += (instead of =), for a query block split over several key blocks
  AttentionDropout dropout{};  // on the probabilities (training); q_offset, k_offset are then global positions
  // Grouped-query attention (Megatron's --num-query-groups): k and v hold n_kv heads, and query head hh reads K, V
  // head hh / (n / n_kv) (n_kv divides n; the query heads of a group are consecutive). 0: n_kv = n.
  int64_t n_kv = 0;
  int64_t kv_heads() const { return n_kv > 0 ? n_kv : n; }
};

// Tile sizes (rows of Q, rows of K/V per block). The defaults were tuned for d = 128, s = 4096 on one Zen 3
// core (bench/bench_attention.cpp): 128 x 256 keeps the [bq, kb] fp32 logit and dP tiles (128 KiB each) in
// the 512 KiB L2; 256 x 512 was ~10% slower, 1024 key rows ~20%. Tests pass small ones to exercise tiling.
struct AttentionBlocks {
  int64_t q = 128;
  int64_t k = 256;
};

// Visible (query, key) pairs for one (batch, head): sum over local i of min(skv, q_offset - k_offset + i + 1).
int64_t causal_attention_pairs(const AttentionShape& sh);
// FLOPs counted on visible pairs only, summed over b and n heads (masked work on diagonal blocks is not
// counted). Forward: 2 matmuls (Q K^T, P V) = 4*d per pair. Backward: 5 matmuls (recompute Q K^T,
// dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q) = 10*d per pair (2.5x the forward).
double causal_attention_flops(const AttentionShape& sh, bool backward);

// ---- Tensor form (use this) ------------------------------------------------------------------------------
// Operands are 2-D matrices [rows*b, n*d] with unit column stride and any row stride >= n*d, so they may be
// views of a fused [s*b, 3h] qkv buffer: for chunk c (rows [q_offset, q_offset + sq), keys [0, skv))
//   q = qkv.rows(q_offset*b, (q_offset+sq)*b).cols(0, h), k = qkv.rows(0, skv*b).cols(h, 2h), v likewise (2h, 3h).
// Row counts must match `sh` exactly. Shapes, dtypes and strides are AMPIPE_CHECKed; then the raw form below
// runs with the tensors' row strides.
//   q [sq*b, h], k, v [skv*b, g*d] (g = sh.kv_heads(), h = n*d): fp32 or bf16, all three the same dtype (the `in`
//   of the raw form).
//   out [sq*b, h] fp32, overwritten. lse: fp32, contiguous, numel b*n*sq (any shape), overwritten.
void attention_forward(const AttentionShape& sh, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& lse, const AttentionBlocks& blocks = {}, ComputeContext& ctx = ComputeContext::host());

//   dout, out [sq*b, h] fp32; q, k, v, lse as in attention_forward.
//   dq [sq*b, h] fp32, overwritten. dk_accum, dv_accum [skv*b, g*d] fp32, ACCUMULATED (+=), as in the raw form.
// dq, dk_accum and dv_accum may be column ranges of one fused [s*b, 3h] fp32 gradient buffer.
void attention_backward(const AttentionShape& sh, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk_accum,
                        Tensor& dv_accum, const AttentionBlocks& blocks = {},
                        ComputeContext& ctx = ComputeContext::host());

// ---- Raw form (pointers and row strides; the Tensor form calls these) ---------------------------------------
// q: [sq, b, n*d] with row stride ldq; k, v: [skv, b, g*d] (g = sh.kv_heads()) with row strides ldk, ldv; type `in`.
// out: [sq, b, n*d] fp32, row stride ldo, overwritten.
// lse: [b, n, sq] fp32 (packed), overwritten: log(sum_j exp(q_i.k_j / sqrt(d))) over visible j; read by
//      attention_backward. With sh.merge, out and lse hold a previous partial result (other keys of the same
//      queries) and receive the merged one: lse = log(e^lse + e^lse_this), out weighted by the two shares. The
//      backward of a merged result runs once per key block with the final out and lse (and accumulate_dq).
void attention_forward(const AttentionShape& sh, DType in, const void* q, int64_t ldq, const void* k,
                       int64_t ldk, const void* v, int64_t ldv, float* out, int64_t ldo, float* lse,
                       const AttentionBlocks& blocks = {}, ComputeContext& ctx = ComputeContext::host());

// dout: [sq, b, n*d] fp32 (row stride lddo), the gradient of out. q, k, v, out, lse: as in / from
// attention_forward for the same shape.
// dq: [sq, b, n*d] fp32 (row stride lddq), overwritten.
// dk_accum, dv_accum: [skv, b, g*d] fp32 (row strides lddk, lddv), ACCUMULATED (+=): every query chunk adds
//      its contribution to the shared K/V gradient, so the caller zeroes them once before the first chunk.
void attention_backward(const AttentionShape& sh, DType in, const float* dout, int64_t lddo, const void* q,
                        int64_t ldq, const void* k, int64_t ldk, const void* v, int64_t ldv, const float* out,
                        int64_t ldo, const float* lse, float* dq, int64_t lddq, float* dk_accum, int64_t lddk,
                        float* dv_accum, int64_t lddv, const AttentionBlocks& blocks = {},
                        ComputeContext& ctx = ComputeContext::host());

}  // namespace ampipe::kernels
