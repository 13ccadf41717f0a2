#include "ampipe/model/seams.h"

namespace ampipe::model {

Seams Seams::make(const LayerDims& d) {
  const bool bf16 = d.cd != DType::f32, sp = d.sp;
  Seams m;
  // The attention side: with sequence parallelism the LN1 rows travel in the compute dtype (a bf16 staging copy),
  // and the out-projection's reduce-scatter carries bf16 too (reduced in fp32, rounded once); the all-reduce
  // without it stays fp32 and in place.
  m.qkv_in = {bf16 ? Buf::ln1_send : Buf::ln1_local, bf16 ? Buf::ln1_out_bf16 : Buf::ln1_out};
  m.proj_out = {sp ? (bf16 ? Buf::proj_send : Buf::proj_partial) : Buf::proj, sp && bf16 ? Buf::proj_recv : Buf::proj};
  m.d_proj_out = {bf16 ? Buf::d_proj_send : Buf::d_proj, bf16 ? Buf::d_proj_bf16 : Buf::d_proj_full};
  m.d_qkv_in = {sp && bf16 ? Buf::d_ln1_send : Buf::d_ln1_out,
                sp ? (bf16 ? Buf::d_ln1_recv : Buf::d_ln1_local) : Buf::d_ln1_out};
  // The dense MLP: its input rows in the compute dtype, its reductions and output gradient in fp32.
  m.mlp_in = {bf16 ? Buf::mlp_send : Buf::ln2_out, Buf::mlp_in};
  m.mlp_out = {Buf::mlp_out, sp ? Buf::mlp_y : Buf::mlp_out};
  m.d_mlp_out = {Buf::d_mlp, Buf::d_mlp_full};
  m.d_mlp_in = {Buf::d_mlp_in, sp ? Buf::d_mlp_in_local : Buf::d_mlp_in};
  // The router's agreements.
  m.capacity = {Buf::capacity_need, Buf::capacity_all};
  m.capacity_tp = {d.ep > 1 ? Buf::capacity_all : Buf::capacity_need, Buf::capacity_tp};
  m.gate_stats = {Buf::gate_stats, Buf::gate_stats};
  // The experts. In fp32 the combine all-to-all receives straight into the weighted sum's input; bf16 (and the
  // piece layout of pipe-experts and the tp overlap) lands in a staging buffer. Without sequence parallelism the
  // experts' tp reduction is an all-reduce in place in the combine's send buffer.
  m.dispatch = {Buf::dispatch_send, Buf::dispatch_recv};
  m.expert_in = {Buf::dispatch_recv, Buf::expert_gather};
  m.expert_out = {sp ? Buf::combine_partial : Buf::combine_send, Buf::combine_send};
  m.combine = {Buf::combine_send, !bf16 && !d.pieced() ? Buf::expert_y : Buf::combine_recv};
  m.d_combine = {Buf::combine_bwd_send, Buf::combine_bwd_recv};
  m.d_expert_out = {Buf::combine_bwd_recv, Buf::d_gather};
  m.d_expert_in = {sp ? Buf::dispatch_bwd_partial : Buf::dispatch_bwd_send, Buf::dispatch_bwd_send};
  m.d_dispatch = {Buf::dispatch_bwd_send, Buf::dispatch_bwd_recv};
  // Context parallelism: K, V travel in the compute dtype, as do the dK, dV sums (added in fp32).
  m.kv = {Buf::cp_kv, Buf::cp_kv};
  m.dkv = {bf16 ? Buf::cp_dkv_send : Buf::cp_dkv, Buf::cp_dkv_recv};
  return m;
}

}  // namespace ampipe::model
