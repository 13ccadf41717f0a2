#include "ampipe/schedule/pipeline.h"

#include <algorithm>
#include <map>
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

std::vector<PipelineSlot> pipeline_timeline(int K, const std::vector<double>& fwd, const std::vector<double>& bwd,
                                            double send) {
  const int P = int(fwd.size());
  AMPIPE_CHECK(P >= 1 && bwd.size() == fwd.size(), "pipeline timeline of {} forward and {} backward times", P,
               bwd.size());
  std::vector<std::vector<std::pair<int, bool>>> order;
  for (int p = 0; p < P; ++p) order.push_back(one_f_one_b(K, P, p));
  std::map<std::tuple<int, int, bool>, double> done;  // (stage, micro-batch, forward?) -> end
  std::vector<size_t> next(size_t(P), 0);
  std::vector<double> free_at(size_t(P), 0);
  std::vector<PipelineSlot> out;
  for (bool progress = true; progress;) {
    progress = false;
    for (int p = 0; p < P; ++p) {
      while (next[size_t(p)] < order[size_t(p)].size()) {
        const auto [m, f] = order[size_t(p)][next[size_t(p)]];
        // what the slot waits for: the previous stage's forward, the next stage's backward (the last: its forward)
        const std::tuple<int, int, bool> dep = f ? std::tuple{p - 1, m, true}
                                                 : p == P - 1 ? std::tuple{p, m, true} : std::tuple{p + 1, m, false};
        double ready = 0;
        if (std::get<0>(dep) >= 0 && !(f && p == 0)) {
          const auto it = done.find(dep);
          if (it == done.end()) break;
          ready = it->second + (std::get<0>(dep) == p ? 0 : send);
        }
        PipelineSlot s{p, m, f, std::max(ready, free_at[size_t(p)]), 0};
        s.end = s.start + (f ? fwd[size_t(p)] : bwd[size_t(p)]);
        free_at[size_t(p)] = s.end;
        done[{p, m, f}] = s.end;
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
  for (const PipelineSlot& s : t) end = std::max(end, s.end);
  const size_t cols = size_t(end / cell + 0.5);
  std::string out;
  for (int p = 0; p < P; ++p) {
    std::vector<std::string> row(cols, " .");
    for (const PipelineSlot& s : t) {
      if (s.stage != p) continue;
      const std::string mark = fmt::format("{}{}", s.forward ? 'F' : 'B', s.micro_batch % 10);
      for (size_t c = size_t(s.start / cell + 0.5); c < size_t(s.end / cell + 0.5) && c < cols; ++c) row[c] = mark;
    }
    out += fmt::format("  stage {:>2} |", p);
    for (const std::string& c : row) out += c;
    out += "\n";
  }
  return out;
}

}  // namespace ampipe::schedule
