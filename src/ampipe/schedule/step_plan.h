// The step Plan: one whole training iteration as data (docs/plan.md, "The step Plan"). Where a layer Plan
// (schedule/plan.h) orders the tasks of one layer, the step Plan orders what a training iteration does around and
// between them: every micro-batch's embedding, layers (each a layer Plan run in one direction; a recomputed layer's
// forward replayed right before its backward), LM head and loss, the sequence-parallel all-gathers, the
// data-parallel gradient reduction bucket by bucket where the trainer issues it, and the optimizer step. The trainer
// (train/) runs it task by task, schedule::LayerStack runs the layer tasks of it (layer-check, bench-layer and the
// tests run a layers-only step Plan), the simulator (sim/) costs exactly it, and `ampipe plan --step` prints it.
// Like the layer Plan, it is built from shapes and flags alone: no MPI, no parameters, no clocks.
//
// Order (K micro-batches m, num_layers layers i, as the engine runs them):
//   for m:  embedding.fwd(m) -> L0.fwd .. L{n-1}.fwd -> [sp_gather.fwd] -> head.fwd(m) -> head.bwd(m)
//           -> for i = n-1 .. 0: [L{i}.recompute] -> L{i}.bwd -> (m = K-1: grad_pack + grad_reduce of layer i's
//              dense and expert buckets, issued on the dp lane: they run under the backward of layers i-1 .. 0)
//           -> [sp_gather.bwd] -> embedding.bwd(m)
//   grad_pack + grad_reduce of the parameters outside the layers (embedding, final LayerNorm, LM head)
//   grad_finish (waits for every reduction; scale, sums over tp, sums of squares, loss all-reduce) -> optimizer
//   distributed optimizer: the buckets' reductions are reduce-scatters, and after the optimizer (its shard only)
//   param_gather of every bucket (in the order of the reductions) -> param_unpack
//   with --overlap-param-gather (Megatron's: the gathers under the next forward), the layers' param_gather tasks
//   come first in the step (the previous step's update), a param_unpack of layer i (its parameters copied out)
//   right before L{i}'s first forward, and only the outer bucket's gather and unpack after the optimizer
// A reduction over a one-rank group is left out (nothing to reduce).
//
// Pipeline parallelism (pp_size P > 1; docs/training.md, "Pipeline parallelism"): this rank's stage runs its layers
// only (the first stage the embedding, the last the head and loss), the micro-batches in Megatron's 1F1B order
// (schedule/pipeline.h):
// min(P - 1 - stage, K) warm-up forwards, then one forward and one backward alternately, then the remaining
// backwards. A forward of a stage after the first starts with pp_wait.fwd (its activation, received by pp_recv.fwd
// on the pp_fwd lane, becomes the layers' input) and every stage but the last ends it with pp_send.fwd; a backward of
// a stage before the last starts with pp_wait.bwd (the gradient of its output, from pp_recv.bwd on the pp_bwd lane)
// and every stage but the first ends it with pp_send.bwd. Each receive is posted one micro-batch ahead (the first at
// the start of the step, the next one as the current one is taken), so a send never waits on its receiver's compute.
// The layers keep one copy of their saved activations per micro-batch in flight (LayerStack::set_slots). With tied
// embeddings the last stage's LM-head gradient goes to the first stage (tied_grad, before the first stage's outer
// bucket) and the updated embedding comes back (tied_param, after the optimizer).
//
// Virtual stages (v model chunks per rank, Megatron's interleaved schedule; schedule::pipeline_order): the stage's
// layers are v chunks of layers / v each (chunk c: layers [c n, (c + 1) n)), and every forward and backward above is
// one chunk's (the task's `chunk`): the first rank's chunk 0 starts from the embedding, the last rank's chunk v - 1
// ends with the head, every other chunk receives its input from the previous rank (the first rank: from the last, its
// chunk c - 1) and sends its output to the next (the last rank: to the first). A chunk's buckets are reduced after its
// last backward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampipe/comm/layout.h"
#include "ampipe/schedule/plan.h"

namespace ampipe::schedule {

enum class StepOp : uint8_t {
  embedding,    // fwd: the micro-batch's token (+ position) embedding; bwd: scatter-add of its gradient
  layer,        // layer `layer`'s Plan in direction `dir`
  recompute,    // layer `layer`'s forward again (the same random numbers), right before its backward
  sp_gather,    // collective, sequence parallel: fwd: the last layer's rows all-gathered over tp for the head; bwd:
                // the first layer's input-gradient rows, for the embedding
  head,         // fwd: final LayerNorm, LM head, cross-entropy (and the micro-batch's routing counts); bwd: theirs
  grad_pack,    // a bucket's gradients copied into the flat reduction buffer
  grad_reduce,  // collective: the all-reduce (sum) of one bucket over its group; with the distributed optimizer
                // its reduce-scatter (each rank keeps the sum of its shard)
  grad_finish,  // waits for the reductions; scale by 1/micro-batches, sums over tp, sums of squares, loss sums
  optimizer,    // clipping, AdamW (of this rank's shard with the distributed optimizer), the bf16 weight copies
                // refreshed (unless param_unpack follows)
  param_gather,  // distributed optimizer, collective: a bucket's updated shard packed and all-gathered over its group
  param_unpack,  // distributed optimizer: waits for the gathers, copies the parameters out, refreshes the bf16 copies
                 // (layer >= 0, --overlap-param-gather: that layer's gathers and parameters only)
  // pipeline parallelism (pp_size > 1)
  pp_recv,     // collective: post the receive of the micro-batch's activation (fwd) or output gradient (bwd)
  pp_wait,     // fwd: wait for the activation, the layers' input (the stage's "embedding"); bwd: wait for the output
               // gradient, the layers' (the stage's "head.bwd")
  pp_send,     // collective: send the stage's output (fwd) or its input gradient (bwd) to the next / previous stage
  tied_grad,   // tied embeddings: the last stage's LM-head gradient sent to the first stage and added to its own
  tied_param,  // tied embeddings: the first stage's updated word embedding sent to the last stage
};
const char* step_op_name(StepOp op);

// A gradient bucket: the parameters of one layer (layer >= 0) or those outside the layers (layer -1), dense
// (reduced over dp x cp) or expert (over the expert-data-parallel group).
enum class Bucket : uint8_t { dense, expert };
const char* bucket_name(Bucket b);

struct StepTask {
  uint32_t id = 0;
  StepOp op = StepOp::layer;
  Dir dir = Dir::fwd;
  int micro_batch = -1;  // -1: once per step
  int chunk = 0;  // virtual stages: the model chunk of a pp_recv / pp_wait / pp_send (layer tasks: their layer's)
  int layer = -1;        // layer ops; grad_pack / grad_reduce: the bucket's layer (-1: outside the layers)
  Bucket bucket = Bucket::dense;  // grad_pack / grad_reduce
  Lane lane = Lane::compute;
  std::vector<uint32_t> deps;  // step tasks that must be done first, besides the compute lane's own order
  // collectives (sp_gather, grad_reduce): kind and group; bytes: what this rank sends
  CollKind kind = CollKind::all_reduce;
  comm::GroupKind group = comm::GroupKind::dp_cp;
  // compute tasks outside the layers: GEMM FLOPs (the engine's head runs them in fp32), the smallest GEMM
  // dimension, and the bytes of the element-wise work (closed forms in docs/plan.md); layer tasks: 0 (their cost
  // is their layer Plan's tasks)
  double gemm_flops = 0, gemm_min_dim = 0;
  double bytes = 0;
  bool is_collective() const {
    return op == StepOp::sp_gather || op == StepOp::grad_reduce || op == StepOp::param_gather ||
           op == StepOp::pp_recv || op == StepOp::pp_send || op == StepOp::tied_grad || op == StepOp::tied_param;
  }
  bool is_layer() const { return op == StepOp::layer || op == StepOp::recompute; }
  // "mb0.embedding.fwd", "mb0.L1.fwd", "mb0.L1.recompute", "mb1.head.bwd", "grad_reduce.dense.L1",
  // "grad_reduce.dense.outer", "grad_finish", "optimizer", "param_gather.expert.L0", "param_unpack",
  // "mb2.pp_recv.fwd", "mb2.pp_send.bwd" ("mb2.c1.pp_send.bwd": chunk 1), "tied_grad": the one name the runners,
  // the trace and the tests use (L{i}: the stage's layer i).
  std::string name() const;
};

// What the step Plan is built from: the layers' Plans, the micro-batches, and this rank's sizes of the work
// outside the layers.
struct StepConfig {
  std::vector<Plan> layers;       // layer i's Plan (num_layers = layers.size())
  int micro_batches = 1;          // K: micro-batches of one iteration on this rank
  std::vector<bool> recompute;    // per layer (--recompute-granularity full); empty: none
  bool model = true;              // embedding, head, loss, optimizer; false: the layers alone
  // per micro-batch on this rank: tokens (T / cp), hidden size, LM-head columns (the vocabulary)
  int64_t tokens = 0, hidden = 0, head_vocab = 0;
  int sp_tp = 1;  // sequence parallel: tp (the all-gathers of sp_gather over tp ranks); 1: none
  // Gradient buckets: bytes per layer (dense, expert) and of the parameters outside the layers (dense only), and
  // the sizes of the groups they are reduced over (1: not reduced).
  std::vector<double> layer_dense_bytes, layer_expert_bytes;
  double outer_dense_bytes = 0;
  int dense_group_size = 1, expert_group_size = 1;
  double params = 0;          // parameters this rank holds (grad_finish, optimizer)
  double bf16_weights = 0;    // of which matrices with a bf16 copy refreshed after the step (0: fp32)
  // --use-distributed-optimizer: each bucket reduce-scattered over its group (when larger than one rank), AdamW on
  // this rank's shard (optimizer_params elements; 0: params), the updated shards all-gathered after the step.
  bool distributed_optimizer = false;
  double optimizer_params = 0;
  // --overlap-param-gather: the layers' buckets gathered at the start of the step (the previous step's update) and
  // each layer's unpacked before its first forward; only the outer bucket's gather follows the optimizer.
  bool overlap_param_gather = false;
  // Pipeline parallelism: P stages, this rank's stage; bytes of one micro-batch's activation between stages (its
  // gradient the same); tied embeddings: bytes of the word embedding exchanged between the first and last stage.
  int pp_size = 1, pp_rank = 0;
  double pp_bytes = 0, tied_bytes = 0;
  // Virtual stages: model chunks on this rank (the layers split evenly among them) and Megatron's micro-batch group
  // (0: pp_size).
  int chunks = 1, microbatch_group = 0;
  int chunk_of(int layer) const { return layer / (int(layers.size()) / chunks); }
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp_size - 1; }
};


struct StepPlan {
  StepConfig config;
  std::vector<StepTask> tasks;  // in issue order

  int num_layers() const { return int(config.layers.size()); }
  const Plan& layer(int i) const { return config.layers[size_t(i)]; }
  // The first task with this op, direction, micro-batch and layer; -1 if absent.
  int index_of(StepOp op, Dir d, int micro_batch, int layer) const;
  double collective_bytes(StepOp op) const;  // bytes this rank sends in collectives of this op
};

// The step Plan of c (docs/plan.md); throws ConfigError on sizes that do not fit (a bucket list of another length
// than the layers).
StepPlan build_step_plan(StepConfig c);

// The layers alone, one micro-batch (forward of every layer, then the backward in reverse with the replays): the
// step layer-check, bench-layer and schedule::LayerStack's forward / backward run.
StepPlan build_layers_step_plan(std::vector<Plan> layers, const std::vector<bool>& recompute = {});

}  // namespace ampipe::schedule
