// Tensor: a dtype (fp32 or bf16), a device, a shape, strides (in elements) and shared 64-byte-aligned storage.
//
// Layout convention: activations are [s, b, h] (sequence first), so a sequence chunk is a contiguous range
// of the first dimension and `rows(begin, end)` is a view, never a copy. Views share storage with their base
// (the storage lives as long as any view does), which is also how async collectives keep buffers alive.
// `cols(begin, end)` of a 2-D tensor is a column range (e.g. q, k or v of a fused [T, 3h] qkv buffer): a
// strided view whose row stride stays that of the base.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "ampipe/core/device.h"
#include "ampipe/core/dtype.h"
#include "ampipe/core/error.h"

namespace ampipe {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// Process-wide, cumulative count of tensor storage allocations (Tensor::empty and everything built on it:
// zeros, from, clone, to; views never allocate) and of the bytes allocated: the size of each storage block,
// i.e. nbytes rounded up to a multiple of 64 (at least 64). Thread-safe; `count` and `bytes` are read one
// after the other, so under concurrent allocation they may be from slightly different instants.
struct TensorAllocStats {
  uint64_t count = 0;
  uint64_t bytes = 0;
};
TensorAllocStats tensor_alloc_stats();

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised / zero-filled contiguous tensors, their storage on `device` (core/device.h: its allocator).
  static Tensor empty(Shape shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor zeros(Shape shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor from(const std::vector<float>& values, Shape shape, DType dtype = DType::f32);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  // Where the storage lives (Device::cpu is the only device built today).
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return int(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  // True when the elements are packed in row-major order of the shape (strides of dimensions of size 1 do
  // not matter; an empty tensor is contiguous). A cols() view is contiguous only if it spans all columns
  // (or has at most one row).
  bool is_contiguous() const;

  // Typed access to the first element; AMPIPE_CHECKs that T matches the dtype.
  template <typename T> T* data();
  template <typename T> const T* data() const;
  void* raw() { return storage_.get() + offset_bytes_; }
  const void* raw() const { return storage_.get() + offset_bytes_; }

  // View of rows [begin, end) of the first dimension (a sequence slice). No copy.
  Tensor rows(int64_t begin, int64_t end) const;
  // View of columns [begin, end) of a 2-D tensor: same row stride, first element at column `begin`. No copy.
  Tensor cols(int64_t begin, int64_t end) const;
  // Same storage, new shape; requires a contiguous tensor with the same element count. One -1 is inferred.
  Tensor view(Shape shape) const;
  // A contiguous `shape` of `dtype` elements starting `byte_offset` bytes into this contiguous tensor's bytes
  // (memory planned once and carved into buffers of several dtypes). The range must lie inside this tensor and
  // the offset be a multiple of the element size. No copy, no allocation.
  Tensor view_bytes(size_t byte_offset, Shape shape, DType dtype) const;
  // Contiguous deep copy, optionally converting the dtype (bf16 rounds to nearest even).
  Tensor clone() const;
  Tensor to(DType dtype) const;
  // Copies src (same shape, any dtype; converted) into this tensor's elements. Either side may be a strided
  // view (rows, cols); src and this must not overlap unless they are the same elements.
  void copy_from(const Tensor& src);
  // Sets every element of this tensor (or view) to value; elements outside a view are untouched.
  void fill(float value);
  void zero() { fill(0.0f); }
  // Element read/write as float (slow; for tests and tools), flat index in [0, numel) in row-major order of
  // the shape (for a view: of the view's shape).
  float get(int64_t flat) const;
  void set(int64_t flat, float v);
  std::vector<float> to_vector() const;

  // True when both share the same storage allocation.
  bool shares_storage_with(const Tensor& o) const { return storage_ == o.storage_; }

 private:
  std::shared_ptr<std::byte> storage_;
  size_t offset_bytes_ = 0;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
  Shape shape_;
  Shape strides_;
  int64_t flat_offset(int64_t flat) const;
};

template <> inline float* Tensor::data<float>() {
  AMPIPE_CHECK(dtype_ == DType::f32, "data<float>() on a {} tensor {}", dtype_name(dtype_), shape_str(shape_));
  return reinterpret_cast<float*>(raw());
}
template <> inline const float* Tensor::data<float>() const {
  AMPIPE_CHECK(dtype_ == DType::f32, "data<float>() on a {} tensor {}", dtype_name(dtype_), shape_str(shape_));
  return reinterpret_cast<const float*>(raw());
}
template <> inline bf16* Tensor::data<bf16>() {
  AMPIPE_CHECK(dtype_ == DType::bf16, "data<bf16>() on a {} tensor {}", dtype_name(dtype_), shape_str(shape_));
  return reinterpret_cast<bf16*>(raw());
}
template <> inline const bf16* Tensor::data<bf16>() const {
  AMPIPE_CHECK(dtype_ == DType::bf16, "data<bf16>() on a {} tensor {}", dtype_name(dtype_), shape_str(shape_));
  return reinterpret_cast<const bf16*>(raw());
}

}  // namespace ampipe
