// One block as a set of stages over planned memory: an AttentionBlock, a MoeBlock (the router, the experts and the
// weighted sum) and, in a block that has one, an MlpBlock (a shared expert, or a dense layer's FFN), sharing a LayerState. The
// layer knows nothing about the order its stages run in, or about communication: a schedule::Plan decides the
// order, and the executor calls run(stage, dir, chunk) for compute tasks and moves the bytes of collective tasks
// between the buffers a Plan names (buffer()). One Layer lives as long as its stack and is reused for every
// micro-batch and step; its memory is carved from an Arena when the plan is made (buffers.h).
#pragma once

#include <cstdint>
#include <memory>

#include "ampipe/model/attention_block.h"
#include "ampipe/model/buffers.h"
#include "ampipe/model/layer_state.h"
#include "ampipe/model/mlp_block.h"
#include "ampipe/model/moe_block.h"
#include "ampipe/model/stage.h"

namespace ampipe::model {

class Layer {
 public:
  // params: this rank's parameters (expert tensors hold the local experts, tp shards with tp > 1); grads: same
  // shapes, accumulated.
  // layout: BufferLayout::make(LayerDims::make(cfg, M)); the layer's saved region starts at saved_base of the
  // arena, the shared region at shared_base. The arena must be reserved to cover both.
  // weights: the GEMM weights in the compute dtype, kept by the owner of the parameters (refreshed here).
  // ctx: the compute context every stage's kernels run in (kernels/context.h), the owner's (it outlives the layer).
  Layer(const LayerConfig& cfg, int M, int ep_rank, int tp_rank, int cp_rank, LayerParams& params, LayerParams& grads, ComputeWeights& weights,
        const BufferLayout& layout, Arena& arena, size_t saved_base, size_t shared_base, kernels::ComputeContext& ctx);
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const LayerDims& dims() const { return st_.dims; }
  const LayerConfig& config() const { return st_.cfg; }
  void set_training(bool on);

  // The weights changed (optimizer step, load, a test's edit): bf16 copies are refreshed before the next forward.
  void weights_changed() { st_.w.stale = true; }

  // x: [s, b, h] fp32 (sequence parallel: this rank's [s/t, b, h] rows, every chunk's r-th sub-block in chunk
  // order), kept by reference until the backward ends. token_base: global index of token 0. recompute: this forward
  // refills what the backward reads (LayerConfig::recompute); the output y of the first forward is kept.
  void begin_forward(const Tensor& x, uint64_t token_base, bool recompute = false);
  // dy: [s, b, h] fp32; d_aux: upstream gradient of l_aux (the aux-loss coefficient).
  void begin_backward(const Tensor& dy, float d_aux);
  // Runs one compute stage (the executor's only way in); piece -1: the whole chunk.
  void run(Stage s, Dir d, int chunk, int piece = -1);
  // A buffer a collective reads or writes: chunk c's slot shaped for its run-time capacity, or piece p's rows of it.
  Tensor buffer(Buf b, int chunk, int piece = -1) const { return st_.mem.collective_view(b, chunk, piece); }
  // Slot `slot` of a buffer with several (a ring step's slot of the context-parallel buffers).
  Tensor buffer_slot(Buf b, int slot) const { return st_.mem.get(b, slot); }

  Tensor output() const { return st_.mem.get(Buf::y); }      // [s, b, h]
  Tensor input_grad() const { return st_.mem.get(Buf::dx); }  // [s, b, h]
  double aux_loss_value() const { return moe_.aux_loss_value(); }
  double z_loss_value() const { return moe_.z_loss_value(); }
  const GateCtx& gate_ctx(int c) const { return moe_.gate_ctx(c); }
  int64_t capacity(int c) const { return st_.mem.capacity(c); }
  // FLOPs of the last step, forward + backward, at the chunks' run-time capacities.
  double flops() const;

 private:
  void run_stage(Stage s, Dir d, int chunk, int piece);
  void refresh_weights();

  LayerState st_;
  AttentionBlock attn_;
  MoeBlock moe_;
  MlpBlock mlp_;
};

}  // namespace ampipe::model
