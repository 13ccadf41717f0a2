#include <gtest/gtest.h>

#include <cmath>

#include "ampipe/core/philox.h"

using namespace ampipe::core;

// Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32_10).
TEST(Philox, KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (Philox4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (Philox4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (Philox4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, KeyedByPositionNotCallOrder) {
  PhiloxKey k{42, 3, RngPurpose::mlp_dropout};
  const float a = philox_uniform(k, 17, 5);
  for (int i = 0; i < 10; ++i) (void)philox_uniform(k, uint64_t(i), 0);
  EXPECT_EQ(a, philox_uniform(k, 17, 5));
  PhiloxKey other = k;
  other.purpose = RngPurpose::attn_dropout;
  EXPECT_NE(a, philox_uniform(other, 17, 5));
}

TEST(Philox, UniformMoments) {
  PhiloxKey k{7, 0, RngPurpose::data};
  double sum = 0, sum2 = 0, nsum = 0, nsum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = philox_uniform(k, uint64_t(i / 64), uint64_t(i % 64));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum2 += u * u;
    const double z = philox_normal(k, uint64_t(i / 64), uint64_t(i % 64));
    nsum += z;
    nsum2 += z * z;
  }
  // 200k samples: standard error of the mean ~ 0.29/sqrt(n) = 6.5e-4; 5e-3 is > 7 sigma.
  EXPECT_NEAR(sum / n, 0.5, 5e-3);
  EXPECT_NEAR(sum2 / n - (sum / n) * (sum / n), 1.0 / 12, 5e-3);
  EXPECT_NEAR(nsum / n, 0.0, 1e-2);
  EXPECT_NEAR(nsum2 / n, 1.0, 2e-2);
}
