#include "ampipe/model/linear.h"

#include "ampipe/core/dtype.h"
#include "ampipe/core/parallel.h"

namespace ampipe::model {

void add_bias(Tensor y, const Tensor& b) {
  AMPIPE_CHECK(y.dim() == 2 && y.dtype() == DType::f32 && b.numel() == y.size(1) && y.strides()[1] == 1,
               "add_bias {} += {}", shape_str(y.shape()), shape_str(b.shape()));
  const int64_t k = y.size(1), stride = y.strides()[0];
  const float* bb = b.data<float>();
  float* base = y.data<float>();
  parallel_for(y.size(0), rows_grain(k), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = base + r * stride;
      for (int64_t j = 0; j < k; ++j) row[j] += bb[j];
    }
  });
}

void add_column_sums(const Tensor& dy, Tensor& db) {
  AMPIPE_CHECK(dy.dim() == 2 && db.numel() == dy.size(1) && dy.strides()[1] == 1, "add_column_sums {} into {}",
               shape_str(dy.shape()), shape_str(db.shape()));
  const int64_t k = dy.size(1), stride = dy.strides()[0];
  float* d = db.data<float>();
  // Summed over the rows in row order, the columns spread over the threads: the same sums at any thread count.
  const int64_t rows = dy.size(0);
  parallel_for(k, kColumnGrain, [&](int64_t j0, int64_t j1) {
    if (dy.dtype() == DType::f32) {
      const float* base = dy.data<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = j0; j < j1; ++j) d[j] += base[r * stride + j];
      return;
    }
    const bf16* base = dy.data<bf16>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = j0; j < j1; ++j) d[j] += bf16_to_f32(base[r * stride + j]);
  });
}

}  // namespace ampipe::model
