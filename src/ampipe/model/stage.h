// The compute stages of one block (MoE, or dense) (docs/layer.md): what a schedule::Plan compute task runs, named
// once here so that the Plan, the executor, the trace and the tests use the same names. A stage runs forward or
// backward (Dir); the backward of a stage is the same Stage with Dir::bwd. The collectives between them are the
// schedule's (schedule/comm_stage.h): the blocks only compute, reading and writing the buffers at their seams with
// communication (model/seams.h).
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
  // tensor parallelism (tp > 1): LN1 and the QKV projection as two stages, with the tp collective between them
  ln1,            // LN1 of the chunk's residual-stream rows
  qkv,            // the QKV projection of the chunk's rows, local heads
  // context parallelism (cp > 1, model/context_parallel.h): attention runs per (chunk, ring slot) piece
  cp_dkv_reduce,  // backward only: piece t < C: a received partial sum added to slot t before it travels on;
                  // piece 0: the last one added to this rank's own dK, dV, unpacked into the QKV gradient
  // selective recomputation (LayerConfig::recompute_attention)
  attention_recompute,  // backward only: the chunk's attention forward again (output, lse; bf16: its bf16 copy)
  // MoE block (model/moe_block.h)
  gate,          // router; with a fixed capacity also the slots and the dispatch layout [E, C_c, h]
  gate_assign,   // a dropless router's agreed capacity: slots for the largest required one, dispatch layout
  experts,       // local experts on the received slots
  expert_wgrad,  // backward only: the expert weight gradients over every chunk's slots at once (fixed capacity)
  weighted_sum,  // sum of the token's expert outputs times its gate weights, then dropout + residual add
  aux_loss,      // load-balancing loss from the gate statistics summed over the chunks
  // the block's dense MLP (model/mlp_block.h): a dense layer's FFN, or the shared expert beside the routed ones
  mlp,            // fc1 -> GeLU (or SwiGLU) -> fc2 on every row of the chunk's LN2 output (tp: the local F columns)
  mlp_wgrad,      // backward only: the MLP's weight gradients over every chunk's rows at once
};
inline constexpr int kNumStages = int(Stage::mlp_wgrad) + 1;

constexpr const char* stage_name(Stage s) {
  switch (s) {
    case Stage::ln1_qkv: return "ln1_qkv";
    case Stage::attention: return "attention";
    case Stage::out_proj: return "out_proj";
    case Stage::residual_ln2: return "residual_ln2";
    case Stage::attention_wgrad: return "attention_wgrad";
    case Stage::ln1: return "ln1";
    case Stage::qkv: return "qkv";
    case Stage::cp_dkv_reduce: return "cp_dkv_reduce";
    case Stage::attention_recompute: return "attention_recompute";
    case Stage::gate: return "gate";
    case Stage::gate_assign: return "gate_assign";
    case Stage::experts: return "experts";
    case Stage::expert_wgrad: return "expert_wgrad";
    case Stage::weighted_sum: return "weighted_sum";
    case Stage::aux_loss: return "aux_loss";
    case Stage::mlp: return "mlp";
    case Stage::mlp_wgrad: return "mlp_wgrad";
  }
  return "?";
}
constexpr const char* dir_name(Dir d) { return d == Dir::fwd ? "fwd" : "bwd"; }

}  // namespace ampipe::model
