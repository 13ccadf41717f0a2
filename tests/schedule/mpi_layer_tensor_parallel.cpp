// Tensor and sequence parallelism (with expert and data parallelism, AMPipe degrees and the tp overlap) equal the
// single-rank layer. Data-parallel rank d processes micro-batch d; every rank also runs every micro-batch alone
// (tp = ep = 1, degree 1) as the reference. Compared: y and dx of its micro-batch (sequence parallel: its rows,
// all-gathered over tp and put back in the natural order), the aux loss, and every parameter gradient summed over
// the micro-batches, on this rank's shard (the reference gradient cut with the same EP rows and tp_take).
#include <gtest/gtest.h>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/model/sequence_shard.h"
#include "parallel_harness.h"

using namespace ampipe;
using ampipe::testing::rel_err;
using ampipe::testing::seeded_normal;

namespace {

model::LayerConfig base(int k, double capacity_factor) {
  model::LayerConfig c;
  c.seq_length = 16;
  c.micro_batch_size = 2;
  c.hidden_size = 16;
  c.ffn_hidden_size = 24;
  c.num_attention_heads = 4;
  c.num_experts = 4;
  c.moe_router_topk = k;
  c.moe_train_capacity_factor = capacity_factor;
  c.moe_min_capacity = 1;
  c.hidden_dropout = 0.1;
  c.init_method_std = 0.2;
  c.seed = 23;
  return c;
}

// Every (tp, ep) layout of the world, created before the first operation starts the engine.
const comm::Groups& groups_for(int tp, int ep) {
  static std::map<std::pair<int, int>, comm::Groups> all;
  if (all.empty()) {
    comm::Runtime& rt = comm::Runtime::current();
    const int w = rt.size();
    for (int t = 1; t <= w; t *= 2)
      for (int e = 1; e * t <= w; e *= 2) all.emplace(std::pair{t, e}, rt.make_groups(comm::Layout::make(w, t, 1, e)));
  }
  return all.at({tp, ep});
}

void check_tensor_parallel(model::LayerConfig cfg, int M, int tp, int ep, double tol = 1e-5) {
  const int world = comm::Runtime::current().size();
  cfg.expert_model_parallel_size = ep;
  cfg.tensor_model_parallel_size = tp;
  const std::string what = fmt::format("k={} cf={} M={} tp={} sp={} overlap={} ep={} world={} bf16={} swiglu={}",
                                       cfg.moe_router_topk, cfg.moe_train_capacity_factor, M, tp, cfg.sequence_parallel,
                                       cfg.ampipe_tp_sp_comm_overlap, ep, world, cfg.bf16,
                                       cfg.expert == model::ExpertKind::swiglu);
  ampipe::testing::expect_equals_single_rank(cfg, M, groups_for(tp, ep), tol, what);
}

}  // namespace

TEST(LayerTensorParallel, TensorParallelWithoutSequenceParallelEqualsSingleRank) {
  const int world = comm::Runtime::current().size();
  groups_for(1, 1);
  for (int tp = 2; tp <= world; tp *= 2)
    for (int k : {1, 2}) {
      model::LayerConfig cfg = base(k, 0.5);  // tokens dropped: every tp rank routes every token, as one rank does
      check_tensor_parallel(cfg, 1, tp, 1);
      cfg = base(k, 8.0);
      check_tensor_parallel(cfg, 2, tp, 1);
      cfg.ampipe_tp_sp_comm_overlap = true;
      check_tensor_parallel(cfg, 2, tp, 1);
    }
}

TEST(LayerTensorParallel, SequenceParallelAtEveryDegreeEqualsSingleRank) {
  // Capacity factor 8: C = the chunk's tokens on each rank, nothing dropped (with sequence parallelism each tp rank
  // routes its own rows with a capacity for them, so drops would differ from one rank's).
  const int world = comm::Runtime::current().size();
  groups_for(1, 1);
  for (int tp = 2; tp <= world; tp *= 2)
    for (int k : {1, 2})
      for (int M : {1, 2, 4})
        for (bool overlap : {false, true}) {
          if (overlap && M == 1) continue;
          model::LayerConfig cfg = base(k, 8.0);
          cfg.sequence_parallel = true;
          cfg.ampipe_tp_sp_comm_overlap = overlap;
          check_tensor_parallel(cfg, M, tp, 1);
        }
}

TEST(LayerTensorParallel, WithExpertParallelAndSwiglu) {
  const int world = comm::Runtime::current().size();
  groups_for(1, 1);
  if (world < 4) GTEST_SKIP() << "tp 2 x ep 2 needs 4 ranks";
  for (int k : {1, 2})
    for (bool sp : {false, true})
      for (int M : {1, 2}) {
        model::LayerConfig cfg = base(k, 8.0);
        cfg.sequence_parallel = sp;
        cfg.expert = model::ExpertKind::swiglu;
        check_tensor_parallel(cfg, M, 2, 2);
        if (M > 1) {
          cfg.ampipe_tp_sp_comm_overlap = true;
          check_tensor_parallel(cfg, M, 2, 2);
        }
      }
}

TEST(LayerTensorParallel, PipeExpertsWithSequenceParallel) {
  const int world = comm::Runtime::current().size();
  groups_for(1, 1);
  for (bool multi_stream : {false, true}) {
    model::LayerConfig cfg = base(2, 8.0);
    cfg.sequence_parallel = true;
    cfg.use_pipe_experts = true;
    cfg.pipe_experts_multi_data = multi_stream ? 2 : 4;
    cfg.pipe_experts_multi_stream = multi_stream;
    check_tensor_parallel(cfg, 2, 2, world >= 4 ? 2 : 1);
  }
}

TEST(LayerTensorParallel, Bf16WithinItsRounding) {
  // bf16 GEMM inputs and all-to-all / tp payloads against the fp32 single rank: bf16 keeps 8 bits of mantissa
  // (relative rounding 2^-9 = 2e-3 per value); through two LayerNorms, attention and two expert GEMMs the errors
  // compound to a few 1e-3 relative to the largest element. The tp partial sums are rounded once more before
  // their fp32 reduction, which the 3e-2 bound covers with a wide margin.
  groups_for(1, 1);
  model::LayerConfig cfg = base(2, 8.0);
  cfg.bf16 = true;
  cfg.sequence_parallel = true;
  cfg.ampipe_tp_sp_comm_overlap = true;
  check_tensor_parallel(cfg, 2, 2, 1, 3e-2);
}
