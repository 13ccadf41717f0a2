// Global token indices of a run of chunk-local tokens. Random numbers (dropout, gate noise, random token selection)
// are keyed by a token's global index t = position * b + batch index in the natural [s, b] order, so they do not
// depend on how the sequence is chunked or spread over ranks. A chunk's local tokens are one contiguous run of
// global tokens, or, with context parallelism (model/context_parallel.h), two: its sub-block of the rank's early
// half and of its late half.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace ampipe::model {

struct TokenMap {
  struct Span {
    int64_t count = INT64_MAX;  // local tokens in this span
    uint64_t token0 = 0;        // global index of its first token
  };
  std::array<Span, 2> spans{};
  int n = 1;

  TokenMap() = default;
  // One contiguous run starting at global token token0 (implicit: the common case).
  TokenMap(uint64_t token0) { spans[0].token0 = token0; }  // NOLINT(google-explicit-constructor)
  TokenMap(Span a, Span b) : spans{a, b}, n(2) {}

  // Calls f(first, count, token0) for each run of local tokens [first, first + count) of the first `tokens` ones
  // that is contiguous in the global order, starting at global token token0 (one or two calls).
  template <typename F>
  void for_each_run(int64_t tokens, F&& f) const {
    const int64_t head = n == 2 ? std::min(tokens, spans[0].count) : tokens;
    f(int64_t(0), head, spans[0].token0);
    if (head < tokens) f(head, tokens - head, spans[1].token0);
  }
  // Global index of local token t.
  uint64_t at(int64_t t) const {
    if (n == 2 && t >= spans[0].count) return spans[1].token0 + uint64_t(t - spans[0].count);
    return spans[0].token0 + uint64_t(t);
  }
};

}  // namespace ampipe::model
