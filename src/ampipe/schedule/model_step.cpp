#include "ampipe/schedule/model_step.h"

namespace ampipe::schedule {

double attention_weights(const model::LayerConfig& l) {
  const double h = double(l.hidden_size), kv = double(l.query_groups() * l.head_dim());
  return (h + 2 * kv) * h + h * h;  // [q | k | v] and the out-projection
}

double dense_layer_params(const model::LayerConfig& l) {
  const double h = double(l.hidden_size), E = double(l.num_experts), tp = double(l.tp());
  const double norms = l.rmsnorm() ? 2 * h : 4 * h;  // LN1 and LN2: weight and bias, or RMSNorm's weight only
  return attention_weights(l) / tp + norms + E * h;
}

double expert_layer_params(const model::LayerConfig& l) {
  const double h = double(l.hidden_size), F = double(l.ffn_hidden_size), tp = double(l.tp());
  const double F1 = l.expert == model::ExpertKind::swiglu ? 2 * F : F;
  return double(l.local_experts()) * (F1 * h + h * F) / tp;
}

StepConfig model_step_config(const ModelShape& m, int M) {
  const model::LayerConfig& l = m.layer;
  StepConfig c;
  model::LayerConfig lc = l;
  for (int i = 0; i < m.num_layers; ++i) {
    lc.layer_index = i;
    lc.recompute = !m.recompute.empty() && m.recompute[size_t(i)];
    c.layers.push_back(build_layer_plan(lc, M));
  }
  const double h = double(l.hidden_size), s = double(l.seq_length), tp = double(l.tp());
  const double V = m.vocab_parallel ? double(m.vocab) / tp : double(m.vocab);
  c.micro_batches = m.micro_batches;
  c.recompute = m.recompute;
  c.tokens = l.seq_length * l.micro_batch_size / l.cp();
  c.hidden = l.hidden_size;
  c.head_vocab = int64_t(V);
  c.sp_tp = l.sp() ? l.tp() : 1;
  const double dense = dense_layer_params(l), expert = expert_layer_params(l);
  c.layer_dense_bytes.assign(size_t(m.num_layers), 4 * dense);
  c.layer_expert_bytes.assign(size_t(m.num_layers), 4 * expert);
  const double final_norm = l.rmsnorm() ? h : 2 * h;
  const double outer = V * h + (m.position_embedding ? s * h : 0) + final_norm + (m.untie_embeddings ? V * h : 0);
  c.outer_dense_bytes = 4 * outer;
  c.dense_group_size = m.dp * l.cp();
  c.expert_group_size = m.dp * l.cp() / int(l.expert_model_parallel_size);
  c.params = double(m.num_layers) * (dense + expert) + outer;
  c.bf16_weights = l.bf16 ? double(m.num_layers) * (attention_weights(l) / tp + expert) : 0;
  return c;
}

}  // namespace ampipe::schedule
