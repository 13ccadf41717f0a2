// Sums over a row by kLanes independent partial sums, shared by the norms (layernorm, rmsnorm): the partial sums
// vectorise (one ymm of 8 floats) and carry about sqrt(8) less rounding error than one running sum, and their order
// is fixed, so the result does not depend on the thread count or the build's vector width.
#pragma once

#include <cstdint>

namespace ampipe::kernels::detail {

constexpr int kLanes = 8;

// acc[0] + acc[1] + ... + acc[kLanes - 1], in that order.
inline float lane_sum(const float* acc) {
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// The sum of term(j) over j in [0, h): lane l adds the terms j = l, l + kLanes, ... below h - h % kLanes in order,
// lane l also the tail's term j = h - h % kLanes + l, then lane_sum. `term` is inlined: a lambda over row pointers.
template <typename Term> inline float sum_lanes(int64_t h, Term term) {
  float acc[kLanes] = {};
  const int64_t hv = h - h % kLanes;
  for (int64_t j = 0; j < hv; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(j + l);
  for (int64_t j = hv; j < h; ++j) acc[j - hv] += term(j);
  return lane_sum(acc);
}

}  // namespace ampipe::kernels::detail
