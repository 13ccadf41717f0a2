// Element-wise activations of the expert MLP, computed in fp32: GeLU (exact erf form) and SwiGLU.
//
// Notation: rows = tokens (routed to one expert, or all tokens of a dense MLP), F = FFN hidden size.
// All tensors are contiguous and 2-D (use Tensor::view to flatten), fp32 except the outputs (the forwards' y, the
// backwards' dx), which may be bf16: the copy the next GEMM reads in bf16 mode, each value rounded once (as
// Tensor::copy_from would round the fp32 result), with no fp32 pass in between. A bf16 output does not alias.
#pragma once

#include "ampipe/core/tensor.h"

namespace ampipe::kernels {

// GeLU, exact form (not the tanh approximation):
//   gelu(x)  = 0.5 * x * (1 + erf(x / sqrt(2))) = x * Phi(x)
//   gelu'(x) = Phi(x) + x * phi(x),   phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
// x, y: [rows, F]; y is overwritten and may alias x (when fp32).
void gelu_forward(const Tensor& x, Tensor& y);
// dx = dy * gelu'(x), overwritten; x is the forward's input. dx may alias dy.
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);

// SwiGLU on one fused tensor, Megatron's layout (torch.chunk(x, 2, dim=-1)):
//   x: [rows, 2F], columns [0, F) are a (the gate, through SiLU), columns [F, 2F) are g (the linear half)
//   y[r, j] = silu(a[r, j]) * g[r, j],   silu(a) = a * sigmoid(a) = a / (1 + exp(-a))
// so a single up-projection GEMM with 2F outputs feeds it directly. y: [rows, F], overwritten.
void swiglu_forward(const Tensor& x, Tensor& y);
// dx: [rows, 2F], overwritten, in the same layout as x:
//   da = dy * g * sigmoid(a) * (1 + a * (1 - sigmoid(a))),   dg = dy * silu(a)
// dx may alias x (the forward's input is then replaced by its gradient).
void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);

}  // namespace ampipe::kernels
