#include "ampipe/train/grad_layout.h"

#include <algorithm>

#include "ampipe/core/error.h"

namespace ampipe::train {

int64_t GradRun::shard_size() const { return sharded ? (padded_end - begin) / group_size : 0; }

GradLayout::GradLayout(const std::vector<NamedParam>& params, const std::vector<int>& layer_of, int dense_group_size,
                       int dense_group_rank, int expert_group_size, int expert_group_rank, bool shard) {
  AMPIPE_CHECK(layer_of.size() == params.size(), "grad layout: {} layers for {} parameters", layer_of.size(),
               params.size());
  dense_sharded_ = shard && dense_group_size > 1;
  expert_sharded_ = shard && expert_group_size > 1;
  offset_.assign(params.size(), 0);
  // Runs: consecutive parameters of one buffer and one layer, in parameter order.
  std::vector<size_t> run_of(params.size(), 0);
  GradRun* open[2] = {nullptr, nullptr};
  auto close = [&](bool expert) {
    GradRun* r = open[expert];
    if (!r) return;
    const int64_t len = r->end - r->begin, D = r->group_size;
    r->padded_end = r->sharded ? r->begin + (len + D - 1) / D * D : r->end;
    (expert ? expert_n_ : dense_n_) = r->padded_end;
    if (r->sharded) {
      int64_t& sn = expert ? expert_shard_n_ : dense_shard_n_;
      r->shard_begin = sn;
      sn += r->shard_size();
    }
    open[expert] = nullptr;
  };
  runs_.reserve(params.size());  // at most one run per parameter: `open` pointers stay valid
  for (size_t i = 0; i < params.size(); ++i) {
    const bool e = params[i].expert;
    if (open[e] && open[e]->layer != layer_of[i]) close(e);
    if (!open[e]) {
      GradRun r;
      r.layer = layer_of[i];
      r.expert = e;
      r.begin = r.end = e ? expert_n_ : dense_n_;
      r.group_size = e ? expert_group_size : dense_group_size;
      r.group_rank = e ? expert_group_rank : dense_group_rank;
      r.sharded = e ? expert_sharded_ : dense_sharded_;
      runs_.push_back(r);
      open[e] = &runs_.back();
    }
    offset_[i] = open[e]->end;
    open[e]->end += params[i].grad.numel();
    run_of[i] = size_t(open[e] - runs_.data());  // not the last run pushed: the other buffer's may be newer
  }
  close(false);
  close(true);
  for (size_t i = 0; i < params.size(); ++i) {
    const GradRun& r = runs_[run_of[i]];
    const int64_t n = params[i].grad.numel();
    if (!r.sharded) {
      pieces_.push_back({{i, 0, n}, r.expert, -1});
      continue;
    }
    const int64_t lo = std::max(offset_[i], r.owned_begin()), hi = std::min(offset_[i] + n, r.owned_end());
    if (lo < hi) pieces_.push_back({{i, lo - offset_[i], hi - offset_[i]}, r.expert, r.shard_begin + lo - r.owned_begin()});
  }
}

std::vector<AdamWSegment> GradLayout::segments() const {
  std::vector<AdamWSegment> s;
  for (const GradPiece& p : pieces_) s.push_back(p.seg);
  return s;
}

int64_t GradLayout::owned_elements() const {
  int64_t n = 0;
  for (const GradPiece& p : pieces_) n += p.seg.end - p.seg.begin;
  return n;
}

}  // namespace ampipe::train
