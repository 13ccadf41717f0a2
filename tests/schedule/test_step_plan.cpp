// The step Plan (schedule/step_plan.h) without MPI: the order of a whole training iteration's tasks and the bytes
// they carry, against closed forms and against the parameter tensors the layers really have (model::init_params).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ampipe/model/layer_params.h"
#include "ampipe/schedule/model_step.h"
#include "ampipe/schedule/step_plan.h"

using namespace ampipe;
using namespace ampipe::schedule;

namespace {

ModelShape two_layer_model(int ep, int tp, bool sp) {
  ModelShape m;
  model::LayerConfig& l = m.layer;
  l.seq_length = 64;
  l.micro_batch_size = 2;
  l.hidden_size = 32;
  l.ffn_hidden_size = 64;
  l.num_attention_heads = 4;
  l.num_experts = 4;
  l.moe_router_topk = 2;
  l.expert_model_parallel_size = ep;
  l.tensor_model_parallel_size = tp;
  l.sequence_parallel = sp;
  m.num_layers = 2;
  m.vocab = 100;
  m.dp = 2;
  m.micro_batches = 2;
  m.recompute = {true, false};
  m.vocab_parallel = false;  // as the engine's head
  return m;
}

std::vector<std::string> names(const StepPlan& p) {
  std::vector<std::string> n;
  for (const StepTask& t : p.tasks) n.push_back(t.name());
  return n;
}

// Bytes of a layer's fp32 gradients on tp rank 0, dense or expert, from the tensors the layer is made of.
double layer_bytes(const model::LayerConfig& l, bool expert) {
  model::LayerParams p = model::init_params(l, 0, 0);
  double b = 0;
  for (auto& [name, t] : p.named())
    if (model::LayerParams::is_expert(name) == expert) b += 4.0 * double(t.numel());
  return b;
}

}  // namespace

TEST(StepPlan, TwoLayersRecomputeDp2OrderAndBuckets) {
  const ModelShape m = two_layer_model(/*ep=*/1, /*tp=*/1, false);
  const StepPlan p = build_step_plan(model_step_config(m, 2));
  // Every micro-batch: embedding, layers forward, head, head backward, layers backward with layer 0's replay before
  // its backward; the last one issues each layer's buckets right after its backward, then the embedding's.
  EXPECT_EQ(names(p), (std::vector<std::string>{
                          "mb0.embedding.fwd", "mb0.L0.fwd", "mb0.L1.fwd", "mb0.head.fwd", "mb0.head.bwd",
                          "mb0.L1.bwd", "mb0.L0.recompute", "mb0.L0.bwd", "mb0.embedding.bwd",
                          "mb1.embedding.fwd", "mb1.L0.fwd", "mb1.L1.fwd", "mb1.head.fwd", "mb1.head.bwd",
                          "mb1.L1.bwd", "grad_pack.dense.L1", "grad_reduce.dense.L1", "grad_pack.expert.L1",
                          "grad_reduce.expert.L1", "mb1.L0.recompute", "mb1.L0.bwd", "grad_pack.dense.L0",
                          "grad_reduce.dense.L0", "grad_pack.expert.L0", "grad_reduce.expert.L0",
                          "mb1.embedding.bwd", "grad_pack.dense.outer", "grad_reduce.dense.outer", "grad_finish",
                          "optimizer"}));
  const model::LayerConfig& l = m.layer;
  const double h = 32, s = 64, T = 128, V = 100, E = 4, F = 64;
  // closed forms: dense 4h^2 + 4h + E h, expert E (F h + h F) parameters per layer (ep 1, GeLU), 4 bytes each
  EXPECT_DOUBLE_EQ(4 * (4 * h * h + 4 * h + E * h), layer_bytes(l, false));
  EXPECT_DOUBLE_EQ(4 * (E * 2 * F * h), layer_bytes(l, true));
  std::vector<uint32_t> reduces;
  for (const StepTask& t : p.tasks) {
    if (t.op == StepOp::grad_reduce) {
      reduces.push_back(t.id);
      EXPECT_EQ(t.lane, Lane::dp);
      EXPECT_EQ(t.kind, CollKind::all_reduce);
      ASSERT_EQ(t.deps.size(), 1u);
      EXPECT_EQ(p.tasks[t.deps[0]].op, StepOp::grad_pack);
      EXPECT_DOUBLE_EQ(p.tasks[t.deps[0]].bytes, 2 * t.bytes);  // the pack reads and writes the bucket
      const double want = t.layer < 0 ? 4 * (V * h + s * h + 2 * h)
                                      : layer_bytes(l, t.bucket == Bucket::expert);
      EXPECT_DOUBLE_EQ(t.bytes, want) << t.name();
      EXPECT_EQ(t.group, t.bucket == Bucket::dense ? comm::GroupKind::dp_cp : comm::GroupKind::edp);
    }
    if (t.op == StepOp::head) {
      EXPECT_DOUBLE_EQ(t.gemm_flops, (t.dir == Dir::fwd ? 2 : 4) * T * h * V) << t.name();
    }
    if (t.op == StepOp::embedding) {
      EXPECT_DOUBLE_EQ(t.bytes, (t.dir == Dir::fwd ? 12 : 20) * T * h) << t.name();
    }
  }
  EXPECT_EQ(p.tasks[size_t(p.index_of(StepOp::grad_finish, Dir::bwd, -1, -1))].deps, reduces);
  const double params = 2 * (4 * h * h + 4 * h + E * h + E * 2 * F * h) + V * h + s * h + 2 * h;
  EXPECT_DOUBLE_EQ(p.tasks[size_t(p.index_of(StepOp::optimizer, Dir::fwd, -1, -1))].bytes, 28 * params);
  EXPECT_DOUBLE_EQ(p.collective_bytes(StepOp::grad_reduce), 4 * params);
}

// The distributed optimizer at dp 2: every bucket reduce-scattered, AdamW on half the parameters, then one
// all-gather per bucket of its half (what this rank sends), in the order of the reductions, and param_unpack after
// all of them.
TEST(StepPlan, DistributedOptimizerShardsTheUpdateAndGathersEachBucket) {
  ModelShape m = two_layer_model(/*ep=*/1, /*tp=*/1, false);
  m.distributed_optimizer = true;
  const StepPlan p = build_step_plan(model_step_config(m, 2));
  const double h = 32, s = 64, V = 100, E = 4, F = 64;
  const double params = 2 * (4 * h * h + 4 * h + E * h + E * 2 * F * h) + V * h + s * h + 2 * h;
  std::vector<const StepTask*> reduces, gathers;
  for (const StepTask& t : p.tasks) {
    if (t.op == StepOp::grad_reduce) {
      EXPECT_EQ(t.kind, CollKind::reduce_scatter) << t.name();
      reduces.push_back(&t);
    }
    if (t.op == StepOp::param_gather) gathers.push_back(&t);
  }
  ASSERT_EQ(gathers.size(), reduces.size());
  const int opt = p.index_of(StepOp::optimizer, Dir::fwd, -1, -1);
  ASSERT_GE(opt, 0);
  EXPECT_DOUBLE_EQ(p.tasks[size_t(opt)].bytes, 44 * params / 2);  // AdamW + the shard's copies, half the parameters
  std::vector<uint32_t> gather_ids;
  for (size_t i = 0; i < gathers.size(); ++i) {
    const StepTask& g = *gathers[i];
    EXPECT_EQ(g.name(), "param_gather." + std::string(bucket_name(reduces[i]->bucket)) +
                            (reduces[i]->layer >= 0 ? ".L" + std::to_string(reduces[i]->layer) : ".outer"));
    EXPECT_EQ(g.kind, CollKind::all_gather);
    EXPECT_EQ(g.lane, Lane::dp);
    EXPECT_EQ(g.group, reduces[i]->group);
    EXPECT_DOUBLE_EQ(g.bytes, reduces[i]->bytes / 2);
    EXPECT_EQ(g.deps, std::vector<uint32_t>{uint32_t(opt)});
    EXPECT_GT(g.id, uint32_t(opt));
    gather_ids.push_back(g.id);
  }
  EXPECT_DOUBLE_EQ(p.collective_bytes(StepOp::param_gather), 4 * params / 2);
  const int unpack = p.index_of(StepOp::param_unpack, Dir::fwd, -1, -1);
  ASSERT_EQ(unpack, int(p.tasks.size()) - 1);
  EXPECT_EQ(p.tasks[size_t(unpack)].deps, gather_ids);
  EXPECT_DOUBLE_EQ(p.tasks[size_t(unpack)].bytes, 8 * params);
}

// --overlap-param-gather (Megatron's: each bucket's all-gather waited for by its layer's forward pre-hook in the next
// step): the layers' gathers open the step (the previous step's update, nothing before them), each layer's
// parameters are unpacked right before its first forward, and only the outer bucket is gathered and unpacked after
// the optimizer. The same bytes are gathered as without the overlap.
TEST(StepPlan, OverlapParamGatherGathersEachLayerUnderTheForwardsBefore) {
  ModelShape m = two_layer_model(/*ep=*/1, /*tp=*/1, false);
  m.distributed_optimizer = true;
  const StepPlan plain = build_step_plan(model_step_config(m, 2));
  m.overlap_param_gather = true;
  const StepPlan p = build_step_plan(model_step_config(m, 2));
  const double h = 32, s = 64, V = 100;
  const double outer = V * h + s * h + 2 * h;
  const std::vector<std::string> n = names(p);
  ASSERT_GE(n.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(n.begin(), n.begin() + 4),
            (std::vector<std::string>{"param_gather.dense.L0", "param_gather.expert.L0", "param_gather.dense.L1",
                                      "param_gather.expert.L1"}));
  for (int i = 0; i < 2; ++i) {
    const int unpack = p.index_of(StepOp::param_unpack, Dir::fwd, -1, i);
    ASSERT_GE(unpack, 0) << i;
    const StepTask& u = p.tasks[size_t(unpack)];
    EXPECT_EQ(u.name(), "param_unpack.L" + std::to_string(i));
    EXPECT_EQ(u.deps, (std::vector<uint32_t>{uint32_t(2 * i), uint32_t(2 * i + 1)}));
    EXPECT_EQ(p.tasks[size_t(unpack) + 1].name(), "mb0.L" + std::to_string(i) + ".fwd");  // its first forward
    const double layer = (layer_bytes(m.layer, false) + layer_bytes(m.layer, true)) / 4;
    EXPECT_DOUBLE_EQ(u.bytes, 8 * layer);
    for (uint32_t g : u.deps) {
      EXPECT_TRUE(p.tasks[g].deps.empty());
      EXPECT_EQ(p.tasks[g].lane, Lane::dp);
      EXPECT_EQ(p.tasks[g].kind, CollKind::all_gather);
    }
  }
  const int opt = p.index_of(StepOp::optimizer, Dir::fwd, -1, -1);
  const int unpack = p.index_of(StepOp::param_unpack, Dir::fwd, -1, -1);
  ASSERT_EQ(unpack, int(p.tasks.size()) - 1);
  EXPECT_EQ(n[size_t(unpack) - 1], "param_gather.dense.outer");
  EXPECT_EQ(p.tasks[size_t(unpack) - 1].deps, std::vector<uint32_t>{uint32_t(opt)});
  EXPECT_EQ(opt, unpack - 2);
  EXPECT_DOUBLE_EQ(p.tasks[size_t(unpack)].bytes, 8 * outer);
  EXPECT_DOUBLE_EQ(p.collective_bytes(StepOp::param_gather), plain.collective_bytes(StepOp::param_gather));
  EXPECT_EQ(p.tasks.size(), plain.tasks.size() + 2);  // an unpack per layer besides the outer one
}

TEST(StepPlan, ExpertBucketsOverAOneRankGroupAndSequenceParallelGathers) {
  // ep 2 with dp 2: the expert-data-parallel group has one rank, so the expert buckets are not reduced; tp 2 with
  // sequence parallelism: the head gets every tp rank's rows (all-gather over tp) and so does the embedding's
  // backward.
  const ModelShape m = two_layer_model(/*ep=*/2, /*tp=*/2, true);
  const StepPlan p = build_step_plan(model_step_config(m, 1));
  const double T = 128, h = 32;
  int gathers = 0;
  for (const StepTask& t : p.tasks) {
    EXPECT_FALSE(t.op == StepOp::grad_reduce && t.bucket == Bucket::expert) << t.name();
    if (t.op == StepOp::grad_reduce && t.layer >= 0) {
      EXPECT_DOUBLE_EQ(t.bytes, layer_bytes(m.layer, false));
    }
    if (t.op != StepOp::sp_gather) continue;
    ++gathers;
    EXPECT_EQ(t.group, comm::GroupKind::tp);
    EXPECT_EQ(t.kind, CollKind::all_gather);
    EXPECT_DOUBLE_EQ(t.bytes, 4 * T / 2 * h);  // this rank's T / tp rows, fp32
    const StepTask& next = p.tasks[t.id + 1];
    EXPECT_EQ(next.op, t.dir == Dir::fwd ? StepOp::head : StepOp::embedding);
    EXPECT_EQ(next.deps, std::vector<uint32_t>{t.id});
  }
  EXPECT_EQ(gathers, 2 * 2);
}

TEST(StepPlan, LayersOnly) {
  const ModelShape m = two_layer_model(1, 1, false);
  StepConfig c = model_step_config(m, 1);
  const StepPlan p = build_layers_step_plan(c.layers, {false, true});
  EXPECT_EQ(names(p), (std::vector<std::string>{"mb0.L0.fwd", "mb0.L1.fwd", "mb0.L1.recompute", "mb0.L1.bwd",
                                                "mb0.L0.bwd"}));
}

// The step Plan of a pipeline stage: stage 0 of 2 (K = 3, one layer) and stage 1, with tied embeddings. Receives are
// posted one micro-batch ahead; the last stage hands its tied LM-head gradient to the first before the first stage's
// outer bucket, and gets the weight back.
TEST(StepPlan, PipelineStagesSendReceiveAndTiedEmbedding) {
  ModelShape m = two_layer_model(/*ep=*/1, /*tp=*/1, false);
  m.num_layers = 1;
  m.recompute = {};
  m.dp = 1;
  m.micro_batches = 3;
  StepConfig c = model_step_config(m, 1);
  c.pp_size = 2;
  c.pp_bytes = 4.0 * 64 * 2 * 32;
  c.tied_bytes = 4.0 * 100 * 32;
  StepConfig first = c, last = c;
  first.pp_rank = 0;
  last.pp_rank = 1;
  EXPECT_EQ(names(build_step_plan(first)),
            (std::vector<std::string>{
                "mb0.pp_recv.bwd", "mb0.embedding.fwd", "mb0.L0.fwd", "mb0.pp_send.fwd",              // warm-up
                "mb1.embedding.fwd", "mb1.L0.fwd", "mb1.pp_send.fwd",                                 // 1F
                "mb0.pp_wait.bwd", "mb1.pp_recv.bwd", "mb0.L0.bwd", "mb0.embedding.bwd",             // 1B
                "mb2.embedding.fwd", "mb2.L0.fwd", "mb2.pp_send.fwd",                                 // 1F
                "mb1.pp_wait.bwd", "mb2.pp_recv.bwd", "mb1.L0.bwd", "mb1.embedding.bwd",             // 1B
                "mb2.pp_wait.bwd", "mb2.L0.bwd", "mb2.embedding.bwd",                                // cool-down
                "tied_grad", "grad_finish", "optimizer", "tied_param"}));
  EXPECT_EQ(names(build_step_plan(last)),
            (std::vector<std::string>{
                "mb0.pp_recv.fwd", "mb0.pp_wait.fwd", "mb1.pp_recv.fwd", "mb0.L0.fwd", "mb0.head.fwd",
                "mb0.head.bwd", "mb0.L0.bwd", "mb0.pp_send.bwd",                                     //
                "mb1.pp_wait.fwd", "mb2.pp_recv.fwd", "mb1.L0.fwd", "mb1.head.fwd", "mb1.head.bwd", "mb1.L0.bwd",
                "mb1.pp_send.bwd",                                                                  //
                "mb2.pp_wait.fwd", "mb2.L0.fwd", "mb2.head.fwd", "mb2.head.bwd", "mb2.L0.bwd", "mb2.pp_send.bwd",
                "tied_grad", "grad_finish", "optimizer", "tied_param"}));
  // lanes and bytes: activations downstream on pp_fwd, gradients upstream on pp_bwd, one activation each
  const StepPlan p = build_step_plan(last);
  for (const StepTask& t : p.tasks) {
    if (t.op == StepOp::pp_recv || t.op == StepOp::pp_send) {
      EXPECT_EQ(t.lane, t.dir == model::Dir::fwd ? comm::Lane::pp_fwd : comm::Lane::pp_bwd) << t.name();
      EXPECT_EQ(t.bytes, c.pp_bytes) << t.name();
      EXPECT_EQ(t.group, comm::GroupKind::pp) << t.name();
    }
    if (t.op == StepOp::pp_wait) {
      ASSERT_EQ(t.deps.size(), 1u);
      EXPECT_EQ(p.tasks[t.deps[0]].op, StepOp::pp_recv);
      EXPECT_EQ(p.tasks[t.deps[0]].micro_batch, t.micro_batch);
    }
  }
  EXPECT_EQ(p.collective_bytes(StepOp::pp_send), 3 * c.pp_bytes);
  EXPECT_EQ(p.collective_bytes(StepOp::tied_grad), c.tied_bytes);
}

// model_step_config for pipeline stages (what ampipe simulate and plan --step cost), by hand: 2 layers on 2 stages,
// h 32, V 100, s 64, b 2, learned positions, tied embeddings. Stage 0: layer 0 and the embedding V h + s h; stage 1:
// layer 1, the final LayerNorm 2h and no output layer (the tied copy is not a parameter). One activation is
// T h fp32 = 128 x 32 x 4 bytes; the tied exchange V h x 4 bytes.
TEST(StepPlan, ModelStepConfigOfPipelineStagesByHand) {
  ModelShape m = two_layer_model(/*ep=*/1, /*tp=*/1, false);
  m.recompute = {};
  m.pp = 2;
  const double dense = layer_bytes(m.layer, false) / 4, expert = layer_bytes(m.layer, true) / 4;  // elements
  for (int q = 0; q < 2; ++q) {
    SCOPED_TRACE("stage " + std::to_string(q));
    m.pp_rank = q;
    const StepConfig c = model_step_config(m, 1);
    ASSERT_EQ(c.layers.size(), 1u);
    EXPECT_EQ(c.layers[0].tasks.front().layer, q);  // the model-wide layer index
    EXPECT_EQ(c.pp_size, 2);
    EXPECT_EQ(c.pp_rank, q);
    EXPECT_DOUBLE_EQ(c.pp_bytes, 128.0 * 32 * 4);
    EXPECT_DOUBLE_EQ(c.tied_bytes, 100.0 * 32 * 4);
    EXPECT_DOUBLE_EQ(c.outer_dense_bytes, 4.0 * (q == 0 ? 100 * 32 + 64 * 32 : 2 * 32));
    EXPECT_DOUBLE_EQ(c.params, dense + expert + c.outer_dense_bytes / 4);
  }
  m.untie_embeddings = true;  // the last stage's output layer is a parameter
  m.pp_rank = 1;
  EXPECT_DOUBLE_EQ(model_step_config(m, 1).outer_dense_bytes, 4.0 * (2 * 32 + 100 * 32));
  EXPECT_DOUBLE_EQ(model_step_config(m, 1).tied_bytes, 0.0);
}
