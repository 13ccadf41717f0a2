// Dispatch and combine driven by a GateRouting (gate.h): the math is kernels/dispatch.h (notation and rules there);
// these take the router's routing as it is kept per chunk.
#pragma once

#include "ampipe/core/tensor.h"
#include "ampipe/kernels/dispatch.h"
#include "ampipe/model/gate.h"

namespace ampipe::model {

// The kernels' view of a routing (checks that it was assigned).
kernels::Routing routing_view(const GateRouting& r);

// x: [S, h] fp32 or bf16 (any row stride); out: [E, C, h] contiguous, fp32 or bf16 (converted), overwritten.
void dispatch_forward(const Tensor& x, const GateRouting& r, Tensor& out);
// d_out: [E, C, h] fp32 contiguous; dx_accum: [S, h] fp32, accumulated (+=) at each filled slot's token.
void dispatch_backward(const Tensor& d_out, const GateRouting& r, Tensor& dx_accum);

// y: [E, C, h] fp32 contiguous (expert outputs after the combine all-to-all); out: [S, h] fp32 or bf16
// (any row stride), overwritten; sums in fp32. Uses r.weight.
void combine_forward(const Tensor& y, const GateRouting& r, Tensor& out);
// d_out: [S, h] fp32 (any row stride); y: as in the forward.
// dy: [E, C, h] fp32 contiguous, overwritten: w[t, i] * d_out[t] at each kept choice's slot, zero elsewhere.
// d_weight: [S, k] fp32 contiguous, overwritten: <d_out[t], y[e_i, slot_i]> for kept choices, 0 for dropped
// ones (feed it to gate_backward).
void combine_backward(const Tensor& d_out, const Tensor& y, const GateRouting& r, Tensor& dy, Tensor& d_weight);

}  // namespace ampipe::model
