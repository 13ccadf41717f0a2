// The memory of a layer step, planned once (docs/plan.md, "Memory"). Every tensor a stage writes is one of the
// named buffers below; its shape, dtype, chunk count and scope are functions of LayerDims, so the whole plan is
// known before the first step and the bytes are carved from one Arena.
//
// Scopes:
//   saved    one copy per layer: what the forward leaves for the backward (and the layer's output y and input
//            gradient dx, which the neighbouring layers read).
//   shared   one copy for every layer of a stack: transient values that live inside one layer's forward or one
//            layer's backward (communication buffers, the backward's gradients, bf16 staging copies). A layer's
//            forward (or backward) waits for all its collectives before the next layer starts, so reuse is safe.
//            A recomputed layer (LayerDims::recompute) plans everything but y and dx here: its forward is re-run
//            into them just before its backward.
// Per-chunk buffers (chunks = M) have one slot per chunk, so a chunk's all-to-all buffers stay untouched while
// later chunks compute. Shapes that depend on the capacity are planned at LayerDims::C; at run time a chunk uses
// the leading part of its slot for its actual capacity (only --moe-no-drop uses less than planned).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampipe/core/tensor.h"
#include "ampipe/model/layer_dims.h"

namespace ampipe::model {

enum class Buf : uint8_t {
  // attention block
  ln1_mean, ln1_rstd,  // [T]
  ln1_out,             // [T, h] fp32 LN1 output (bf16 mode: [S_c, h], one chunk's staging)
  ln1_out_bf16,          // [T, h] its bf16 copy (bf16 only)
  qkv,                 // [T, 3h] fp32 QKV projection, columns [q | k | v] (bf16 mode: [S_c, 3h] staging); with
                       // grouped-query attention [T, (n + 2g)d/t]; q and k rotated with RoPE
  qkv_bf16,              // [T, 3h] its bf16 copy (bf16 only); attention reads it
  attn,                // [T, h] fp32 attention output
  attn_bf16,             // [T, h] its bf16 copy (bf16 only)
  lse,                 // [M, b*n*sq] log-sum-exp of every chunk's attention rows
  proj,                // [T, h] output projection
  ln_in,               // [T, h] x + dropout(proj): the residual stream entering the MoE half
  ln2_mean, ln2_rstd,  // [T]
  ln2_out,             // [T, h] LN2 output, the MoE input
  // MoE block, per chunk unless noted
  gate_probs,          // [S_c, E] clean softmax of the router
  gate_input,          // [S_c, h] jittered router input (Jitter only)
  capacity_need,       // [1] this rank's required capacity (--moe-no-drop with ep > 1)
  capacity_all,        // [ep] every EP rank's
  dispatch_rows,       // [E, C, h] the gate's dispatch layout (pieced MoE only: pipe-experts or the tp overlap; packed into dispatch_send's pieces)
  // Piece-major (all-to-all) buffers: a chunk slot holds its pieces one after another, piece p at rows
  // [row0, row0 + ep*experts*slots) laid out [ep][experts][slots][h] (ExpertPiece). Without pipe-experts a chunk is
  // one piece of all L experts and C slots, so [ep][L][C][h] = [E, C, h] in expert order.
  dispatch_send,       // [E, C, h] slots in expert order: block j (experts [j*L, (j+1)*L)) goes to EP rank j
  dispatch_recv,       // [ep, L, C, h] the slots of this rank's experts, from every EP rank
  // Expert-major buffers hold every chunk: [L, M*ep*C, *], local expert l's slots of chunk c at rows
  // [c*ep*C, (c+1)*ep*C) of block l (LayerMemory::expert_rows), so a weight gradient can take all chunks at once.
  expert_in,           // [L, M*ep*C, h] the received slots, grouped by local expert
  fc1_out,             // [L, M*ep*C, F1]
  act,                 // [L, M*ep*C, F] activation (GeLU or SwiGLU); bf16 mode: [ep*C, F], one expert's staging
  act_bf16,              // [L, M*ep*C, F] its bf16 copy (bf16 only)
  expert_out,          // [L, ep*C, h] fp32 expert output (one slot, reused by every chunk)
  combine_send,        // [ep, L, C, h] expert outputs back to their tokens' ranks (converted while packed)
  combine_recv,        // [E, C, h] received expert outputs (bf16 or pipe-experts; else they land in expert_y)
  expert_y,            // [E, C, h] fp32 expert outputs of this rank's tokens (the weighted sum's backward reads it)
  moe_out,             // [T, h] weighted sum of the expert outputs
  y,                   // [s, b, h] the layer output
  // backward
  d_moe,               // [S_c, h] one slot: dropout backward of the weighted sum
  d_expert_y,          // [E, C, h] fp32 gradient of expert_y (bf16 or pipe-experts; else it is combine_bwd_send)
  d_weight,            // [S_c, k] gradient of the gate weights
  combine_bwd_send,    // [E, C, h] the reverse of combine
  combine_bwd_recv,    // [ep, L, C, h]
  d_expert_out,        // [L, M*ep*C, h] expert-major, every chunk (the deferred fc2 weight gradient reads it)
  d_expert_in,         // [L, ep*C, h] fp32, one slot (converted while packed into dispatch_bwd_send)
  d_act,               // [ep*C, F] one slot, one expert at a time
  d_fc1,               // [L, M*ep*C, F1] expert-major; bf16 mode: [ep*C, F1], one expert's staging
  d_fc1_bf16,            // [L, M*ep*C, F1] its bf16 copy (bf16 only)
  dispatch_bwd_send,   // [ep, L, C, h] the reverse of dispatch
  dispatch_bwd_recv,   // [E, C, h]
  d_dispatch,          // [E, C, h] fp32 copy of dispatch_bwd_recv (bf16 or pipe-experts), one slot
  d_logits,            // [S_c, E] one slot
  d_ln_in, d_ln2,      // [T, h]
  d_proj, d_attn,      // [T, h]
  d_proj_bf16,           // [T, h] bf16 copy of d_proj (bf16 only; the deferred weight gradient reads every row)
  dqkv,                // [T, 3h] fp32; the K and V columns accumulate over chunks
  dqkv_bf16,             // [T, 3h] bf16 copy of dqkv (bf16 only), rows written once a chunk's rows are final
  d_ln1_out,           // [S_c, h] per chunk: the QKV input gradient (tp > 1: partial sums, reduced over tp)
  dx,                  // [s, b, h] the layer's input gradient
  // tensor parallelism with sequence parallelism (tp > 1): the local halves of the collectives that move rows
  // between the residual stream (Tl rows) and the attention core or the experts (every row of a chunk)
  ln1_local,           // [Scl, h] fp32 LN1 output of the chunk's local rows, one slot (the all-gather's input in fp32)
  ln1_send,            // [Scl, h] its bf16 copy, the all-gather's input (bf16 only)
  proj_partial,        // [S_c, h] fp32 out-projection partial sums, one slot (reduce-scattered into proj)
  d_proj_full,         // [T, h] fp32 gradient of the out-projection output, all rows (all-gathered from d_proj)
  d_proj_send,         // [Scl, h] bf16 copy of a chunk's d_proj rows, the all-gather's input (bf16 only)
  d_ln1_local,         // [Scl, h] per chunk: the QKV input gradient of the local rows (reduce-scattered)
  expert_gather,       // [t*ep, L, C, h] per chunk: dispatch_recv all-gathered over tp (the experts' input)
  combine_partial,     // [t*ep, L, C, h] per chunk: the experts' partial outputs (reduce-scattered into combine_send)
  d_gather,            // [t*ep, L, C, h] per chunk: combine_bwd_recv all-gathered over tp
  dispatch_bwd_partial,  // [t*ep, L, C, h] per chunk: the experts' partial input gradients (reduce-scattered)
  gate_stats,          // [2E + 2] the gate statistics of the local rows (sum probs, first-choice counts, tokens,
                       // the z-loss's sum of lse^2); seq_aux_loss: then [b, E] each per sequence (probs, counts)
  // sequence parallel in bf16: the attention side's reductions carry bf16 (reduced in fp32, rounded once)
  proj_send,           // [S_c, h] bf16 copy of proj_partial, one slot
  proj_recv,           // [Tl, h] bf16: the reduce-scattered rows of every chunk (converted into proj)
  d_ln1_send,          // [S_c, h] bf16 copy of d_ln1_out, per chunk
  d_ln1_recv,          // [Scl, h] bf16, per chunk (converted into d_ln1_local)
  // context parallelism (cp > 1): one slot per ring step t = 0..C-1, holding cp rank (r - t) mod C's rows packed as
  // [A half ; B half] (model/context_parallel.h)
  cp_kv,               // [T, 2h/t] compute dtype, [k | v]: slot 0 this rank's (written by qkv), slot t received
  cp_dkv,              // [T, 2h/t] fp32 [dk | dv] of slot t's keys from this rank's queries (+ partial sums passed on)
  cp_dkv_recv,         // [T, 2h/t] compute dtype: partial sums received at ring step t (backward)
  cp_dkv_send,         // [T, 2h/t] bf16 copy of cp_dkv slot t, what ring step t sends (bf16 only: the dK, dV sums
                       // travel in the compute dtype, as K and V do, and are added in fp32)
  // the dense MLP (LayerDims::mlp, model/mlp_block.h): a dense layer's FFN, or the shared expert; row buffers
  mlp_send,            // [Tl, h] bf16 copy of ln2_out, the all-gather's input (sequence parallel in bf16 only)
  mlp_in,              // [T, h] compute dtype: every row's MLP input (sequence parallel: all-gathered; bf16:
                       // converted); fp32 without sequence parallelism the MLP reads ln2_out itself
  mlp_fc1,             // [T, F1m/t] fp32
  mlp_act,             // [T, Fm/t] fp32 activation (bf16 mode: [S_c, Fm/t], one chunk's staging)
  mlp_act_bf16,        // [T, Fm/t] its bf16 copy (bf16 only)
  mlp_out,             // [T, h] fp32 output; tp: partial sums over the local F columns, all-reduced in place or
                       // reduce-scattered into mlp_y
  mlp_y,               // [Tl, h] fp32 the reduce-scattered rows (sequence parallel only)
  d_mlp,               // [Tl, h] fp32 gradient of the MLP output (the weighted sum's dropout backward)
  d_mlp_full,          // [T, h] fp32 d_mlp all-gathered (sequence parallel only)
  d_mlp_bf16,          // [T, h] bf16 copy of every row's output gradient (bf16 only)
  d_mlp_act,           // [S_c, Fm/t] fp32, one slot
  d_mlp_fc1,           // [T, F1m/t] fp32 (bf16 mode: [S_c, F1m/t], one chunk's staging)
  d_mlp_fc1_bf16,      // [T, F1m/t] its bf16 copy (bf16 only)
  d_mlp_in,            // [T, h] fp32 input gradient; tp: partial sums, all-reduced in place or reduce-scattered
  d_mlp_in_local,      // [Tl, h] fp32 the reduce-scattered rows (sequence parallel only)
  // --qk-layernorm (the per-head norm of q and k after the QKV projection, before RoPE)
  qk_raw,              // [T*(hl + kvl)] fp32 q and k before the norm: every row's q ([T*nl, d]) then k ([T*gl, d])
  qk_stats,            // [2*T*(nl + gl)] the norm's mean (LayerNorm) then rstd, of every (row, head): q's then k's
  qk_scratch,          // [2*S_c*(hl + kvl)] one chunk's normalised q, k (forward) or their two gradients (backward)
  capacity_tp,         // [tp * ep] per chunk: every tp rank's capacity_all (a dropless router with sequence parallelism)
};
inline constexpr int kNumBufs = int(Buf::capacity_tp) + 1;

enum class Scope : uint8_t { saved, shared };

struct BufferSpec {
  Buf id{};
  std::string name;
  DType dtype = DType::f32;
  Shape shape;     // of one chunk slot, at the planned capacity
  int chunks = 1;  // slots (1, or M for per-chunk buffers)
  Scope scope = Scope::saved;
  size_t slot_bytes() const;
  size_t bytes() const { return slot_bytes() * size_t(chunks); }
};

const char* buf_name(Buf b);
// Buffers holding the slots of all t*ep source ranks (sequence parallelism's all-gathered expert buffers): a
// piece's rows are t times those of an all-to-all buffer.
bool gathered_over_tp(Buf b);
// Row buffers: a collective of chunk c moves rows [c*n/M, (c+1)*n/M) of them.
bool chunked_by_rows(Buf b);
// Shape of one slot of `b` for expert capacity C (the planned one, or a chunk's actual one).
Shape buffer_shape(const LayerDims& d, Buf b, int64_t C);
// The buffers a layer with these dims uses (buffers not needed, e.g. bf16 copies in fp32 mode, are left out).
std::vector<BufferSpec> layer_buffers(const LayerDims& d);

// Byte offsets of every (buffer, slot) of one scope, each 64-byte aligned.
struct BufferLayout {
  std::vector<BufferSpec> specs;                      // in Buf order, needed buffers only
  std::vector<std::vector<size_t>> offset;            // [Buf][slot]; empty for a buffer not needed
  std::vector<int> spec_index;                        // [Buf] position in specs, -1 for a buffer not needed
  size_t saved_bytes = 0, shared_bytes = 0;           // one layer's saved region, the shared region
  static BufferLayout make(const LayerDims& d);
  const BufferSpec* spec(Buf b) const;
};

// One allocation that the buffers of a stack are carved from: [layer 0 saved | layer 1 saved | ... | shared].
// Several stacks that never run at the same time (bench-layer's degrees) may share one Arena: it is sized for the
// largest. reserve() before the first step; growing later reallocates (views taken earlier keep the old storage
// alive but are no longer the arena's).
class Arena {
 public:
  void reserve(size_t bytes);
  // Exactly `bytes` from now on, smaller or larger (re-planning a stack that owns its arena, e.g. for
  // recomputation); the storage is reallocated on the next view.
  void resize(size_t bytes);
  size_t capacity() const { return capacity_; }
  // A view of `shape` elements of `dtype` starting at byte `offset` (allocates on first use).
  Tensor view(size_t offset, const Shape& shape, DType dtype);

 private:
  size_t capacity_ = 0;
  Tensor storage_;  // fp32 elements, 64-byte aligned
};

}  // namespace ampipe::model
