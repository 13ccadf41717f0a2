// One forward + backward step of one MoE block, as stage functions with explicit saved state
// (DESIGN.md section 3). The stages know nothing about the order they run in: a schedule::Plan decides that,
// and the executor calls them. Communication is not done here either: the all-to-all stages only expose their
// send and receive buffers (a2a_buffers), and the executor moves the bytes.
//
// Notation: s sequence, b micro-batch, h hidden, F FFN hidden, n heads, d head dim, E experts, k top-k,
// ep expert-parallel size, L = E/ep local experts, M AMPipe degree, chunk c = sequence rows [c*s/M, (c+1)*s/M),
// S_c = s/M * b tokens of a chunk, C_c its expert capacity. Activations are [s, b, h] flattened to [s*b, h]
// rows (token t = s_index * b + b_index), so chunk c is the contiguous row range [c*S_c, (c+1)*S_c).
//
// Forward stages (per chunk unless noted):
//   ln1_qkv(c)    x -> LN1 -> qkv = xn Wqkv^T         the chunk's rows
//   attention(c)  q rows of chunk c against K, V of rows [0, (c+1)*s/M) (causal with row offset c*s/M: later
//                 keys are invisible, so ln1_qkv(c') for c' <= c is all it needs)
//   out_proj(c)   proj = attn Wproj^T
//   bdal(c)       ln_in = x + dropout(proj); ln2 = LN2(ln_in)
//   gate(c)       routing of the chunk's S_c tokens with capacity C_c; dispatch buffer [E, C_c, h]
//   [dispatch a2a: send [E, C_c, h] (peer j gets experts [j*L, (j+1)*L)), receive [ep, L, C_c, h]]
//   experts(c)    per local expert: fc1 -> GeLU (or SwiGLU) -> fc2 on its ep*C_c received slots
//   [combine a2a: send [ep, L, C_c, h] back, receive [E, C_c, h] in natural expert order]
//   combine(c)    moe = sum_i w_i * Y[e_i, slot_i]; y = ln_in + dropout(moe)
//   aux_loss()    l_aux from the gate statistics summed over all chunks
// Backward stages mirror them; attention_backward(c) ACCUMULATES dK and dV over chunks, and parameter
// gradients accumulate (+=) into `grads`, so chunks (and micro-batches) sum for free.
#pragma once

#include <cstdint>
#include <vector>

#include "ampipe/core/tensor.h"
#include "ampipe/model/gate.h"
#include "ampipe/model/layer_config.h"
#include "ampipe/model/layer_params.h"

namespace ampipe::model {

// Which all-to-all of the layer step.
enum class A2a : uint8_t { dispatch, combine, combine_bwd, dispatch_bwd };

// The buffers of one all-to-all: `send` and `recv` are contiguous and hold `ep` equal blocks of
// `elems_per_peer` elements each (block j goes to / comes from EP rank j).
struct A2aBuffers {
  Tensor send, recv;
  int64_t elems_per_peer = 0;
};

class LayerStep {
 public:
  // params: this rank's parameters (expert tensors hold the local experts). grads: same shapes, accumulated.
  // token_base: global index of this micro-batch's token 0 (keys the dropout and gate random numbers).
  LayerStep(const LayerConfig& cfg, int M, int ep_rank, LayerParams& params, LayerParams& grads,
            uint64_t token_base = 0);

  int degree() const { return M_; }
  int64_t chunk_tokens() const { return Sc_; }
  int64_t capacity(int c) const { return C_[size_t(c)]; }

  // ---- forward ----
  void begin_forward(const Tensor& x);  // x: [s, b, h] fp32 (kept by reference until the backward ends)
  void ln1_qkv(int c);
  void attention(int c);
  void out_proj(int c);
  void bdal(int c);
  void gate(int c);
  // --moe-no-drop with ep > 1 (needs_capacity_agreement): gate(c) only routes; the executor all-gathers
  // capacity_need(c) ([1], this rank's need) into capacity_all(c) ([ep]); gate_assign(c) uses the largest.
  bool needs_capacity_agreement() const { return cfg_.moe_no_drop && ep_ > 1; }
  Tensor capacity_need(int c) const { return cap_need_[size_t(c)]; }
  Tensor capacity_all(int c) const { return cap_all_[size_t(c)]; }
  void gate_assign(int c);
  void experts(int c);
  void combine(int c);
  void aux_loss();
  const Tensor& output() const { return y_; }  // [s, b, h] fp32
  double aux_loss_value() const { return aux_; }
  // The chunk's gate statistics (for tests and for summing over ranks).
  const GateCtx& gate_ctx(int c) const { return gctx_[size_t(c)]; }

  // ---- backward ----
  // dy: [s, b, h] fp32; d_aux: upstream gradient of l_aux (the aux-loss coefficient).
  void begin_backward(const Tensor& dy, float d_aux);
  void aux_loss_backward();
  void combine_backward(int c);
  void experts_backward(int c);
  void gate_backward(int c);
  void bdal_backward(int c);
  void out_proj_backward(int c);
  void attention_backward(int c);
  void ln1_qkv_backward(int c);  // after attention_backward(c') for every c' >= c
  const Tensor& input_grad() const { return dx_; }  // [s, b, h] fp32

  // Buffers of an all-to-all of chunk c (valid once the producing stage has run). With ep = 1 the executor
  // copies send to recv.
  A2aBuffers a2a_buffers(A2a which, int c);

  // FLOPs of the whole step (forward + backward, causal attention counted as such), for TFLOP/s reports.
  double flops() const;

 private:
  Tensor chunk_rows(const Tensor& t, int c) const { return t.rows(c * Sc_, (c + 1) * Sc_); }
  void alloc_chunk_buffers(int c);
  // [ep, L, C, h] <-> [L, ep*C, h] (received slots grouped by local expert and back).
  void to_expert_major(const Tensor& src, Tensor& dst, int64_t C) const;
  void from_expert_major(const Tensor& src, Tensor& dst, int64_t C) const;

  LayerConfig cfg_;
  int M_, ep_, ep_rank_;
  int64_t s_, b_, h_, F_, F1_, E_, L_, T_, Sc_;
  LayerParams& p_;
  LayerParams& g_;
  uint64_t token_base_;
  DType cd_;  // compute dtype of GEMM inputs and all-to-all payloads

  // Weights in the compute dtype (bf16 copies made once per step in bf16 mode; views in fp32 mode).
  Tensor wqkv_, wproj_, w1_, w2_;

  // Forward state, [T, *] rows unless noted.
  Tensor x_, xn_, xn_c_, ln1_mean_, ln1_rstd_, qkv_, qkv_c_;
  Tensor attn_, attn_c_, lse_;  // lse: [M, b*n*S_c/b]
  Tensor proj_, ln_in_, ln2_, ln2_mean_, ln2_rstd_, moe_, y_;
  std::vector<GateCtx> gctx_;
  std::vector<int64_t> C_;
  std::vector<Tensor> cap_need_, cap_all_;  // [1] and [ep] fp32 (capacities are exact in fp32)
  // Per chunk: dispatch send [E, C, h], dispatch recv [ep, L, C, h], expert input [L, ep*C, h],
  // fc1 output [L, ep*C, F1], activation [L, ep*C, F] (+ compute-dtype copy), expert output send [ep, L, C, h],
  // combine recv [E, C, h].
  std::vector<Tensor> disp_send_, disp_recv_, ex_in_, h1_, act_, act_c_, ex_out_send_, comb_recv_, comb_f32_;
  GateStats total_;
  double aux_ = 0;

  // Backward state.
  Tensor dy_, dx_, d_ln_in_, d_ln2_, d_proj_, d_attn_, dqkv_;
  float d_aux_ = 0;
  std::vector<Tensor> dcomb_send_, dcomb_recv_, dweight_, ddisp_send_, ddisp_recv_;
};

}  // namespace ampipe::model
