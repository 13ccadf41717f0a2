// XXH64 (xxHash's 64-bit hash, https://github.com/Cyan4973/xxHash), computed by Debian's libxxhash (the reference
// implementation; its header is included only in core/checksum.cpp): the checksum of every data section of a
// checkpoint (core/safetensors.h) and of the corpus the ranks agree on (cli/train_agreement.cpp). It runs at
// several GB/s per core, so hashing a checkpoint costs a small fraction of writing or reading it.
// tests/core/test_checksum.cpp pins published test vectors, so checkpoints written before the switch still load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ampipe::core {

uint64_t xxh64(const void* data, size_t n, uint64_t seed = 0);

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF), table-driven,
// one byte at a time: the checksum of TFRecord files (train/tensorboard.h). crc32c("123456789") = 0xE3069283.
// `crc` continues a previous call's result (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's masked form of a CRC-32C: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32).
uint32_t crc32c_masked(const void* data, size_t n);

// "xxh64:" followed by 16 lower-case hex digits: the form checksums take in files.
std::string checksum_string(uint64_t h);

}  // namespace ampipe::core
