// The block's dense MLP (docs/layer.md §6.11): fc1 -> GeLU (or SwiGLU) -> fc2 over every token of a chunk, beside the
// routed experts (Megatron-Core's shared expert: its output is added to theirs before the dropout and residual) or
// as a dense layer's FFN (no router, no experts). Megatron's column-parallel fc1 and row-parallel fc2 with tp > 1:
// the chunk's LN2 rows are all-gathered first with sequence parallelism, and the partial sums are reduced after
// (the Plan's tp_mlp_in, tp_mlp_out: Plan collectives); the block only computes.
//   forward(c)     mlp_out rows of chunk c = fc2(act(fc1(ln2 rows)))   (tp: partial sums)
//   backward(c)    d_mlp_in rows of chunk c from the output gradient   (tp: partial sums); the LN2 backward adds it
//   weight_grads() dW2 += dY^T act, dW1 += d_fc1^T x over every chunk's rows at once (K = T), as the attention's
#pragma once

#include "ampipe/model/layer_state.h"

namespace ampipe::model {

class MlpBlock {
 public:
  explicit MlpBlock(LayerState& st) : st_(st) {}

  void forward(int c);
  void backward(int c);
  void weight_grads();


 private:
  Tensor input_all() const;        // every row's input in the compute dtype
  Tensor output_grad_all() const;  // every row's output gradient, fp32

  LayerState& st_;
};

// Chunk c's rows of the MLP output on this rank's residual stream, after the tp reduction ([Scl, h] fp32): what the
// weighted sum adds to the experts' output.
Tensor mlp_output_rows(const LayerState& s, int c);
// Chunk c's rows of the MLP's input gradient on this rank's residual stream, after the tp reduction: what the LN2
// backward adds to the router's and the dispatch's.
Tensor mlp_input_grad_rows(const LayerState& s, int c);
// dst += src, element-wise (fp32, same shape, contiguous rows).
void add_rows(Tensor dst, const Tensor& src);

// --moe-shared-expert-gate (docs/layer.md §6.11): on chunk c's rows of this rank, s_t = sigmoid(x2_t . g) with x2 the
// LN2 output (fp32) and g = mlp.gate.weight. Without the gate these are the plain sum and copy.
//   add_shared_expert_rows:  moe_t += s_t mlp_t                      (mlp: mlp_output_rows, kept for the backward)
//   shared_expert_output_grad: d_mlp_t = s_t d_moe_t
//   shared_expert_gate_backward (once d ln2 holds the rest): z_t = (1 - s_t) <d_mlp_t, mlp_t> (= d loss / d logit_t),
//     dg += z_t x2_t, d_ln2_t += z_t g
void add_shared_expert_rows(const LayerState& s, int c, Tensor moe);
void shared_expert_output_grad(const LayerState& s, int c, const Tensor& d_moe, Tensor d_mlp);
void shared_expert_gate_backward(LayerState& s, int c);

}  // namespace ampipe::model
