#include "ampipe/schedule/pipeline.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "ampipe/core/error.h"

namespace ampipe::schedule {

std::vector<std::pair<int, bool>> one_f_one_b(int K, int P, int p) {
  AMPIPE_CHECK(K >= 1 && P >= 1 && p >= 0 && p < P, "1F1B of {} micro-batches, stage {} of {}", K, p, P);
  const int warm = std::min(P - 1 - p, K);
  std::vector<std::pair<int, bool>> order;
  for (int m = 0; m < warm; ++m) order.push_back({m, true});
  for (int m = 0; m + warm < K; ++m) {
    order.push_back({m + warm, true});
    order.push_back({m, false});
  }
  for (int m = K - warm; m < K; ++m) order.push_back({m, false});
  return order;
}

std::vector<PipelineStep> pipeline_order(int K, int P, int p, int v, int group) {
  AMPIPE_CHECK(v >= 1, "pipeline order of {} chunks", v);
  std::vector<PipelineStep> order;
  if (v == 1) {
    for (const auto& [m, f] : one_f_one_b(K, P, p)) order.push_back({m, 0, f});
    return order;
  }
  AMPIPE_CHECK(K >= 1 && P >= 1 && p >= 0 && p < P, "interleaved order of {} micro-batches, stage {} of {}", K, p, P);
  const int N = group > 0 ? group : P;
  // Megatron's schedule table: virtual micro-batch k -> (micro-batch, chunk)
  std::vector<std::pair<int, int>> table;
  for (int lo = 0; lo < K; lo += N) {
    const int hi = lo + N >= K ? K : lo + N;
    for (int c = 0; c < v; ++c)
      for (int m = lo; m < hi; ++m) table.push_back({m, c});
  }
  const int total = K * v;
  const int warm = std::min(2 * (P - 1 - p) + (v - 1) * N, total);
  auto fwd = [&](int k) { return PipelineStep{table[size_t(k)].first, table[size_t(k)].second, true}; };
  auto bwd = [&](int k) { return PipelineStep{table[size_t(k)].first, v - 1 - table[size_t(k)].second, false}; };
  for (int k = 0; k < warm; ++k) order.push_back(fwd(k));
  for (int k = 0; k + warm < total; ++k) {
    order.push_back(fwd(k + warm));
    order.push_back(bwd(k));
  }
  for (int k = total - warm; k < total; ++k) order.push_back(bwd(k));
  return order;
}

int max_in_flight(const std::vector<PipelineStep>& order) {
  std::map<int, int> now;  // chunk -> micro-batches in flight
  int most = 0;
  for (const PipelineStep& s : order) {
    int& n = now[s.chunk];
    n += s.forward ? 1 : -1;
    most = std::max(most, n);
  }
  return most;
}

std::vector<PipelineSlot> pipeline_timeline(int K, const std::vector<double>& fwd, const std::vector<double>& bwd,
                                            double send, int v, int group) {
  const int P = int(fwd.size());
  AMPIPE_CHECK(P >= 1 && bwd.size() == fwd.size(), "pipeline timeline of {} forward and {} backward times", P,
               bwd.size());
  std::vector<std::vector<PipelineStep>> order;
  for (int p = 0; p < P; ++p) order.push_back(pipeline_order(K, P, p, v, group));
  using Key = std::tuple<int, int, int, bool>;  // (stage, micro-batch, chunk, forward?)
  std::map<Key, double> done;                   // -> end
  // what a slot waits for: the step before it in its micro-batch's path (none: the first virtual stage's forward)
  auto before = [&](int p, const PipelineStep& s) -> std::optional<Key> {
    const int m = s.micro_batch, c = s.chunk;
    if (s.forward) {
      if (p > 0) return Key{p - 1, m, c, true};
      if (c > 0) return Key{P - 1, m, c - 1, true};
      return std::nullopt;
    }
    if (p < P - 1) return Key{p + 1, m, c, false};
    if (c < v - 1) return Key{0, m, c + 1, false};
    return Key{p, m, c, true};
  };
  std::vector<size_t> next(size_t(P), 0);
  std::vector<double> free_at(size_t(P), 0);
  std::vector<PipelineSlot> out;
  for (bool progress = true; progress;) {
    progress = false;
    for (int p = 0; p < P; ++p) {
      while (next[size_t(p)] < order[size_t(p)].size()) {
        const PipelineStep st = order[size_t(p)][next[size_t(p)]];
        double ready = 0;
        if (const std::optional<Key> dep = before(p, st)) {
          const auto it = done.find(*dep);
          if (it == done.end()) break;
          ready = it->second + (std::get<0>(*dep) == p ? 0 : send);
        }
        PipelineSlot s{p, st.micro_batch, st.chunk, st.forward, std::max(ready, free_at[size_t(p)]), 0};
        s.end = s.start + (st.forward ? fwd[size_t(p)] : bwd[size_t(p)]) / double(v);
        free_at[size_t(p)] = s.end;
        done[{p, st.micro_batch, st.chunk, st.forward}] = s.end;
        out.push_back(s);
        ++next[size_t(p)];
        progress = true;
      }
    }
  }
  for (int p = 0; p < P; ++p)
    AMPIPE_CHECK(next[size_t(p)] == order[size_t(p)].size(), "pipeline timeline: stage {} is stuck", p);
  std::stable_sort(out.begin(), out.end(), [](const PipelineSlot& a, const PipelineSlot& b) {
    return a.stage != b.stage ? a.stage < b.stage : a.start < b.start;
  });
  return out;
}

double pipeline_bubble(const std::vector<PipelineSlot>& t, int P) {
  double busy = 0, end = 0;
  for (const PipelineSlot& s : t) {
    busy += s.end - s.start;
    end = std::max(end, s.end);
  }
  return end > 0 ? 1.0 - busy / (double(P) * end) : 0.0;
}

std::string draw_pipeline(const std::vector<PipelineSlot>& t, int P, double cell) {
  AMPIPE_CHECK(cell > 0, "draw_pipeline: cell {}", cell);
  double end = 0;
  int chunks = 1;
  for (const PipelineSlot& s : t) {
    end = std::max(end, s.end);
    chunks = std::max(chunks, s.chunk + 1);
  }
  const size_t cols = size_t(end / cell + 0.5);
  std::string out;
  for (int p = 0; p < P; ++p) {
    std::vector<std::string> row(cols, chunks > 1 ? "  ." : " .");
    for (const PipelineSlot& s : t) {
      if (s.stage != p) continue;
      std::string mark = fmt::format("{}{}", s.forward ? 'F' : 'B', s.micro_batch % 10);
      if (chunks > 1) mark += char('a' + s.chunk % 26);
      for (size_t c = size_t(s.start / cell + 0.5); c < size_t(s.end / cell + 0.5) && c < cols; ++c) row[c] = mark;
    }
    out += fmt::format("  stage {:>2} |", p);
    for (const std::string& c : row) out += c;
    out += "\n";
  }
  return out;
}

}  // namespace ampipe::schedule
