// Pipeline parallelism's schedule (docs/training.md, "Pipeline parallelism"; docs/plan.md §9): Megatron's 1F1B order
// of one stage's micro-batches and its interleaved order over virtual stages (model chunks), and the timeline of every
// stage running it, from shapes and durations alone (no MPI). The step Plan (step_plan.h) is built in this order;
// `ampipe plan --step` draws the timeline.
//
// Virtual stages (v model chunks per rank, --num-layers-per-virtual-pipeline-stage): the model's P v virtual stages
// are spread round-robin, rank p holding virtual stages p, P + p, ..., (v - 1) P + p as its chunks 0 .. v-1. A
// micro-batch's forward runs chunk 0 on ranks 0 .. P-1, then chunk 1 on ranks 0 .. P-1 (rank P-1 sends to rank 0),
// and so on; its backward the reverse.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ampipe::schedule {

// Stage p of P over K micro-batches, as (micro-batch, forward?) pairs: min(P - 1 - p, K) warm-up forwards, then one
// forward and one backward alternately, then the remaining backwards. P = 1: F0 B0 F1 B1 ...
std::vector<std::pair<int, bool>> one_f_one_b(int micro_batches, int pp_size, int pp_rank);

// One forward or backward of a micro-batch's model chunk on a stage.
struct PipelineStep {
  int micro_batch = 0, chunk = 0;
  bool forward = true;
  bool operator==(const PipelineStep&) const = default;
};
// Stage p's order over K micro-batches and v chunks. v = 1: one_f_one_b. v > 1: Megatron's interleaved schedule
// (forward_backward_pipelining_with_interleaving): the forwards in the order of its schedule table (groups of
// `group` micro-batches, default P: every chunk of a group before the next group; the last group takes the rest),
// the backwards in the same order with the chunks reversed; min(2 (P - 1 - p) + (v - 1) group, K v) warm-up
// forwards, then one forward and one backward alternately, then the remaining backwards. Megatron's rules on K and
// group are the caller's (TrainConfig::validate_pipeline).
std::vector<PipelineStep> pipeline_order(int micro_batches, int pp_size, int pp_rank, int chunks = 1, int group = 0);
// The most micro-batches of one chunk that have run their forward and not yet their backward at any point of
// `order` (each needs its own copy of the chunk's saved activations).
int max_in_flight(const std::vector<PipelineStep>& order);

// One forward or backward of a micro-batch on a stage, placed in time.
struct PipelineSlot {
  int stage = 0, micro_batch = 0, chunk = 0;
  bool forward = true;
  double start = 0, end = 0;
};

// Every stage running its order (pipeline_order): F(p, m, c) starts once the forward before it in the micro-batch's
// path is done and its activation sent (`send`): F(p - 1, m, c), or for p = 0 F(P - 1, m, c - 1); B(p, m, c) once
// B(p + 1, m, c) is done and sent, or for p = P - 1 B(0, m, c + 1), and the last virtual stage once its own forward
// is done; each stage one at a time. fwd[p], bwd[p]: stage p's forward and backward time of one micro-batch (all its
// chunks; a chunk takes 1/v of it). Slots in start order per stage.
std::vector<PipelineSlot> pipeline_timeline(int micro_batches, const std::vector<double>& fwd,
                                            const std::vector<double>& bwd, double send = 0, int chunks = 1,
                                            int group = 0);
// The idle share of the stages' time up to the last slot's end: 1 - busy / (P x makespan). With equal stages and no
// send time it is (P - 1) / (K + P - 1).
double pipeline_bubble(const std::vector<PipelineSlot>& timeline, int pp_size);
// The timeline as text, one row per stage, `cell` time units per character column: "F3" for a forward of
// micro-batch 3, "B3" a backward, "." idle (micro-batches beyond 9 print their last digit); with chunks, the chunk's
// letter follows ("F3a" chunk 0, "F3b" chunk 1, ...).
std::string draw_pipeline(const std::vector<PipelineSlot>& timeline, int pp_size, double cell);

}  // namespace ampipe::schedule
