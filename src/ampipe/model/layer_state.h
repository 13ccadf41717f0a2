// What the stages of one layer share: the config and dims, the parameters and their gradients, the weights in the
// compute dtype, the layer's view of the planned memory, and the step's inputs (x, dy). The blocks
// (attention_block.h, moe_block.h) read and write only through it; model/layer.h owns it.
#pragma once

#include <cstdint>
#include <vector>

#include "ampipe/core/tensor.h"
#include "ampipe/kernels/context.h"
#include "ampipe/model/buffers.h"
#include "ampipe/model/context_parallel.h"
#include "ampipe/model/layer_config.h"
#include "ampipe/model/layer_dims.h"
#include "ampipe/model/layer_params.h"
#include "ampipe/model/seams.h"

namespace ampipe::model {

// The GEMM weights in the compute dtype: views of the fp32 parameters, or bf16 copies refreshed once per optimizer
// step (Layer::weights_changed), never per layer step. Expert weights are flattened to one row block per expert.
// Owned next to the parameters (schedule::LayerStack), so re-planning a layer for another degree keeps them.
struct ComputeWeights {  // this tp rank's shards (tp = 1: the whole tensors)
  Tensor qkv;   // [3h/t, h]: the q, k, v rows of the local heads
  Tensor proj;  // [h, h/t]: the local heads' columns
  Tensor fc1;   // [L*F1/t, h]
  Tensor fc2;   // [L*h, F/t]
  Tensor mlp_fc1;  // [F1_m/t, h]: the dense MLP
  Tensor mlp_fc2;  // [h, F_m/t]
  bool stale = true;  // bf16: the copies no longer match the parameters
};

// One layer's buffers: its saved region and the stack's shared region of one Arena (buffers.h).
class LayerMemory {
 public:
  LayerMemory(const LayerDims& dims, const BufferLayout& layout, Arena& arena, size_t saved_base, size_t shared_base);
  // Buffer `b` for chunk c: slot c of a per-chunk buffer (the only slot otherwise), shaped for chunk c's capacity
  // (c = -1: the planned capacity). No allocation; a view into the arena.
  Tensor get(Buf b, int c = -1) const;
  // Piece p's rows [row0, row0 + ep*experts*slots) of chunk c's slot of a piece-major buffer, as [rows, h]
  // (p = -1: the whole slot, as get(b, c)).
  Tensor get(Buf b, int c, int p) const;
  // Local expert l's slots of chunk c ([ep*C_c, *] rows) in an expert-major buffer [L, M*ep*C, *] (buffers.h).
  Tensor expert_rows(Buf b, int64_t l, int c) const;
  // Local expert l's slots of every chunk ([M*ep*C, *] rows; all chunks use the planned capacity).
  Tensor expert_rows_all(Buf b, int64_t l) const;
  // What a collective of chunk c (piece p) reads or writes: the chunk's slot (or piece) of a per-chunk buffer,
  // chunk c's rows [c*n/M, (c+1)*n/M) of a row buffer ([T, *], [Tl, *], [s, b, h]), or a one-slot staging
  // buffer whole.
  Tensor collective_view(Buf b, int c, int p) const;
  void set_capacity(int c, int64_t C);
  int64_t capacity(int c) const { return C_[size_t(c)]; }
  // The buffers at the seams with communication (seams.h): a block writes a collective's send buffer and reads its
  // receive buffer from here, never choosing them itself.
  const Seams& seams() const { return seams_; }
  // The stage input/output check (stage_io.h, on when AMPIPE_CHECK_STAGE_IO=1, as in the tests): while stage s runs
  // in direction d, taking a buffer that is not in its table stops with the stage and the buffer named.
  void enter_stage(Stage s, Dir d);
  void leave_stage() { in_stage_ = false; }

 private:
  const LayerDims* dims_;
  const BufferLayout* layout_;
  Arena* arena_;
  size_t saved_base_, shared_base_;
  std::vector<int64_t> C_;  // run-time capacity per chunk
  Seams seams_;
  bool check_io_ = false, in_stage_ = false;
  Stage stage_{};
  Dir dir_{};
  std::vector<bool> allowed_;  // [Buf] while in_stage_
  void check_access(Buf b) const;
};

struct LayerState {
  LayerConfig cfg;
  LayerDims dims;
  LayerParams& p;
  LayerParams& g;
  ComputeWeights& w;
  LayerMemory mem;
  int ep_rank = 0;
  int tp_rank = 0;
  int cp_rank = 0;
  uint64_t token_base = 0;  // global index of the micro-batch's token 0 (keys dropout and gate noise)
  Tensor x;                 // [Tl, h] the layer input (the caller keeps it alive until the backward ends)
  Tensor dy;                // [Tl, h] gradient of the output, during the backward
  float d_aux = 0;          // upstream gradient of the aux loss (its coefficient)
  kernels::ComputeContext* ctx = nullptr;  // the compute lane's context (kernels/context.h), the stack's
  bool recomputing = false; // the forward re-runs to refill what the backward reads (full recomputation): the
                            // layer's output is kept from the first run, so the stages skip work only it needs

  bool bf16() const { return dims.cd != DType::f32; }
  // Rows of chunk c of a residual-stream tensor [Tl, *]: this rank's Scl rows of the chunk (with sequence
  // parallelism tokens [c*S_c + r*Scl, c*S_c + (r+1)*Scl) of tp rank r; else tokens [c*S_c, (c+1)*S_c), contiguous
  // in the [s, b, h] layout).
  Tensor rows(const Tensor& t, int c) const { return t.rows(int64_t(c) * dims.Scl, int64_t(c + 1) * dims.Scl); }
  Tensor rows(Buf b, int c) const { return rows(mem.get(b), c); }
  // Rows of chunk c of an attention-core tensor [T, *]: every row of the chunk.
  Tensor full_rows(const Tensor& t, int c) const { return t.rows(int64_t(c) * dims.Sc, int64_t(c + 1) * dims.Sc); }
  Tensor full_rows(Buf b, int c) const { return full_rows(mem.get(b), c); }
  // Context parallelism: this rank's rows of the sequence (context_parallel.h).
  CpLayout cp_layout() const { return CpLayout::make(dims.s_global, int(dims.cp), cp_rank, dims.M); }
  // Global indices of this rank's residual-stream tokens of chunk c (key the random numbers of those rows): one run
  // starting at the chunk's first token (with sequence parallelism this tp rank's sub-block), or with context
  // parallelism the chunk's runs in the early and the late half.
  TokenMap chunk_tokens(int c) const {
    const uint64_t local0 = uint64_t(c) * uint64_t(dims.Sc) + (dims.sp ? uint64_t(tp_rank) * uint64_t(dims.Scl) : 0);
    if (dims.cp == 1) return TokenMap(token_base + local0);
    return cp_layout().tokens(int64_t(local0) / dims.b, dims.Scl / dims.b, dims.b, token_base);
  }
};

}  // namespace ampipe::model
