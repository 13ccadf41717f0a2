// Tensor: a dtype (fp32 or bf16), a shape, strides (in elements) and shared 64-byte-aligned storage.
//
// Layout convention: activations are [s, b, h] (sequence first), so a sequence chunk is a contiguous range
// of the first dimension and `rows(begin, end)` is a view, never a copy. Views share storage with their base
// (the storage lives as long as any view does), which is also how async collectives keep buffers alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "ampipe/core/dtype.h"
#include "ampipe/core/error.h"

namespace ampipe {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised / zero-filled contiguous tensors.
  static Tensor empty(Shape shape, DType dtype = DType::f32);
  static Tensor zeros(Shape shape, DType dtype = DType::f32);
  static Tensor from(const std::vector<float>& values, Shape shape, DType dtype = DType::f32);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return int(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  // Typed access to the first element; AMPIPE_CHECKs that T matches the dtype.
  template <typename T> T* data();
  template <typename T> const T* data() const;
  void* raw() { return storage_.get() + offset_bytes_; }
  const void* raw() const { return storage_.get() + offset_bytes_; }

  // View of rows [begin, end) of the first dimension (a sequence slice). No copy.
  Tensor rows(int64_t begin, int64_t end) const;
  // Same storage, new shape; requires a contiguous tensor with the same element count. One -1 is inferred.
  Tensor view(Shape shape) const;
  // Contiguous deep copy, optionally converting the dtype (bf16 rounds to nearest even).
  Tensor clone() const;
  Tensor to(DType dtype) const;
  // Copies src (same shape, any dtype; converted) into this tensor's storage.
  void copy_from(const Tensor& src);
  void fill(float value);
  void zero() { fill(0.0f); }
  // Element read/write as float (slow; for tests and tools), flat index in row-major order of the shape.
  float get(int64_t flat) const;
  void set(int64_t flat, float v);
  std::vector<float> to_vector() const;

  // True when both share the same storage allocation.
  bool shares_storage_with(const Tensor& o) const { return storage_ == o.storage_; }

 private:
  std::shared_ptr<std::byte> storage_;
  size_t offset_bytes_ = 0;
  DType dtype_ = DType::f32;
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
