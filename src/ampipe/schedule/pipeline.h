// Pipeline parallelism's schedule (docs/training.md, "Pipeline parallelism"; docs/plan.md §9): Megatron's 1F1B order
// of one stage's micro-batches, and the timeline of every stage running it, from shapes and durations alone (no MPI).
// The step Plan (step_plan.h) is built in this order; `ampipe plan --step` draws the timeline.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ampipe::schedule {

// Stage p of P over K micro-batches, as (micro-batch, forward?) pairs: min(P - 1 - p, K) warm-up forwards, then one
// forward and one backward alternately, then the remaining backwards. P = 1: F0 B0 F1 B1 ...
std::vector<std::pair<int, bool>> one_f_one_b(int micro_batches, int pp_size, int pp_rank);

// One forward or backward of a micro-batch on a stage, placed in time.
struct PipelineSlot {
  int stage = 0, micro_batch = 0;
  bool forward = true;
  double start = 0, end = 0;
};

// Every stage running its 1F1B order: F(p, m) starts once F(p - 1, m) is done and its activation sent (`send`),
// B(p, m) once B(p + 1, m) is done and sent (the last stage: once its F(p, m) is done), each stage one at a time.
// fwd[p], bwd[p]: stage p's forward and backward time of one micro-batch. Slots in start order per stage.
std::vector<PipelineSlot> pipeline_timeline(int micro_batches, const std::vector<double>& fwd,
                                            const std::vector<double>& bwd, double send = 0);
// The idle share of the stages' time up to the last slot's end: 1 - busy / (P x makespan). With equal stages and no
// send time it is (P - 1) / (K + P - 1).
double pipeline_bubble(const std::vector<PipelineSlot>& timeline, int pp_size);
// The timeline as text, one row per stage, `cell` time units per character column: "F3" for a forward of
// micro-batch 3, "B3" a backward, "." idle (micro-batches beyond 9 print their last digit).
std::string draw_pipeline(const std::vector<PipelineSlot>& timeline, int pp_size, double cell);

}  // namespace ampipe::schedule
