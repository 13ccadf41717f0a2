// `ampipe simulate`: one training iteration of `ampipe train`'s configuration, predicted on a hardware profile by
// sim::simulate, for every AMPipe degree asked for; the fastest is chosen.
//
// Notation: s sequence, b micro-batch, T = s*b, h hidden, F FFN hidden, n heads, E experts, k top-k, ep, dp,
// L_loc = E/ep local experts, V vocabulary, num_layers blocks, M AMPipe degree, W world size (devices), K nodes.
//
// Flags: every flag of `ampipe train` (TrainFlags, --config FILE included) with the same meaning and the same rules
// (TrainConfig::validate for W devices), except that --ampipe-degree takes a comma list or `auto` (every degree of
// {1, 2, 4, 8, 16} that divides s, each with the settings auto_settings weighs) and --trace writes the predicted
// timeline. Flags that do not change the
// iteration's time (--data-path, --save, --load, --train-iters, ...) are checked as train checks them and otherwise
// not used: simulate reads no data, so the vocabulary is the tokenizer's (--tokenizer-type with its files, as train
// reads it; --vocab-size stands in when they cannot be read here), else --vocab-size (default 256, the bundled
// corpus's bytes), padded as train pads it (--make-vocab-size-divisible-by x tp, or --padded-vocab-size:
// train/vocab_size.h), V below.
// Degrees that the rules refuse (e.g. > 1 without --use-flash-attn, or the pipe-experts rules) are skipped with
// their reason; rules that no degree can satisfy fail the command.
//
// The iteration (what Megatron's TFLOP/s divides by), per device: the step Plan of the model
// (schedule/model_step.h: parameters by closed form, the vocabulary split over tp as Megatron's head) costed by
// sim::simulate, the same step Plan structure the trainer runs (schedule/step_plan.h):
//   micro-batches  nmb = global batch / (b * dp); each runs the embedding, the layers' Plans (forward of layers
//                  0..num_layers-1, backward in reverse, replays before the recomputed ones), the LM head and loss
//   gradients      each layer's buckets (dense over dp x cp, expert over dp x cp / ep) packed and all-reduced on
//                  the dp lane right after that layer's backward in the last micro-batch, under the layers below;
//                  the embedding's and head's after the last embedding backward; then grad_finish and AdamW
//   costs          the step tasks' closed forms (docs/plan.md): LM head GEMMs 2*T*h*V forward, 4*T*h*V backward at
//                  the fp32 rate, element-wise bytes at elementwise_gbps; RoPE (not in the engine's layer Plans yet)
//                  added per micro-batch
// Memory per device (cli/device_memory.h): every stage's peak from the trainer's own estimate plus the profile's
// framework reserve, against its device memory; the fastest degree that fits is chosen, auto skips the others and
// refuses when none fits, naming the setting that would (docs/simulator.md, "Memory per device").
// Link classes: the EP group spans nodes iff K > 1 and ep > W/K (EP groups are ep consecutive data-parallel ranks,
// comm/layout.h); the data-parallel all-reduce spans nodes iff K > 1.
//
// Reported per degree: the iteration time, compute (compute tasks, LM head, optimizer), comm (collectives alone),
// exposed (compute lane waiting for communication), hidden fraction (compute + comm - iteration) / min(compute,
// comm), and TFLOP/s per device two ways:
//   engine    the FLOPs this engine counts: nmb * (sum of Plan::flops() of the layers + 6*T*h*V) / iteration
//   Megatron  core_r0.7.0's formula (training.py, num_floating_point_operations), which the seed's table uses:
//             F = 12*B*s*num_layers*h^2 * [(1 + g/n + s/h)*(q/h) + (F/h)*k*(3/2 with SwiGLU) + V_pad/(2*num_layers*h)]
//             with B the global batch, g/n the K, V heads' share (1 without grouped queries), q = h, V_pad = V
//             (Megatron's padded_vocab_size, the head's V above); printed F / (iteration * 1e12 * W)
#include "ampipe/cli/simulate.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ampipe/cli/device_memory.h"
#include "ampipe/cli/flag_registry.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/core/host_memory.h"
#include "ampipe/core/output_file.h"
#include "ampipe/schedule/model_step.h"
#include "ampipe/schedule/plan.h"
#include "ampipe/sim/profile.h"
#include "ampipe/sim/simulator.h"
#include "ampipe/train/text_data.h"
#include "ampipe/train/tokenizer.h"
#include "ampipe/train/vocab_size.h"

namespace ampipe::cli {

void check_output_path(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  std::error_code ec;
  if (path.empty() || fs::is_directory(p, ec))
    throw ConfigError(fmt::format("{} {}: not a file name", flag, path));
  if (!fs::is_directory(dir, ec) || access(dir.c_str(), W_OK) != 0)
    throw ConfigError(
        fmt::format("{} {}: the directory {} does not exist or cannot be written", flag, path, dir.string()));
}

void SimulateArgs::add_to(CLI::App& app) {
  // Every flag of `ampipe train` except its --ampipe-degree (one degree or auto; here a list or auto, and
  // --config's "ampipe_degree" sets this one) and its --sim-profile; then simulate's own (flag_registry.cpp).
  FlagTargets t;
  t.simulate = this;
  train.add_to(app, kSimulate, t);
}

namespace {

// The layout of W devices on K nodes: group sizes, which groups cross nodes, micro-batches per device.
struct Layout {
  int W = 1, K = 1, ep = 1, dp = 1, dpcp = 1, nmb = 1;
  int64_t G = 1;
  sim::SimOptions opts;
};

Layout layout_of(const train::TrainConfig& cfg, int W, int K) {
  const model::LayerConfig& l = cfg.layer;
  Layout y;
  y.W = W;
  y.K = K;
  y.ep = int(l.expert_model_parallel_size);
  y.dp = cfg.data_parallel_size(W);
  y.dpcp = y.dp * l.cp();
  y.G = cfg.global_batch(W);
  y.nmb = int(y.G / (l.micro_batch_size * y.dp));
  sim::SimOptions& o = y.opts;
  // rank = tp fastest: a tp group is tp consecutive devices, an EP group's members lie tp apart; a cp group's
  // members lie tp apart (tp fastest, then cp), so it crosses nodes when tp x cp exceeds a node
  o.tp_size = l.tp();
  o.cp_size = l.cp();
  o.ep_size = y.ep;
  o.cp_spans_nodes = K > 1 && l.cp() > 1 && l.tp() * l.cp() > W / K;
  o.tp_spans_nodes = K > 1 && l.tp() > W / K;
  o.ep_spans_nodes = K > 1 && y.ep * l.tp() > W / K;
  o.dp_size = y.dp;
  // pipeline stages: the stage's tp x cp x dp ranks are consecutive, the stages one after the other, so the dp groups
  // stay inside a node when a stage fits one, and neighbouring stages cross nodes when a stage fills one
  const int stage = l.tp() * l.cp() * y.dp;
  o.dp_spans_nodes = K > 1 && stage > W / K;
  o.pp_spans_nodes = K > 1 && cfg.pp() > 1 && stage >= W / K;
  return y;
}

struct Prediction {
  int M = 1;
  schedule::StepPlan step;
  sim::SimResult sim;  // the whole iteration
  double step_s = 0, compute_s = 0, comm_s = 0, exposed_s = 0, hidden = 0;
  double layers_s = 0;       // the iteration less the work outside the layers and the waits for its collectives
  double layer_flops = 0;    // one micro-batch, all layers, this rank
  double head_s = 0, optim_s = 0, dp_allreduce_s = 0, dp_allreduce_bytes = 0;  // head: one micro-batch's
  double tflops_engine = 0, tflops_megatron = 0, megatron_flops = 0, flops_engine = 0;
  // pipeline stages: the 1F1B timeline (sim::simulate_pipeline); step and sim are the slowest stage's alone
  std::optional<sim::PipelineSim> pipeline;
  DeviceMemory memory;  // every stage's peak against the profile's device memory
  std::string setting;  // --ampipe-degree auto: the pipe-experts and tp-sp overlap flags it was costed with
  int weighed = 1;      // auto: the settings weighed at this degree
};

// --ampipe-degree auto weighs the whole setting at each degree (docs/simulator.md, "auto"): the given flags, then
// pipe-experts off or on with N of {1, 2, 4, 8} slices, with and without multi-stream, each with and without the
// tp-sp overlap; every one that the rules accept (TrainConfig::validate) and that has something to pipeline.
std::string setting_flags(const train::TrainConfig& c) {
  const model::LayerConfig& l = c.layer;
  std::string s = l.use_pipe_experts ? fmt::format("--use-pipe-experts --pipe-experts-multi-data {}{}",
                                                   l.pipe_experts_multi_data,
                                                   l.pipe_experts_multi_stream ? " --pipe-experts-multi-stream" : "")
                                     : std::string("no pipe-experts");
  if (l.sp()) s += l.ampipe_tp_sp_comm_overlap ? ", --ampipe-tp-sp-comm-overlap" : ", no tp-sp overlap";
  return s;
}

std::vector<train::TrainConfig> auto_settings(const train::TrainConfig& cfg, int M, int W) {
  std::vector<train::TrainConfig> out;
  auto add = [&](train::TrainConfig c) {
    c.ampipe_degree = M;
    try {
      c.validate(W);
    } catch (const ConfigError&) {
      return;  // a rule this setting breaks at this degree
    }
    if (!c.drop_idle_pipe_experts().empty()) return;  // nothing to pipeline: the same as without
    for (const train::TrainConfig& o : out)
      if (setting_flags(o) == setting_flags(c)) return;
    out.push_back(std::move(c));
  };
  add(cfg);
  for (bool overlap : {false, true})
    for (bool pipe : {false, true})
      for (int N : {1, 2, 4, 8})
        for (bool stream : {false, true}) {
          if (!pipe && (N > 1 || stream)) continue;
          train::TrainConfig c = cfg;
          c.layer.use_pipe_experts = pipe;
          c.layer.pipe_experts_multi_data = N;
          c.layer.pipe_experts_multi_stream = stream;
          c.layer.ampipe_tp_sp_comm_overlap = overlap;
          add(std::move(c));
        }
  return out;
}

std::string ms(double s) { return fmt::format("{:.2f}", 1e3 * s); }

bool outside_layers(const std::string& stage) {
  for (schedule::StepOp op : {schedule::StepOp::embedding, schedule::StepOp::head, schedule::StepOp::grad_pack,
                              schedule::StepOp::grad_finish, schedule::StepOp::optimizer, schedule::StepOp::sp_gather,
                              schedule::StepOp::param_gather, schedule::StepOp::param_unpack})
    if (stage == schedule::step_op_name(op)) return true;
  return stage == "dp_allreduce";
}

// The iteration at degree M: the step Plan of the model (schedule/model_step.h, Megatron's vocabulary-parallel
// head) costed by sim::simulate (RoPE is part of each layer's QKV stage and its backward).
Prediction predict(const train::TrainConfig& cfg, const Layout& lay, int M, const sim::Profile& prof) {
  const model::LayerConfig& l = cfg.layer;
  schedule::ModelShape shape;
  shape.layer = sim::costed_layer(l);
  shape.num_layers = cfg.num_layers;
  for (const model::LayerConfig& li : cfg.layer_configs()) shape.layers.push_back(sim::costed_layer(li));
  shape.vocab = cfg.padded_vocab_size;
  shape.untie_embeddings = cfg.untie_embeddings_and_output_weights;
  shape.position_embedding = l.position_embedding == model::PositionEmbedding::learned_absolute;
  shape.dp = lay.dp;
  shape.micro_batches = lay.nmb;
  shape.recompute = cfg.recompute_layers();
  shape.distributed_optimizer = cfg.use_distributed_optimizer;
  shape.overlap_param_gather = cfg.overlap_param_gather;
  Prediction p;
  p.M = M;
  shape.pp = cfg.pp();
  if (shape.pp > 1) {  // each stage's micro-batch, then the 1F1B timeline over them
    std::vector<schedule::StepPlan> one;
    for (int q = 0; q < shape.pp; ++q) {
      schedule::ModelShape sq = shape;
      sq.pp_rank = q;
      sq.micro_batches = 1;
      one.push_back(schedule::build_step_plan(schedule::model_step_config(sq, M)));
      for (const schedule::Plan& pl : one.back().config.layers) p.layer_flops += pl.flops() / double(shape.pp);
    }
    p.pipeline = sim::simulate_pipeline(one, lay.nmb, prof, lay.opts, cfg.virtual_stages(),
                                        cfg.microbatch_group_size_per_vp_stage);
    shape.pp_rank = p.pipeline->slowest;
  }
  p.step = schedule::build_step_plan(schedule::model_step_config(shape, M));
  p.sim = sim::simulate(p.step, prof, lay.opts);
  const double s = double(l.seq_length), b = double(l.micro_batch_size), h = double(l.hidden_size),
               F = double(l.ffn_hidden_size), k = double(l.moe_router_topk), T = s * b,
               V = double(cfg.padded_vocab_size), nl = double(cfg.num_layers), nmb = double(lay.nmb);
  for (const schedule::StepTask& t : p.step.tasks) {
    if (t.is_layer()) continue;
    const double c = sim::step_task_seconds(t, prof, lay.opts);
    if ((t.op == schedule::StepOp::head || t.op == schedule::StepOp::embedding) && t.micro_batch == 0) p.head_s += c;
    if (t.op == schedule::StepOp::grad_finish || t.op == schedule::StepOp::optimizer ||
        t.op == schedule::StepOp::param_unpack || t.op == schedule::StepOp::param_gather)
      p.optim_s += c;
    if (t.op == schedule::StepOp::grad_reduce) p.dp_allreduce_s += c;
  }
  p.dp_allreduce_bytes = p.step.collective_bytes(schedule::StepOp::grad_reduce);
  p.step_s = p.pipeline ? p.pipeline->step_s : p.sim.step_s;
  p.compute_s = p.sim.compute_s;
  p.comm_s = p.sim.comm_s;
  p.exposed_s = p.sim.exposed_s;
  p.layers_s = p.sim.step_s;
  for (const sim::SimRecord& r : p.sim.timeline)
    if (outside_layers(r.stage) && (r.cat == "compute" || r.cat == "wait")) p.layers_s -= r.end_s - r.start_s;
  const double mn = std::min(p.compute_s, p.comm_s);
  p.hidden = mn > 0 ? (p.compute_s + p.comm_s - p.sim.step_s) / mn : 0;  // of the (slowest) stage's own step
  if (!p.pipeline)
    for (const schedule::Plan& pl : p.step.config.layers) p.layer_flops += pl.flops();
  // per device: with stages, the model's layers and LM head shared out over them
  p.flops_engine = nmb * (p.layer_flops + 6 * T * h * V / double(cfg.pp()));
  p.tflops_engine = p.flops_engine / p.step_s / 1e12;
  // Megatron core_r0.7.0 (see the file comment); V is its padded_vocab_size.
  const double V_pad = V;
  const bool swiglu = l.expert == model::ExpertKind::swiglu;
  const double gn = double(l.query_groups()) / double(l.num_attention_heads);  // grouped-query attention's g/n
  // the FFN term per layer, averaged over the layers: the routed experts' k x F (MoE blocks) plus the dense MLP's F_m
  // (a shared expert, or a dense block's FFN), as Megatron counts shared experts and --moe-layer-freq
  double ffn = 0;
  for (const model::LayerConfig& li : cfg.layer_configs())
    ffn += ((li.dense() ? 0.0 : F * k) + double(li.mlp_ffn_hidden_size)) / h / nl;
  p.megatron_flops = 12 * double(lay.G) * s * nl * h * h *
                     ((1 + gn + s / h) * 1 + ffn * (swiglu ? 1.5 : 1.0) + V_pad / (2 * nl * h));
  p.tflops_megatron = p.megatron_flops / (p.step_s * 1e12 * lay.W);
  return p;
}

void print_predictions(const train::TrainConfig& cfg, const Layout& lay, const sim::Profile& prof,
                       const std::vector<std::string>& skipped, const std::vector<Prediction>& preds,
                       const Prediction& best, const Prediction& ref, const std::string& fits_with,
                       bool is_auto, const Prediction* runner_up) {
  const model::LayerConfig& l = cfg.layer;
  const sim::SimOptions& o = lay.opts;
  const bool swiglu = l.expert == model::ExpertKind::swiglu;
  const bool inter_missing = (o.ep_spans_nodes || o.cp_spans_nodes || (o.dp_spans_nodes && lay.dp > 1)) &&
                             !prof.links.count("inter");
  const bool reduce_spans = o.dp_spans_nodes && (lay.dp > 1 || o.cp_spans_nodes);
  fmt::print("ampipe simulate: GPT-MoE num_layers={} s={} b={} h={} F={} heads={} E={} top-{} V={} {} {}{} | {} "
             "device{} on {} node{}, {}{}ep={}{} dp={} | global batch {}: {} micro-batch{} per device | profile {}\n",
             cfg.num_layers, l.seq_length, l.micro_batch_size, l.hidden_size, l.ffn_hidden_size,
             l.num_attention_heads, l.num_experts, l.moe_router_topk, cfg.padded_vocab_size, l.bf16 ? "bf16" : "fp32",
             swiglu ? "swiglu" : "gelu", cfg.ffn_summary(), lay.W, lay.W == 1 ? "" : "s", lay.K, lay.K == 1 ? "" : "s",
             l.tp() > 1 ? fmt::format("tp={}{}{} ", l.tp(), l.sp() ? " (sequence parallel)" : "",
                                      o.tp_spans_nodes ? " (across nodes)" : "")
                        : std::string(),
             (l.cp() > 1 ? fmt::format("cp={}{} ", l.cp(), o.cp_spans_nodes ? " (across nodes)" : "") : std::string()) +
                 (cfg.pp() > 1 ? fmt::format("pp={}{} ", cfg.pp(), o.pp_spans_nodes ? " (across nodes)" : "")
                               : std::string()),
             lay.ep, o.ep_spans_nodes ? " (across nodes)" : "", lay.dp, lay.G, lay.nmb, lay.nmb == 1 ? "" : "es",
             prof.name);
  fmt::print("  per iteration besides the layers: embedding + LM head {} ms x {}, optimizer {} ms, gradient "
             "all-reduce {} ms alone ({:.1f} MiB in {} buckets{}, under the last micro-batch's backward){}\n",
             ms(ref.head_s), lay.nmb,
             ms(ref.optim_s), ms(ref.dp_allreduce_s), ref.dp_allreduce_bytes / (1 << 20),
             std::count_if(ref.step.tasks.begin(), ref.step.tasks.end(),
                           [](const schedule::StepTask& t) { return t.op == schedule::StepOp::grad_reduce; }),
             lay.dpcp > 1 ? (reduce_spans ? ", over dp x cp, across nodes" : ", over dp x cp, within a node")
                          : ", dp x cp = 1: none",
             inter_missing ? "; the profile has no links.inter: cross-node collectives use links.intra" : "");
  if (!l.dense() && l.dropless())
    fmt::print("  dropless router: its all-to-alls are costed at a balanced load, every expert ceil(S k / E) of a "
               "chunk's S tokens (an imbalanced step moves more)\n");
  if (ref.pipeline)
    for (const Prediction& p : preds) {
      const sim::PipelineSim& ps = *p.pipeline;
      std::string stages;
      for (size_t q = 0; q < ps.fwd_s.size(); ++q)
        stages += fmt::format("{}{}/{}", q ? ", " : "", ms(ps.fwd_s[q]), ms(ps.bwd_s[q]));
      // the ideal bubble: (P - 1) / v idle micro-batch times of K + (P - 1) / v
      const double idle = double(ps.fwd_s.size() - 1) / ps.chunks;
      fmt::print("  degree {}: {} pipeline stages ({}), forward/backward ms of one micro-batch per stage {}; "
                 "activation send {} ms{}; bubble {:.1f}% of the stages' time ({} = {:.1f}%)\n",
                 p.M, ps.fwd_s.size(),
                 ps.chunks > 1 ? fmt::format("interleaved, {} virtual stages each", ps.chunks) : std::string("1F1B"),
                 stages, ms(ps.send_s), o.pp_spans_nodes ? " (across nodes)" : "", 100 * ps.bubble,
                 ps.chunks > 1 ? "((P - 1) / v) / (K + (P - 1) / v)" : "(P - 1) / (K + P - 1)",
                 100.0 * idle / (double(lay.nmb) + idle));
    }
  for (const std::string& sk : skipped) fmt::print("  skipped: {}\n", sk);
  fmt::print("{:>6} {:>12} {:>11} {:>11} {:>11} {:>11} {:>7} {:>8} {:>14} {:>16}\n", "degree", "iteration ms",
             "layers ms", "compute ms", "comm ms", "exposed ms", "hidden", "speedup", "TFLOP/s engine",
             "TFLOP/s Megatron");
  for (const Prediction& p : preds)
    fmt::print("{:>6} {:>12} {:>11} {:>11} {:>11} {:>11} {:>7.2f} {:>8.3f} {:>14.4g} {:>16.4g}\n", p.M, ms(p.step_s),
               ms(p.layers_s), ms(p.compute_s), ms(p.comm_s), ms(p.exposed_s), p.hidden, ref.step_s / p.step_s,
               p.tflops_engine, p.tflops_megatron);
  // Which communication each degree leaves exposed (what it hides is the difference to another row).
  for (const Prediction& p : preds) {
    std::string line;
    for (const auto& [stage, t] : p.sim.comm_by_stage_s) {
      const auto e = p.sim.exposed_by_stage_s.find(stage);
      line += fmt::format("{}{} {}/{}", line.empty() ? "" : ", ", stage,
                          ms(e == p.sim.exposed_by_stage_s.end() ? 0 : e->second), ms(t));
    }
    fmt::print("  degree {} exposed/alone ms by communication: {}\n", p.M, line);
  }
  // Memory per device: the trainer's estimate of the largest stage, the framework's reserve, the device's memory.
  for (const Prediction& p : preds) {
    fmt::print("  degree {} memory per device: {}\n", p.M, p.memory.describe());
    if (p.memory.stages.size() > 1) {
      std::string per;
      for (size_t q = 0; q < p.memory.stages.size(); ++q)
        per += fmt::format("{}{}", q ? ", " : "", core::format_bytes(double(p.memory.stages[q].total())));
      fmt::print("    per stage (before the reserve): {}\n", per);
    }
  }
  if (!best.memory.fits())
    fmt::print("  no degree fits in {} per device: {}\n", core::format_bytes(double(best.memory.device_bytes)),
               fits_with.empty() ? "neither the distributed optimizer, full recomputation nor up to 8x the pipeline "
                                   "stages make it fit"
                                 : "it would fit with " + fits_with);
  if (is_auto)
    for (const Prediction& p : preds)
      fmt::print("  degree {} setting: {} (the fastest of {} weighed)\n", p.M, p.setting, p.weighed);
  fmt::print("chosen: degree {}{} ({} ms per iteration{}){}\n", best.M, is_auto ? ", " + best.setting : "",
             ms(best.step_s),
             &best == &ref ? "" : fmt::format(", {:.3f}x degree {}", ref.step_s / best.step_s, ref.M),
             best.memory.fits() ? "" : ", does NOT fit in memory");
  if (runner_up)
    fmt::print("runner-up: degree {}, {} ({} ms per iteration: {:+.2f} ms, {:+.2f}% against the chosen)\n",
               runner_up->M, runner_up->setting, ms(runner_up->step_s), 1e3 * (runner_up->step_s - best.step_s),
               100.0 * (runner_up->step_s / best.step_s - 1.0));
  if (!cfg.trace.empty()) fmt::print("wrote {} (degree {}: the whole iteration)\n", cfg.trace, best.M);
}

nlohmann::json memory_json(const DeviceMemory& m) {
  nlohmann::json stages = nlohmann::json::array();
  for (const schedule::MemoryEstimate& e : m.stages) {
    nlohmann::json parts = nlohmann::json::object();
    for (const schedule::MemoryEstimate::Part& part : e.parts) parts[part.name] = part.bytes;
    stages.push_back({{"bytes", e.total()}, {"parts", parts}});
  }
  return {{"stages", stages},
          {"largest_stage", m.largest},
          {"reserve_bytes", m.reserve_bytes},
          {"peak_bytes", m.peak_bytes()},
          {"device_bytes", m.device_bytes},  // 0: the profile gives none
          {"fits", m.fits()}};
}

void write_json(const SimulateArgs& a, const train::TrainConfig& cfg, const Layout& lay, const sim::Profile& prof,
                const std::vector<std::string>& skipped, const std::vector<Prediction>& preds,
                const Prediction& best, const Prediction& ref, const Prediction* runner_up) {
  const model::LayerConfig& l = cfg.layer;
  nlohmann::json configs = nlohmann::json::array();
  for (const Prediction& p : preds) {
    nlohmann::json pipeline;  // null without stages
    if (p.pipeline)
      pipeline = {{"stages", p.pipeline->fwd_s.size()}, {"forward_s", p.pipeline->fwd_s},
                  {"backward_s", p.pipeline->bwd_s}, {"tail_s", p.pipeline->tail_s},
                  {"send_s", p.pipeline->send_s}, {"bubble_fraction", p.pipeline->bubble},
                  {"virtual_stages", p.pipeline->chunks}};
    configs.push_back({{"ampipe_degree", p.M},
                       {"pipeline", pipeline},
                       {"step_s", p.step_s},
                       {"compute_s", p.compute_s},
                       {"comm_s", p.comm_s},
                       {"exposed_s", p.exposed_s},
                       {"hidden_fraction", p.hidden},
                       {"tflops_engine", p.tflops_engine},
                       {"tflops_megatron", p.tflops_megatron},
                       {"layers_s", p.layers_s},
                       // what bench-layer times: the layers' forward and backward; the gradient buckets' waits
                       // (none inside the layers: each layer's reduction is waited for at grad_finish) are out
                       {"layers_without_allreduce_s", p.layers_s},
                       {"speedup", ref.step_s / p.step_s},
                       {"flops_engine", p.flops_engine},
                       {"comm_by_stage_s", p.sim.comm_by_stage_s},
                       {"exposed_by_stage_s", p.sim.exposed_by_stage_s},
                       {"memory", memory_json(p.memory)},
                       {"setting", p.setting},
                       {"settings_weighed", p.weighed}});
  }
  nlohmann::json doc{{"configs", configs},
                     {"chosen_degree", best.M},
                     {"chosen_setting", best.setting},
                     {"runner_up", runner_up ? nlohmann::json{{"ampipe_degree", runner_up->M},
                                                              {"setting", runner_up->setting},
                                                              {"step_s", runner_up->step_s}}
                                             : nlohmann::json()},
                     {"profile", prof.name},
                     {"profile_file", a.profile_file},
                     {"compute_efficiency", a.compute_efficiency},
                     {"skipped", skipped},
                     {"config",
                      {{"num_layers", cfg.num_layers},
                       {"seq_length", l.seq_length},
                       {"micro_batch_size", l.micro_batch_size},
                       {"hidden_size", l.hidden_size},
                       {"ffn_hidden_size", l.ffn_hidden_size},
                       {"num_attention_heads", l.num_attention_heads},
                       {"num_experts", l.num_experts},
                       {"moe_router_topk", l.moe_router_topk},
                       {"swiglu", l.expert == model::ExpertKind::swiglu},
                       {"bf16", l.bf16},
                       {"vocab_size", cfg.padded_vocab_size},
                       {"world_size", lay.W},
                       {"nodes", lay.K},
                       {"expert_model_parallel_size", lay.ep},
                       {"data_parallel_size", lay.dp},
                       {"global_batch_size", lay.G},
                       {"micro_batches", lay.nmb},
                       {"ep_spans_nodes", lay.opts.ep_spans_nodes},
                       {"head_s", ref.head_s},
                       {"position_embedding_type", model::position_embedding_name(cfg.layer.position_embedding)},
                       {"optimizer_s", ref.optim_s},
                       {"dp_allreduce_bytes", ref.dp_allreduce_bytes},
                       {"dp_allreduce_s", ref.dp_allreduce_s},
                       {"megatron_flops", ref.megatron_flops}}}};
  core::write_output(core::open_output(a.json_file, "--json"), doc.dump(2) + "\n", a.json_file, "--json");
  fmt::print("wrote {}\n", a.json_file);
}

// The vocabulary: the tokenizer's (as train), else --vocab-size (no data: the bundled corpus's 256 bytes), padded as
// train pads it; its notes join the layer's.
void simulated_vocabulary(train::TrainConfig& cfg, SimulateArgs& a) {
  train::DataVocab need;
  need.ids = cfg.vocab_size > 0 ? cfg.vocab_size : train::kVocabSize;
  need.source = cfg.vocab_size > 0 ? "--vocab-size" : "simulate reads no data: the bundled corpus's bytes";
  if (!cfg.tokenizer_type.empty()) {
    try {
      const std::unique_ptr<train::Tokenizer> tok =
          train::make_tokenizer(cfg.tokenizer_type, cfg.tokenizer_model, cfg.vocab_file, cfg.merge_file);
      need.ids = tok->vocab_size();
      need.source = "the tokenizer is " + tok->describe();
      need.tokenizer = true;
      need.tokenizer_type = cfg.tokenizer_type;
    } catch (const ConfigError& e) {
      if (cfg.vocab_size <= 0)
        throw ConfigError(fmt::format("{} (simulate takes the vocabulary from the tokenizer: make its file "
                                      "readable here, or give --vocab-size)",
                                      e.what()));
      a.train.layer.notices.push_back(fmt::format("the tokenizer cannot be read here ({}): --vocab-size {} stands "
                                                  "in for its vocabulary",
                                                  e.what(), cfg.vocab_size));
    }
  }
  const train::VocabSizing v = train::size_vocabulary(cfg, need);
  for (const std::string& n : v.notes) a.train.layer.notices.push_back(n);
}

// The nodes of the simulated world: --nodes, else as many as W devices fill at dpn a node.
int node_count(const SimulateArgs& a, int W, int dpn) {
  int K = a.nodes;
  if (K == 0) {
    if (W > dpn && W % dpn != 0)
      throw ConfigError(fmt::format("--world-size {} does not fill nodes of {} devices (--profile {}: "
                                    "devices_per_node {}): pass --nodes",
                                    W, dpn, a.profile_file, dpn));
    K = W > dpn ? W / dpn : 1;
  }
  if (W % K != 0)
    throw ConfigError(fmt::format("--world-size {} is not divisible by --nodes {}: every node must hold the same "
                                  "number of devices",
                                  W, K));
  if (W / K > dpn)
    throw ConfigError(fmt::format("--world-size {} on {} node{} puts {} devices on a node, more than --profile {} "
                                  "has (devices_per_node {}): pass --nodes {} or more",
                                  W, K, K == 1 ? "" : "s", W / K, a.profile_file, dpn, (W + dpn - 1) / dpn));
  return K;
}

}  // namespace

int run_simulate(SimulateArgs& a) {
  train::TrainConfig cfg = a.train.finish();
  const bool rank0 = !comm::Runtime::exists() || comm::Runtime::current().rank() == 0;
  const int W = a.world_size > 0 ? a.world_size : (comm::Runtime::exists() ? comm::Runtime::current().size() : 1);
  if (a.world_size < 0) throw ConfigError(fmt::format("--world-size {} is invalid: it must be >= 1", a.world_size));
  if (a.nodes < 0) throw ConfigError(fmt::format("--nodes {} is invalid: it must be >= 1", a.nodes));
  simulated_vocabulary(cfg, a);
  if (!std::isfinite(a.compute_efficiency) || a.compute_efficiency <= 0)
    throw ConfigError(fmt::format("--compute-efficiency {} is invalid: it must be a positive number (a factor on "
                                  "the profile's compute rates)",
                                  a.compute_efficiency));
  const sim::Profile prof = sim::scale_compute(sim::load_profile(a.profile_file, "--profile"), a.compute_efficiency);
  const int K = node_count(a, W, prof.devices_per_node);
  if (rank0 && !a.json_file.empty()) check_output_path("--json", a.json_file);  // rank 0 writes them
  if (rank0 && !cfg.trace.empty()) check_output_path("--trace", cfg.trace);

  // The rules that do not depend on the degree: the configuration at degree 1 without pipe-experts.
  {
    train::TrainConfig base = cfg;
    base.ampipe_degree = 1;
    base.layer.use_pipe_experts = false;
    base.layer.pipe_experts_multi_data = 1;
    base.layer.pipe_experts_multi_stream = false;
    base.layer.ampipe_tp_sp_comm_overlap = false;  // needs a degree > 1: checked per degree below
    base.validate(W);
  }
  if (cfg.pp() > 1 && (cfg.decoder_first_pipeline_num_layers > 0 || cfg.decoder_last_pipeline_num_layers > 0))
    throw ConfigError("--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers: ampipe simulate "
                      "costs evenly split stages only (ampipe train runs the uneven split)");
  const Degrees given = parse_degree(a.degrees, Grammar::degree_list);
  const std::vector<int> degrees =
      given.is_auto ? auto_degree_candidates(cfg.layer.seq_length, {1, 2, 4, 8, 16}) : given.list;
  std::vector<int> valid;
  std::vector<std::string> skipped;  // "degree M: reason"
  for (int M : degrees) {
    train::TrainConfig c = cfg;
    c.ampipe_degree = M;
    try {
      c.validate(W);
      valid.push_back(M);
    } catch (const ConfigError& e) {
      skipped.push_back(fmt::format("degree {}: {}", M, e.what()));
    }
  }
  if (valid.empty()) {
    if (degrees.size() == 1) {  // the one degree's own error
      train::TrainConfig c = cfg;
      c.ampipe_degree = degrees[0];
      c.validate(W);
    }
    std::string why;
    for (const std::string& s : skipped) why += (why.empty() ? "" : "; ") + s;
    throw ConfigError(fmt::format("--ampipe-degree {}: no degree is valid ({})", a.degrees, why));
  }

  // ---- the step Plan per degree, costed ----
  const Layout lay = layout_of(cfg, W, K);
  auto at_degree = [&](int M) {
    train::TrainConfig c = cfg;
    c.ampipe_degree = M;
    return c;
  };
  std::vector<Prediction> preds;
  std::vector<Prediction> others;  // auto: every other setting that fits, for the runner-up
  for (int M : valid) {
    const std::vector<train::TrainConfig> settings =
        given.is_auto ? auto_settings(cfg, M, W) : std::vector<train::TrainConfig>{at_degree(M)};
    std::vector<Prediction> at_m;
    for (const train::TrainConfig& c : settings) {
      at_m.push_back(predict(c, lay, M, prof));
      at_m.back().memory = device_memory(c, W, prof);
      at_m.back().setting = setting_flags(c);
    }
    // the fastest that fits, else the one needing the least memory
    size_t pick = 0;
    for (size_t i = 1; i < at_m.size(); ++i) {
      const Prediction &p = at_m[i], &q = at_m[pick];
      if (p.memory.fits() != q.memory.fits() ? p.memory.fits()
          : p.memory.fits()                  ? p.step_s < q.step_s
                                             : p.memory.peak_bytes() < q.memory.peak_bytes())
        pick = i;
    }
    for (size_t i = 0; i < at_m.size(); ++i)
      if (i != pick && at_m[i].memory.fits()) others.push_back(std::move(at_m[i]));
    preds.push_back(std::move(at_m[pick]));
    preds.back().weighed = int(settings.size());
  }
  // auto chooses among the degrees that fit in the device's memory; when none does, it refuses and says what would
  if (given.is_auto) {
    std::vector<Prediction> fit;
    const Prediction* least = &preds[0];
    for (const Prediction& p : preds)
      if (p.memory.peak_bytes() < least->memory.peak_bytes()) least = &p;
    for (Prediction& p : preds) {
      if (p.memory.fits())
        fit.push_back(std::move(p));
      else
        skipped.push_back(fmt::format("degree {}: needs {} per device, more than the {} of --profile {}", p.M,
                                      core::format_bytes(double(p.memory.peak_bytes())),
                                      core::format_bytes(double(p.memory.device_bytes)), a.profile_file));
    }
    if (fit.empty()) {
      const std::string with = setting_that_fits(at_degree(least->M), W, prof);
      throw ConfigError(fmt::format(
          "--ampipe-degree auto: no degree fits in the {} per device of --profile {}: the least is degree {}, {}; {}",
          core::format_bytes(double(least->memory.device_bytes)), a.profile_file, least->M,
          least->memory.describe(),
          with.empty() ? "neither the distributed optimizer, full recomputation nor up to 8x the pipeline stages "
                         "make it fit"
                       : "it would fit with " + with));
    }
    preds = std::move(fit);
  }
  const Prediction* best = &preds[0];
  for (const Prediction& p : preds)
    if (p.memory.fits() > best->memory.fits() ||
        (p.memory.fits() == best->memory.fits() && p.step_s < best->step_s))
      best = &p;
  const Prediction* ref = &preds[0];
  for (const Prediction& p : preds)
    if (p.M == 1) ref = &p;
  // auto: the next fastest setting that fits, at any degree
  const Prediction* runner_up = nullptr;
  if (given.is_auto) {
    for (const std::vector<Prediction>* v : {&preds, &others})
      for (const Prediction& p : *v)
        if (&p != best && p.memory.fits() && (!runner_up || p.step_s < runner_up->step_s)) runner_up = &p;
  }

  if (!rank0) return 0;
  if (!cfg.trace.empty()) sim::write_chrome_trace(best->sim, cfg.trace);
  for (const std::string& n : a.train.layer.notices) fmt::print(stderr, "ampipe: note: {}\n", n);
  const std::string fits_with = best->memory.fits() ? "" : setting_that_fits(at_degree(best->M), W, prof);
  print_predictions(cfg, lay, prof, skipped, preds, *best, *ref, fits_with, given.is_auto, runner_up);
  if (!a.json_file.empty()) write_json(a, cfg, lay, prof, skipped, preds, *best, *ref, runner_up);
  return 0;
}

}  // namespace ampipe::cli
