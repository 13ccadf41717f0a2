// Element types: fp32 and bf16 (bfloat16, the top 16 bits of an IEEE fp32, rounded to nearest even).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace ampipe {

enum class DType : uint8_t { f32, bf16 };

constexpr size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
constexpr std::string_view dtype_name(DType t) { return t == DType::f32 ? "f32" : "bf16"; }

struct bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_f32(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even; NaN stays NaN.
inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

}  // namespace ampipe
