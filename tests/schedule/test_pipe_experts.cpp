// pipe-experts (--use-pipe-experts, --pipe-experts-multi-data N) on one rank: the pieces' all-to-alls and expert
// GEMMs give the layer without pipe-experts (output, aux loss, dx and every parameter gradient), with dropout,
// token drops, uneven and empty slices, one and several local experts, top-1 and top-2, and with AMPipe chunks.
// The multi-rank cases (EP 2) are in mpi_layer_parallel.cpp.
#include <gtest/gtest.h>

#include "layer_harness.h"

using namespace ampipe;
using ampipe::testing::rel_err;
using ampipe::testing::run_layer;

namespace {
model::LayerConfig tiny(int k, int64_t E, double cf, double dropout) {
  model::LayerConfig c;
  c.seq_length = 24;
  c.micro_batch_size = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 4;
  c.num_experts = E;
  c.moe_router_topk = k;
  c.moe_train_capacity_factor = cf;
  c.moe_min_capacity = 1;
  c.hidden_dropout = dropout;
  c.init_method_std = 0.2;
  c.seed = 31;
  return c;
}

model::LayerConfig with_pieces(model::LayerConfig c, int N, int M) {
  c.use_pipe_experts = true;
  c.pipe_experts_multi_data = N;
  const std::string notice = c.check_pipe_experts(M);
  if (!notice.empty()) c.use_pipe_experts = false;
  return c;
}

void expect_equal(const ampipe::testing::LayerRun& got, const ampipe::testing::LayerRun& ref, const std::string& what) {
  EXPECT_NEAR(got.aux, ref.aux, 1e-6 * std::abs(ref.aux)) << what;
  for (const auto& [name, t] : ref.tensors)
    EXPECT_LE(rel_err(got.tensors.at(name), t), 1e-5) << name << " " << what;
}
}  // namespace

TEST(PipeExperts, PiecesEqualTheLayerWithout) {
  // E = 1 (one local expert) and E = 2, 4 (several); capacity factors with drops (0.6) and without (4).
  for (int64_t E : {2, 4})
    for (int k : {1, 2})
      for (double cf : {0.6, 4.0}) {
        if (k > E) continue;
        const model::LayerConfig cfg = tiny(k, E, cf, 0.1);
        const auto ref = run_layer(cfg, 1);
        for (int N : {1, 2, 3, 4}) {
          const model::LayerConfig pc = with_pieces(cfg, N, 1);
          const model::LayerDims d = model::LayerDims::make(pc, 1);
          ASSERT_TRUE(d.pieced());
          expect_equal(run_layer(pc, 1), ref, fmt::format("E={} k={} cf={} N={} C={}", E, k, cf, N, d.C));
        }
      }
}

TEST(PipeExperts, UnevenAndEmptySlices) {
  // C = 5 slots in 4 slices: 2, 2, 1 and an empty one, which gets no piece.
  model::LayerConfig cfg = tiny(1, 2, 1.0, 0.0);
  cfg.seq_length = 5;
  cfg.micro_batch_size = 2;
  const model::LayerConfig pc = with_pieces(cfg, 4, 1);
  const model::LayerDims d = model::LayerDims::make(pc, 1);
  ASSERT_EQ(d.C, 5);
  ASSERT_EQ(d.pieces.size(), 6u);  // 2 local experts x 3 non-empty slices
  EXPECT_EQ(d.pieces[2].slots, 1);
  expect_equal(run_layer(pc, 1), run_layer(cfg, 1), "C=5 N=4");
}

TEST(PipeExpertsWithAmpipe, PiecesInsideChunksEqualAmpipeAlone) {
  for (int k : {1, 2})
    for (double cf : {0.6, 4.0}) {
      model::LayerConfig cfg = tiny(k, 4, cf, 0.1);
      cfg.seq_length = 48;  // chunks large enough for 3 slices of their capacity
      for (int M : {2, 4}) {
        const auto ref = run_layer(cfg, M);
        for (int N : {2 * M, 3 * M}) {
          const model::LayerConfig pc = with_pieces(cfg, N, M);
          expect_equal(run_layer(pc, M), ref, fmt::format("k={} cf={} M={} N={}", k, cf, M, N));
        }
      }
    }
}

TEST(PipeExperts, Bf16PiecesCloseToWithout) {
  model::LayerConfig cfg = tiny(2, 4, 1.0, 0.1);
  cfg.bf16 = true;
  const auto ref = run_layer(cfg, 2);
  const auto got = run_layer(with_pieces(cfg, 4, 2), 2);
  // Same roundings in the same places (the pieces change only which rows a GEMM call covers), so the bf16
  // results agree to fp32 summation order.
  for (const auto& [name, t] : ref.tensors) EXPECT_LE(rel_err(got.tensors.at(name), t), 1e-5) << name;
}
