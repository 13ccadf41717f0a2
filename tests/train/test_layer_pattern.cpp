// Megatron's --moe-layer-freq (integer or list expression) and MindSpeed-LLM's --first-k-dense-replace: which blocks
// have experts, and the one-line refusals.
#include <gtest/gtest.h>

#include "ampipe/core/error.h"
#include "ampipe/train/layer_pattern.h"

using ampipe::ConfigError;
using ampipe::train::moe_layer_pattern;

namespace {
std::string bits(const std::vector<bool>& v) {
  std::string s;
  for (bool b : v) s += b ? '1' : '0';
  return s;
}
std::string error_of(const std::string& freq, int k, int n) {
  try {
    moe_layer_pattern(freq, k, n);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(LayerPattern, IntegerFrequencyAsMegatron) {
  EXPECT_EQ(bits(moe_layer_pattern("1", 0, 4)), "1111");
  EXPECT_EQ(bits(moe_layer_pattern("2", 0, 5)), "10101");  // layer i has experts when i % k == 0
  EXPECT_EQ(bits(moe_layer_pattern("3", 0, 7)), "1001001");
}

TEST(LayerPattern, ListExpressions) {
  EXPECT_EQ(bits(moe_layer_pattern("[1,0,1,0]", 0, 4)), "1010");
  EXPECT_EQ(bits(moe_layer_pattern("([0]+[1]*5)", 0, 6)), "011111");
  EXPECT_EQ(bits(moe_layer_pattern("[0]*2+[1,0]*2", 0, 6)), "001010");
  EXPECT_EQ(bits(moe_layer_pattern(" ( [0] * 1 ) + ( [1] * 3 ) ", 0, 4)), "0111");
}

TEST(LayerPattern, FirstKDenseReplace) {
  EXPECT_EQ(bits(moe_layer_pattern("1", 2, 5)), "00111");
  EXPECT_EQ(bits(moe_layer_pattern("2", 1, 5)), "00101");
  EXPECT_EQ(bits(moe_layer_pattern("1", 3, 3)), "000");
}

TEST(LayerPattern, RefusalsNameTheFlagValueAndRule) {
  EXPECT_NE(error_of("[1,1]", 0, 3).find("--moe-layer-freq [1,1] has 2 entries: it must have one per layer (--num-layers 3)"),
            std::string::npos);
}

TEST(LayerPattern, BadExpressionsAreRefused) {
  EXPECT_NE(error_of("0", 0, 2).find("--moe-layer-freq 0 is invalid: an integer frequency must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of("[1,2]", 0, 2).find("entry 1 is 2: each entry is 1 (experts) or 0 (dense)"), std::string::npos);
  EXPECT_NE(error_of("[1,0", 0, 2).find("a ']' is missing"), std::string::npos);
  EXPECT_NE(error_of("__import__('os')", 0, 2).find("--moe-layer-freq __import__('os') is invalid"), std::string::npos);
  EXPECT_NE(error_of("[1]*99999999", 0, 2).find("too"), std::string::npos);
  EXPECT_NE(error_of("", 0, 2).find("--moe-layer-freq  is invalid"), std::string::npos);
  EXPECT_NE(error_of("1", 4, 3).find("--first-k-dense-replace 4 is invalid: it must be in [0, --num-layers 3]"),
            std::string::npos);
  EXPECT_NE(error_of("1", -1, 3).find("--first-k-dense-replace -1 is invalid"), std::string::npos);
}
