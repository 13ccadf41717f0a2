// Where every gradient lives in the flat buffers of the data-parallel reduction, and, with the distributed optimizer
// (--use-distributed-optimizer, ZeRO-1 as Megatron's), which part of them this rank owns (docs/training.md,
// "Distributed optimizer").
//
// Two buffers: dense (the parameters every rank of the dp x cp group holds) and expert (those of the
// expert-data-parallel group). Each is a sequence of runs: the parameters of one layer (layer >= 0), or the
// embedding-level ones before and after the layers (layer -1, two runs), in the model's parameter order. A run is
// one reduction of the step Plan's bucket (schedule/step_plan.h).
//
// Sharded (the distributed optimizer on, the group larger than one rank): each run is padded with zeros to a multiple
// of the group size D, so rank r of the group owns elements [begin + r S, begin + (r + 1) S) of it, S = padded / D.
// The run's gradients are reduce-scattered into that shard, the optimizer updates those elements only (its moments
// are the shard's), and the updated parameters are all-gathered back over the run. Unsharded (off, or D = 1): the
// runs are all-reduced whole and every rank updates every parameter.
#pragma once

#include <cstdint>
#include <vector>

#include "ampipe/train/adamw.h"
#include "ampipe/train/gpt_model.h"

namespace ampipe::train {

struct GradRun {
  int layer = -1;
  bool expert = false;
  int64_t begin = 0, end = 0, padded_end = 0;  // in the buffer; padded_end - begin is a multiple of D when sharded
  int64_t shard_begin = 0;                     // sharded: where this rank's S elements sit in the shard buffer
  int64_t shard_size() const;                  // S (sharded), else 0
  int group_size = 1;                          // D
  int group_rank = 0;                          // r
  bool sharded = false;
  // This rank's elements of the run, in buffer coordinates (sharded: [begin + r S, begin + (r + 1) S); else all).
  int64_t owned_begin() const { return sharded ? begin + group_rank * shard_size() : begin; }
  int64_t owned_end() const { return sharded ? owned_begin() + shard_size() : end; }
};

// (The trainer reduce-scatters and gathers in place: a sharded piece's values live at the parameter's offset in the
// flat buffer, inside this rank's own block of the run; shard_begin and shard_at place the same values in the
// concatenation of this rank's shards, the optimizer state's order.)
// One parameter's elements that this rank's optimizer updates: [begin, end) of parameter `param`, at `shard_at` in its
// buffer's shard (sharded runs only; -1 for whole parameters of an unsharded run).
struct GradPiece {
  AdamWSegment seg;
  bool expert = false;
  int64_t shard_at = -1;
};

class GradLayout {
 public:
  GradLayout() = default;
  // layer_of: per parameter its layer (-1: outside the layers). dense/expert group: the sizes and this rank's index
  // in the dp x cp and expert-data-parallel groups. shard: --use-distributed-optimizer.
  GradLayout(const std::vector<NamedParam>& params, const std::vector<int>& layer_of, int dense_group_size,
             int dense_group_rank, int expert_group_size, int expert_group_rank, bool shard);

  int64_t offset(size_t param) const { return offset_[param]; }  // in its buffer
  int64_t buffer_size(bool expert) const { return expert ? expert_n_ : dense_n_; }
  int64_t shard_buffer_size(bool expert) const { return expert ? expert_shard_n_ : dense_shard_n_; }
  bool sharded(bool expert) const { return expert ? expert_sharded_ : dense_sharded_; }
  const std::vector<GradRun>& runs() const { return runs_; }
  // The optimizer's segments in parameter order: the owned slices of sharded runs, whole parameters of the others.
  const std::vector<GradPiece>& pieces() const { return pieces_; }
  std::vector<AdamWSegment> segments() const;
  // The parameter elements this rank's optimizer updates (its AdamW state holds two fp32 moments of each).
  int64_t owned_elements() const;

 private:
  std::vector<int64_t> offset_;
  std::vector<GradRun> runs_;
  std::vector<GradPiece> pieces_;
  int64_t dense_n_ = 0, expert_n_ = 0, dense_shard_n_ = 0, expert_shard_n_ = 0;
  bool dense_sharded_ = false, expert_sharded_ = false;
};

}  // namespace ampipe::train
