// XXH64 (xxHash's 64-bit hash, https://github.com/Cyan4973/xxHash, the algorithm of its spec, written here so that
// no library is needed): the checksum of every data section of a checkpoint (core/safetensors.h). It runs at
// several GB/s per core (four independent 64-bit multiply lanes over 32-byte stripes), so hashing a checkpoint
// costs a small fraction of writing or reading it. Results equal the reference implementation's XXH64(data, n,
// seed) (tests/core/test_checksum.cpp pins its test vectors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ampipe::core {

uint64_t xxh64(const void* data, size_t n, uint64_t seed = 0);

// "xxh64:" followed by 16 lower-case hex digits: the form checksums take in files.
std::string checksum_string(uint64_t h);

}  // namespace ampipe::core
