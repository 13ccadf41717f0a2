// kernels::copy_row_blocks (kernels/dispatch.h): the packing between buffer layouts, against hand-placed rows.
#include <gtest/gtest.h>

#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/core/parallel.h"
#include "ampipe/kernels/dispatch.h"

using namespace ampipe;

TEST(RowBlocks, CopiesEachBlockToItsPlaceAndConverts) {
  // src row r holds r*10 + column; blocks: rows 4-5 -> 0-1, row 0 -> 3, rows 1-2 -> 5-6; untouched rows stay -1
  Tensor src = Tensor::empty({6, 3});
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t j = 0; j < 3; ++j) src.set(r * 3 + j, float(r * 10 + j));
  const std::vector<kernels::RowBlock> blocks = {{4, 0, 2}, {0, 3, 1}, {1, 5, 2}};
  const std::vector<int> want_src = {4, 5, -1, 0, -1, 1, 2};  // the source row of each destination row
  for (DType dt : {DType::f32, DType::bf16})
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor dst = Tensor::empty({7, 3}, dt);
      dst.fill(-1.0f);
      kernels::copy_row_blocks(src, dst, blocks);
      for (int64_t r = 0; r < 7; ++r)
        for (int64_t j = 0; j < 3; ++j)
          EXPECT_EQ(dst.get(r * 3 + j), want_src[size_t(r)] < 0 ? -1.0f : float(want_src[size_t(r)] * 10 + j))
              << dtype_name(dt) << " row " << r << " col " << j;  // small integers: exact in bf16
    }
  set_num_threads(1);
}

TEST(RowBlocksDeathTest, ABlockOutsideEitherTensorStops) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Tensor src = Tensor::zeros({4, 2});
  Tensor dst = Tensor::zeros({4, 2});
  EXPECT_DEATH(kernels::copy_row_blocks(src, dst, {{3, 0, 2}}), "outside");
  EXPECT_DEATH(kernels::copy_row_blocks(src, dst, {{0, 3, 2}}), "outside");
  Tensor narrow = Tensor::zeros({4, 3});
  EXPECT_DEATH(kernels::copy_row_blocks(src, narrow, {}), "copy_row_blocks");
}
