#include <gtest/gtest.h>

#include <cstdint>

#include "ampipe/core/tensor.h"

using namespace ampipe;

TEST(Tensor, AlignedContiguous) {
  Tensor t = Tensor::zeros({5, 3, 7});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  EXPECT_EQ(t.numel(), 105);
  EXPECT_EQ(t.strides(), (Shape{21, 7, 1}));
  EXPECT_TRUE(t.is_contiguous());
}

TEST(Tensor, RowsIsAViewNotACopy) {
  Tensor t = Tensor::empty({6, 2, 4});
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, float(i));
  Tensor v = t.rows(2, 5);
  EXPECT_EQ(v.shape(), (Shape{3, 2, 4}));
  EXPECT_TRUE(v.shares_storage_with(t));
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.get(0), 16.0f);
  v.set(0, -1.0f);
  EXPECT_EQ(t.get(16), -1.0f);
  Tensor flat = v.view({3, 8});
  EXPECT_EQ(flat.get(8), 24.0f);
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly half-way between bf16 1.0 and 1 + 2^-7: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f).bits, 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.01171875f).bits, 0x3f82);  // 1 + 3*2^-8 -> tie -> even 1 + 2^-6
  Tensor t = Tensor::from({1.0f, -2.5f, 3.14159f}, {3});
  Tensor b = t.to(DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_FLOAT_EQ(b.get(1), -2.5f);
  EXPECT_NEAR(b.get(2), 3.14159f, 0.02f);
}
