// Helpers for numerical tests against double-precision references (docs/design.md, "Tests").
#pragma once

#include <random>
#include <vector>

#include "ampipe/core/tensor.h"

namespace ampipe::testing {

using Vec = std::vector<double>;

// Central finite difference of a scalar loss at coordinate i. loss(x) = <r, f(x)>; step 1e-6 in double: error
// ~1e-10 (rounding / step), far below a 1e-6 tolerance.
double fd(const auto& loss, Vec x, size_t i, double step = 1e-6) {
  x[i] += step;
  const double up = loss(x);
  x[i] -= 2 * step;
  return (up - loss(x)) / (2 * step);
}

// n normal draws, each fp32-representable, so a kernel sees exactly the reference's input.
inline Vec randn(size_t n, std::mt19937& rng, double mean = 0.0, double sd = 1.0) {
  std::normal_distribution<float> nd{float(mean), float(sd)};
  Vec v(n);
  for (auto& e : v) e = nd(rng);
  return v;
}

inline Tensor to_tensor(const Vec& v, Shape s) {
  return Tensor::from(std::vector<float>(v.begin(), v.end()), std::move(s));
}

}  // namespace ampipe::testing
