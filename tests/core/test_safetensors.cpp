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
