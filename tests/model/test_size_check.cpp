// The overflow-checked size rules (model/size_check.h) that LayerConfig::validate applies: a size that cannot be
// represented is refused naming the flag; the seed's large scale is not.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "ampipe/core/error.h"
#include "ampipe/model/layer_config.h"
#include "ampipe/model/size_check.h"

using namespace ampipe;
using ::testing::HasSubstr;

namespace {

// docs/layer.md section 12's layer: s 16, b 2, h 32, F 24, 4 heads, 4 experts, top-2.
model::LayerConfig small_layer() {
  model::LayerConfig c;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 24;
  c.num_attention_heads = 4;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  return c;
}

std::string error_of(const model::LayerConfig& c) {
  try {
    c.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(SizeCheck, OverflowNamesTheFlag) {
  model::LayerConfig c = small_layer();
  c.hidden_size = INT64_MAX;
  c.num_attention_heads = 1;
  EXPECT_THAT(error_of(c), HasSubstr("--hidden-size 9223372036854775807 is too large"));
  EXPECT_THAT(error_of(c), HasSubstr("overflows 64-bit arithmetic"));
  c = small_layer();
  c.hidden_size = int64_t(1) << 31;  // 3 h^2 = 3 x 2^62 elements of the QKV weight
  EXPECT_THAT(error_of(c), HasSubstr("--hidden-size 2147483648 is too large: the [3h, h] QKV weight"));
  c = small_layer();
  c.micro_batch_size = int64_t(1) << 44;  // [T, h] = 2^4 x 2^44 x 2^5 = 2^53 elements: 2^55 bytes fit; [T, 3h] not
  EXPECT_THAT(error_of(c), HasSubstr("--micro-batch-size 17592186044416 is too large: the [T, 3h] QKV activation"));
  c = small_layer();
  c.num_experts = int64_t(1) << 48;  // [S_c, E] 2^53 and [E, F, h] 2^53 elements (F = 1) fit; [E, T, h] = 2^58 not
  c.ffn_hidden_size = 1;
  EXPECT_THAT(error_of(c), HasSubstr("--num-experts 281474976710656 is too large: the [E, C, h] all-to-all"));
  EXPECT_EQ(error_of(small_layer()), "");
  // The seed's large scale still validates: only sizes that cannot be represented are refused.
  c = small_layer();
  c.seq_length = 131072;
  c.hidden_size = 12288;
  c.ffn_hidden_size = 4 * 12288;
  c.num_attention_heads = 96;
  c.num_experts = 16;
  EXPECT_EQ(error_of(c), "");
}

TEST(SizeCheck, CheckedArithmetic) {
  EXPECT_EQ(model::checked_elements("x", {{"--a", 3}, {nullptr, 5}}), 15);
  EXPECT_EQ(model::checked_elements("x", {{"--a", int64_t(1) << 54}}), int64_t(1) << 54);  // 2^56 bytes: the bound
  EXPECT_THROW(model::checked_elements("x", {{"--a", (int64_t(1) << 54) + 1}}), ConfigError);
  EXPECT_THROW(model::checked_mul(INT64_MAX, 2, "x"), ConfigError);
  EXPECT_THROW(model::checked_add(INT64_MAX, 1, "x"), ConfigError);
  EXPECT_EQ(model::checked_add(INT64_MAX - 1, 1, "x"), INT64_MAX);
}

TEST(SizeCheck, PlanSize) {
  model::LayerConfig c = small_layer();
  c.seq_length = int64_t(1) << 30;
  EXPECT_EQ(model::check_plan_size(c, 16), 16);
  EXPECT_EQ(model::check_plan_size(c, 1 << 16), 1 << 16);  // the bound itself is planned
  try {
    model::check_plan_size(c, (1 << 16) * 2);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("--ampipe-degree 131072 is too large"));
  }
  c.use_pipe_experts = true;  // 4 local experts x 8 / 2 slices: 16 pieces per chunk, 2 x 17 groups
  c.pipe_experts_multi_data = 8;
  EXPECT_EQ(model::check_plan_size(c, 2), 34);
  c.pipe_experts_multi_data = 1 << 20;  // 4 x 2^19 pieces per chunk
  EXPECT_THROW(model::check_plan_size(c, 2), ConfigError);
  c.use_pipe_experts = false;
  EXPECT_EQ(model::check_plan_size(c, 4, 1 << 18), 4);  // 2^20 groups over the stack: the bound
  try {
    model::check_plan_size(c, 4, (1 << 18) + 1);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("--num-layers 262145 is too large"));
  }
}
