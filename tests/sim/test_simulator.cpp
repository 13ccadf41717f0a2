// The simulator on hand-made Plans with known answers, on real Plans (degree 1 is the sum of its compute costs;
// a higher degree hides communication), the slowdown factor, the Chrome trace, and profile loading and saving.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/model/layer_dims.h"
#include "ampipe/schedule/plan.h"
#include "ampipe/schedule/step_plan.h"
#include "ampipe/sim/profile.h"
#include "ampipe/sim/simulator.h"

using namespace ampipe;
using namespace ampipe::schedule;
using namespace ampipe::sim;

namespace {

// 1 byte per ns everywhere and no fixed costs: an element-wise task of B bytes takes B/1e9 s, an all-to-all over
// 2 ranks of B bytes B/2/1e9 s.
Profile unit_profile() {
  Profile p;
  p.name = "unit";
  p.bf16 = p.fp32 = ComputeRates{1, 1, 1, 1};
  p.elementwise_gbps = 1;
  p.task_overhead_us = 0;
  p.links["intra"] = LinkClass{0, 1};
  p.links["inter"] = LinkClass{0, 1};
  return p;
}

// A hand-made Plan: tasks appended in issue order (each its own chunk, so names differ).
struct PlanBuilder {
  Plan p;
  PlanBuilder() {
    p.dims.s = p.dims.sq = p.dims.T = p.dims.Sc = 64;
    p.dims.b = 1;
    p.dims.h = 64;
    p.dims.ep = 2;
  }
  // An element-wise compute task of `seconds` under unit_profile().
  uint32_t compute(double seconds, std::vector<uint32_t> deps = {}, Dir dir = Dir::fwd) {
    Task t;
    t.id = uint32_t(p.tasks.size());
    t.dir = dir;
    t.stage = Stage::residual_ln2;
    t.chunk = int(t.id);
    t.lane = Lane::compute;
    t.deps = std::move(deps);
    t.bytes = seconds * 1e9;
    p.tasks.push_back(t);
    return t.id;
  }
  // A collective that takes `seconds` under unit_profile() (an all-to-all over 2 ranks sends half its bytes).
  uint32_t collective(double seconds, Lane lane = Lane::ep, std::vector<uint32_t> deps = {}, Dir dir = Dir::fwd,
                      CommStage stage = CommStage::dispatch) {
    Task t;
    t.id = uint32_t(p.tasks.size());
    t.dir = dir;
    t.stage = stage;
    t.chunk = int(t.id);
    t.lane = lane;
    t.deps = std::move(deps);
    CollectiveSpec c;
    c.kind = CollKind::all_to_all;
    c.group = lane == Lane::cp ? comm::GroupKind::cp : comm::GroupKind::ep;
    c.bytes = 2 * seconds * 1e9;
    t.bytes = c.bytes;
    t.collective = c;
    p.tasks.push_back(t);
    return t.id;
  }
};

const SimRecord* find(const SimResult& r, const std::string& name) {
  for (const auto& x : r.timeline)
    if (x.name == name) return &x;
  return nullptr;
}

// Layer `index`: a 1 s forward task, a 0.5 s all-to-all after it, and a backward task of `bwd_s`.
Plan fwd_comm_bwd_layer(int index, double bwd_s) {
  PlanBuilder b;
  const uint32_t f = b.compute(1);
  b.collective(0.5, Lane::ep, {f});
  b.compute(bwd_s, {f}, Dir::bwd);
  for (Task& t : b.p.tasks) t.layer = index;
  return b.p;
}

model::LayerConfig small_config(int ep) {
  model::LayerConfig cfg;
  cfg.seq_length = 64;
  cfg.hidden_size = 64;
  cfg.ffn_hidden_size = 256;
  cfg.num_attention_heads = 4;
  cfg.num_experts = 4;
  cfg.moe_router_topk = 2;
  cfg.expert_model_parallel_size = ep;
  return cfg;
}

// A CPU-like machine with a slow network.
Profile slow_link_profile() {
  Profile p;
  p.name = "slow link";
  p.bf16 = p.fp32 = ComputeRates{0.01, 8, 0.005, 0.004};
  p.elementwise_gbps = 10;
  p.task_overhead_us = 1;
  p.links["intra"] = LinkClass{10, 0.05};
  return p;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ampipe_sim_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

const char* kGoodProfile = R"({
  "name": "test", "source": "made up", "_sources": {"elementwise_gbps": "a guess"},
  "devices_per_node": 8,
  "compute": {
    "bf16": {"gemm_peak_tflops": 250.0, "gemm_half_rate_dim": 256, "attention_fwd_tflops": 180.0,
             "attention_bwd_tflops": 150.0},
    "fp32": {"gemm_peak_tflops": 60.0, "gemm_half_rate_dim": 128, "attention_fwd_tflops": 40.0,
             "attention_bwd_tflops": 30.0}
  },
  "elementwise_gbps": 1300.0,
  "task_overhead_us": 20.0,
  "compute_slowdown_during_comm": 0.1,
  "links": {"intra": {"latency_us": 5.0, "gbps": 130.0}, "inter": {"latency_us": 20.0, "gbps": 17.5}}
})";

// The message of the ConfigError that load_profile throws for `text`.
std::string load_error(const std::string& text, const std::string& name) {
  const std::string path = temp_path(name);
  write_text(path, text);
  std::string msg;
  try {
    load_profile(path);
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  std::filesystem::remove(path);
  EXPECT_NE(msg.find("--profile " + path + ": "), std::string::npos) << msg;
  return msg;
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

}  // namespace

// ---- costs ----

TEST(SimCost, GemmAttentionElementwiseAndCollective) {
  Profile p = unit_profile();
  p.bf16 = ComputeRates{100, 64, 50, 40};
  p.fp32 = ComputeRates{10, 16, 5, 4};
  p.task_overhead_us = 3;
  p.links["intra"] = LinkClass{7, 20};
  Plan plan = PlanBuilder().p;
  plan.dims.h = plan.dims.hl = 256;  // tp = 1
  plan.dims.qkvl = 3 * plan.dims.hl;  // [q | k | v] of multi-head attention
  plan.dims.Scl = plan.dims.Sc;
  plan.dims.E = 8;
  plan.dims.cd = DType::bf16;
  Task t;
  t.stage = Stage::ln1_qkv;  // smallest dimension S_c = 64: half the bf16 peak
  t.flops = 1e12;
  EXPECT_DOUBLE_EQ(cost_seconds(t, plan, p, {}), 3e-6 + 1e12 / (100e12 * 64 / (64 + 64)));
  t.stage = Stage::gate;  // fp32 rates, smallest dimension E = 8
  EXPECT_DOUBLE_EQ(cost_seconds(t, plan, p, {}), 3e-6 + 1e12 / (10e12 * 8 / (8 + 16)));
  t.stage = Stage::attention;
  EXPECT_DOUBLE_EQ(cost_seconds(t, plan, p, {}), 3e-6 + 1e12 / 50e12);
  t.dir = Dir::bwd;
  EXPECT_DOUBLE_EQ(cost_seconds(t, plan, p, {}), 3e-6 + 1e12 / 40e12);
  t.stage = Stage::weighted_sum;
  t.bytes = 5e9;
  EXPECT_DOUBLE_EQ(cost_seconds(t, plan, p, {}), 3e-6 + 5e9 / 1e9);
  // An all-to-all over ep = 2 sends half its bytes off the rank, with no task overhead.
  t.stage = CommStage::dispatch;
  t.lane = Lane::ep;
  t.collective = CollectiveSpec{CollKind::all_to_all, comm::GroupKind::ep, {}, {}, 4e9};
  EXPECT_DOUBLE_EQ(cost_seconds(t, plan, p, {}), 7e-6 + 2e9 / 20e9);
  plan.dims.ep = 4;
  EXPECT_DOUBLE_EQ(cost_seconds(t, plan, p, {}), 7e-6 + 3e9 / 20e9);
  SimOptions spans;
  spans.ep_spans_nodes = true;  // the inter link class
  EXPECT_DOUBLE_EQ(cost_seconds(t, plan, p, spans), 0 + 3e9 / 1e9);
  EXPECT_DOUBLE_EQ(collective_seconds(CollKind::all_reduce, 4e9, 4, LinkClass{0, 1}), 6.0);
  EXPECT_DOUBLE_EQ(collective_seconds(CollKind::all_gather, 4, 4, LinkClass{1, 1}), 1e-6 + 12 / 1e9);
}

TEST(SimCost, AMissingLinkClassIsAConfigError) {
  Profile p = unit_profile();
  p.links.erase("inter");
  EXPECT_EQ(p.link_name(true), "intra");  // a one-node profile: inter falls back to intra
  p.links.clear();
  try {
    p.link(false);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("field links.intra is missing"), std::string::npos) << e.what();
  }
}

// ---- hand-made Plans ----

TEST(Simulator, ChainOfComputeTakesTheSum) {  // (a)
  PlanBuilder b;
  const uint32_t a = b.compute(1.5);
  b.compute(2.25, {a});
  const SimResult r = simulate({b.p}, unit_profile());
  EXPECT_DOUBLE_EQ(r.step_s, 3.75);
  EXPECT_DOUBLE_EQ(r.compute_s, 3.75);
  EXPECT_EQ(r.comm_s, 0);
  EXPECT_EQ(r.exposed_s, 0);
  EXPECT_EQ(r.hidden_fraction, 0);
  EXPECT_DOUBLE_EQ(r.lane_busy_s.at("compute"), 3.75);
}

TEST(Simulator, IndependentComputeAndCollectiveOverlap) {  // (b)
  for (double coll : {2.0, 5.0}) {
    PlanBuilder b;
    b.collective(coll);
    b.compute(3);
    const SimResult r = simulate({b.p}, unit_profile());
    EXPECT_DOUBLE_EQ(r.step_s, std::max(3.0, coll));
    EXPECT_DOUBLE_EQ(r.compute_s, 3);
    EXPECT_DOUBLE_EQ(r.comm_s, coll);
    // The compute lane waits for the collective at the end of the phase (the executor waits for every collective
    // of a direction): that wait is exposed.
    EXPECT_DOUBLE_EQ(r.exposed_s, std::max(0.0, coll - 3));
    EXPECT_DOUBLE_EQ(r.hidden_fraction, (3 + coll - r.step_s) / std::min(3.0, coll));
    EXPECT_DOUBLE_EQ(r.lane_busy_s.at("ep"), coll);
  }
}

TEST(Simulator, CollectivesSharingALinkClassSerialise) {  // (c)
  PlanBuilder b;
  b.collective(1, Lane::ep);
  b.collective(2, Lane::cp);
  SimOptions o;
  o.cp_size = 2;
  // Both lanes on the intra link: one after the other, in issue order.
  SimResult r = simulate({b.p}, unit_profile(), o);
  EXPECT_DOUBLE_EQ(r.step_s, 3);
  EXPECT_DOUBLE_EQ(find(r, "L0.fwd.dispatch.c1")->start_s, 1);
  EXPECT_DOUBLE_EQ(find(r, "L0.fwd.dispatch.c1")->issue_s, 0);
  // The CP ring spans nodes: it uses the inter link and overlaps the EP all-to-all.
  o.cp_spans_nodes = true;
  r = simulate({b.p}, unit_profile(), o);
  EXPECT_DOUBLE_EQ(r.step_s, 2);
  EXPECT_EQ(find(r, "L0.fwd.dispatch.c1")->link, "inter");
  // ... unless the profile has no inter class: then it falls back to intra and serialises again.
  Profile one_node = unit_profile();
  one_node.links.erase("inter");
  r = simulate({b.p}, one_node, o);
  EXPECT_DOUBLE_EQ(r.step_s, 3);
  // Two collectives on one lane are serialised by the lane even on different links.
  PlanBuilder same;
  same.collective(1, Lane::ep);
  same.collective(2, Lane::ep);
  o.ep_spans_nodes = false;
  r = simulate({same.p}, unit_profile(), o);
  EXPECT_DOUBLE_EQ(r.step_s, 3);
}

TEST(Simulator, ComputeCollectiveComputeChain) {  // (d)
  PlanBuilder b;
  const uint32_t a = b.compute(1);
  const uint32_t c = b.collective(2, Lane::ep, {a});
  b.compute(0.5, {c});
  const SimResult r = simulate({b.p}, unit_profile());
  EXPECT_DOUBLE_EQ(r.step_s, 3.5);
  EXPECT_DOUBLE_EQ(r.exposed_s, 2);
  EXPECT_DOUBLE_EQ(r.hidden_fraction, 0);
  const SimRecord* w = find(r, "wait:L0.fwd.dispatch.c1");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->lane, Lane::compute);
  EXPECT_EQ(w->cat, "wait");
  EXPECT_DOUBLE_EQ(w->start_s, 1);
  EXPECT_DOUBLE_EQ(w->end_s, 3);
  EXPECT_DOUBLE_EQ(find(r, "L0.fwd.residual_ln2.c2")->wait_s, 2);
  EXPECT_DOUBLE_EQ(find(r, "L0.fwd.residual_ln2.c2")->start_s, 3);
}

// Which communication a step waits for: a wait is charged to the collective while it runs and, before it started,
// to the collective it waited for (a combine behind its tp reduction), or to itself while queued behind its link.
TEST(Simulator, ExposedWaitsAreChargedToWhatHeldThemUp) {
  PlanBuilder b;
  const uint32_t a = b.compute(1);
  const uint32_t red = b.collective(2, Lane::etp, {a}, Dir::fwd, CommStage::tp_expert_out);
  const uint32_t comb = b.collective(1, Lane::ep, {red}, Dir::fwd, CommStage::combine);
  b.compute(0.5, {comb});
  SimResult r = simulate({b.p}, unit_profile());
  EXPECT_DOUBLE_EQ(r.step_s, 4.5);
  EXPECT_DOUBLE_EQ(r.exposed_s, 3);  // one wait record, for the combine, [1, 4)
  EXPECT_DOUBLE_EQ(find(r, "wait:L0.fwd.combine.c2")->start_s, 1);
  EXPECT_DOUBLE_EQ(r.exposed_by_stage_s.at("tp_expert_out"), 2);
  EXPECT_DOUBLE_EQ(r.exposed_by_stage_s.at("combine"), 1);
  EXPECT_DOUBLE_EQ(r.comm_by_stage_s.at("tp_expert_out"), 2);
  EXPECT_DOUBLE_EQ(r.comm_by_stage_s.at("combine"), 1);

  // Queued behind another lane's collective on the same link: charged to that collective while it held the link.
  PlanBuilder q;
  q.collective(2, Lane::ep, {}, Dir::fwd, CommStage::dispatch);
  const uint32_t ring = q.collective(1, Lane::cp, {}, Dir::fwd, CommStage::cp_ring);
  q.compute(1, {ring});
  SimOptions o;
  o.cp_size = 2;
  r = simulate({q.p}, unit_profile(), o);
  EXPECT_DOUBLE_EQ(r.exposed_s, 3);
  EXPECT_DOUBLE_EQ(r.exposed_by_stage_s.at("cp_ring"), 1);
  EXPECT_DOUBLE_EQ(r.exposed_by_stage_s.at("dispatch"), 2);
  double sum = 0;
  for (const auto& [stage, t] : r.exposed_by_stage_s) sum += t;
  EXPECT_DOUBLE_EQ(sum, r.exposed_s);
}

TEST(Simulator, SlowdownStretchesOverlappedCompute) {  // (g)
  Profile p = unit_profile();
  p.compute_slowdown_during_comm = 0.5;
  {  // a 4 s collective in flight from 0: the first 4 s of compute do 4/1.5 s of work
    PlanBuilder b;
    b.collective(4);
    b.compute(10);
    const SimResult r = simulate({b.p}, p);
    EXPECT_NEAR(r.step_s, 4 + (10 - 4 / 1.5), 1e-12);
    EXPECT_NEAR(r.compute_s, 4 + (10 - 4 / 1.5), 1e-12);
  }
  {  // a collective longer than the compute: all of it runs 1.5 times slower
    PlanBuilder b;
    b.collective(20);
    b.compute(10);
    const SimResult r = simulate({b.p}, p);
    EXPECT_NEAR(r.compute_s, 15, 1e-12);
    EXPECT_NEAR(r.step_s, 20, 1e-12);
  }
  {  // not overlapped: no slowdown
    PlanBuilder b;
    const uint32_t a = b.compute(10);
    b.collective(4, Lane::ep, {a});
    const SimResult r = simulate({b.p}, p);
    EXPECT_DOUBLE_EQ(r.compute_s, 10);
    EXPECT_DOUBLE_EQ(r.step_s, 14);
  }
}

// The step Plan of a 2-layer model (hand-made layer Plans: a 1 s forward with a 0.5 s all-to-all after it, a 1 s
// backward), two micro-batches, layer 0 recomputed, dp 2 (ep 2: the expert buckets' group has one rank), costed by
// hand: T = h = V = 1000 (T h = T V = 1e6, T h V = 1e9) at 1 TFLOP/s and 1 GB/s.
//   embedding.fwd 12 T h B = .012   head.fwd 2 T h V F + (8 T h + 8 T V) B = .002 + .016   head.bwd .004 + .020
//   embedding.bwd 20 T h B = .020   grad_pack 2 x bucket bytes   all-reduce over 2 ranks: the bucket's bytes
//   grad_finish 12 B per parameter (1e6: .012)   optimizer 28 B per parameter (.028)
// Layer buckets 0.25e9 B (pack 0.5 s, all-reduce 0.25 s), the embedding's 0.5e9 B (pack 1 s, all-reduce 0.5 s).
TEST(Simulator, StepPlanOverlapsEachLayersGradientReductionWithTheBackwardBelow) {
  StepConfig c;
  c.layers = {fwd_comm_bwd_layer(0, 1), fwd_comm_bwd_layer(1, 1)};
  c.micro_batches = 2;
  c.recompute = {true, false};
  c.tokens = c.hidden = c.head_vocab = 1000;
  c.layer_dense_bytes = {0.25e9, 0.25e9};
  c.layer_expert_bytes = {1e9, 1e9};  // over a one-rank group: not reduced
  c.outer_dense_bytes = 0.5e9;
  c.dense_group_size = 2;
  c.expert_group_size = 1;
  c.params = 1e6;
  const StepPlan step = build_step_plan(c);
  Profile p = unit_profile();
  p.fp32 = ComputeRates{1, 0, 1, 1};  // 1 TFLOP/s at any GEMM size
  SimOptions o;
  o.dp_size = 2;
  const SimResult r = simulate(step, p, o);
  // mb0: .012 + (1 + .5) + (1 + .5) + .018 + .024 + 1 + (1 + .5) + 1 + .020 = 6.574
  // mb1: .012 + 1.5 + 1.5 + .018 + .024 + L1.bwd 1 (10.628), pack L1 .5 (11.128, its all-reduce to 11.378 under
  //      the replay of L0), replay 1 + .5 (12.628), L0.bwd 1 (13.628), pack L0 .5 (14.128, all-reduce to 14.378
  //      under embedding.bwd and the embedding's pack), embedding.bwd .020 (14.148), pack 1 (15.148), its
  //      all-reduce .5 (15.648) waited for by grad_finish .012 (15.660), optimizer .028
  EXPECT_NEAR(r.step_s, 15.688, 1e-9);
  EXPECT_NEAR(r.exposed_s, 6 * 0.5 + 0.5, 1e-9);  // the six layer all-to-alls and the last bucket
  EXPECT_NEAR(r.lane_busy_s.at("dp"), 0.25 + 0.25 + 0.5, 1e-9);
  const SimRecord* l1 = find(r, "grad_reduce.dense.L1");
  const SimRecord* l0 = find(r, "grad_reduce.dense.L0");
  const SimRecord* outer = find(r, "grad_reduce.dense.outer");
  ASSERT_NE(l1, nullptr);
  ASSERT_NE(l0, nullptr);
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(find(r, "grad_reduce.expert.L0"), nullptr);
  EXPECT_NEAR(l1->start_s, 11.128, 1e-9);
  EXPECT_NEAR(l0->start_s, 14.128, 1e-9);
  EXPECT_NEAR(outer->start_s, 15.148, 1e-9);
  EXPECT_EQ(l1->cat, "all_reduce");
  EXPECT_EQ(l1->stage, "dp_allreduce");
  EXPECT_NEAR(r.exposed_by_stage_s.at("dp_allreduce"), 0.5, 1e-9);
  EXPECT_EQ(find(r, "wait:grad_reduce.dense.L1"), nullptr);  // hidden
  EXPECT_NE(find(r, "wait:grad_reduce.dense.outer"), nullptr);
  // the replay of layer 0 in each micro-batch, before its backward
  EXPECT_NE(find(r, "recompute:mb1.L0.fwd.residual_ln2.c0"), nullptr);
  const SimRecord* opt = find(r, "optimizer");
  ASSERT_NE(opt, nullptr);
  EXPECT_NEAR(opt->end_s, 15.688, 1e-9);
}

// The distributed optimizer on the step above (dp 2): the reductions are reduce-scatters and the updated halves are
// all-gathered after the optimizer (each layer bucket's .125e9 B, the embedding's .25e9 B), then unpacked.
// With --overlap-param-gather the layers' gathers open the step instead and each layer waits for its own before its
// first forward: L0's right after the embedding's forward, L1's under L0's forward; the outer one stays at the end.
TEST(Simulator, OverlapParamGatherHidesTheLayersGathersUnderTheForward) {
  StepConfig c;
  c.layers = {fwd_comm_bwd_layer(0, 1), fwd_comm_bwd_layer(1, 1)};
  c.micro_batches = 2;
  c.tokens = c.hidden = c.head_vocab = 1000;
  c.layer_dense_bytes = {0.25e9, 0.25e9};
  c.outer_dense_bytes = 0.5e9;
  c.dense_group_size = 2;
  c.params = 1e6;
  c.distributed_optimizer = true;
  c.optimizer_params = 0.5e6;
  Profile p = unit_profile();
  p.fp32 = ComputeRates{1, 0, 1, 1};
  SimOptions o;
  o.dp_size = 2;
  const SimResult plain = simulate(build_step_plan(c), p, o);
  c.overlap_param_gather = true;
  const SimResult r = simulate(build_step_plan(c), p, o);
  for (const char* name : {"param_gather.dense.L0", "param_gather.dense.L1", "param_gather.dense.outer"}) {
    const SimRecord* a = find(plain, name);
    const SimRecord* b = find(r, name);
    ASSERT_NE(a, nullptr) << name;
    ASSERT_NE(b, nullptr) << name;
    EXPECT_NEAR(b->end_s - b->start_s, a->end_s - a->start_s, 1e-12) << name;  // the same gather, elsewhere
  }
  const double g = find(r, "param_gather.dense.L0")->end_s - find(r, "param_gather.dense.L0")->start_s;
  EXPECT_NEAR(find(r, "param_gather.dense.L0")->start_s, 0, 1e-12);
  EXPECT_NEAR(find(r, "param_gather.dense.L1")->start_s, g, 1e-12);  // the dp lane: one after the other
  // L0 waits for its gather after the embedding (.012 s), L1's is done under L0's forward (1 s)
  const SimRecord* u0 = find(r, "param_unpack.L0");
  const SimRecord* u1 = find(r, "param_unpack.L1");
  ASSERT_NE(u0, nullptr);
  ASSERT_NE(u1, nullptr);
  EXPECT_NEAR(u0->start_s, g, 1e-12);
  EXPECT_EQ(find(r, "wait:param_gather.dense.L1"), nullptr);
  // the step is shorter by what the layers' gathers and their unpacks cost after the optimizer, less what L0's
  // gather still holds up before its forward (g - .012)
  const double unpack_layers = 2 * 8 * 0.25e9 / 4 / 1e9;  // 8 bytes per parameter, 1 GB/s
  EXPECT_NEAR(plain.step_s - r.step_s, 2 * g - (g - 0.012), 1e-9);
  EXPECT_NEAR(u0->end_s - u0->start_s + u1->end_s - u1->start_s, unpack_layers, 1e-12);
}

TEST(Simulator, LayersRunForwardThenBackwardInReverse) {
  const SimResult r = simulate({fwd_comm_bwd_layer(0, 1), fwd_comm_bwd_layer(1, 1)}, unit_profile());
  std::vector<std::string> compute_order;
  for (const auto& x : r.timeline)
    if (x.lane == Lane::compute && x.cat == "compute") compute_order.push_back(x.name);
  EXPECT_EQ(compute_order, (std::vector<std::string>{"L0.fwd.residual_ln2.c0", "L1.fwd.residual_ln2.c0",
                                                     "L1.bwd.residual_ln2.c2", "L0.bwd.residual_ln2.c2"}));
  // Each layer's forward ends by waiting for its collective (0.5 s exposed each).
  EXPECT_DOUBLE_EQ(r.step_s, 1 + 0.5 + 1 + 0.5 + 1 + 1);
  EXPECT_DOUBLE_EQ(r.exposed_s, 0.5 + 0.5);
}

TEST(Simulator, RecomputedLayerReplaysItsForwardBeforeItsBackward) {
  SimOptions o;
  o.recompute = {true, false};  // layer 0 only
  const SimResult r = simulate({fwd_comm_bwd_layer(0, 2), fwd_comm_bwd_layer(1, 2)}, unit_profile(), o);
  std::vector<std::string> compute_order;
  for (const auto& x : r.timeline)
    if (x.lane == Lane::compute && x.cat == "compute") compute_order.push_back(x.name);
  EXPECT_EQ(compute_order,
            (std::vector<std::string>{"L0.fwd.residual_ln2.c0", "L1.fwd.residual_ln2.c0", "L1.bwd.residual_ln2.c2",
                                      "recompute:L0.fwd.residual_ln2.c0", "L0.bwd.residual_ln2.c2"}));
  // three forwards of 1 s, each followed by its exposed 0.5 s collective, and two backwards of 2 s
  EXPECT_DOUBLE_EQ(r.step_s, 3 * 1.5 + 2 * 2);
  EXPECT_DOUBLE_EQ(r.compute_s, 3 * 1 + 2 * 2);
  EXPECT_NE(find(r, "recompute:L0.fwd.dispatch.c1"), nullptr);
}

// ---- real Plans ----

TEST(Simulator, DegreeOneWithFreeCommunicationIsTheSumOfComputeCosts) {  // (e)
  Profile p = slow_link_profile();
  p.links["intra"] = LinkClass{0, 1e12};
  for (bool bf16 : {false, true}) {
    model::LayerConfig cfg = small_config(1);
    cfg.bf16 = bf16;
    std::vector<Plan> plans;
    for (int i = 0; i < 2; ++i) {
      cfg.layer_index = i;
      plans.push_back(build_layer_plan(cfg, 1));
    }
    // The compute tasks run one after another: forward of layers 0, 1, then backward of 1, 0.
    double sum = 0;
    for (int i = 0; i < 2; ++i)
      for (const Task& t : plans[size_t(i)].tasks)
        if (!t.is_collective() && t.dir == Dir::fwd) sum += cost_seconds(t, plans[size_t(i)], p, {});
    for (int i = 1; i >= 0; --i)
      for (const Task& t : plans[size_t(i)].tasks)
        if (!t.is_collective() && t.dir == Dir::bwd) sum += cost_seconds(t, plans[size_t(i)], p, {});
    const SimResult r = simulate(plans, p);
    EXPECT_DOUBLE_EQ(r.step_s, sum);
    EXPECT_DOUBLE_EQ(r.compute_s, sum);
    EXPECT_EQ(r.exposed_s, 0);
    EXPECT_GT(sum, 0);
  }
}

TEST(Simulator, HigherDegreeHidesMoreOfASlowLink) {  // (f)
  const Profile p = slow_link_profile();
  const model::LayerConfig cfg = small_config(2);
  const SimResult r1 = simulate({build_layer_plan(cfg, 1)}, p);
  const SimResult r2 = simulate({build_layer_plan(cfg, 2)}, p);
  EXPECT_GT(r1.exposed_s, 0);
  EXPECT_LT(r2.exposed_s, r1.exposed_s) << "degree 1 " << r1.exposed_s << " s, degree 2 " << r2.exposed_s << " s";
  EXPECT_LT(r2.step_s, r1.step_s) << "degree 1 " << r1.step_s << " s, degree 2 " << r2.step_s << " s";
  EXPECT_GT(r2.hidden_fraction, r1.hidden_fraction);
  // Bookkeeping: the compute lane is either busy or waiting for a collective.
  EXPECT_NEAR(r1.step_s, r1.compute_s + r1.exposed_s, 1e-12);
  EXPECT_NEAR(r2.step_s, r2.compute_s + r2.exposed_s, 1e-12);
  // Degree 1 hides the all-to-alls of the forward not at all; what it hides is the backward's last dispatch,
  // behind expert_wgrad.
  const SimRecord* wgrad = find(r1, "L0.bwd.expert_wgrad");
  const SimRecord* last_dispatch = find(r1, "L0.bwd.dispatch.c0");
  ASSERT_NE(wgrad, nullptr);
  ASSERT_NE(last_dispatch, nullptr);
  EXPECT_LT(last_dispatch->start_s, wgrad->end_s);
  double a2a = 0;
  for (const auto& x : r1.timeline)
    if (x.cat == "all_to_all") a2a += x.end_s - x.start_s;
  EXPECT_DOUBLE_EQ(r1.comm_s, a2a);
  EXPECT_NEAR(r1.exposed_s, a2a - (std::min(wgrad->end_s, last_dispatch->end_s) - last_dispatch->start_s), 1e-12);
}

TEST(Simulator, ChromeTraceHasLanesTasksAndWaits) {
  PlanBuilder b;
  const uint32_t a = b.compute(1);
  const uint32_t c = b.collective(2, Lane::ep, {a});
  b.compute(0.5, {c});
  const SimResult r = simulate({b.p}, unit_profile());
  const std::string path = temp_path("trace.json");
  write_chrome_trace(r, path);
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f);
  std::filesystem::remove(path);
  int tasks = 0, threads = 0;
  bool saw_wait = false;
  for (const auto& e : j.at("traceEvents")) {
    if (e["ph"] == "M" && e["name"] == "thread_name") ++threads;
    if (e["ph"] != "X") continue;
    ++tasks;
    EXPECT_EQ(e["pid"], 0);
    if (e["name"] == "wait:L0.fwd.dispatch.c1") {
      saw_wait = true;
      EXPECT_EQ(e["tid"], 0);
      EXPECT_EQ(e["cat"], "wait");
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1e6);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2e6);
    }
    if (e["name"] == "L0.fwd.dispatch.c1") {
      EXPECT_EQ(e["tid"], comm::lane_index(Lane::ep));
    }
  }
  EXPECT_EQ(threads, comm::kNumLanes);
  EXPECT_EQ(tasks, 4);
  EXPECT_TRUE(saw_wait);
  EXPECT_EQ(j.at("displayTimeUnit"), "ms");
}

// ---- profiles ----

// --compute-efficiency: every compute rate times the factor; GEMM shape, links, latencies and overheads unchanged.
TEST(Profile, ScaleComputeScalesEveryComputeRateOnly) {
  Profile p = unit_profile();
  p.bf16 = ComputeRates{100, 256, 80, 60};
  p.fp32 = ComputeRates{25, 128, 20, 15};
  p.elementwise_gbps = 1000;
  p.task_overhead_us = 5;
  p.links["inter"] = LinkClass{11.5, 17.5};
  const Profile q = scale_compute(p, 0.5);
  EXPECT_DOUBLE_EQ(q.bf16.gemm_peak_tflops, 50);
  EXPECT_DOUBLE_EQ(q.bf16.attention_fwd_tflops, 40);
  EXPECT_DOUBLE_EQ(q.bf16.attention_bwd_tflops, 30);
  EXPECT_DOUBLE_EQ(q.fp32.gemm_peak_tflops, 12.5);
  EXPECT_DOUBLE_EQ(q.fp32.attention_fwd_tflops, 10);
  EXPECT_DOUBLE_EQ(q.fp32.attention_bwd_tflops, 7.5);
  EXPECT_DOUBLE_EQ(q.elementwise_gbps, 500);
  EXPECT_DOUBLE_EQ(q.bf16.gemm_half_rate_dim, 256);
  EXPECT_DOUBLE_EQ(q.fp32.gemm_half_rate_dim, 128);
  EXPECT_DOUBLE_EQ(q.task_overhead_us, 5);
  EXPECT_DOUBLE_EQ(q.links.at("inter").gbps, 17.5);
  EXPECT_DOUBLE_EQ(q.links.at("inter").latency_us, 11.5);
}

TEST(Profile, LoadsIgnoresUnknownKeysAndRoundTrips) {
  const std::string path = temp_path("good.json");
  write_text(path, kGoodProfile);
  const Profile p = load_profile(path);
  EXPECT_EQ(p.name, "test");
  EXPECT_EQ(p.devices_per_node, 8);
  EXPECT_EQ(p.bf16.gemm_peak_tflops, 250);
  EXPECT_EQ(p.fp32.attention_bwd_tflops, 30);
  EXPECT_EQ(p.compute_slowdown_during_comm, 0.1);
  EXPECT_EQ(p.link(true).gbps, 17.5);
  EXPECT_EQ(p.link(false).latency_us, 5);
  const std::string out = temp_path("saved.json");
  Profile q = p;
  q.bf16.gemm_half_rate_dim = 1.0 / 3;  // not a short decimal: the round trip must be exact
  save_profile(q, out);
  const Profile back = load_profile(out);
  EXPECT_EQ(back.name, q.name);
  EXPECT_EQ(back.source, q.source);
  EXPECT_EQ(back.devices_per_node, q.devices_per_node);
  EXPECT_EQ(back.bf16.gemm_half_rate_dim, q.bf16.gemm_half_rate_dim);
  EXPECT_EQ(back.bf16.attention_fwd_tflops, q.bf16.attention_fwd_tflops);
  EXPECT_EQ(back.fp32.gemm_peak_tflops, q.fp32.gemm_peak_tflops);
  EXPECT_EQ(back.elementwise_gbps, q.elementwise_gbps);
  EXPECT_EQ(back.task_overhead_us, q.task_overhead_us);
  EXPECT_EQ(back.compute_slowdown_during_comm, q.compute_slowdown_during_comm);
  ASSERT_EQ(back.links.size(), 2u);
  EXPECT_EQ(back.links.at("inter").latency_us, 20);
  EXPECT_EQ(back.links.at("intra").gbps, 130);
  // The optional parts: no slowdown, no inter link, fp32 from bf16 and a ratio.
  std::string lean = replace(kGoodProfile, R"("compute_slowdown_during_comm": 0.1,)", "");
  lean = replace(lean, R"(, "inter": {"latency_us": 20.0, "gbps": 17.5})", "");
  lean = replace(lean, R"("fp32": {"gemm_peak_tflops": 60.0, "gemm_half_rate_dim": 128, "attention_fwd_tflops": 40.0,
             "attention_bwd_tflops": 30.0})", R"("fp32_over_bf16": 0.25)");
  write_text(path, lean);
  const Profile l = load_profile(path);
  EXPECT_EQ(l.compute_slowdown_during_comm, 0);
  EXPECT_EQ(l.links.count("inter"), 0u);
  EXPECT_EQ(&l.link(true), &l.link(false));
  EXPECT_EQ(l.fp32.gemm_peak_tflops, 62.5);
  EXPECT_EQ(l.fp32.attention_fwd_tflops, 45);
  EXPECT_EQ(l.fp32.gemm_half_rate_dim, 256);
  EXPECT_EQ(l.device_memory_gib, 0);  // not given: memory is not checked
  EXPECT_EQ(l.memory_reserve_gib, 0);
  // The device memory and the framework's reserve round-trip.
  Profile mem = l;
  mem.device_memory_gib = 64;
  mem.memory_reserve_gib = 2.98;
  save_profile(mem, out);
  const Profile mb = load_profile(out);
  EXPECT_EQ(mb.device_memory_gib, 64);
  EXPECT_EQ(mb.memory_reserve_gib, 2.98);
  std::filesystem::remove(path);
  std::filesystem::remove(out);
}

TEST(Profile, BadProfilesNameTheFileAndTheField) {  // (h)
  try {
    load_profile("/nonexistent/ampipe/profile.json");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--profile /nonexistent/ampipe/profile.json: cannot be read");
  }
  try {
    load_profile("/tmp", "--sim-profile");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--sim-profile /tmp: cannot be read");
  }
  EXPECT_NE(load_error("{\"name\": ", "bad.json").find(": not valid JSON: "), std::string::npos);
  EXPECT_NE(load_error("[1, 2]", "array.json").find(": not valid JSON: "), std::string::npos);
  std::string m = load_error(replace(kGoodProfile, R"("elementwise_gbps": 1300.0,)", ""), "missing.json");
  EXPECT_NE(m.find(": field elementwise_gbps is missing"), std::string::npos) << m;
  m = load_error(replace(kGoodProfile, R"("gemm_half_rate_dim": 256, )", ""), "missing_nested.json");
  EXPECT_NE(m.find(": field compute.bf16.gemm_half_rate_dim is missing"), std::string::npos) << m;
  m = load_error(replace(kGoodProfile, R"("gbps": 130.0)", R"("gbps": -3)"), "negative.json");
  EXPECT_NE(m.find(": field links.intra.gbps is -3: it must be a positive number"), std::string::npos) << m;
  m = load_error(replace(kGoodProfile, R"("task_overhead_us": 20.0)", R"("task_overhead_us": 0)"), "zero.json");
  EXPECT_NE(m.find(": field task_overhead_us is 0: it must be a positive number"), std::string::npos) << m;
  m = load_error(replace(kGoodProfile, R"("attention_bwd_tflops": 30.0)", R"("attention_bwd_tflops": "fast")"),
                 "string.json");
  EXPECT_NE(m.find(": field compute.fp32.attention_bwd_tflops is \"fast\": it must be a positive number"),
            std::string::npos)
      << m;
  m = load_error(replace(kGoodProfile, R"("compute_slowdown_during_comm": 0.1)",
                         R"("compute_slowdown_during_comm": -0.1)"),
                 "slowdown.json");
  EXPECT_NE(m.find(": field compute_slowdown_during_comm is -0.1: it must be a number >= 0"), std::string::npos) << m;
  m = load_error(replace(kGoodProfile, R"("devices_per_node": 8)", R"("devices_per_node": 2.5)"), "dpn.json");
  EXPECT_NE(m.find(": field devices_per_node is 2.5: it must be a positive integer"), std::string::npos) << m;
  // JSON has no infinity: an overflowing number is refused by the parser.
  m = load_error(replace(kGoodProfile, R"("elementwise_gbps": 1300.0)", R"("elementwise_gbps": 1e999)"),
                 "inf.json");
  EXPECT_NE(m.find(": not valid JSON: "), std::string::npos) << m;
  m = load_error(replace(kGoodProfile, R"({"latency_us": 5.0, "gbps": 130.0})", "7"), "link_number.json");
  EXPECT_NE(m.find(": field links.intra is 7: it must be an object"), std::string::npos) << m;
  std::string no_fp32 = replace(kGoodProfile, R"("fp32": {"gemm_peak_tflops": 60.0, "gemm_half_rate_dim": 128,)",
                                R"("other": {"gemm_peak_tflops": 60.0, "gemm_half_rate_dim": 128,)");
  m = load_error(no_fp32, "no_fp32.json");
  EXPECT_NE(m.find(": field compute.fp32 is missing"), std::string::npos) << m;
  m = load_error(replace(kGoodProfile, R"("devices_per_node": 8)", R"("devices_per_node": 8, "device_memory_gib": 0)"),
                 "memory.json");
  EXPECT_NE(m.find(": field device_memory_gib is 0: it must be a positive number"), std::string::npos) << m;
  m = load_error(replace(kGoodProfile, R"("devices_per_node": 8)",
                         R"("devices_per_node": 8, "device_memory_gib": 4, "memory_reserve_gib": 4)"),
                 "reserve.json");
  EXPECT_NE(m.find(": field memory_reserve_gib is 4: it must be less than device_memory_gib 4"), std::string::npos)
      << m;
}

TEST(Profile, ShippedProfilesLoad) {
  const auto root = std::filesystem::path(AMPIPE_SOURCE_DIR) / "profiles";
  for (const char* name : {"atlas-800t-a2-910b2.json", "h100-sxm.json"}) {
    const Profile p = load_profile((root / name).string());
    EXPECT_EQ(p.devices_per_node, 8) << name;
    EXPECT_EQ(p.links.count("intra"), 1u) << name;
    EXPECT_EQ(p.links.count("inter"), 1u) << name;
    EXPECT_GT(p.bf16.gemm_peak_tflops, p.fp32.gemm_peak_tflops) << name;
    EXPECT_FALSE(p.source.empty()) << name;
    EXPECT_GT(p.device_memory_gib, p.memory_reserve_gib) << name;
    EXPECT_GT(p.memory_reserve_gib, 0) << name;
    // A real Plan runs on it.
    model::LayerConfig cfg = small_config(2);
    cfg.bf16 = true;
    SimOptions o;
    o.ep_spans_nodes = true;
    const SimResult r = simulate({build_layer_plan(cfg, 2)}, p, o);
    EXPECT_GT(r.step_s, 0) << name;
  }
}

// A layer of the seed's kind (scaled down) on the shipped 910B2 profile, EP across nodes: AMPipe hides part of
// the all-to-all, so degree 2 and 4 beat degree 1, and degree 1 exposes every forward all-to-all.
TEST(Profile, ShippedProfilePredictsAnAMPipeGain) {
  const auto root = std::filesystem::path(AMPIPE_SOURCE_DIR) / "profiles";
  const Profile p = load_profile((root / "atlas-800t-a2-910b2.json").string());
  model::LayerConfig cfg;
  cfg.seq_length = 8192;
  cfg.hidden_size = 4096;
  cfg.ffn_hidden_size = 16384;
  cfg.num_attention_heads = 32;
  cfg.num_experts = 4;
  cfg.moe_router_topk = 2;
  cfg.moe_train_capacity_factor = 1.1;
  cfg.expert_model_parallel_size = 2;
  cfg.bf16 = true;
  SimOptions o;
  o.ep_spans_nodes = true;
  double step1 = 0;
  for (int M : {1, 2, 4, 8}) {
    const SimResult r = simulate({build_layer_plan(cfg, M)}, p, o);
    std::printf("degree %d: step %.3f ms, compute %.3f ms, comm %.3f ms, exposed %.3f ms, hidden %.2f\n", M,
                r.step_s * 1e3, r.compute_s * 1e3, r.comm_s * 1e3, r.exposed_s * 1e3, r.hidden_fraction);
    if (M == 1) {
      step1 = r.step_s;
    } else {
      EXPECT_LT(r.step_s, step1) << "degree " << M;
    }
  }
}

// A dropless router is costed at a balanced load: every expert ceil(S_c k / E) of a chunk's S_c tokens, by hand
// s 64, b 1, degree 2 -> S_c 32, k 2, E 4 -> 16 per expert (the Plan's own bound is every token: 32). DeepSpeed's
// gate with --moe-no-drop gets the same; a layer with a capacity is costed as it is.
TEST(Simulator, DroplessRoutersAreCostedAtABalancedLoad) {
  model::LayerConfig mega = small_config(2);
  mega.moe_router = model::Router::megatron;
  ASSERT_TRUE(mega.dropless());
  EXPECT_EQ(model::LayerDims::make(mega, 2).C, 32);
  EXPECT_EQ(model::LayerDims::make(costed_layer(mega), 2).C, 16);

  model::LayerConfig ds = small_config(2);
  ds.moe_no_drop = true;
  EXPECT_EQ(model::LayerDims::make(costed_layer(ds), 2).C, 16);

  model::LayerConfig capped = small_config(2);  // DeepSpeed's gate, factor 2: ceil(32 * 2 * 2 / 4) = 32, kept
  capped.moe_train_capacity_factor = 2.0;
  EXPECT_EQ(model::LayerDims::make(costed_layer(capped), 2).C, 32);
}

// Two pipeline stages of one layer each (forward 1 s of compute and a 0.5 s all-to-all it waits for, backward 1 s),
// an activation of 0.25 GB (0.25 s on the unit link), 2 micro-batches, by hand: each stage's micro-batch alone gives
// forward 1.5 and backward 1 (stage 1's forward counted from its received activation); the 1F1B timeline is
//   stage 0: F0 [0, 1.5) F1 [1.5, 3) B0 [4.5, 5.5) B1 [7, 8)
//   stage 1: F0 [1.75, 3.25) B0 [3.25, 4.25) F1 [4.25, 5.75) B1 [5.75, 6.75)
// so the step is 8 s and the stages idle 6 of 16 s.
TEST(Simulator, PipelineStagesTimelineByHand) {
  std::vector<StepPlan> stages;
  for (int q = 0; q < 2; ++q) {
    StepConfig c;
    c.layers = {fwd_comm_bwd_layer(0, 1)};
    c.model = false;
    c.pp_size = 2;
    c.pp_rank = q;
    c.pp_bytes = 0.25e9;
    stages.push_back(build_step_plan(c));
  }
  const PipelineSim ps = simulate_pipeline(stages, 2, unit_profile());
  EXPECT_NEAR(ps.send_s, 0.25, 1e-12);
  for (int q = 0; q < 2; ++q) {
    EXPECT_NEAR(ps.fwd_s[size_t(q)], 1.5, 1e-9) << "stage " << q;
    EXPECT_NEAR(ps.bwd_s[size_t(q)], 1.0, 1e-9) << "stage " << q;
    EXPECT_NEAR(ps.tail_s[size_t(q)], 0.0, 1e-9) << "stage " << q;
  }
  EXPECT_NEAR(ps.step_s, 8.0, 1e-9);
  EXPECT_NEAR(ps.bubble, 6.0 / 16.0, 1e-9);
  ASSERT_EQ(ps.timeline.size(), 8u);
  EXPECT_NEAR(ps.timeline[3].start, 7.0, 1e-9);  // stage 0's B1, after stage 1's B1 and its send
}
