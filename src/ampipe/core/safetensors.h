// safetensors files (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, a JSON
// header of N bytes ({"name": {"dtype": "F32"|"BF16", "shape": [...], "data_offsets": [begin, end]}, ...,
// optional "__metadata__": {string: string}}), then the raw little-endian data. Readable by the `safetensors`
// Python package.
//
// Writes are atomic: a temporary file in the same directory, fsync, then rename, so a crash never leaves a
// half-written file under the final name.
#pragma once

#include <map>
#include <string>

#include "ampipe/core/tensor.h"

namespace ampipe::core {

using TensorMap = std::map<std::string, Tensor>;  // sorted by name, as the format's readers expect

// Throws ConfigError naming the path when the file cannot be written.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Throws ConfigError naming the path and what is wrong (missing, truncated, bad header, bad offsets).
TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync of the directory).
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace ampipe::core
