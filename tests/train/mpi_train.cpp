// Multi-rank trainer tests (mpirun -np 2 and 4): expert parallelism (EP = 2, and 4 where there are 4 ranks) equals
// EP = 1 with the same data-parallel ranks, with AMPipe degree 1 and 2 (losses and final weights, fp32,
// tensor-norm relative error 1e-5: only summation orders differ); a checkpoint saved with EP = 2 resumes with
// EP = 1 (and degree 1) as the uninterrupted run. Tensor parallelism (tp 2 with sequence parallelism, AMPipe
// degree 2 and --ampipe-tp-sp-comm-overlap, and with EP 2 on 4 ranks) trains as tp 1 over 20 iterations, and
// checkpoints load across tp sizes both ways.
#include <gtest/gtest.h>

#include <filesystem>

#include "ampipe/comm/collectives.h"
#include "train/train_harness.h"

using namespace ampipe;
using namespace ampipe::testing;

namespace {

// Groups for every (tp, EP) layout, created together before the first operation.
const comm::Groups& groups_for(int ep, int tp = 1) {
  static std::map<std::pair<int, int>, comm::Groups> all;
  if (all.empty()) {
    comm::Runtime& rt = comm::Runtime::current();
    for (int t = 1; t <= rt.size(); t *= 2)
      for (int e = 1; e * t <= rt.size(); e *= 2)
        all.emplace(std::pair{t, e}, rt.make_groups(comm::Layout::make(rt.size(), t, 1, e)));
  }
  return all.at({tp, ep});
}



train::TrainConfig mpi_config(int ep, int M) {
  train::TrainConfig c = tiny_config();
  c.train_iters = 6;
  c.layer.expert_model_parallel_size = ep;
  c.ampipe_degree = M;
  return c;
}

// tp ranks with sequence parallelism, degree M, the tp overlap when M > 1; the global batch fixed (2 sequences
// per rank of the world) so that every layout sees the same batches.
train::TrainConfig tp_config(int tp, int ep, int M, int iters) {
  train::TrainConfig c = mpi_config(ep, M);
  c.train_iters = iters;
  c.global_batch_size = 2 * comm::Runtime::current().size();
  c.layer.tensor_model_parallel_size = tp;
  c.layer.sequence_parallel = tp > 1;
  c.layer.ampipe_tp_sp_comm_overlap = tp > 1 && M > 1;
  return c;
}

}  // namespace

TEST(MpiTrainer, ExpertParallelEqualsOneExpertRank) {
  const int world = comm::Runtime::current().size();
  groups_for(1);
  const RunResult ref = run_training(mpi_config(1, 1), groups_for(1));
  for (int ep = 2; ep <= world; ep *= 2)
    for (int M : ep == 2 ? std::vector<int>{1, 2} : std::vector<int>{2}) {
      SCOPED_TRACE("ep " + std::to_string(ep) + " ampipe degree " + std::to_string(M));
      expect_same_run(run_training(mpi_config(ep, M), groups_for(ep)), ref, 1e-5);
    }
}

TEST(MpiTrainer, CheckpointOfEp2ResumesWithEp1) {
  const std::string dir = (std::filesystem::temp_directory_path() / "ampipe_mpi_train_ckpt").string();
  comm::Runtime& rt = comm::Runtime::current();
  if (rt.rank() == 0) std::filesystem::remove_all(dir);
  comm::barrier_sync(groups_for(1).world);
  const RunResult full = run_training(mpi_config(1, 1), groups_for(1));
  train::TrainConfig first = mpi_config(2, 2);
  first.save = dir;
  first.exit_interval = 3;
  run_training(first, groups_for(2));
  train::TrainConfig second = mpi_config(1, 1);
  second.load = dir;
  const RunResult tail = run_training(second, groups_for(1));
  ASSERT_EQ(tail.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE(std::abs(tail.losses[i] - full.losses[3 + i]) / full.losses[3 + i], 1e-5) << "iteration " << 4 + i;
  for (const auto& [name, w] : full.weights) EXPECT_LE(rel_err(tail.weights.at(name), w), 1e-5) << name;
  comm::barrier_sync(groups_for(1).world);
  if (rt.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(MpiTrainer, TensorSequenceParallelTrainsAsOneTpRank) {
  const int world = comm::Runtime::current().size();
  groups_for(1);
  const RunResult ref = run_training(tp_config(1, 1, 1, 20), groups_for(1));
  SCOPED_TRACE("tp 2, sequence parallel, degree 2, tp overlap");
  expect_same_run(run_training(tp_config(2, 1, 2, 20), groups_for(1, 2)), ref, 1e-5);
  if (world >= 4) {
    SCOPED_TRACE("tp 2 x ep 2, sequence parallel, degree 2, tp overlap");
    expect_same_run(run_training(tp_config(2, 2, 2, 20), groups_for(2, 2)), ref, 1e-5);
  }
}

// The model `make(tp, ep, M)` builds trains as one rank (tp 1, EP 1, degree 1): at tp 2 with sequence parallelism and
// the tp overlap, degree 2, and (on 4 ranks) at tp 2 x ep 2, degree 2.
template <typename Make>
void expect_tp_layouts_train_as_one_rank(Make make) {
  groups_for(1);
  const RunResult ref = run_training(make(1, 1, 1), groups_for(1));
  SCOPED_TRACE("tp 2 + SP, degree 2");
  expect_same_run(run_training(make(2, 1, 2), groups_for(1, 2)), ref, 1e-5);
  if (comm::Runtime::current().size() >= 4) {
    SCOPED_TRACE("tp 2 x ep 2 + SP, degree 2");
    expect_same_run(run_training(make(2, 2, 2), groups_for(2, 2)), ref, 1e-5);
  }
}

// A Mixtral-like model (RMSNorm, RoPE, grouped-query attention, SwiGLU, Megatron-Core's dropless top-2 router) over
// 20 iterations: tp 2 + SP (x ep 2 on 4 ranks) at AMPipe degree 2 trains as one tp rank, EP 1, degree 1.
TEST(MpiTrainer, MixtralLikeTrainsAsOneRank) {
  auto mixtral = [](int tp, int ep, int M) {
    train::TrainConfig c = tp_config(tp, ep, M, 20);
    model::LayerConfig& l = c.layer;
    l.normalization = model::Normalization::rmsnorm;
    l.position_embedding = model::PositionEmbedding::rope;
    l.num_attention_heads = 4;
    l.num_query_groups = 2;
    l.expert = model::ExpertKind::swiglu;
    l.moe_router = model::Router::megatron;
    c.moe_aux_loss_coeff = 0.01;
    return c;
  };
  expect_tp_layouts_train_as_one_rank(mixtral);
}

// A DeepSeek-like model (block 0 dense, block 1 an MoE block with a shared expert beside Megatron-Core's dropless top-2
// router with DeepSeek-V3's routing: sigmoid scores, 2 expert groups of which 1 is kept, the per-sequence aux loss,
// the expert bias; a gated shared expert; RMSNorm, RoPE, SwiGLU) over 20 iterations: tp 2 with sequence parallelism and the tp overlap (x ep 2
// on 4 ranks) at AMPipe degree 2 trains as one rank, the expert biases included.
TEST(MpiTrainer, DeepSeekLikeTrainsAsOneRank) {
  auto deepseek = [](int tp, int ep, int M) {
    train::TrainConfig c = tp_config(tp, ep, M, 20);
    model::LayerConfig& l = c.layer;
    l.moe_router_score_function = model::ScoreFunction::sigmoid;
    l.moe_router_num_groups = 2;
    l.moe_router_group_topk = 1;
    l.moe_router_load_balancing = model::Balancing::seq_aux_loss;
    l.moe_router_enable_expert_bias = true;
    l.moe_router_bias_update_rate = 0.01;
    l.moe_shared_expert_gate = true;  // the shared expert gated per token (Qwen2-MoE's; on each rank's own rows)
    l.normalization = model::Normalization::rmsnorm;
    l.position_embedding = model::PositionEmbedding::rope;
    l.expert = model::ExpertKind::swiglu;
    l.moe_router = model::Router::megatron;
    l.ffn_hidden_size = 8;
    l.mlp_ffn_hidden_size = 16;
    c.dense_ffn_hidden_size = 32;
    c.num_layers = 2;
    c.first_k_dense_replace = 1;
    c.moe_aux_loss_coeff = 0.01;
    return c;
  };
  expect_tp_layouts_train_as_one_rank(deepseek);
}

// --add-bias-linear (Megatron's default biases: QKV, the out-projection, the experts' and a dense layer's fc1 and fc2;
// block 0 dense, block 1 MoE with Megatron-Core's dropless top-2 router and grouped GEMM) over 20 iterations, the
// biases trained away from their zero start: tp 2 + SP with the tp overlap (x ep 2 on 4 ranks) at degree 2, and tp 2
// without sequence parallelism (the out-projection's and fc2's biases after the all-reduce), train as one rank.
TEST(MpiTrainer, LinearBiasesTrainAsOneRank) {
  auto biased = [](int tp, int ep, int M) {
    train::TrainConfig c = tp_config(tp, ep, M, 20);
    model::LayerConfig& l = c.layer;
    l.add_bias_linear = true;
    l.moe_router = model::Router::megatron;
    l.moe_grouped_gemm = true;
    c.dense_ffn_hidden_size = 24;
    c.num_layers = 2;
    c.first_k_dense_replace = 1;
    c.moe_aux_loss_coeff = 0.01;
    // The k rows of the QKV bias have a zero gradient in exact arithmetic (a query's softmax does not change when
    // every key moves by the same vector), so AdamW would scale their rounding noise up to full steps, different on
    // every layout; a larger epsilon keeps a zero-gradient parameter where it is.
    c.adam_eps = 1e-4;
    return c;
  };
  expect_tp_layouts_train_as_one_rank(biased);
  if (comm::Runtime::current().size() == 2) {
    SCOPED_TRACE("tp 2 without sequence parallelism, degree 2");
    train::TrainConfig c = biased(2, 1, 2);
    c.layer.sequence_parallel = false;
    c.layer.ampipe_tp_sp_comm_overlap = false;
    expect_same_run(run_training(c, groups_for(1, 2)), run_training(biased(1, 1, 1), groups_for(1)), 1e-5);
  }
}

// Qwen3-MoE-like (q and k norms per head, shared over the heads): tp 2 without sequence parallelism gives each rank
// half the heads, so the norms' gradients are summed over tp (Megatron-Core's finalize_model_grads); it trains as
// one rank over 20 iterations.
TEST(MpiTrainer, QkLayerNormTensorParallelTrainsAsOneRank) {
  auto qwen = [](int tp, int M) {
    train::TrainConfig c = tp_config(tp, 1, M, 20);
    model::LayerConfig& l = c.layer;
    l.sequence_parallel = false;
    l.ampipe_tp_sp_comm_overlap = false;
    l.normalization = model::Normalization::rmsnorm;
    l.position_embedding = model::PositionEmbedding::rope;
    l.num_attention_heads = 4;
    l.num_query_groups = 2;
    l.qk_layernorm = true;
    l.expert = model::ExpertKind::swiglu;
    l.moe_router = model::Router::megatron;
    return c;
  };
  groups_for(1);
  const RunResult ref = run_training(qwen(1, 1), groups_for(1));
  SCOPED_TRACE("tp 2, degree 2");
  expect_same_run(run_training(qwen(2, 2), groups_for(1, 2)), ref, 1e-5);
}

TEST(MpiTrainer, CheckpointsLoadAcrossTensorParallelSizes) {
  comm::Runtime& rt = comm::Runtime::current();
  if (rt.size() != 2) GTEST_SKIP() << "the 2-rank run covers it (tp 2 and tp 1 x dp 2)";
  const RunResult full = run_training(tp_config(1, 1, 1, 6), groups_for(1));
  for (const auto& [save_tp, load_tp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    SCOPED_TRACE(fmt::format("saved at tp {}, resumed at tp {}", save_tp, load_tp));
    const std::string dir = (std::filesystem::temp_directory_path() / "ampipe_mpi_train_tp_ckpt").string();
    if (rt.rank() == 0) std::filesystem::remove_all(dir);
    comm::barrier_sync(groups_for(1).world);
    train::TrainConfig first = tp_config(save_tp, 1, 2, 6);
    first.save = dir;
    first.exit_interval = 3;
    run_training(first, groups_for(1, save_tp));
    train::TrainConfig second = tp_config(load_tp, 1, 2, 6);
    second.load = dir;
    const RunResult tail = run_training(second, groups_for(1, load_tp));
    ASSERT_EQ(tail.losses.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_LE(std::abs(tail.losses[i] - full.losses[3 + i]) / full.losses[3 + i], 1e-5) << "iteration " << 4 + i;
    for (const auto& [name, w] : full.weights) EXPECT_LE(rel_err(tail.weights.at(name), w), 1e-5) << name;
    comm::barrier_sync(groups_for(1).world);
    if (rt.rank() == 0) std::filesystem::remove_all(dir);
  }
}

TEST(MpiTrainer, RecomputeTrainsAsKeepingTheActivations) {
  // Issue 14's check: 20 iterations with --recompute-granularity full --recompute-method block
  // --recompute-num-layers 2 at degree 2 and EP 2 equal the run without recomputation (losses and weights; the
  // recomputed forward is the same Plan on the same input with the same random numbers, so they are bitwise equal
  // in fact). Three layers, so block 2 leaves one layer keeping its activations; uniform recomputes all.
  if (comm::Runtime::current().size() != 2) GTEST_SKIP() << "the 2-rank run covers it (EP 2)";
  groups_for(1);
  train::TrainConfig base = mpi_config(2, 2);
  base.train_iters = 20;
  base.num_layers = 3;
  const RunResult ref = run_training(base, groups_for(2));
  for (const char* method : {"block", "uniform"}) {
    SCOPED_TRACE(method);
    train::TrainConfig c = base;
    c.recompute_granularity = "full";
    c.recompute_method = method;
    c.recompute_num_layers = 2;
    expect_same_run(run_training(c, groups_for(2)), ref, 1e-5);
  }
}

// The distributed optimizer (--use-distributed-optimizer, ZeRO-1) trains as the unsharded optimizer on the same
// ranks (itself checked against one rank above) over 20 iterations: dp = world, with the overlap flags, and at ep 2 x
// degree 2 (the expert buffer sharded over its own group where it has more than one rank). The validation losses
// too: with --overlap-param-gather the layers' parameters are gathered in the next step, so an evaluation between
// two steps must gather them first.
TEST(MpiTrainer, DistributedOptimizerTrainsAsUnsharded) {
  groups_for(1);
  auto with_eval = [](train::TrainConfig c) {
    c.eval_interval = 7;
    c.eval_iters = 1;
    return c;
  };
  const RunResult ref = run_training(with_eval(tp_config(1, 1, 1, 20)), groups_for(1));
  ASSERT_EQ(ref.evals.size(), 3u);  // iterations 7, 14 and the last
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "dp, with --overlap-grad-reduce --overlap-param-gather" : "dp");
    train::TrainConfig c = with_eval(tp_config(1, 1, 1, 20));
    c.use_distributed_optimizer = true;
    c.overlap_grad_reduce = c.overlap_param_gather = overlap;
    expect_same_run(run_training(c, groups_for(1)), ref, 1e-5);
  }
  {
    SCOPED_TRACE("ep 2, degree 2, with both overlap flags");
    train::TrainConfig c = with_eval(tp_config(1, 2, 2, 20));
    c.use_distributed_optimizer = c.overlap_grad_reduce = c.overlap_param_gather = true;
    expect_same_run(run_training(c, groups_for(2)), ref, 1e-5);
  }
}

// Checkpoints hold whole tensors: one saved with the distributed optimizer (ep 2, degree 2; with
// --overlap-param-gather, so the save gathers the layers' parameters the next step would) resumes without it (and
// the reverse) as the uninterrupted run.
TEST(MpiTrainer, DistributedOptimizerCheckpointResumesEitherWay) {
  const std::string dir = (std::filesystem::temp_directory_path() / "ampipe_mpi_train_distopt").string();
  comm::Runtime& rt = comm::Runtime::current();
  groups_for(1);
  const RunResult full = run_training(mpi_config(1, 1), groups_for(1));
  for (bool first_sharded : {true, false}) {
    SCOPED_TRACE(first_sharded ? "sharded -> unsharded" : "unsharded -> sharded");
    if (rt.rank() == 0) std::filesystem::remove_all(dir);
    comm::barrier_sync(groups_for(1).world);
    train::TrainConfig first = mpi_config(2, 2);
    first.use_distributed_optimizer = first.overlap_grad_reduce = first.overlap_param_gather = first_sharded;
    first.save = dir;
    first.exit_interval = 3;
    run_training(first, groups_for(2));
    train::TrainConfig second = mpi_config(1, 1);
    second.use_distributed_optimizer = !first_sharded;
    second.load = dir;
    const RunResult tail = run_training(second, groups_for(1));
    ASSERT_EQ(tail.losses.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_LE(std::abs(tail.losses[i] - full.losses[3 + i]) / full.losses[3 + i], 1e-5) << "iteration " << 4 + i;
    for (const auto& [name, w] : full.weights) EXPECT_LE(rel_err(tail.weights.at(name), w), 1e-5) << name;
  }
  comm::barrier_sync(groups_for(1).world);
  if (rt.rank() == 0) std::filesystem::remove_all(dir);
}
