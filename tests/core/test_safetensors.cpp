#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ampipe/core/safetensors.h"

using namespace ampipe;

TEST(Safetensors, RoundTripBothDtypesAndMetadata) {
  const std::string path = ::testing::TempDir() + "/rt.safetensors";
  core::TensorMap m;
  m["b"] = Tensor::from({1, 2, 3, 4, 5, 6}, {2, 3});
  m["a"] = Tensor::from({0.5f, -1.25f}, {2}, DType::bf16);
  core::save_safetensors(path, m, {{"iteration", "7"}});
  std::map<std::string, std::string> meta;
  const auto back = core::load_safetensors(path, &meta);
  EXPECT_EQ(meta.at("iteration"), "7");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back.at("b").shape(), (Shape{2, 3}));
  EXPECT_EQ(back.at("b").to_vector(), m["b"].to_vector());
  EXPECT_EQ(back.at("a").dtype(), DType::bf16);
  EXPECT_EQ(back.at("a").to_vector(), m["a"].to_vector());
  // Header: 8-byte little-endian length, JSON; data aligned to 8.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, CorruptFilesNameThePath) {
  const std::string path = ::testing::TempDir() + "/bad.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    out << "\x10\x00\x00\x00\x00\x00\x00\x00{\"x\":";
  }
  try {
    core::load_safetensors(path);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(core::load_safetensors(path + ".missing"), ConfigError);
  EXPECT_THROW(core::save_safetensors("/nonexistent-dir/x.safetensors", {}), ConfigError);
}

TEST(Safetensors, AWriteRemovesTempFilesOfKilledWritesOfThatPathOnly) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ampipe_st_tmp_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "model.safetensors").string();
  // pid 2^22 + 1 is above Linux's default pid_max (2^22): no live process has it.
  const std::string stale = path + ".tmp.4194305", other = (dir / "other.safetensors.tmp.4194305").string();
  const std::string not_ours = path + ".tmp.x1";
  for (const std::string& f : {stale, other, not_ours}) std::ofstream(f) << "left by a killed save";
  core::save_safetensors(path, {{"w", Tensor::zeros({2})}}, {});
  EXPECT_FALSE(fs::exists(stale));    // this path's temp of a dead writer: removed
  EXPECT_TRUE(fs::exists(other));     // another file's temp: not ours to remove
  EXPECT_TRUE(fs::exists(not_ours));  // not a name the writer makes
  EXPECT_TRUE(fs::exists(path));
  fs::remove_all(dir);
}

namespace {

// A safetensors file from a header (JSON text) and `data_bytes` bytes of data, as a hostile or damaged file would be.
std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
  return path;
}

std::string load_error(const std::string& path, bool require_checksums = false) {
  try {
    core::load_safetensors(path, {.require_checksums = require_checksums}, nullptr, nullptr);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, WritesAndVerifiesAChecksumPerTensor) {
  const std::string path = ::testing::TempDir() + "/sum.safetensors";
  core::TensorMap m;
  m["a"] = Tensor::from({1, 2, 3, 4}, {4});
  m["b"] = Tensor::from({5, 6}, {2});
  const core::SafetensorsInfo info = core::save_safetensors(path, m, {{"k", "v"}});
  std::map<std::string, std::string> meta;
  core::SafetensorsInfo back;
  core::load_safetensors(path, {.require_checksums = true}, &meta, &back);
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"k", "v"}}));  // the checksums are not user metadata
  EXPECT_EQ(back.file_bytes, info.file_bytes);
  EXPECT_EQ(back.header_checksum, info.header_checksum);
  EXPECT_EQ(back.file_bytes, uint64_t(std::filesystem::file_size(path)));
  // One flipped bit in the last data byte (tensor "b"): refused, naming the file and the tensor.
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(char(c ^ 0x01));
  }
  const std::string e = load_error(path);
  EXPECT_NE(e.find(path + ": tensor 'b': the data does not match its checksum"), std::string::npos) << e;
}

TEST(Safetensors, RefusesBadShapesOffsetsAndChecksumsBeforeAllocating) {
  // Overlapping data sections.
  EXPECT_NE(load_error(write_raw("overlap.safetensors",
                                 R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                 16))
                .find("the data of tensors 'a' [0, 8) and 'b' [4, 12) overlap"),
            std::string::npos);
  // A shape larger than any file (2^62 x 2^62 elements): refused from the header, nothing allocated.
  EXPECT_NE(load_error(write_raw("huge.safetensors",
                                 R"({"a":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],)"
                                 R"("data_offsets":[0,8]}})",
                                 8))
                .find("more data than the file holds"),
            std::string::npos);
  EXPECT_NE(load_error(write_raw("negative.safetensors",
                                 R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8))
                .find("a dimension is negative"),
            std::string::npos);
  EXPECT_NE(load_error(write_raw("outside.safetensors",
                                 R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 16))
                .find("lie outside the data"),
            std::string::npos);
  EXPECT_NE(load_error(write_raw("array.safetensors", R"([1,2])", 0)).find("not a JSON object"), std::string::npos);
  // Checksums: required but absent; recorded for a tensor the file does not hold.
  const std::string plain = write_raw("plain.safetensors",
                                      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  EXPECT_EQ(load_error(plain), "");
  EXPECT_NE(load_error(plain, true).find("tensor 'a' has no recorded checksum"), std::string::npos);
  EXPECT_NE(load_error(write_raw("extra_sum.safetensors",
                                 R"({"__metadata__":{"ampipe.checksum.gone":"xxh64:0000000000000000"},)"
                                 R"("a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
                                 0))
                .find("records a checksum of tensor 'gone', which the file does not hold"),
            std::string::npos);
}
