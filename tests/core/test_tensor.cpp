#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

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

TEST(Tensor, DeviceIsCpu) {
  Tensor t = Tensor::zeros({4, 6});
  EXPECT_EQ(t.device(), Device::cpu);
  EXPECT_EQ(t.rows(1, 3).device(), Device::cpu);
  EXPECT_EQ(t.cols(1, 3).device(), Device::cpu);
  EXPECT_EQ(t.to(DType::bf16).device(), Device::cpu);
  EXPECT_EQ(device_name(Device::cpu), "cpu");
}

// Every new storage block counts once, with its 64-byte-rounded size; views, copies of the handle, copy_from and
// fill allocate nothing.
TEST(Tensor, AllocStatsCountStorageNotViews) {
  const TensorAllocStats s0 = tensor_alloc_stats();
  Tensor a = Tensor::empty({3, 5});  // 60 bytes -> 64
  TensorAllocStats s = tensor_alloc_stats();
  EXPECT_EQ(s.count - s0.count, 1u);
  EXPECT_EQ(s.bytes - s0.bytes, 64u);

  Tensor z = Tensor::zeros({10, 10}, DType::bf16);            // 200 -> 256
  Tensor f = Tensor::from({1, 2, 3}, {3});                    // 12 -> 64
  Tensor c = a.clone();                                       // 64
  Tensor b = a.to(DType::bf16);                               // 30 -> 64
  Tensor e = Tensor::empty({0, 4});                           // empty: still one 64-byte block
  Tensor big = Tensor::empty({1000, 33});                     // 132000 -> 132032
  s = tensor_alloc_stats();
  EXPECT_EQ(s.count - s0.count, 7u);
  EXPECT_EQ(s.bytes - s0.bytes, 64u + 256u + 64u + 64u + 64u + 64u + 132032u);

  const TensorAllocStats s1 = tensor_alloc_stats();
  Tensor r = big.rows(10, 20);
  Tensor col = big.cols(3, 7);
  Tensor rc = big.rows(2, 9).cols(1, 2);
  Tensor v = big.view({-1});
  Tensor handle = big;  // copy of the handle shares the storage
  r.fill(1.0f);
  col.copy_from(big.cols(10, 14));
  rc.zero();
  (void)v;
  (void)handle;
  s = tensor_alloc_stats();
  EXPECT_EQ(s.count, s1.count);
  EXPECT_EQ(s.bytes, s1.bytes);
  // a clone of a view allocates a packed block of the view's size
  Tensor packed = col.clone();  // 1000 x 4 fp32 = 16000 bytes, a multiple of 64
  s = tensor_alloc_stats();
  EXPECT_EQ(s.count - s1.count, 1u);
  EXPECT_EQ(s.bytes - s1.bytes, 16000u);
  EXPECT_TRUE(packed.is_contiguous());
}

TEST(Tensor, AllocStatsAreThreadSafe) {
  constexpr int kThreads = 4, kPerThread = 500;
  const TensorAllocStats s0 = tensor_alloc_stats();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < kPerThread; ++i) {
        Tensor x = Tensor::empty({int64_t(i % 7) + 1, 16});  // (i % 7 + 1) * 64 bytes
        (void)x;
      }
    });
  for (auto& th : threads) th.join();
  uint64_t want_bytes = 0;
  for (int i = 0; i < kPerThread; ++i) want_bytes += uint64_t(i % 7 + 1) * 64;
  const TensorAllocStats s = tensor_alloc_stats();
  EXPECT_EQ(s.count - s0.count, uint64_t(kThreads * kPerThread));
  EXPECT_EQ(s.bytes - s0.bytes, kThreads * want_bytes);
}

namespace {
// [r, c] fp32 or bf16 tensor holding 8*i + j at (i, j) (exact in bf16 for the small sizes used here)
Tensor iota2(int64_t r, int64_t c, DType dt = DType::f32) {
  Tensor t = Tensor::empty({r, c}, dt);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) t.set(i * c + j, float(i * 8 + j));
  return t;
}
}  // namespace

TEST(Tensor, ColsIsAStridedView) {
  Tensor t = iota2(4, 9);
  Tensor c = t.cols(3, 6);
  EXPECT_EQ(c.shape(), (Shape{4, 3}));
  EXPECT_EQ(c.strides(), (Shape{9, 1}));
  EXPECT_TRUE(c.shares_storage_with(t));
  EXPECT_FALSE(c.is_contiguous());
  EXPECT_EQ(c.data<float>(), t.data<float>() + 3);
  // flat index of the view is row-major in the view's shape
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(c.get(i * 3 + j), float(i * 8 + 3 + j));
  c.set(4, -7.0f);  // (1, 1) of the view = (1, 4) of the base
  EXPECT_EQ(t.get(1 * 9 + 4), -7.0f);
  EXPECT_EQ(c.to_vector(), (std::vector<float>{3, 4, 5, 11, -7, 13, 19, 20, 21, 27, 28, 29}));

  // all columns, or a single row, are contiguous; an empty range too
  EXPECT_TRUE(t.cols(0, 9).is_contiguous());
  EXPECT_TRUE(t.rows(2, 3).cols(3, 6).is_contiguous());
  EXPECT_TRUE(t.cols(5, 5).is_contiguous());
  EXPECT_EQ(t.cols(5, 5).numel(), 0);
  EXPECT_TRUE(t.rows(2, 3).cols(3, 6).view({3}).shares_storage_with(t));
  EXPECT_EQ(t.rows(2, 3).cols(3, 6).view({3}).to_vector(), (std::vector<float>{19, 20, 21}));

  // rows of cols and cols of rows agree
  Tensor rc = t.cols(2, 7).rows(1, 3), cr = t.rows(1, 3).cols(2, 7);
  EXPECT_EQ(rc.shape(), (Shape{2, 5}));
  EXPECT_EQ(rc.raw(), cr.raw());
  EXPECT_EQ(rc.strides(), cr.strides());
  EXPECT_EQ(rc.to_vector(), cr.to_vector());
  // a column range of a column range
  EXPECT_EQ(t.cols(2, 7).cols(1, 3).to_vector(), t.cols(3, 5).to_vector());
}

TEST(Tensor, FillAndCopyThroughColumnViews) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor t = iota2(5, 8, dt);
    const std::vector<float> before = t.to_vector();
    t.cols(2, 5).fill(-1.0f);  // only columns 2..4 change
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 8; ++j)
        EXPECT_EQ(t.get(i * 8 + j), (j >= 2 && j < 5) ? -1.0f : before[size_t(i * 8 + j)]) << i << " " << j;

    // strided -> strided (another column range of the same buffer, no overlap), same dtype
    Tensor u = iota2(5, 8, dt);
    u.cols(5, 8).copy_from(u.cols(0, 3));
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 8; ++j)
        EXPECT_EQ(u.get(i * 8 + j), float(i * 8 + (j >= 5 ? j - 5 : j))) << i << " " << j;

    // contiguous -> strided and strided -> contiguous, converting the dtype
    const DType other = dt == DType::f32 ? DType::bf16 : DType::f32;
    Tensor src = Tensor::from({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {5, 2}, other);
    Tensor w = iota2(5, 8, dt);
    w.cols(6, 8).copy_from(src);
    EXPECT_EQ(w.cols(6, 8).to_vector(), src.to_vector());
    EXPECT_EQ(w.cols(0, 6).to_vector(), iota2(5, 8, dt).cols(0, 6).to_vector());  // rest untouched
    Tensor back = Tensor::zeros({5, 2}, other);
    back.copy_from(w.cols(6, 8));
    EXPECT_EQ(back.to_vector(), src.to_vector());

    // clone / to of a view: packed copies of the view's elements
    Tensor cl = w.cols(1, 4).clone();
    EXPECT_TRUE(cl.is_contiguous());
    EXPECT_FALSE(cl.shares_storage_with(w));
    EXPECT_EQ(cl.dtype(), dt);
    EXPECT_EQ(cl.to_vector(), w.cols(1, 4).to_vector());
    EXPECT_EQ(w.cols(1, 4).to(other).to_vector(), w.cols(1, 4).to_vector());
  }
}

TEST(Tensor, BadViewsAreCaught) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor t = Tensor::zeros({4, 6});
  EXPECT_DEATH(t.cols(2, 7), "cols\\(2, 7\\) of \\[4, 6\\]");
  EXPECT_DEATH(t.cols(3, 2), "cols\\(3, 2\\)");
  EXPECT_DEATH(Tensor::zeros({2, 3, 4}).cols(0, 1), "cols\\(0, 1\\) of \\[2, 3, 4\\]");
  EXPECT_DEATH(t.cols(0, 3).view({12}), "non-contiguous");
  EXPECT_DEATH(t.cols(0, 3).get(12), "get\\(12\\)");
  EXPECT_DEATH(t.set(-1, 0.0f), "set\\(-1\\)");
}

TEST(Tensor, ViewBytesCarvesTypedBuffersWithoutAllocating) {
  Tensor arena = Tensor::zeros({64});  // 256 bytes
  const uint64_t before = tensor_alloc_stats().count;
  Tensor a = arena.view_bytes(0, {2, 3}, DType::f32);
  Tensor b = arena.view_bytes(64, {4, 4}, DType::bf16);
  EXPECT_EQ(tensor_alloc_stats().count, before);
  EXPECT_TRUE(a.shares_storage_with(arena));
  EXPECT_TRUE(b.is_contiguous());
  EXPECT_EQ(b.dtype(), DType::bf16);
  a.fill(2.0f);
  b.fill(-1.5f);
  EXPECT_EQ(arena.get(5), 2.0f);   // a's last element
  EXPECT_EQ(arena.get(6), 0.0f);   // untouched between a and b
  EXPECT_EQ(b.get(15), -1.5f);
  EXPECT_EQ(arena.get(16 + 8), 0.0f);  // after b (64 + 32 bytes = float 24)
  EXPECT_DEATH(arena.view_bytes(250, {4}, DType::f32), "view_bytes f32 \\[4\\] at byte 250");  // past the end
  EXPECT_DEATH(arena.view_bytes(2, {1}, DType::f32), "at byte 2 of");                        // misaligned
}
