// Philox-4x32-10 counter-based random numbers (Salmon et al., SC'11), the generator of cuRAND and JAX.
//
// Every random draw in ampipe is keyed by position, never by call order, so chunking the sequence or
// splitting work over ranks cannot change it (docs/design.md, "Numerics and determinism"):
//   key     = (seed & 0xffffffff, seed >> 32)
//   counter = (feature >> 2, token, (layer << 8) | purpose, 0)
//   value   = output word (feature & 3) of philox4x32_10(counter, key)
// `token` is the global token index t = s_index * b + b_index in the [s, b] layout; `feature` is the column.
#pragma once

#include <array>
#include <cstdint>

namespace ampipe::core {

using Philox4 = std::array<uint32_t, 4>;

inline Philox4 philox4x32_10(Philox4 ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kM0) * ctr[0];
    const uint64_t p1 = uint64_t(kM1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1], uint32_t(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// What a random draw is for; part of the counter, so two purposes never share numbers.
enum class RngPurpose : uint32_t {
  attn_dropout = 1,     // dropout after the attention out-projection
  mlp_dropout = 2,      // dropout after the MoE output
  gate_jitter = 3,      // --noisy-gate-policy Jitter: multiplicative uniform noise on the gate input
  gate_rsample = 4,     // --noisy-gate-policy RSample: Gumbel noise on the logits (top-1)
  gate_rts = 5,         // random token selection priority (top-1)
  attn_prob_dropout = 6,  // --attention-dropout on the attention probabilities (token = query, feature = key)
  init = 16,            // parameter initialisation (token = parameter id, feature = element index)
  data = 17,            // input/gradient generation in layer-check (token = tensor id)
};

struct PhiloxKey {
  uint64_t seed = 0;
  uint32_t layer = 0;
  RngPurpose purpose = RngPurpose::init;
};

inline uint32_t philox_u32(const PhiloxKey& k, uint64_t token, uint64_t feature) {
  const Philox4 ctr{uint32_t(feature >> 2), uint32_t(token), (k.layer << 8) | uint32_t(k.purpose),
                    uint32_t(token >> 32)};
  return philox4x32_10(ctr, {uint32_t(k.seed), uint32_t(k.seed >> 32)})[feature & 3];
}

// Uniform in [0, 1): the top 24 bits times 2^-24 (exact in fp32).
inline float philox_uniform(const PhiloxKey& k, uint64_t token, uint64_t feature) {
  return float(philox_u32(k, token, feature) >> 8) * (1.0f / 16777216.0f);
}

// Standard normal by Box-Muller over features (2f, 2f+1): u1 = uniform(2f) mapped to (0, 1], u2 = uniform(2f+1);
// z = sqrt(-2 ln u1) cos(2 pi u2). Computed in double, returned as float.
float philox_normal(const PhiloxKey& k, uint64_t token, uint64_t feature);

}  // namespace ampipe::core
