// Argument checks shared by the element-wise kernels: internal invariants (AMPIPE_CHECK), not user errors.
#pragma once

#include <algorithm>
#include <cstdint>

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

// `t` must be a defined 2-D CPU tensor whose rows are packed (unit column stride) and spaced by a row stride of
// at least its column count: a contiguous matrix, a rows() block or a cols() range of a bigger one. Returns the
// row stride in elements (the leading dimension to pass to a raw kernel).
inline int64_t matrix_ld(const Tensor& t, const char* op, const char* name) {
  AMPIPE_CHECK(t.defined() && t.dim() == 2, "{}: {} must be a defined 2-D tensor, got {}{}", op, name,
               t.defined() ? "" : "undefined ", shape_str(t.shape()));
  AMPIPE_CHECK(t.device() == Device::cpu, "{}: {} is on {}, this kernel runs on cpu", op, name,
               device_name(t.device()));
  const int64_t rows = t.size(0), cols = t.size(1), ld = t.strides()[0];
  AMPIPE_CHECK(cols <= 1 || t.strides()[1] == 1, "{}: {} {} needs unit column stride, has strides {}", op, name,
               shape_str(t.shape()), shape_str(t.strides()));
  if (rows <= 1) return std::max(ld, cols);  // a single row: its stride never matters
  AMPIPE_CHECK(ld >= cols, "{}: {} {} has row stride {} below its {} columns", op, name, shape_str(t.shape()), ld,
               cols);
  return ld;
}

// matrix_ld, plus dtype `dt` and shape [rows, cols].
inline int64_t check_matrix(const Tensor& t, const char* op, const char* name, DType dt, int64_t rows,
                            int64_t cols) {
  const int64_t ld = matrix_ld(t, op, name);
  AMPIPE_CHECK(t.dtype() == dt && t.size(0) == rows && t.size(1) == cols,
               "{}: {} must be a {} tensor of shape [{}, {}], got {} {}", op, name, dtype_name(dt), rows, cols,
               dtype_name(t.dtype()), shape_str(t.shape()));
  return ld;
}

}  // namespace ampipe::kernels::detail
