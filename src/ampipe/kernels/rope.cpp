#include "ampipe/kernels/rope.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/core/parallel.h"
#include "ampipe/kernels/checks.h"

namespace ampipe::kernels {

std::vector<float> rope_inv_freq(const RopeSpec& spec) {
  const int64_t half = spec.rot_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[size_t(i)] = 1.0f / std::pow(float(spec.base), float(2 * i) / float(spec.rot_dim));
  if (!spec.llama3_scaling) return f;
  // Llama 3.x: wavelengths above the original context's are slowed by the factor, those below a quarter of it kept,
  // the band between interpolated smoothly.
  constexpr float kLow = 1.0f, kHigh = 4.0f, kContext = 8192.0f;
  const float factor = float(spec.scaling_factor), low_wavelen = kContext / kLow, high_wavelen = kContext / kHigh;
  for (float& x : f) {
    const float wavelen = 2.0f * std::numbers::pi_v<float> / x;
    const float scaled = wavelen > low_wavelen ? x / factor : x;
    if (wavelen < high_wavelen || wavelen > low_wavelen) {
      x = scaled;
      continue;
    }
    const float smooth = (kContext / wavelen - kLow) / (kHigh - kLow);
    x = (1.0f - smooth) * scaled / factor + smooth * scaled;
  }
  return f;
}

void rope_apply(const RopeSpec& spec, Tensor& x, int64_t heads, int64_t d, int64_t b,
                std::span<const int64_t> positions, bool inverse) {
  constexpr const char* op = "rope_apply";
  const int64_t r = spec.rot_dim, half = r / 2, rows = int64_t(positions.size());
  AMPIPE_CHECK(r > 0 && r % 2 == 0 && r <= d && b > 0, "{}: rotary dim {} for head dim {} (b {})", op, r, d, b);
  const int64_t ld = detail::check_matrix(x, op, "x", DType::f32, rows * b, heads * d);
  const std::vector<float> inv_freq = rope_inv_freq(spec);
  float* base = x.data<float>();
  const float sign = inverse ? -1.0f : 1.0f;
  // channel pairs (lo, hi) of frequency i: (i, i + r/2) or, interleaved, (2i, 2i + 1)
  const int64_t step = spec.interleaved ? 2 : 1, partner = spec.interleaved ? 1 : half;
  parallel_for(rows, rows_grain(b * heads * d), [&](int64_t i0, int64_t i1) {
    std::vector<float> cs(static_cast<size_t>(2 * half));  // cos, sin of the position's angles
    for (int64_t i = i0; i < i1; ++i) {
      const float p = float(positions[size_t(i)]) * float(spec.position_scale);
      for (int64_t f = 0; f < half; ++f) {
        const float a = p * inv_freq[size_t(f)];
        cs[size_t(f)] = std::cos(a);
        cs[size_t(half + f)] = sign * std::sin(a);
      }
      for (int64_t bb = 0; bb < b; ++bb) {
        float* row = base + (i * b + bb) * ld;
        for (int64_t hh = 0; hh < heads; ++hh) {
          float* v = row + hh * d;
          for (int64_t f = 0; f < half; ++f) {
            float& lo = v[f * step];
            float& hi = v[f * step + partner];
            const float c = cs[size_t(f)], s = cs[size_t(half + f)], x0 = lo, x1 = hi;
            lo = x0 * c - x1 * s;
            hi = x1 * c + x0 * s;
          }
        }
      }
    }
  });
}

}  // namespace ampipe::kernels
