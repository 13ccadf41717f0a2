// kernels::adamw_update against hand-computed steps, and the embedding forward / backward against a direct
// double-precision evaluation of their formulas (kernels/adamw.h, kernels/embedding.h).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ampipe/kernels/adamw.h"
#include "ampipe/kernels/embedding.h"

using namespace ampipe;

TEST(AdamW, TwoStepsMatchTheHandComputedUpdate) {
  // p = 1, g = 0.5, lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.1, clip 1:
  // t = 1: m = 0.05, v = 2.5e-4, m_hat = 0.5, v_hat = 0.25: p = 1 * (1 - 0.01) - 0.1 * 0.5 / (0.5 + 1e-8) = 0.89
  // t = 2 (g = 0.5 again): m = 0.095, v = 4.9975e-4, m_hat = 0.095 / 0.19 = 0.5, v_hat = 4.9975e-4 / 1.999e-3 = 0.25:
  //        p = 0.89 * 0.99 - 0.1 * 0.5 / 0.5 = 0.7811
  Tensor p = Tensor::empty({1}), g = Tensor::empty({1}), m = Tensor::zeros({1}), v = Tensor::zeros({1});
  p.fill(1.0f);
  g.fill(0.5f);
  for (int t = 1; t <= 2; ++t) {
    kernels::AdamWScalars s;
    s.b1 = 0.9f;
    s.b2 = 0.999f;
    s.step_size = float(0.1 / (1 - std::pow(0.9, t)));
    s.inv_sqrt_bc2 = float(1 / std::sqrt(1 - std::pow(0.999, t)));
    s.eps = 1e-8f;
    s.decay = float(1 - 0.1 * 0.1);
    kernels::adamw_update(p, g, m, v, s);
    EXPECT_NEAR(p.get(0), t == 1 ? 0.89 : 0.7811, 2e-6) << "step " << t;
  }
  EXPECT_NEAR(m.get(0), 0.095, 1e-7);  // fp32's 1 - 0.999f is 1.3e-5 relative off 1e-3
  EXPECT_NEAR(v.get(0), 4.9975e-4, 2e-8);
}

TEST(AdamW, ClipScalesTheGradientAndNoDecayKeepsTheWeight) {
  Tensor p = Tensor::empty({2}), g = Tensor::empty({2}), m = Tensor::zeros({2}), v = Tensor::zeros({2});
  p.fill(2.0f);
  g.fill(4.0f);
  kernels::AdamWScalars s;
  s.step_size = float(0.01 / 0.1);
  s.inv_sqrt_bc2 = float(1 / std::sqrt(1 - 0.999));
  s.clip_coef = 0.25f;  // g -> 1: m = 0.1, v = 1e-3
  kernels::adamw_update(p, g, m, v, s);
  // 1 - b1 and 1 - b2 in fp32 (0.9f, 0.999f): 0.1 and 1e-3 to 4e-7 and 1.3e-5 relative
  EXPECT_NEAR(m.get(1), 0.1, 1e-7);
  EXPECT_NEAR(v.get(1), 1e-3, 2e-8);
  EXPECT_NEAR(p.get(1), 2.0 - 0.01 * 1.0 / (1.0 + 1e-8), 1e-6);  // m_hat 1, sqrt(v_hat) 1
}

TEST(Embedding, ForwardAndBackwardFollowTheirFormulas) {
  const int64_t V = 5, P = 3, h = 4, b = 2;
  Tensor wte = Tensor::empty({V, h}), wpe = Tensor::empty({P, h});
  for (int64_t i = 0; i < wte.numel(); ++i) wte.data<float>()[i] = 0.1f * float(i);
  for (int64_t i = 0; i < wpe.numel(); ++i) wpe.data<float>()[i] = -0.01f * float(i);
  const std::vector<int32_t> tokens = {4, 0, 2, 2, 1, 4};  // [s = 3, b = 2]
  const std::vector<int64_t> pos = {2, 0, 1};              // sequence row -> position
  Tensor x = Tensor::empty({6, h});
  kernels::embedding_forward(wte, wpe, tokens, pos, b, x);
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t j = 0; j < h; ++j)
      EXPECT_FLOAT_EQ(x.get(t * h + j), wte.get(tokens[size_t(t)] * h + j) + wpe.get(pos[size_t(t / b)] * h + j));
  Tensor dx = Tensor::empty({6, h});
  for (int64_t i = 0; i < dx.numel(); ++i) dx.data<float>()[i] = float(i % 7) - 3.0f;
  Tensor dwte = Tensor::zeros({V, h}), dwpe = Tensor::zeros({P, h});
  dwte.data<float>()[0] = 1.0f;  // accumulated, not overwritten
  kernels::embedding_backward(dx, tokens, pos, b, dwte, dwpe);
  std::vector<double> want_te(size_t(V * h), 0), want_pe(size_t(P * h), 0);
  want_te[0] = 1.0;
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t j = 0; j < h; ++j) {
      want_te[size_t(tokens[size_t(t)] * h + j)] += dx.get(t * h + j);
      want_pe[size_t(pos[size_t(t / b)] * h + j)] += dx.get(t * h + j);
    }
  for (int64_t i = 0; i < V * h; ++i) EXPECT_DOUBLE_EQ(dwte.get(i), want_te[size_t(i)]) << i;
  for (int64_t i = 0; i < P * h; ++i) EXPECT_DOUBLE_EQ(dwpe.get(i), want_pe[size_t(i)]) << i;
}
