#include "ampipe/core/checksum.h"

#include <fmt/format.h>
#include <xxhash.h>

namespace ampipe::core {

// Debian's libxxhash (libxxhash-dev): the reference implementation itself, one-shot over a contiguous buffer (every
// caller hashes one). XXH64, not XXH3: the checkpoints written so far carry XXH64 values with seed 0.
uint64_t xxh64(const void* data, size_t n, uint64_t seed) { return uint64_t(XXH64(data, n, XXH64_hash_t(seed))); }

namespace {

struct Crc32cTable {
  uint32_t t[256];
  constexpr Crc32cTable() : t() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};
constexpr Crc32cTable kCrc32c;

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = kCrc32c.t[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c_masked(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string checksum_string(uint64_t h) { return fmt::format("xxh64:{:016x}", h); }

}  // namespace ampipe::core
