// The MoE half of the block, per AMPipe chunk c (S_c tokens, capacity C_c), forward and backward side by side
// (docs/layer.md). The all-to-alls between these stages are Plan tasks run by the executor; the block only fills
// their send buffers and reads their receive buffers (buffers.h: dispatch_send -> dispatch_recv,
// combine_send -> expert_y (bf16: combine_recv), and the reverse pair in the backward).
//   gate(c)          router over ln2_out rows; with a fixed capacity also the slots and dispatch_send [E, C_c, h]
//   gate_assign(c)   --moe-no-drop with ep > 1: after the capacity all-gather, slots for the largest need
//   experts(c)       per local expert: fc1 -> GeLU (or SwiGLU) -> fc2 on its ep*C_c received slots
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
  void experts(int c);
  void weighted_sum(int c);
  void aux_loss();

  void weighted_sum_backward(int c);
  void experts_backward(int c);
  void gate_backward(int c);
  void weight_grads();  // the deferred expert weight gradients, after experts_backward(c) for every c

  double aux_loss_value() const { return aux_; }
  const GateCtx& gate_ctx(int c) const { return gctx_[size_t(c)]; }

 private:
  GateConfig gate_config() const;
  // [ep, L, C, h] -> chunk c's rows of each local expert in an expert-major buffer; [L, ep*C, h] -> [ep, L, C, h].
  void to_expert_major(const Tensor& src, Buf dst, int c) const;
  void from_expert_major(const Tensor& src, Tensor& dst, int64_t C) const;
  void set_routing(int c);  // capacity known: buffers sized, dispatch_send filled

  LayerState& st_;
  std::vector<GateCtx> gctx_;
  GateStats total_;
  double aux_ = 0;
};

}  // namespace ampipe::model
