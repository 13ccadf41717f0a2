// The MoE half of the block, per AMPipe chunk c (S_c tokens, capacity C_c), forward and backward side by side
// (docs/layer.md). The all-to-alls between these stages are Plan tasks run by the executor; the block only fills
// their send buffers and reads their receive buffers (buffers.h: dispatch_send -> dispatch_recv,
// combine_send -> expert_y (bf16: combine_recv), and the reverse pair in the backward).
//   gate(c)          router over ln2_out rows; with a fixed capacity also the slots and dispatch_send [E, C_c, h]
//   gate_assign(c)   --moe-no-drop with ep > 1: after the capacity all-gather, slots for the largest need
//   experts(c, p)    per local expert: fc1 -> GeLU (or SwiGLU) -> fc2 on its ep*C_c received slots; with
//                    pipe-experts one piece (one local expert, a slice of its slots) at a time, each piece with
//                    its own dispatch and combine all-to-all (LayerDims::pieces)
//   weighted_sum(c)  moe = sum_i w_i * Y[e_i, slot_i]; y = ln_in + dropout(moe)
//   aux_loss()       l_aux from the gate statistics summed over all chunks
// Backward: weighted_sum -> experts (input gradients; with a fixed capacity the weight gradients wait for
// weight_grads(), Stage::expert_wgrad, one GEMM per expert over all chunks) -> gate (router and dispatch backward
// into d_ln2). The aux loss has no
// backward stage of its own: each chunk's gate backward adds d_aux * d l_aux / d probs from the forward's totals,
// so M chunks give the M = 1 gradient.
#pragma once

#include <vector>

#include "ampipe/model/gate.h"
#include "ampipe/model/layer_state.h"

namespace ampipe::model {

class MoeBlock {
 public:
  explicit MoeBlock(LayerState& st);

  void begin_forward();
  void gate(int c);
  void gate_assign(int c);
  void experts(int c, int p);  // piece p of chunk c (the whole chunk without pipe-experts)
  void weighted_sum(int c);
  void aux_loss();

  void weighted_sum_backward(int c);
  void experts_backward(int c, int p);
  void gate_backward(int c);
  void weight_grads();  // the deferred expert weight gradients, after experts_backward(c) for every c

  double aux_loss_value() const { return aux_; }
  double z_loss_value() const { return z_; }  // the router z-loss, its coefficient included (0 without one)
  const GateCtx& gate_ctx(int c) const { return gctx_[size_t(c)]; }

 private:
  GateConfig gate_config() const;
  // Piece p of chunk c (without pipe-experts: the whole chunk, all L experts, its run-time capacity).
  ExpertPiece piece(int c, int p) const;
  // [E, C, h] (expert order) <-> a chunk's piece-major all-to-all buffer (buffers.h); dtypes converted.
  void copy_slots_pieces(const Tensor& from, Tensor& to, int c, bool to_pieces) const;
  // A piece's all-to-all block [ep][experts][slots][h] -> its rows of an expert-major buffer, and from a chunk's
  // [L, ep*C, h] expert rows back to a piece's block.
  void piece_to_experts(const Tensor& region, Buf dst, int c, const ExpertPiece& pc) const;
  void experts_to_piece(const Tensor& rows, Tensor& region, const ExpertPiece& pc) const;
  void set_routing(int c);  // capacity known: buffers sized, dispatch_send filled
  int64_t expert_stride(Buf b) const;  // elements from one local expert's rows to the next's
  void accumulate_stats(const GateStats& chunk);  // into the totals (and gate_stats, sequence parallel)

  LayerState& st_;
  std::vector<GateCtx> gctx_;
  GateStats total_;
  double aux_ = 0, z_ = 0;
};

}  // namespace ampipe::model
