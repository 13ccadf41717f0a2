#include "ampipe/core/philox.h"

#include <cmath>
#include <numbers>

namespace ampipe::core {

float philox_normal(const PhiloxKey& k, uint64_t token, uint64_t feature) {
  const double u1 = 1.0 - double(philox_uniform(k, token, 2 * feature));  // (0, 1]
  const double u2 = double(philox_uniform(k, token, 2 * feature + 1));
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace ampipe::core
