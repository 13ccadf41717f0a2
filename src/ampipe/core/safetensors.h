// safetensors files (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, a JSON
// header of N bytes ({"name": {"dtype": "F32"|"BF16", "shape": [...], "data_offsets": [begin, end]}, ...,
// optional "__metadata__": {string: string}}), then the raw little-endian data. Readable by the `safetensors`
// Python package.
//
// Writes are atomic: a temporary file in the same directory, fsync, then rename, so a crash never leaves a
// half-written file under the final name.
//
// Verification. Every write records the checksum of each tensor's data section in __metadata__ as
// "ampipe.checksum.<name>": "xxh64:<16 hex digits>" (core/checksum.h; other readers ignore the key). Every read
// checks, before it trusts a byte: the header is a JSON object of well-formed entries; each shape's byte size is
// computed without overflow and equals its offsets; offsets lie inside the file and no two data sections overlap;
// each recorded checksum equals the data's (and names a tensor of the file). LoadOptions::require_checksums refuses
// a tensor without one (checkpoints: a file written without checksums cannot be verified).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "ampipe/core/tensor.h"

namespace ampipe::core {

using TensorMap = std::map<std::string, Tensor>;  // sorted by name, as the format's readers expect

inline constexpr const char* kChecksumKeyPrefix = "ampipe.checksum.";

// What identifies a written file: its size and the checksum of its JSON header (which holds every tensor's
// checksum, so it covers the data too). A checkpoint's metadata.json records it for each of its files.
struct SafetensorsInfo {
  uint64_t file_bytes = 0;
  std::string header_checksum;  // checksum_string(xxh64 of the header's bytes)
  std::string file_checksum;    // checksum_string(xxh64 of the whole file): what a checkpoint's manifest records
};

struct SafetensorsLoadOptions {
  bool require_checksums = false;  // refuse a tensor whose checksum is not recorded
};

// Throws ConfigError naming the path when the file cannot be written. `metadata` keys must not start with
// kChecksumKeyPrefix.
SafetensorsInfo save_safetensors(const std::string& path, const TensorMap& tensors,
                                 const std::map<std::string, std::string>& metadata = {});

// Throws ConfigError naming the path and what is wrong (missing, truncated, bad header, bad shape or offsets,
// overlapping data, a checksum that does not match). `metadata` receives __metadata__ without the checksums.
TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);
TensorMap load_safetensors(const std::string& path, const SafetensorsLoadOptions& opts,
                           std::map<std::string, std::string>* metadata, SafetensorsInfo* info);

// The header of the file at `path` (its JSON object, "__metadata__" included), read without the data: what a
// checker needs to compare the tensors' names, dtypes and shapes before anything is allocated for them. Throws
// ConfigError naming the path when the file is missing, not regular, shorter than its header length says, or the
// header is not a JSON object.
nlohmann::json read_safetensors_header(const std::string& path);

// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync of the directory).
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace ampipe::core
