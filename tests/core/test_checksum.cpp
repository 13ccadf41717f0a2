// XXH64 against the reference implementation's values (libxxhash 0.8.1, XXH64(data, n, seed)), on inputs that
// exercise every tail path (empty, 1 byte, 3 bytes, 771 bytes: 24 stripes, then 8-, 4- and 1-byte tails) and a seed,
// and the values python-xxhash's README publishes. These values are what the checkpoints written so far carry: they
// must never change.
#include <gtest/gtest.h>

#include <string>

#include "ampipe/core/checksum.h"

using namespace ampipe;

TEST(Checksum, Xxh64MatchesTheReferenceImplementation) {
  EXPECT_EQ(core::xxh64("", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(core::xxh64("a", 1), 0xd24ec4f1a98c6e5bull);
  EXPECT_EQ(core::xxh64("abc", 3), 0x44bc2cf5ad770999ull);
  EXPECT_EQ(core::xxh64("abc", 3, 1), 0xbea9ca8199328908ull);
  std::string s;
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 256; ++i) s.push_back(char(i));
  s += "xyz";
  ASSERT_EQ(s.size(), 771u);
  EXPECT_EQ(core::xxh64(s.data(), s.size()), 0xe921a1b45bd779f8ull);
  const std::string spam = "Nobody inspects the spammish repetition";  // 39 bytes: one stripe, then 1-byte tails
  EXPECT_EQ(core::xxh64(spam.data(), spam.size()), 0xfbcea83c8a378bf1ull);
  EXPECT_EQ(core::xxh64("xxhash", 6), 0x32dd38952c4bc720ull);
  EXPECT_EQ(core::xxh64("xxhash", 6, 20141025), 0xb559b98d844e0635ull);
  EXPECT_EQ(core::checksum_string(core::xxh64("", 0)), "xxh64:ef46db3751d8e999");
}

TEST(Checksum, OneFlippedBitChangesTheChecksum) {
  std::string s(4096, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = char(i * 7);
  const uint64_t h = core::xxh64(s.data(), s.size());
  for (size_t pos : {size_t(0), size_t(31), size_t(32), size_t(4095)}) {
    std::string t = s;
    t[pos] = char(t[pos] ^ 1);
    EXPECT_NE(core::xxh64(t.data(), t.size()), h) << pos;
  }
  EXPECT_EQ(core::checksum_string(0xabcull), "xxh64:0000000000000abc");
}

// CRC-32C against the check value of the Castagnoli CRC and the test vectors of RFC 3720 (iSCSI), appendix B.4.
TEST(Checksum, Crc32cMatchesTheRfc3720Vectors) {
  EXPECT_EQ(core::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(core::crc32c("", 0), 0u);
  std::string zeros(32, '\0'), ones(32, '\xff'), up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(char(i));
    down.push_back(char(31 - i));
  }
  EXPECT_EQ(core::crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(core::crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(core::crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(core::crc32c(down.data(), 32), 0x113FDB5Cu);
  // Continuing a previous result equals one call over the whole input.
  EXPECT_EQ(core::crc32c("56789", 5, core::crc32c("1234", 4)), 0xE3069283u);
}

// TFRecord's mask: rotate right by 15, add 0xa282ead8.
TEST(Checksum, Crc32cMaskedIsTfRecordsMask) {
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(core::crc32c_masked("123456789", 9), uint32_t(((c >> 15) | (c << 17)) + 0xa282ead8u));
  EXPECT_NE(core::crc32c_masked("123456789", 9), c);
}
