// Argument checks shared by the element-wise kernels: internal invariants (AMPIPE_CHECK), not user errors.
#pragma once

#include "ampipe/core/error.h"
#include "ampipe/core/tensor.h"

namespace ampipe::kernels::detail {

// `t` must be a defined, contiguous fp32 tensor of shape `want`; the message names the kernel and the argument.
inline void check_f32(const Tensor& t, const char* op, const char* name, const Shape& want) {
  AMPIPE_CHECK(t.defined() && t.dtype() == DType::f32 && t.is_contiguous() && t.shape() == want,
               "{}: {} must be a contiguous f32 tensor of shape {}, got {} {}{}", op, name, shape_str(want),
               t.defined() ? dtype_name(t.dtype()) : "undefined", shape_str(t.shape()),
               t.defined() && !t.is_contiguous() ? " (non-contiguous)" : "");
}

inline void check_2d(const Tensor& t, const char* op, const char* name) {
  AMPIPE_CHECK(t.dim() == 2, "{}: {} must be 2-D, got {}", op, name, shape_str(t.shape()));
}

}  // namespace ampipe::kernels::detail
