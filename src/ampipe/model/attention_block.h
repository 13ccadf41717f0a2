// The attention half of the block, per AMPipe chunk c (rows [c*s/M, (c+1)*s/M) of the sequence), forward and
// backward side by side (docs/layer.md):
//   ln1_qkv(c)       xn = LN1(x); qkv = xn Wqkv^T (--qk-layernorm: q, k normalised per head; RoPE: then rotated)
//                    (tp > 1: ln1(c) on this rank's rows, then qkv(c) on every row of the chunk, local heads,
//                    with the tp collective between them as its own Plan task; the same split in the backward)
//   attention(c)     the chunk's q rows against K, V of rows [0, (c+1)*s/M) (causal with offset c*s/M: later keys
//                    are invisible, so ln1_qkv(c') for c' <= c is all it needs)
//   out_proj(c)      proj = attn Wproj^T
//   residual_ln2(c)  ln_in = x + dropout(proj); ln2_out = LN2(ln_in)
// Backward: residual_ln2 -> out_proj -> attention (dq of the chunk; dK, dV ACCUMULATE into the rows of earlier
// chunks) -> ln1_qkv (once dK, dV of the chunk's rows are complete, i.e. after attention(c') for all c' >= c).
// The per-chunk backward stages compute input gradients only; weight_grads() (Stage::attention_wgrad) adds the QKV
// and out-projection weight gradients over all rows once every chunk is done. Parameter gradients accumulate (+=),
// so micro-batches sum.
#pragma once

#include "ampipe/model/layer_state.h"

namespace ampipe::model {

class AttentionBlock {
 public:
  explicit AttentionBlock(LayerState& st) : st_(st) {}

  void ln1_qkv(int c);  // ln1(c) then qkv(c)
  void ln1(int c);
  void qkv(int c);
  // piece: with context parallelism the ring slot t (0: this rank's own K, V) whose keys this call sees; -1 otherwise
  void attention(int c, int piece = -1);
  void out_proj(int c);
  void residual_ln2(int c);

  void begin_backward();  // zeroes the dK, dV accumulators
  void residual_ln2_backward(int c);
  void out_proj_backward(int c);
  void attention_backward(int c, int piece = -1);
  // Selective recomputation: attention(c) again (every ring slot with context parallelism), and in bf16 the copy of
  // its output the out-projection's weight gradient reads.
  void attention_recompute(int c);
  // Context parallelism, backward: piece t > 0: the partial sums received at ring step t-1 (t > 1) added to slot
  // t's before they travel on (bf16: and slot t rounded into the bf16 send buffer); piece 0: the last ones added to
  // this rank's own dK, dV, unpacked into dqkv.
  void cp_dkv_reduce(int piece);
  void ln1_qkv_backward(int c);  // qkv_backward(c) then ln1_backward(c)
  void qkv_backward(int c);
  void ln1_backward(int c);
  void weight_grads();  // after ln1_qkv_backward(c) for every c

 private:
  // The out-projection's output gradient of every row, in the compute dtype.
  Tensor d_proj_all() const;
  // Context parallelism: chunk c's K, V rows moved between the qkv layout ([A_c ; B_c] per chunk) and the ring's
  // packed [A ; B] (to_packed), or its dK, dV back.
  void cp_pack(int c, Tensor rows, Tensor packed, bool to_packed) const;
  void cp_attention(int c, int t, bool backward);
  // RoPE (LayerConfig::rope_spec): the q and k columns of chunk c's rows of qkv [S_c, qkvl] rotated by their global
  // positions (inverse: the transpose, on the gradient). Nothing without rotary embeddings.
  void rotate_qk(int c, Tensor qkv, bool inverse) const;
  // --qk-layernorm: the q and k columns of chunk c's rows of qkv [S_c, qkvl] normalised per head (their raw
  // values and statistics kept for the backward); backward: dqkv's q, k columns replaced by the gradient of the raw
  // q, k, and the norms' weight gradients accumulated. Nothing without the flag.
  void qk_norm(int c, Tensor qkv);
  void qk_norm_backward(int c, Tensor dqkv);

  LayerState& st_;
};

}  // namespace ampipe::model
