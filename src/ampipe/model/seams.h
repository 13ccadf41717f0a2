// Where compute meets communication (docs/plan.md, "Seams"). Each collective of a layer step moves one buffer that
// the compute stage before it wrote (`send`) into one that the stage after it reads (`recv`). Which buffers those
// are depends on the layout (bf16 staging copies, sequence parallelism's local rows, the pieces of pipe-experts),
// and it is chosen here, once: the Plan's collectives (schedule/comm_stage) move exactly these buffers, and the
// blocks write and read exactly these.
#pragma once

#include "ampipe/model/buffers.h"
#include "ampipe/model/layer_dims.h"

namespace ampipe::model {

struct Seam {
  Buf send{}, recv{};
};

struct Seams {
  // forward
  Seam qkv_in;       // sequence parallel: the chunk's LN1 rows, all-gathered to every row (QKV's input)
  Seam proj_out;     // tp: the out-projection's partial sums, reduced (sequence parallel: to this rank's rows)
  Seam mlp_in;       // sequence parallel: the chunk's LN2 rows, all-gathered (the dense MLP's input)
  Seam mlp_out;      // tp: the dense MLP's partial sums, reduced
  Seam capacity;     // dropless, ep > 1: this rank's required capacity, all-gathered over EP
  Seam capacity_tp;  // dropless with sequence parallelism: those (or this rank's own) all-gathered over tp
  Seam gate_stats;   // sequence or context parallel: the gate statistics, all-reduced in place
  Seam dispatch;     // the capacity slots, to the experts' owners
  Seam expert_in;    // sequence parallel: the received slots, all-gathered over tp
  Seam expert_out;   // tp: the experts' partial outputs, reduced
  Seam combine;      // the expert outputs, back to their tokens' owners
  Seam kv;           // context parallel: a K, V ring slot to the next cp rank
  // backward (the reverse of the forward's; an all-gather's adjoint reduces, and the reverse)
  Seam d_qkv_in, d_proj_out, d_mlp_in, d_mlp_out, d_dispatch, d_expert_in, d_expert_out, d_combine;
  Seam dkv;  // context parallel: the dK, dV partial sums of a ring slot, one hop on

  static Seams make(const LayerDims& d);
};

}  // namespace ampipe::model
