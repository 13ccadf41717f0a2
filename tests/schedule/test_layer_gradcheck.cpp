// The whole layer's input and parameter gradients against central finite differences of the fp32 forward.
#include <gtest/gtest.h>

#include <cmath>

#include "layer_harness.h"

using namespace ampipe;

namespace {
model::LayerConfig tiny(int k, model::ExpertKind expert) {
  model::LayerConfig c;
  c.seq_length = 6;
  c.micro_batch_size = 2;
  c.hidden_size = 8;
  c.ffn_hidden_size = 12;
  c.num_attention_heads = 2;
  c.num_experts = 4;
  c.moe_router_topk = k;
  c.moe_train_capacity_factor = 4.0;  // nothing dropped: the loss is smooth in every parameter
  c.hidden_dropout = 0.1;
  c.init_method_std = 0.3;
  c.expert = expert;
  c.seed = 5;
  return c;
}

// loss = <dy, y> + coeff * l_aux, accumulated in double.
double loss_of(const model::LayerConfig& cfg, const model::LayerParams& p, const Tensor& x, const Tensor& dy,
               float coeff) {
  schedule::LayerStack stack(cfg, 1, 1, 0, nullptr);
  stack.params(0) = p;  // shallow: the step only reads parameters
  const Tensor y = stack.forward(x, 0);
  double l = coeff * stack.aux_loss();
  for (int64_t i = 0; i < y.numel(); ++i) l += double(dy.get(i)) * y.get(i);
  return l;
}

model::LayerParams deep_copy(const model::LayerParams& p) {
  model::LayerParams q = p;
  q.ln1_w = p.ln1_w.clone();
  q.ln1_b = p.ln1_b.clone();
  q.qkv_w = p.qkv_w.clone();
  q.proj_w = p.proj_w.clone();
  q.ln2_w = p.ln2_w.clone();
  q.ln2_b = p.ln2_b.clone();
  q.gate_w = p.gate_w.clone();
  q.fc1_w = p.fc1_w.clone();
  q.fc2_w = p.fc2_w.clone();
  return q;
}
}  // namespace

// dy_scale 0 makes the loss the aux loss alone, so its gradient path is checked on its own.
TEST(LayerGradcheck, InputAndEveryParameterAgainstFiniteDifferences) {
  for (int k : {1, 2})
    for (model::ExpertKind ek : {model::ExpertKind::gelu, model::ExpertKind::swiglu})
      for (float dy_scale : {1.0f, 0.0f}) {
      model::LayerConfig cfg = tiny(k, ek);
      cfg.use_rts = false;
      const float coeff = 0.5f;  // large, so the aux-loss path is visible in the gate gradient
      const model::LayerParams p0 = model::init_params(cfg, 0);
      const Shape act{cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size};
      const auto run = ampipe::testing::run_layer(cfg, 1, coeff, &p0, dy_scale);
      // (name, perturbable tensor, analytic gradient)
      model::LayerParams p = deep_copy(p0);
      // run_layer draws x and dy from cfg.seed; use the same tensors here.
      Tensor x = ampipe::testing::seeded_normal(act, cfg.seed, 0);
      const Tensor dy = ampipe::testing::seeded_normal(act, cfg.seed, 1, dy_scale);
      std::vector<std::tuple<std::string, Tensor, Tensor>> cases{{"x", x, run.tensors.at("grad.x")}};
      for (auto& [name, t] : p.named()) cases.emplace_back(name, t, run.tensors.at("grad." + name));
      for (auto& [name, t, grad] : cases) {
        double gmax = 0;
        for (int64_t i = 0; i < grad.numel(); ++i) gmax = std::max(gmax, double(std::abs(grad.get(i))));
        for (int trial = 0; trial < 5; ++trial) {
          const int64_t i = (trial * 7919 + 13) % t.numel();
          const float orig = t.get(i);
          // fp32 forward: step 1e-2 balances truncation (~eps^2) against rounding (~1e-7 |loss| / eps);
          // together well below 3% of the tensor's largest gradient entry.
          const float eps = 1e-2f;
          t.set(i, orig + eps);
          const double up = loss_of(cfg, p, x, dy, coeff);
          t.set(i, orig - eps);
          const double down = loss_of(cfg, p, x, dy, coeff);
          t.set(i, orig);
          const double fd = (up - down) / (2.0 * eps);
          if (gmax == 0) {  // a parameter the loss does not reach (the experts, for the aux loss alone)
            EXPECT_NEAR(fd, 0.0, 1e-3) << name;
            continue;
          }
          EXPECT_NEAR(grad.get(i), fd, 3e-2 * gmax)
              << name << "[" << i << "] k=" << k << " swiglu=" << (ek == model::ExpertKind::swiglu) << " dy_scale=" << dy_scale;
        }
      }
    }
}
