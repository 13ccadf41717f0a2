// The sizes of one layer step, derived once from a LayerConfig and the AMPipe degree M: everything the Plan, the
// memory plan and the cost counts need, without parameters, data or MPI.
//
// Notation (docs/design.md): s sequence, b micro-batch, h hidden, F FFN hidden (F1 = F, or 2F for SwiGLU's fused
// up-projection), n heads, d head dim, E experts, k top-k, ep expert-parallel size, L = E/ep local experts,
// T = s*b tokens, M degree, sq = s/M rows of a chunk, S_c = sq*b tokens of a chunk, C the planned expert capacity of
// a chunk, R = ep*C slots one local expert processes per chunk.
#pragma once

#include <cstdint>
#include <vector>

#include "ampipe/core/dtype.h"
#include "ampipe/kernels/attention.h"
#include "ampipe/model/layer_config.h"
#include "ampipe/model/stage.h"

namespace ampipe::model {

// One pipe-experts piece of a chunk: local experts [expert0, expert0 + experts) and capacity slots
// [slot0, slot0 + slots) of each of them, from every EP rank. Its all-to-all blocks are laid out [ep][experts][slots][h]
// (EP rank j's block first), starting at row `row0` of the chunk's piece-major buffers (buffers.h).
struct ExpertPiece {
  int64_t expert0 = 0, experts = 0, slot0 = 0, slots = 0, row0 = 0;
};

struct LayerDims {
  int64_t s = 0, b = 0, h = 0, F = 0, F1 = 0, n = 0, d = 0, E = 0, k = 0, ep = 1, L = 0, T = 0;
  int M = 1;
  int64_t sq = 0, Sc = 0;
  // Tensor parallelism (tp ranks t). The attention core (QKV, attention, out-projection) runs on every row of a
  // chunk (S_c) and nl = n/t local heads, hl = h/t columns of each of q, k, v; the experts on F/t (F1/t) columns.
  // The residual stream (x, LayerNorms, dropout, gate, weighted sum, y) holds Tl rows per rank: T/t with sequence
  // parallelism (rank r holds rows [c*S_c + r*Scl, c*S_c + (r+1)*Scl) of every chunk c), T without; Scl = Tl/M
  // of them per chunk. The gate routes Scl tokens per chunk and the capacity C is planned for them. An expert
  // processes the slots of `srcs` source ranks per chunk: the ep ranks of its all-to-all, times t with sequence
  // parallelism (the slots are all-gathered over tp before the expert and reduce-scattered after it).
  // Context parallelism (cp ranks C, model/context_parallel.h): s above is this rank's s_global / C rows (its two
  // load-balanced halves, chunk by chunk [A_c ; B_c]), and everything per token runs on them; the attention of a
  // chunk runs against every cp rank's K and V, which travel around the ring in C slots.
  int64_t cp = 1, s_global = 0;
  int64_t tp = 1;
  bool sp = false;          // sequence parallelism with tp > 1
  bool overlap_tp = false;  // --ampipe-tp-sp-comm-overlap (or pipe-experts multi-stream): per-piece tp collectives
  int64_t Tl = 0, Scl = 0, hl = 0, nl = 0, Fl = 0, F1l = 0, srcs = 1;
  // Grouped-query attention: g K, V heads (g = n without it), gl = g/t of them on this rank, kvl = gl*d columns of
  // each of k and v, qkvl = hl + 2*kvl columns of the fused [q | k | v] (3*hl without grouping).
  int64_t g = 0, gl = 0, kvl = 0, qkvl = 0;
  // The block's parts: routed experts (moe: E > 0) and a dense MLP (mlp: F_m = Fm > 0; F1m = Fm or 2Fm for
  // SwiGLU, Fml and F1ml their tp shares): a shared expert beside the experts, or a dense layer's FFN alone.
  bool moe = true, mlp = false;
  bool mlp_gate = false;  // --moe-shared-expert-gate (a shared expert beside the experts)
  bool fc1_bias = false;  // --add-bias-linear: fc1's bias gradient sums the fp32 d_fc1 (bf16: a staging buffer)
  int64_t Fm = 0, F1m = 0, Fml = 0, F1ml = 0;
  bool qk_norm = false;  // --qk-layernorm: the QKV stage normalises q and k per head (before RoPE)
  bool rope = false;  // rotary embeddings: the QKV stage rotates q and k (its backward rotates dq, dk back)
  // Expert capacity per chunk the buffers are planned for. With token drops this is the capacity every chunk uses
  // (gate_capacity(S_c, E, k, factor, min)); with --moe-no-drop the capacity is data-dependent, and C is its bound
  // S_c (an expert receives each token at most once), so nothing is ever reallocated.
  int64_t C = 0;
  bool capacity_is_bound = false;  // --moe-no-drop: the run-time capacity is <= C
  bool agree_capacity = false;     // dropless with ep > 1 or sequence parallel tp > 1: the ranks agree first
  bool seq_aux = false;            // seq_aux_loss: the gate statistics per sequence too ([b, E] each)
  bool agree_capacity_tp = false;  // ... over the tp ranks too (sequence parallel: each routes its own rows)
  // The expert weight gradients wait for every chunk and run as one GEMM per expert over all chunks' slots
  // (K = M*ep*C instead of ep*C per chunk). Only with a fixed capacity: with --moe-no-drop the chunks' slots are
  // not packed, so each chunk's backward adds its own.
  bool defer_expert_wgrad = true;
  bool jitter = false;             // Jitter: in training the gate input is a noisy copy (planned either way)
  bool recompute = false;          // LayerConfig::recompute: the saved buffers (but y and dx) are planned as shared
  bool recompute_attention = false;  // LayerConfig::recompute_attention: attn and lse are planned as shared
  DType cd = DType::f32;           // compute dtype of GEMM inputs and all-to-all payloads
  // pipe-experts: every chunk's MoE MLP cut into pieces, one per (local expert, capacity slice); S = N / M slices of
  // ceil(C / S) slots per expert and chunk (the last ones may be shorter; empty slices have no piece). Empty without
  // pipe-experts: then a chunk is one piece of all L experts and all C slots.
  // --ampipe-tp-sp-comm-overlap without pipe-experts also cuts a chunk into pieces: one per local expert, all slots.
  int64_t slices = 1;
  std::vector<ExpertPiece> pieces;
  // The MoE MLP runs in pieces (pipe-experts or the tp overlap): piece-major all-to-all buffers, staged copies.
  bool pieced() const { return !pieces.empty(); }
  // Piece p of a chunk whose run-time capacity is C (a dropless router's, at most the planned one): pipe-experts'
  // slices are planned for a fixed capacity; the tp overlap's pieces (a local expert's slots) are C slots each.
  ExpertPiece piece(int p, int64_t C) const {
    const ExpertPiece& pc = pieces.at(size_t(p));
    if (!capacity_is_bound || C == this->C) return pc;
    return {pc.expert0, pc.experts, 0, C, pc.expert0 * ep * C};
  }

  static LayerDims make(const LayerConfig& cfg, int M);
  int64_t R() const { return srcs * C; }  // slots one local expert processes per chunk
};

// Chunk c's attention on the local heads without context parallelism: its sq query rows see the keys of rows
// [0, (c+1)*sq), q_offset c*sq (no dropout set: the block adds it).
kernels::AttentionShape chunk_attention(const LayerDims& d, int c);

// FLOPs of one stage for chunk c (chunk -1: the whole-sequence stages), closed form (docs/plan.md): GEMMs count
// 2mnk, attention its visible causal pairs (kernels::causal_attention_flops), element-wise work 0. The backward of
// ln1_qkv, out_proj and experts counts the input-gradient GEMMs only; their weight gradients are the wgrad stages
// (with --moe-no-drop the experts' backward holds both).
double stage_flops(const LayerDims& d, Stage s, Dir dir, int c, int piece = -1);
// Bytes a compute stage reads and writes in memory (activations and weights, once each): an estimate for the cost
// model, not a measurement.
double stage_bytes(const LayerDims& d, Stage s, Dir dir, int c, int piece = -1);

}  // namespace ampipe::model
