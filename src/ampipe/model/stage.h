// The stages of one block (MoE, or dense) (docs/layer.md): what a schedule::Plan task runs, named once here so that the Plan,
// the executor, the trace and the tests use the same names. A stage runs forward or backward (Dir); the backward of
// a stage is the same Stage with Dir::bwd. Which stages move bytes between ranks, on which lane, is the Plan's
// business (schedule/plan.h holds the stage-to-lane table); the block code only computes.
#pragma once

#include <cstdint>

namespace ampipe::model {

enum class Dir : uint8_t { fwd, bwd };

enum class Stage : uint8_t {
  // attention block (model/attention_block.h)
  ln1_qkv,       // LN1 and the QKV projection of the chunk's rows
  attention,     // the chunk's query rows against the keys and values of rows [0, (c+1)*s/M)
  out_proj,      // attention output projection
  residual_ln2,  // dropout + residual add, then LN2
  attention_wgrad,  // backward only: the QKV and out-projection weight gradients over every chunk's rows at once
  // MoE block (model/moe_block.h)
  gate,          // router; with a fixed capacity also the slots and the dispatch layout [E, C_c, h]
  capacity,      // collective: --moe-no-drop with ep > 1, all-gather of each EP rank's required capacity
  gate_assign,   // --moe-no-drop with ep > 1: slots for the agreed (largest) capacity, dispatch layout
  dispatch,      // collective: all-to-all of the capacity slots to the experts' owners
  experts,       // local experts on the received slots
  expert_wgrad,  // backward only: the expert weight gradients over every chunk's slots at once (fixed capacity)
  combine,       // collective: all-to-all of the expert outputs back to the tokens' owners
  weighted_sum,  // sum of the token's expert outputs times its gate weights, then dropout + residual add
  aux_loss,      // load-balancing loss from the gate statistics summed over the chunks
  // tensor parallelism (tp > 1): LN1 and the QKV projection as two stages, with the tp collective between them,
  // and the collectives of Megatron's column- and row-parallel linears (forward and backward are adjoints:
  // all-gather <-> reduce-scatter, all-reduce <-> nothing)
  ln1,            // LN1 of the chunk's residual-stream rows
  qkv,            // the QKV projection of the chunk's rows, local heads
  tp_qkv_in,      // collective: fwd, sequence parallel: all-gather of the chunk's LN1 rows; bwd: reduce-scatter
                  // (sequence parallel) or all-reduce of the QKV input gradient
  tp_proj_out,    // collective: fwd: reduce-scatter (sequence parallel) or all-reduce of the out-projection's
                  // partial sums; bwd, sequence parallel: all-gather of its output gradient
  tp_aux_stats,   // collective, sequence parallel: all-reduce of the gate statistics over the tp ranks' rows
  tp_expert_in,   // collective: fwd, sequence parallel: all-gather of the received slots; bwd: reduce-scatter
                  // (sequence parallel) or all-reduce of the experts' input gradient
  tp_expert_out,  // collective: fwd: reduce-scatter (sequence parallel) or all-reduce of the experts' partial
                  // outputs; bwd, sequence parallel: all-gather of their gradient
  // context parallelism (cp > 1, model/context_parallel.h): attention runs per (chunk, ring slot) piece
  cp_ring,        // collective, one ring step (piece t): fwd: K, V of slot t-1 to the next cp rank, slot t from the
                  // previous; bwd: the dK, dV partial sums of slot t, one hop towards their owner
  cp_dkv_reduce,  // backward only: piece t < C: a received partial sum added to slot t before it travels on;
                  // piece 0: the last one added to this rank's own dK, dV, unpacked into the QKV gradient
  cp_aux_stats,   // collective: all-reduce of the gate statistics over the cp ranks' rows
  // selective recomputation (LayerConfig::recompute_attention)
  attention_recompute,  // backward only: the chunk's attention forward again (output, lse; bf16: its bf16 copy)
  // the block's dense MLP (model/mlp_block.h): a dense layer's FFN, or the shared expert beside the routed ones
  mlp,            // fc1 -> GeLU (or SwiGLU) -> fc2 on every row of the chunk's LN2 output (tp: the local F columns)
  mlp_wgrad,      // backward only: the MLP's weight gradients over every chunk's rows at once
  tp_mlp_in,      // collective: fwd, sequence parallel: all-gather of the chunk's LN2 rows; bwd: reduce-scatter
                  // (sequence parallel) or all-reduce of the MLP's input gradient
  tp_mlp_out,     // collective: fwd: reduce-scatter (sequence parallel) or all-reduce of the MLP's partial sums;
                  // bwd, sequence parallel: all-gather of its output gradient
  tp_capacity,    // collective: a dropless router with sequence parallelism (every tp rank routes its own rows), the
                  // all-gather over tp of the EP ranks' required capacities (so the largest is agreed over EP x TP)
};
inline constexpr int kNumStages = int(Stage::tp_capacity) + 1;

constexpr const char* stage_name(Stage s) {
  switch (s) {
    case Stage::ln1_qkv: return "ln1_qkv";
    case Stage::attention: return "attention";
    case Stage::out_proj: return "out_proj";
    case Stage::residual_ln2: return "residual_ln2";
    case Stage::attention_wgrad: return "attention_wgrad";
    case Stage::gate: return "gate";
    case Stage::capacity: return "capacity";
    case Stage::gate_assign: return "gate_assign";
    case Stage::dispatch: return "dispatch";
    case Stage::experts: return "experts";
    case Stage::expert_wgrad: return "expert_wgrad";
    case Stage::combine: return "combine";
    case Stage::weighted_sum: return "weighted_sum";
    case Stage::aux_loss: return "aux_loss";
    case Stage::ln1: return "ln1";
    case Stage::qkv: return "qkv";
    case Stage::tp_qkv_in: return "tp_qkv_in";
    case Stage::tp_proj_out: return "tp_proj_out";
    case Stage::tp_aux_stats: return "tp_aux_stats";
    case Stage::tp_expert_in: return "tp_expert_in";
    case Stage::tp_expert_out: return "tp_expert_out";
    case Stage::cp_ring: return "cp_ring";
    case Stage::cp_dkv_reduce: return "cp_dkv_reduce";
    case Stage::cp_aux_stats: return "cp_aux_stats";
    case Stage::attention_recompute: return "attention_recompute";
    case Stage::mlp: return "mlp";
    case Stage::mlp_wgrad: return "mlp_wgrad";
    case Stage::tp_mlp_in: return "tp_mlp_in";
    case Stage::tp_mlp_out: return "tp_mlp_out";
    case Stage::tp_capacity: return "tp_capacity";
  }
  return "?";
}
constexpr const char* dir_name(Dir d) { return d == Dir::fwd ? "fwd" : "bwd"; }

}  // namespace ampipe::model
