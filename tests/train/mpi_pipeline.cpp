// Pipeline parallelism (--pipeline-model-parallel-size, Megatron's 1F1B schedule; docs/training.md "Pipeline
// parallelism"), under mpirun with 2 and 4 ranks: every layout trains for 20 iterations as one rank does (the same
// global batch; losses and every final weight, fp32, tensor-norm relative error 1e-5: the stages change only where
// the tied embedding's two gradient halves are summed): pp 2 (tied and untied embeddings, an uneven split, full
// recomputation per stage, a DeepSeek-like model with a dense first layer and the router's expert bias) and, on 4
// ranks, pp 4, pp 2 x tp 2 + SP x degree 2 with the tp overlap, pp 2 x ep 2, pp 2 x cp 2, pp 2 x dp 2 with the
// distributed optimizer; the interleaved schedule (pp 2 and pp 4 with 2 virtual stages, with recompute, Megatron's
// micro-batch groups, the distributed optimizer); a checkpoint saved at pp 2 resumes at pp 1, and one saved at pp 1
// at pp 2 with virtual stages, as the uninterrupted run.
#include <gtest/gtest.h>

#include <filesystem>
#include <tuple>

#include "ampipe/comm/collectives.h"
#include "train/train_harness.h"

using namespace ampipe;
using namespace ampipe::testing;

namespace {

// (tp, cp, ep, pp) -> groups; every layout that fits the world is created on the first call, in one order on every
// rank (groups must exist before the first operation).
const comm::Groups& groups_for(int tp, int cp, int ep, int pp) {
  static std::map<std::tuple<int, int, int, int>, comm::Groups> all;
  if (all.empty()) {
    comm::Runtime& rt = comm::Runtime::current();
    const int W = rt.size();
    for (const auto& [t, c, e, p] : std::vector<std::tuple<int, int, int, int>>{
             {1, 1, 1, 1}, {1, 1, 1, 2}, {1, 1, 1, 4}, {2, 1, 1, 2}, {1, 1, 2, 2}, {1, 2, 1, 2}})
      if (W % (t * c * p) == 0 && (W / (t * c * p) * c) % e == 0)
        all.emplace(std::tuple{t, c, e, p}, rt.make_groups(comm::Layout::make(W, t, c, e, p)));
  }
  return all.at({tp, cp, ep, pp});
}

// 4 layers, a global batch of 8 sequences in micro-batches of 2 (4 micro-batches per data-parallel rank at dp 1: the
// 1F1B schedule has its warm-up, steady state and cool-down at pp 2; at pp 4 stage 0 runs 3 warm-up forwards).
train::TrainConfig pp_config(int pp) {
  train::TrainConfig c = tiny_config();
  c.num_layers = 4;
  c.global_batch_size = 8;
  c.pipeline_model_parallel_size = pp;
  c.moe_aux_loss_coeff = 0.01;
  return c;
}

// The model `make(pp)` builds trains on `groups` as on one stage of the whole world (data parallel).
template <typename Make>
void expect_trains_as_one_stage(Make make, int tp, int cp, int ep, int pp) {
  groups_for(1, 1, 1, 1);
  const RunResult ref = run_training(make(1), groups_for(1, 1, 1, 1));
  expect_same_run(run_training(make(pp), groups_for(tp, cp, ep, pp)), ref, 1e-5);
}

}  // namespace

TEST(MpiPipeline, TwoStagesTrainAsOne) {
  {
    SCOPED_TRACE("pp 2, tied embeddings");
    expect_trains_as_one_stage([](int pp) { return pp_config(pp); }, 1, 1, 1, 2);
  }
  {
    SCOPED_TRACE("pp 2, untied embeddings, degree 2");
    expect_trains_as_one_stage(
        [](int pp) {
          train::TrainConfig c = pp_config(pp);
          c.untie_embeddings_and_output_weights = true;
          c.ampipe_degree = 2;
          return c;
        },
        1, 1, 1, 2);
  }
}

// 3 layers, the first stage holding 1 (--decoder-first-pipeline-num-layers 1), with full recomputation of the first
// layer of each stage (--recompute-method block counts per stage).
TEST(MpiPipeline, UnevenStagesWithRecomputeTrainAsOne) {
  auto make = [](int pp) {
    train::TrainConfig c = pp_config(pp);
    c.num_layers = 3;
    if (pp > 1) c.decoder_first_pipeline_num_layers = 1;
    c.recompute_granularity = "full";
    c.recompute_method = "block";
    c.recompute_num_layers = 1;
    return c;
  };
  // one stage recomputes layer 0 only; two stages recompute their first layers (0 and 1): the same numbers
  expect_trains_as_one_stage(make, 1, 1, 1, 2);
}

// The interleaved schedule (virtual stages): 2 model chunks of one layer per rank (rank 0 holds layers 0 and 2, rank 1
// layers 1 and 3; chunk 0's output on rank 1 goes back to rank 0), tied embeddings; and with K = 12 micro-batches
// (6 on 4 ranks) in groups of 3 (--microbatch-group-size-per-virtual-pipeline-stage), degree 2, untied, every layer
// recomputed.
TEST(MpiPipeline, InterleavedStagesTrainAsOne) {
  {
    SCOPED_TRACE("pp 2, 2 virtual stages, tied embeddings");
    expect_trains_as_one_stage(
        [](int pp) {
          train::TrainConfig c = pp_config(pp);
          if (pp > 1) c.num_layers_per_virtual_pipeline_stage = 1;
          return c;
        },
        1, 1, 1, 2);
  }
  {
    SCOPED_TRACE("pp 2, 2 virtual stages, micro-batches in groups of 3, degree 2, untied, recompute");
    expect_trains_as_one_stage(
        [](int pp) {
          train::TrainConfig c = pp_config(pp);
          c.global_batch_size = 12;
          c.layer.micro_batch_size = 1;  // 12 micro-batches at pp 2 (6 at pp 2 x dp 2), 3 per rank at dp 4
          c.untie_embeddings_and_output_weights = true;
          c.ampipe_degree = 2;
          c.recompute_granularity = "full";
          c.recompute_method = "uniform";
          if (pp > 1) {
            c.num_virtual_stages_per_pipeline_rank = 2;
            c.microbatch_group_size_per_vp_stage = 3;
          }
          return c;
        },
        1, 1, 1, 2);
  }
}

// A DeepSeek-like model (block 0 dense, sigmoid router with the expert bias, a gated shared expert, RMSNorm, RoPE,
// SwiGLU): the dense stage and the MoE stage, the bias moving with the loads every stage counts.
TEST(MpiPipeline, DeepSeekLikeTrainsAsOne) {
  auto make = [](int pp) {
    train::TrainConfig c = pp_config(pp);
    model::LayerConfig& l = c.layer;
    l.moe_router_score_function = model::ScoreFunction::sigmoid;
    l.moe_router_enable_expert_bias = true;
    l.moe_router_bias_update_rate = 0.01;
    l.moe_router_load_balancing = model::Balancing::seq_aux_loss;
    l.moe_shared_expert_gate = true;
    l.mlp_ffn_hidden_size = 16;
    l.normalization = model::Normalization::rmsnorm;
    l.position_embedding = model::PositionEmbedding::rope;
    l.expert = model::ExpertKind::swiglu;
    c.dense_ffn_hidden_size = 32;
    c.first_k_dense_replace = 1;
    return c;
  };
  expect_trains_as_one_stage(make, 1, 1, 1, 2);
}

TEST(MpiPipeline, FourRankLayoutsTrainAsOne) {
  if (comm::Runtime::current().size() < 4) GTEST_SKIP() << "needs 4 ranks";
  {
    SCOPED_TRACE("pp 4");
    expect_trains_as_one_stage([](int pp) { return pp_config(pp); }, 1, 1, 1, 4);
  }
  {
    SCOPED_TRACE("pp 2 x tp 2 + SP, degree 2, tp overlap");
    expect_trains_as_one_stage(
        [](int pp) {
          train::TrainConfig c = pp_config(pp);
          c.ampipe_degree = 2;
          if (pp > 1) {
            c.layer.tensor_model_parallel_size = 2;
            c.layer.sequence_parallel = true;
            c.layer.ampipe_tp_sp_comm_overlap = true;
          }
          return c;
        },
        2, 1, 1, 2);
  }
  {
    SCOPED_TRACE("pp 2 x ep 2, degree 2");
    expect_trains_as_one_stage(
        [](int pp) {
          train::TrainConfig c = pp_config(pp);
          c.ampipe_degree = 2;
          if (pp > 1) c.layer.expert_model_parallel_size = 2;
          return c;
        },
        1, 1, 2, 2);
  }
  {
    SCOPED_TRACE("pp 2 x cp 2, degree 2");
    expect_trains_as_one_stage(
        [](int pp) {
          train::TrainConfig c = pp_config(pp);
          c.ampipe_degree = 2;
          if (pp > 1) c.layer.context_parallel_size = 2;
          return c;
        },
        1, 2, 1, 2);
  }
  {
    SCOPED_TRACE("pp 4, 2 virtual stages");
    expect_trains_as_one_stage(
        [](int pp) {
          train::TrainConfig c = pp_config(pp);
          c.num_layers = 8;
          if (pp > 1) c.num_virtual_stages_per_pipeline_rank = 2;
          return c;
        },
        1, 1, 1, 4);
  }
  {
    SCOPED_TRACE("pp 2 x dp 2, 2 virtual stages, distributed optimizer");
    expect_trains_as_one_stage(
        [](int pp) {
          train::TrainConfig c = pp_config(pp);
          c.use_distributed_optimizer = c.overlap_grad_reduce = pp > 1;
          if (pp > 1) c.num_layers_per_virtual_pipeline_stage = 1;
          return c;
        },
        1, 1, 1, 2);
  }
  {
    SCOPED_TRACE("pp 2 x dp 2, distributed optimizer with both overlap flags");
    expect_trains_as_one_stage(
        [](int pp) {
          train::TrainConfig c = pp_config(pp);
          c.use_distributed_optimizer = c.overlap_grad_reduce = c.overlap_param_gather = pp > 1;
          return c;
        },
        1, 1, 1, 2);
  }
}

// Checkpoints hold whole tensors: one saved at pp 2 (with the distributed optimizer where dp > 1) resumes at pp 1
// (and the reverse) as the uninterrupted run.
TEST(MpiPipeline, CheckpointsLoadAcrossStageCounts) {
  const std::string dir = (std::filesystem::temp_directory_path() / "ampipe_mpi_pipeline_ckpt").string();
  comm::Runtime& rt = comm::Runtime::current();
  auto config = [](int pp, bool interleaved = false) {
    train::TrainConfig c = pp_config(pp);
    c.train_iters = 6;
    c.use_distributed_optimizer = pp > 1;
    if (interleaved) c.num_layers_per_virtual_pipeline_stage = 1;
    return c;
  };
  groups_for(1, 1, 1, 1);
  const RunResult full = run_training(config(1), groups_for(1, 1, 1, 1));
  for (bool first_pipelined : {true, false}) {
    SCOPED_TRACE(first_pipelined ? "pp 2 -> pp 1" : "pp 1 -> pp 2 with 2 virtual stages");
    if (rt.rank() == 0) std::filesystem::remove_all(dir);
    comm::barrier_sync(groups_for(1, 1, 1, 1).world);
    train::TrainConfig first = config(first_pipelined ? 2 : 1);
    first.save = dir;
    first.exit_interval = 3;
    run_training(first, groups_for(1, 1, 1, first_pipelined ? 2 : 1));
    train::TrainConfig second = config(first_pipelined ? 1 : 2, !first_pipelined);
    second.load = dir;
    const RunResult tail = run_training(second, groups_for(1, 1, 1, first_pipelined ? 1 : 2));
    ASSERT_EQ(tail.losses.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_LE(std::abs(tail.losses[i] - full.losses[3 + i]) / full.losses[3 + i], 1e-5) << "iteration " << 4 + i;
    ASSERT_EQ(tail.weights.size(), full.weights.size());
    for (const auto& [name, w] : full.weights) EXPECT_LE(rel_err(tail.weights.at(name), w), 1e-5) << name;
  }
  comm::barrier_sync(groups_for(1, 1, 1, 1).world);
  if (rt.rank() == 0) std::filesystem::remove_all(dir);
}
