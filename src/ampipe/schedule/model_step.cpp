#include "ampipe/schedule/model_step.h"

#include <algorithm>

#include "ampipe/core/error.h"

namespace ampipe::schedule {

double attention_weights(const model::LayerConfig& l) {
  const double h = double(l.hidden_size), kv = double(l.query_groups() * l.head_dim());
  return (h + 2 * kv) * h + h * h;  // [q | k | v] and the out-projection
}

double mlp_weights(const model::LayerConfig& l) {
  const double h = double(l.hidden_size), Fm = double(l.mlp_ffn_hidden_size);
  return ((l.expert == model::ExpertKind::swiglu ? 2 * Fm : Fm) + Fm) * h;  // fc1 and fc2 of the dense MLP
}

double dense_layer_params(const model::LayerConfig& l) {
  const double h = double(l.hidden_size), E = double(l.num_experts), tp = double(l.tp());
  const double norms = l.rmsnorm() ? 2 * h : 4 * h;  // LN1 and LN2: weight and bias, or RMSNorm's weight only
  return (attention_weights(l) + mlp_weights(l)) / tp + norms + E * h;
}

double expert_layer_params(const model::LayerConfig& l) {
  const double h = double(l.hidden_size), F = double(l.ffn_hidden_size), tp = double(l.tp());
  const double F1 = l.expert == model::ExpertKind::swiglu ? 2 * F : F;
  return double(l.local_experts()) * (F1 * h + h * F) / tp;
}

StepConfig model_step_config(const ModelShape& m, int M) {
  const model::LayerConfig& l = m.layer;
  StepConfig c;
  AMPIPE_CHECK(m.pp >= 1 && m.pp_rank >= 0 && m.pp_rank < m.pp && m.chunks >= 1 &&
                   m.num_layers % (m.pp * m.chunks) == 0,
               "model step of stage {} of {} in {} chunks over {} layers", m.pp_rank, m.pp, m.chunks, m.num_layers);
  // the stage's layers, chunk by chunk (chunk c: virtual stage c pp + pp_rank)
  const int per_chunk = m.num_layers / (m.pp * m.chunks);
  std::vector<int> stage_layers;
  for (int ch = 0; ch < m.chunks; ++ch)
    for (int i = 0; i < per_chunk; ++i) stage_layers.push_back((ch * m.pp + m.pp_rank) * per_chunk + i);
  auto layer_at = [&](int i) -> const model::LayerConfig& { return m.layers.empty() ? l : m.layers.at(size_t(i)); };
  for (int i : stage_layers) {
    model::LayerConfig lc = layer_at(i);
    lc.layer_index = i;
    lc.recompute = !m.recompute.empty() && m.recompute[size_t(i)];
    c.layers.push_back(build_layer_plan(lc, M));
  }
  const double h = double(l.hidden_size), s = double(l.seq_length), tp = double(l.tp());
  const double V = m.vocab_parallel ? double(m.vocab) / tp : double(m.vocab);
  c.micro_batches = m.micro_batches;
  for (int i : stage_layers)
    if (!m.recompute.empty()) c.recompute.push_back(m.recompute[size_t(i)]);
  c.tokens = l.seq_length * l.micro_batch_size / l.cp();
  c.hidden = l.hidden_size;
  c.head_vocab = int64_t(V);
  c.sp_tp = l.sp() ? l.tp() : 1;
  double params = 0, bf16_weights = 0, dense_params = 0, expert_params = 0;
  for (int i : stage_layers) {
    const model::LayerConfig& li = layer_at(i);
    const double dense = dense_layer_params(li), expert = expert_layer_params(li);
    c.layer_dense_bytes.push_back(4 * dense);
    c.layer_expert_bytes.push_back(4 * expert);
    params += dense + expert;
    dense_params += dense;
    expert_params += expert;
    bf16_weights += (attention_weights(li) + mlp_weights(li)) / tp + expert;
  }
  const double final_norm = l.rmsnorm() ? h : 2 * h;
  const bool first_stage = m.pp_rank == 0, last_stage = m.pp_rank == m.pp - 1;
  // the embedding (first stage), the final norm and an untied output layer (last stage); a tied LM head on another
  // stage than the embedding is a copy, not a parameter (train/gpt_model.h)
  const double outer = (first_stage ? V * h + (m.position_embedding ? s * h : 0) : 0) +
                       (last_stage ? final_norm + (m.untie_embeddings ? V * h : 0) : 0);
  c.pp_size = m.pp;
  c.pp_rank = m.pp_rank;
  c.chunks = m.chunks;
  c.microbatch_group = m.microbatch_group;
  c.pp_bytes = 4.0 * double(c.tokens) / double(c.sp_tp) * h;
  if (m.pp > 1 && !m.untie_embeddings) c.tied_bytes = 4 * V * h;
  c.outer_dense_bytes = 4 * outer;
  c.dense_group_size = m.dp * l.cp();
  c.expert_group_size = m.dp * l.cp() / int(l.expert_model_parallel_size);
  c.params = params + outer;
  // The distributed optimizer updates 1/D of each group's parameters (padding aside).
  c.distributed_optimizer = m.distributed_optimizer;
  c.overlap_param_gather = m.overlap_param_gather;
  c.optimizer_params = m.distributed_optimizer ? (dense_params + outer) / double(c.dense_group_size) +
                                                     expert_params / double(std::max(1, c.expert_group_size))
                                               : c.params;
  c.bf16_weights = l.bf16 ? bf16_weights : 0;
  return c;
}

}  // namespace ampipe::schedule
