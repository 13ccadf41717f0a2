// core/host_memory.h: --memory-limit's byte counts, and what /proc says about this process and host.
#include <gtest/gtest.h>

#include <cstdint>

#include "ampipe/core/error.h"
#include "ampipe/core/host_memory.h"

using namespace ampipe;

TEST(HostMemory, ParseBytes) {
  EXPECT_EQ(core::parse_bytes("--memory-limit", "0"), 0);
  EXPECT_EQ(core::parse_bytes("--memory-limit", "1048576"), 1048576);
  EXPECT_EQ(core::parse_bytes("--memory-limit", "1M"), 1 << 20);
  EXPECT_EQ(core::parse_bytes("--memory-limit", "512MiB"), int64_t(512) << 20);
  EXPECT_EQ(core::parse_bytes("--memory-limit", "8G"), int64_t(8) << 30);
  EXPECT_EQ(core::parse_bytes("--memory-limit", "1.5k"), 1536);
  EXPECT_EQ(core::parse_bytes("--memory-limit", "2TB"), int64_t(2) << 40);
  for (const char* bad : {"", "G", "8X", "-1", "1..5G", "99999999999999999999", "16E", "8 G"})
    EXPECT_THROW(core::parse_bytes("--memory-limit", bad), ConfigError) << bad;
  EXPECT_GT(core::current_rss_bytes(), 0);
  EXPECT_GE(core::peak_rss_bytes(), core::current_rss_bytes());
  EXPECT_GT(core::available_memory().bytes, 0);  // Linux: /proc/meminfo is there
}

TEST(HostMemory, FormatBytes) {
  EXPECT_EQ(core::format_bytes(4), "4 B");
  EXPECT_EQ(core::format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(core::format_bytes(double(int64_t(512) << 20)), "512 MiB");
}
