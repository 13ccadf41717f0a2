#include "ampipe/core/tensor.h"

#include <cstdlib>
#include <cstring>

namespace ampipe {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

static Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (int64_t d : shape) AMPIPE_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  size_t bytes = size_t(t.numel()) * dtype_size(dtype);
  bytes = (bytes + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, bytes));
  AMPIPE_CHECK(p != nullptr, "out of memory allocating {} bytes for {}", bytes, shape_str(t.shape_));
  t.storage_ = std::shared_ptr<std::byte>(p, [](std::byte* q) { std::free(q); });
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from(const std::vector<float>& values, Shape shape, DType dtype) {
  AMPIPE_CHECK(int64_t(values.size()) == shape_numel(shape), "{} values for shape {}", values.size(),
               shape_str(shape));
  Tensor t = empty(std::move(shape), dtype);
  for (size_t i = 0; i < values.size(); ++i) t.set(int64_t(i), values[i]);
  return t;
}

int64_t Tensor::size(int d) const {
  if (d < 0) d += dim();
  AMPIPE_CHECK(d >= 0 && d < dim(), "dimension {} of a {}-d tensor", d, dim());
  return shape_[size_t(d)];
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  AMPIPE_CHECK(dim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "rows({}, {}) of {}", begin, end,
               shape_str(shape_));
  Tensor v = *this;
  v.offset_bytes_ += size_t(begin * strides_[0]) * dtype_size(dtype_);
  v.shape_[0] = end - begin;
  return v;
}

Tensor Tensor::view(Shape shape) const {
  AMPIPE_CHECK(is_contiguous(), "view {} of a non-contiguous tensor {}", shape_str(shape), shape_str(shape_));
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      AMPIPE_CHECK(infer < 0, "two -1 in view {}", shape_str(shape));
      infer = int64_t(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) shape[size_t(infer)] = known ? numel() / known : 0;
  AMPIPE_CHECK(shape_numel(shape) == numel(), "view {} of {} changes the element count", shape_str(shape),
               shape_str(shape_));
  Tensor v = *this;
  v.strides_ = contiguous_strides(shape);
  v.shape_ = std::move(shape);
  return v;
}

int64_t Tensor::flat_offset(int64_t flat) const {
  int64_t off = 0;
  for (size_t i = shape_.size(); i-- > 0;) {
    off += (flat % shape_[i]) * strides_[i];
    flat /= shape_[i];
  }
  return off;
}

float Tensor::get(int64_t flat) const {
  const int64_t o = flat_offset(flat);
  if (dtype_ == DType::f32) return reinterpret_cast<const float*>(raw())[o];
  return bf16_to_f32(reinterpret_cast<const bf16*>(raw())[o]);
}

void Tensor::set(int64_t flat, float v) {
  const int64_t o = flat_offset(flat);
  if (dtype_ == DType::f32)
    reinterpret_cast<float*>(raw())[o] = v;
  else
    reinterpret_cast<bf16*>(raw())[o] = f32_to_bf16(v);
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  if (is_contiguous() && dtype_ == DType::f32) {
    std::memcpy(out.data(), raw(), nbytes());
  } else {
    for (int64_t i = 0; i < numel(); ++i) out[size_t(i)] = get(i);
  }
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  AMPIPE_CHECK(src.shape_ == shape_, "copy_from {} into {}", shape_str(src.shape_), shape_str(shape_));
  if (src.dtype_ == dtype_ && src.is_contiguous() && is_contiguous()) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  if (src.is_contiguous() && is_contiguous()) {
    const int64_t n = numel();
    if (dtype_ == DType::bf16) {  // f32 -> bf16
      const float* s = src.data<float>();
      bf16* d = data<bf16>();
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    } else {  // bf16 -> f32
      const bf16* s = src.data<bf16>();
      float* d = data<float>();
      for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    }
    return;
  }
  for (int64_t i = 0; i < numel(); ++i) set(i, src.get(i));
}

Tensor Tensor::clone() const { return to(dtype_); }

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype);
  t.copy_from(*this);
  return t;
}

void Tensor::fill(float value) {
  if (is_contiguous() && dtype_ == DType::f32) {
    float* p = data<float>();
    for (int64_t i = 0; i < numel(); ++i) p[i] = value;
    return;
  }
  for (int64_t i = 0; i < numel(); ++i) set(i, value);
}

}  // namespace ampipe
