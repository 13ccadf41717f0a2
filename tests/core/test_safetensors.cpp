#include <gtest/gtest.h>

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
