#include "ampipe/core/tensor.h"

#include "ampipe/core/parallel.h"

#include <algorithm>
#include <atomic>
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

namespace {

std::atomic<uint64_t> g_alloc_count{0};
std::atomic<uint64_t> g_alloc_bytes{0};

// A new storage block of at least `nbytes` on `device`: 64-byte aligned, its size rounded up to a multiple of
// 64 (at least 64). Every tensor storage allocation goes through here, so this is where it is counted.
std::shared_ptr<std::byte> allocate_storage(size_t nbytes, Device device, const Shape& shape) {
  size_t bytes = (nbytes + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  std::shared_ptr<std::byte> storage;
  switch (device) {
    case Device::cpu: {
      auto* p = static_cast<std::byte*>(std::aligned_alloc(64, bytes));
      AMPIPE_CHECK(p != nullptr, "out of memory allocating {} bytes for {}", bytes, shape_str(shape));
      storage = std::shared_ptr<std::byte>(p, [](std::byte* q) { std::free(q); });
      break;
    }
  }
  g_alloc_count.fetch_add(1, std::memory_order_relaxed);
  g_alloc_bytes.fetch_add(bytes, std::memory_order_relaxed);
  return storage;
}

// count elements from src (type st, stride ss) to dst (type dt, stride ds), converting the type (bf16 rounds
// to nearest even). Strides in elements.
void copy_elems(void* dst, DType dt, int64_t ds, const void* src, DType st, int64_t ss, int64_t count) {
  if (dt == st && ds == 1 && ss == 1) {
    std::memmove(dst, src, size_t(count) * dtype_size(dt));
    return;
  }
  if (dt == DType::f32 && st == DType::f32) {
    auto* d = static_cast<float*>(dst);
    const auto* s = static_cast<const float*>(src);
    for (int64_t i = 0; i < count; ++i) d[i * ds] = s[i * ss];
  } else if (dt == DType::bf16 && st == DType::bf16) {
    auto* d = static_cast<bf16*>(dst);
    const auto* s = static_cast<const bf16*>(src);
    for (int64_t i = 0; i < count; ++i) d[i * ds] = s[i * ss];
  } else if (dt == DType::bf16) {  // f32 -> bf16
    auto* d = static_cast<bf16*>(dst);
    const auto* s = static_cast<const float*>(src);
    for (int64_t i = 0; i < count; ++i) d[i * ds] = f32_to_bf16(s[i * ss]);
  } else {  // bf16 -> f32
    auto* d = static_cast<float*>(dst);
    const auto* s = static_cast<const bf16*>(src);
    for (int64_t i = 0; i < count; ++i) d[i * ds] = bf16_to_f32(s[i * ss]);
  }
}

std::byte* elem_ptr(void* base, DType t, int64_t offset) {
  return static_cast<std::byte*>(base) + offset * int64_t(dtype_size(t));
}
const std::byte* elem_ptr(const void* base, DType t, int64_t offset) {
  return static_cast<const std::byte*>(base) + offset * int64_t(dtype_size(t));
}

}  // namespace

TensorAllocStats tensor_alloc_stats() {
  return {g_alloc_count.load(std::memory_order_relaxed), g_alloc_bytes.load(std::memory_order_relaxed)};
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape) AMPIPE_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.device_ = device;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.storage_ = allocate_storage(size_t(t.numel()) * dtype_size(dtype), t.device_, t.shape_);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  switch (device) {  // a device's own fill, where another device is added
    case Device::cpu: std::memset(t.raw(), 0, t.nbytes()); break;
  }
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

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expect = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  AMPIPE_CHECK(dim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "rows({}, {}) of {}", begin, end,
               shape_str(shape_));
  Tensor v = *this;
  v.offset_bytes_ += size_t(begin * strides_[0]) * dtype_size(dtype_);
  v.shape_[0] = end - begin;
  return v;
}

Tensor Tensor::cols(int64_t begin, int64_t end) const {
  AMPIPE_CHECK(dim() == 2 && 0 <= begin && begin <= end && end <= shape_[1], "cols({}, {}) of {}", begin, end,
               shape_str(shape_));
  Tensor v = *this;
  v.offset_bytes_ += size_t(begin * strides_[1]) * dtype_size(dtype_);
  v.shape_[1] = end - begin;
  return v;
}

Tensor Tensor::view_bytes(size_t byte_offset, Shape shape, DType dtype) const {
  AMPIPE_CHECK(is_contiguous(), "view_bytes of a non-contiguous tensor {}", shape_str(shape_));
  const size_t n = size_t(shape_numel(shape)) * dtype_size(dtype);
  AMPIPE_CHECK(byte_offset % dtype_size(dtype) == 0 && byte_offset + n <= nbytes(),
               "view_bytes {} {} at byte {} of a {}-byte tensor", dtype_name(dtype), shape_str(shape), byte_offset,
               nbytes());
  Tensor v = *this;
  v.offset_bytes_ += byte_offset;
  v.dtype_ = dtype;
  v.strides_ = contiguous_strides(shape);
  v.shape_ = std::move(shape);
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
  AMPIPE_CHECK(0 <= flat && flat < numel(), "get({}) of {}", flat, shape_str(shape_));
  const int64_t o = flat_offset(flat);
  if (dtype_ == DType::f32) return reinterpret_cast<const float*>(raw())[o];
  return bf16_to_f32(reinterpret_cast<const bf16*>(raw())[o]);
}

void Tensor::set(int64_t flat, float v) {
  AMPIPE_CHECK(0 <= flat && flat < numel(), "set({}) of {}", flat, shape_str(shape_));
  const int64_t o = flat_offset(flat);
  if (dtype_ == DType::f32)
    reinterpret_cast<float*>(raw())[o] = v;
  else
    reinterpret_cast<bf16*>(raw())[o] = f32_to_bf16(v);
}

// Strided tensors (rows / cols views) are walked row by row of the last dimension: `inner` elements per row
// with stride strides_.back(), each row's start from flat_offset.

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  const int64_t n = numel();
  if (n == 0) return out;
  AMPIPE_CHECK(defined(), "to_vector of an undefined tensor");
  if (is_contiguous()) {
    copy_elems(out.data(), DType::f32, 1, raw(), dtype_, 1, n);
    return out;
  }
  const int64_t inner = shape_.back(), stride = strides_.back();
  for (int64_t r = 0; r < n / inner; ++r)
    copy_elems(out.data() + r * inner, DType::f32, 1, elem_ptr(raw(), dtype_, flat_offset(r * inner)), dtype_,
               stride, inner);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  AMPIPE_CHECK(src.shape_ == shape_, "copy_from {} into {}", shape_str(src.shape_), shape_str(shape_));
  const int64_t n = numel();
  if (n == 0) return;
  AMPIPE_CHECK(defined() && src.defined(), "copy_from with an undefined tensor");
  // Spread over the threads (every element copied once, so the same bits at any count), unless both are views
  // of one storage: they may overlap, and only a serial memmove keeps an overlapping copy right.
  const bool serial = shares_storage_with(src);
  if (src.is_contiguous() && is_contiguous()) {
    parallel_for(n, serial ? n : kElementGrain, [&](int64_t i0, int64_t i1) {
      copy_elems(elem_ptr(raw(), dtype_, i0), dtype_, 1, elem_ptr(src.raw(), src.dtype_, i0), src.dtype_, 1, i1 - i0);
    });
    return;
  }
  const int64_t inner = shape_.back(), ds = strides_.back(), ss = src.strides_.back();
  parallel_for(n / inner, serial ? n / inner : rows_grain(inner), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      copy_elems(elem_ptr(raw(), dtype_, flat_offset(r * inner)), dtype_, ds,
                 elem_ptr(src.raw(), src.dtype_, src.flat_offset(r * inner)), src.dtype_, ss, inner);
  });
}

Tensor Tensor::clone() const { return to(dtype_); }

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype);
  t.copy_from(*this);
  return t;
}

void Tensor::fill(float value) {
  const int64_t n = numel();
  if (n == 0) return;
  AMPIPE_CHECK(defined(), "fill of an undefined tensor");
  const bf16 v16 = f32_to_bf16(value);
  auto fill_run = [&](int64_t at, int64_t count, int64_t step) {
    if (dtype_ == DType::f32) {
      float* p = reinterpret_cast<float*>(raw()) + at;
      for (int64_t i = 0; i < count; ++i) p[i * step] = value;
    } else {
      bf16* p = reinterpret_cast<bf16*>(raw()) + at;
      for (int64_t i = 0; i < count; ++i) p[i * step] = v16;
    }
  };
  // Element ranges (contiguous) or rows (a view) spread over the threads.
  if (is_contiguous()) {
    parallel_for(n, kElementGrain, [&](int64_t i0, int64_t i1) { fill_run(i0, i1 - i0, 1); });
    return;
  }
  const int64_t inner = shape_.back(), stride = strides_.back();
  parallel_for(n / inner, rows_grain(inner), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) fill_run(flat_offset(r * inner), inner, stride);
  });
}

}  // namespace ampipe
