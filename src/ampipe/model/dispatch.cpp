#include "ampipe/model/dispatch.h"

#include "ampipe/core/error.h"

namespace ampipe::model {

kernels::Routing routing_view(const GateRouting& r) {
  AMPIPE_CHECK(int64_t(r.slot_token.size()) == r.E * r.C && int64_t(r.slot.size()) == r.S * r.k &&
                   int64_t(r.weight.size()) == r.S * r.k && int64_t(r.expert.size()) == r.S * r.k,
               "routing not assigned (S={}, E={}, k={}, C={})", r.S, r.E, r.k, r.C);
  return {r.S, r.E, r.k, r.C, r.expert.data(), r.slot.data(), r.weight.data(), r.slot_token.data()};
}

void dispatch_forward(const Tensor& x, const GateRouting& r, Tensor& out) {
  kernels::dispatch_forward(x, routing_view(r), out);
}
void dispatch_backward(const Tensor& d_out, const GateRouting& r, Tensor& dx_accum) {
  kernels::dispatch_backward(d_out, routing_view(r), dx_accum);
}
void combine_forward(const Tensor& y, const GateRouting& r, Tensor& out) {
  kernels::combine_forward(y, routing_view(r), out);
}
void combine_backward(const Tensor& d_out, const Tensor& y, const GateRouting& r, Tensor& dy, Tensor& d_weight) {
  kernels::combine_backward(d_out, y, routing_view(r), dy, d_weight);
}

}  // namespace ampipe::model
