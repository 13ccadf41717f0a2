// `ampipe simulate`: one training iteration of `ampipe train`'s configuration, predicted on a hardware profile by
// sim::simulate, for every AMPipe degree asked for; the fastest is chosen.
//
// Notation: s sequence, b micro-batch, T = s*b, h hidden, F FFN hidden, n heads, E experts, k top-k, ep, dp,
// L_loc = E/ep local experts, V vocabulary, num_layers blocks, M AMPipe degree, W world size (devices), K nodes.
//
// Flags: every flag of `ampipe train` (TrainFlags, --config FILE included) with the same meaning and the same rules
// (TrainConfig::validate for W devices), except that --ampipe-degree takes a comma list or `auto` (every degree of
// {1, 2, 4, 8, 16} that divides s) and --trace writes the predicted timeline. Flags that do not change the
// iteration's time (--data-path, --save, --load, --train-iters, ...) are checked as train checks them and otherwise
// not used: simulate reads no data, so the vocabulary is --vocab-size (default 256, the bundled corpus's bytes).
// Degrees that the rules refuse (e.g. > 1 without --use-flash-attn, or the pipe-experts rules) are skipped with
// their reason; rules that no degree can satisfy fail the command.
//
// The iteration (what Megatron's TFLOP/s divides by), per device:
//   micro-batches  nmb = global batch / (b * dp); each runs the layers' Plans (sim::simulate: forward of layers
//                  0..num_layers-1, backward in reverse), the last one followed by the data-parallel gradient
//                  all-reduce (the trainer starts each layer's reduction during the backward: the simulator's
//                  all-reduce after the backward is an upper bound)
//   LM head        per micro-batch, on the compute lane, not overlapped: the three fp32 GEMMs 3 x 2*T*h*V (logits,
//                  dW, dx) at gemm_rate(min(T, h, V)) of the fp32 rates, plus the element-wise work at
//                  elementwise_gbps: cross-entropy 12*T*V bytes (logits read twice, dlogits written) and embedding +
//                  final LayerNorm forward and backward 44*T*h bytes; one task overhead per kernel (8)
//   optimizer      AdamW + gradient norm + zeroing over the local parameters: 36 bytes per parameter (read param,
//                  grad, m, v; write param, m, v; norm reads grad; zero writes grad), + 6 per layer matrix parameter
//                  in bf16 mode (the bf16 weight copies), at elementwise_gbps
// Parameters (closed form, names of model/layer_params.h and train/gpt_model.h):
//   dense per layer   ln1 2h + attn.qkv 3h^2 + attn.proj h^2 + ln2 2h + moe.gate E*h  = 4h^2 + 4h + E*h
//   expert per layer  L_loc * (fc1 F1*h + fc2 h*F), F1 = F (GeLU) or 2F (SwiGLU)       (this rank's experts)
//   embedding etc.    word V*h/tp + position s*h (none with --position-embedding-type rope) + final LayerNorm 2h
//                     (+ output layer V*h/tp when untied): the vocabulary split over tp as in Megatron's
//                     vocabulary-parallel embedding and head, which the LM head's cost below assumes too
// Gradient all-reduce (fp32, sum): dense over dp, expert over the expert-data-parallel group of dp/ep ranks. The
// simulator takes one all-reduce over dp ranks, so the expert part enters with the bytes that cost the same over dp
// ranks: expert bytes * ((edp-1)/edp) / ((dp-1)/dp) (a ring all-reduce moves 2*bytes*(g-1)/g; one latency).
// Link classes: the EP group spans nodes iff K > 1 and ep > W/K (EP groups are ep consecutive data-parallel ranks,
// comm/layout.h); the data-parallel all-reduce spans nodes iff K > 1.
//
// Reported per degree: the iteration time, compute (compute tasks, LM head, optimizer), comm (collectives alone),
// exposed (compute lane waiting for communication), hidden fraction (compute + comm - iteration) / min(compute,
// comm), and TFLOP/s per device two ways:
//   engine    the FLOPs this engine counts: nmb * (sum of Plan::flops() of the layers + 6*T*h*V) / iteration
//   Megatron  core_r0.7.0's formula (training.py, num_floating_point_operations), which the seed's table uses:
//             F = 12*B*s*num_layers*h^2 * [(1 + g/n + s/h)*(q/h) + (F/h)*k*(3/2 with SwiGLU) + V_pad/(2*num_layers*h)]
//             with B the global batch, g/n = 1 and q = h (no grouped-query attention here), V_pad = V rounded up
//             to a multiple of 128 (Megatron's --make-vocab-size-divisible-by); printed F / (iteration * 1e12 * W)
#include "ampipe/cli/simulate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ampipe/cli/flag_registry.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/schedule/plan.h"
#include "ampipe/sim/profile.h"
#include "ampipe/sim/simulator.h"

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
  // --config's "ampipe_degree" sets this one), its --sim-profile and its refusal of --position-embedding-type
  // (simulate costs rope); then simulate's own (flag_registry.cpp).
  FlagTargets t;
  t.simulate = this;
  train.add_to(app, kSimulate, t);
}

namespace {

struct Prediction {
  int M = 1;
  sim::SimResult last, mid;  // the last micro-batch (with the gradient all-reduce), another one
  double step_s = 0, compute_s = 0, comm_s = 0, exposed_s = 0, hidden = 0;
  double layer_flops = 0;  // one micro-batch, all layers, this rank
  std::map<std::string, double> comm_by_stage, exposed_by_stage;  // the iteration's, by collective stage
  double tflops_engine = 0, tflops_megatron = 0;
};

std::string ms(double s) { return fmt::format("{:.2f}", 1e3 * s); }

}  // namespace

int run_simulate(SimulateArgs& a) {
  train::TrainConfig cfg = a.train.finish();
  const bool rank0 = !comm::Runtime::exists() || comm::Runtime::current().rank() == 0;
  const int W = a.world_size > 0 ? a.world_size : (comm::Runtime::exists() ? comm::Runtime::current().size() : 1);
  if (a.world_size < 0) throw ConfigError(fmt::format("--world-size {} is invalid: it must be >= 1", a.world_size));
  if (a.nodes < 0) throw ConfigError(fmt::format("--nodes {} is invalid: it must be >= 1", a.nodes));
  if (a.vocab_size < 0) throw ConfigError(fmt::format("--vocab-size {} is invalid: it must be >= 1", a.vocab_size));
  if (a.vocab_size > 0) cfg.vocab_size = a.vocab_size;
  if (a.position_embedding != "learned_absolute" && a.position_embedding != "rope")
    throw ConfigError(fmt::format("--position-embedding-type {} is not supported: simulate costs learned_absolute "
                                  "or rope",
                                  a.position_embedding));
  const bool rope = a.position_embedding == "rope";
  if (!std::isfinite(a.compute_efficiency) || a.compute_efficiency <= 0)
    throw ConfigError(fmt::format("--compute-efficiency {} is invalid: it must be a positive number (a factor on "
                                  "the profile's compute rates)",
                                  a.compute_efficiency));
  const sim::Profile prof = sim::scale_compute(sim::load_profile(a.profile_file, "--profile"), a.compute_efficiency);
  const int dpn = prof.devices_per_node;
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
  const std::vector<int> degrees = a.degrees == "auto" ? auto_degree_candidates(cfg.layer.seq_length, {1, 2, 4, 8, 16})
                                                        : parse_degree_list(a.degrees);
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

  // ---- sizes and the parts of the iteration that do not depend on the degree ----
  const model::LayerConfig& l = cfg.layer;
  const double s = double(l.seq_length), b = double(l.micro_batch_size), h = double(l.hidden_size),
               F = double(l.ffn_hidden_size), E = double(l.num_experts), k = double(l.moe_router_topk),
               T = s * b, V = double(cfg.vocab_size), nl = double(cfg.num_layers);
  // The dense gradients are reduced over dp x cp (every cp rank saw other tokens of the same sequences), the expert
  // ones over dp x cp / ep.
  const int ep = l.expert_model_parallel_size, dp = cfg.data_parallel_size(W), dpcp = dp * l.cp(), edp = dpcp / ep;
  const int64_t G = cfg.global_batch(W);
  const int nmb = int(G / (l.micro_batch_size * dp));
  const bool swiglu = l.expert == model::ExpertKind::swiglu;
  const double F1 = swiglu ? 2 * F : F;
  // per device: the attention matrices and the experts' F columns are cut over tp (docs/ampipe.md §5)
  const double tp = double(l.tp());
  const double dense_layer = 4 * h * h / tp + 4 * h + E * h,
               expert_layer = double(l.local_experts()) * (F1 * h + h * F) / tp;
  // the word embedding (and an untied output layer) as Megatron's vocabulary-parallel ones: V/tp rows per device,
  // like the LM head below
  const double dense_params = nl * dense_layer + V / tp * h + (rope ? 0 : s * h) + 2 * h +
                              (cfg.untie_embeddings_and_output_weights ? V / tp * h : 0);
  const double expert_params = nl * expert_layer;
  const double matrix_params = nl * (4 * h * h / tp + expert_layer);  // layer matrices with bf16 copies (not the gate)

  // The LM head and cross-entropy per device: the device's T/cp tokens, and, as Megatron's vocabulary-parallel head,
  // V/tp columns (docs/simulator.md §8: the engine's own head keeps the whole vocabulary on every tp rank).
  const double Th = T / double(l.cp()), Vh = V / tp;
  const sim::ComputeRates& r32 = prof.fp32;
  const double head_gemm = 3 * 2 * Th * h * Vh / sim::gemm_rate(r32, std::min({Th, h, Vh}));
  const double head_s = head_gemm + (12 * Th * Vh + 44 * Th * h) / (prof.elementwise_gbps * 1e9) + 8 * prof.task_overhead_us * 1e-6;
  // RoPE: q and k of the device's rows and local heads rotated in the forward (again when recomputed) and in the
  // backward, each a read and a write at elementwise_gbps, one task overhead each (outside the layers' Plans)
  const std::vector<bool> recomputed = cfg.recompute_layers();
  const double rope_passes = rope ? nl * 2 + double(std::count(recomputed.begin(), recomputed.end(), true)) : 0;
  const double rope_s = rope_passes * (2 * 2 * (T / double(l.cp())) * (h / tp) * (l.bf16 ? 2 : 4) /
                                           (prof.elementwise_gbps * 1e9) +
                                       prof.task_overhead_us * 1e-6);
  const double optim_s = ((dense_params + expert_params) * 36 + (l.bf16 ? 6 * matrix_params : 0)) / (prof.elementwise_gbps * 1e9);

  sim::SimOptions opts;
  // rank = tp fastest: a tp group is tp consecutive devices, an EP group's members lie tp apart
  opts.tp_size = l.tp();
  // a cp group's members lie tp apart (tp fastest, then cp), so it crosses nodes when tp x cp exceeds a node
  opts.cp_size = l.cp();
  opts.cp_spans_nodes = K > 1 && l.cp() > 1 && l.tp() * l.cp() > W / K;
  opts.recompute = cfg.recompute_layers();
  opts.tp_spans_nodes = K > 1 && l.tp() > W / K;
  opts.ep_spans_nodes = K > 1 && ep * l.tp() > W / K;
  opts.dp_size = dp;
  opts.dp_spans_nodes = K > 1;
  if (dpcp > 1) {
    const double expert_equiv = edp > 1 ? 4 * expert_params * ((edp - 1.0) / edp) / ((dpcp - 1.0) / dpcp) : 0;
    opts.dp_allreduce_bytes = 4 * dense_params + expert_equiv;
  }
  sim::SimOptions no_dp = opts;
  no_dp.dp_allreduce_bytes = 0;
  const bool reduce_spans = opts.dp_spans_nodes && (dp > 1 || opts.cp_spans_nodes);
  const double dp_ar_s =
      dpcp > 1 ? sim::collective_seconds(schedule::CollKind::all_reduce, opts.dp_allreduce_bytes, dpcp,
                                         prof.link(reduce_spans))
               : 0;

  // Megatron core_r0.7.0 (see the file comment).
  const double V_pad = std::ceil(V / (128.0 * cfg.layer.tp())) * 128.0 * cfg.layer.tp();
  const double megatron_flops = 12 * double(G) * s * nl * h * h *
                                ((1 + 1 + s / h) * 1 + (F / h) * k * (swiglu ? 1.5 : 1.0) + V_pad / (2 * nl * h));

  // ---- one simulation per degree ----
  std::vector<Prediction> preds;
  for (int M : valid) {
    std::vector<schedule::Plan> plans;
    model::LayerConfig lc = l;
    for (int i = 0; i < cfg.num_layers; ++i) {
      lc.layer_index = i;
      plans.push_back(schedule::build_layer_plan(lc, M));
    }
    Prediction p;
    p.M = M;
    p.last = sim::simulate(plans, prof, opts);
    if (nmb > 1) p.mid = sim::simulate(plans, prof, no_dp);
    const double n_mid = nmb - 1;
    for (const schedule::Plan& pl : plans) p.layer_flops += pl.flops();
    p.step_s = n_mid * p.mid.step_s + p.last.step_s + nmb * (head_s + rope_s) + optim_s;
    p.compute_s = n_mid * p.mid.compute_s + p.last.compute_s + nmb * (head_s + rope_s) + optim_s;
    p.comm_s = n_mid * p.mid.comm_s + p.last.comm_s;
    p.exposed_s = n_mid * p.mid.exposed_s + p.last.exposed_s;
    auto add = [](std::map<std::string, double>& to, const std::map<std::string, double>& from, double times) {
      for (const auto& [stage, t] : from) to[stage] += times * t;
    };
    add(p.comm_by_stage, p.last.comm_by_stage_s, 1);
    add(p.comm_by_stage, p.mid.comm_by_stage_s, n_mid);
    add(p.exposed_by_stage, p.last.exposed_by_stage_s, 1);
    add(p.exposed_by_stage, p.mid.exposed_by_stage_s, n_mid);
    const double mn = std::min(p.compute_s, p.comm_s);
    p.hidden = mn > 0 ? (p.compute_s + p.comm_s - p.step_s) / mn : 0;
    p.tflops_engine = nmb * (p.layer_flops + 6 * T * h * V) / p.step_s / 1e12;
    p.tflops_megatron = megatron_flops / (p.step_s * 1e12 * W);
    preds.push_back(std::move(p));
  }
  const Prediction* best = &preds[0];
  for (const Prediction& p : preds)
    if (p.step_s < best->step_s) best = &p;
  const Prediction* ref = &preds[0];
  for (const Prediction& p : preds)
    if (p.M == 1) ref = &p;

  if (!rank0) return 0;
  if (!cfg.trace.empty()) sim::write_chrome_trace(best->last, cfg.trace);
  for (const std::string& n : a.train.layer.notices) fmt::print(stderr, "ampipe: note: {}\n", n);
  const bool inter_missing =
      (opts.ep_spans_nodes || opts.cp_spans_nodes || (opts.dp_spans_nodes && dp > 1)) && !prof.links.count("inter");
  fmt::print("ampipe simulate: GPT-MoE num_layers={} s={} b={} h={} F={} heads={} E={} top-{} V={} {} {} | {} "
             "device{} on {} node{}, {}{}ep={}{} dp={} | global batch {}: {} micro-batch{} per device | profile {}\n",
             cfg.num_layers, l.seq_length, l.micro_batch_size, l.hidden_size, l.ffn_hidden_size,
             l.num_attention_heads, l.num_experts, l.moe_router_topk, cfg.vocab_size, l.bf16 ? "bf16" : "fp32",
             swiglu ? "swiglu" : "gelu", W, W == 1 ? "" : "s", K, K == 1 ? "" : "s",
             l.tp() > 1 ? fmt::format("tp={}{}{} ", l.tp(), l.sp() ? " (sequence parallel)" : "",
                                      opts.tp_spans_nodes ? " (across nodes)" : "")
                        : std::string(),
             l.cp() > 1 ? fmt::format("cp={}{} ", l.cp(), opts.cp_spans_nodes ? " (across nodes)" : "") : std::string(),
             ep,
             opts.ep_spans_nodes ? " (across nodes)" : "", dp, G, nmb, nmb == 1 ? "" : "es", prof.name);
  fmt::print("  per iteration besides the layers: LM head {} ms x {}{}, optimizer {} ms, gradient all-reduce {} ms "
             "({:.1f} MiB{}){}\n",
             ms(head_s), nmb, rope ? fmt::format(", RoPE {} ms x {}", ms(rope_s), nmb) : std::string(), ms(optim_s),
             ms(dp_ar_s), opts.dp_allreduce_bytes / (1 << 20),
             dpcp > 1 ? (reduce_spans ? ", over dp x cp, across nodes" : ", over dp x cp, within a node")
                      : ", dp x cp = 1: none",
             inter_missing ? "; the profile has no links.inter: cross-node collectives use links.intra" : "");
  for (const std::string& sk : skipped) fmt::print("  skipped: {}\n", sk);
  fmt::print("{:>6} {:>12} {:>11} {:>11} {:>11} {:>11} {:>7} {:>8} {:>14} {:>16}\n", "degree", "iteration ms",
             "layers ms", "compute ms", "comm ms", "exposed ms", "hidden", "speedup", "TFLOP/s engine",
             "TFLOP/s Megatron");
  nlohmann::json configs = nlohmann::json::array();
  for (const Prediction& p : preds) {
    const double layers = p.last.step_s + (nmb - 1) * p.mid.step_s;
    fmt::print("{:>6} {:>12} {:>11} {:>11} {:>11} {:>11} {:>7.2f} {:>8.3f} {:>14.4g} {:>16.4g}\n", p.M, ms(p.step_s),
               ms(layers), ms(p.compute_s), ms(p.comm_s), ms(p.exposed_s), p.hidden, ref->step_s / p.step_s,
               p.tflops_engine, p.tflops_megatron);
    configs.push_back({{"ampipe_degree", p.M},
                       {"step_s", p.step_s},
                       {"compute_s", p.compute_s},
                       {"comm_s", p.comm_s},
                       {"exposed_s", p.exposed_s},
                       {"hidden_fraction", p.hidden},
                       {"tflops_engine", p.tflops_engine},
                       {"tflops_megatron", p.tflops_megatron},
                       {"layers_s", layers},
                       // what bench-layer times: the layers' forward and backward, without the gradient all-reduce
                       // (a phase of its own after the last backward, so the two add exactly)
                       {"layers_without_allreduce_s", layers - dp_ar_s},
                       {"speedup", ref->step_s / p.step_s},
                       {"flops_engine", nmb * (p.layer_flops + 6 * T * h * V)},
                       {"comm_by_stage_s", p.comm_by_stage},
                       {"exposed_by_stage_s", p.exposed_by_stage}});
  }
  // Which communication each degree leaves exposed (what it hides is the difference to another row).
  for (const Prediction& p : preds) {
    std::string line;
    for (const auto& [stage, t] : p.comm_by_stage) {
      const auto e = p.exposed_by_stage.find(stage);
      line += fmt::format("{}{} {}/{}", line.empty() ? "" : ", ", stage,
                          ms(e == p.exposed_by_stage.end() ? 0 : e->second), ms(t));
    }
    fmt::print("  degree {} exposed/alone ms by communication: {}\n", p.M, line);
  }
  fmt::print("chosen: degree {} ({} ms per iteration{})\n", best->M, ms(best->step_s),
             best == ref ? "" : fmt::format(", {:.3f}x degree {}", ref->step_s / best->step_s, ref->M));
  if (!cfg.trace.empty()) fmt::print("wrote {} (degree {}: the last micro-batch and the all-reduce)\n", cfg.trace, best->M);
  if (!a.json_file.empty()) {
    nlohmann::json doc{{"configs", configs},
                       {"chosen_degree", best->M},
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
                         {"swiglu", swiglu},
                         {"bf16", l.bf16},
                         {"vocab_size", cfg.vocab_size},
                         {"world_size", W},
                         {"nodes", K},
                         {"expert_model_parallel_size", ep},
                         {"data_parallel_size", dp},
                         {"global_batch_size", G},
                         {"micro_batches", nmb},
                         {"ep_spans_nodes", opts.ep_spans_nodes},
                         {"head_s", head_s},
                         {"position_embedding_type", a.position_embedding},
                         {"rope_s", rope_s},
                         {"optimizer_s", optim_s},
                         {"dp_allreduce_bytes", opts.dp_allreduce_bytes},
                         {"dp_allreduce_s", dp_ar_s},
                         {"megatron_flops", megatron_flops}}}};
    std::ofstream f(a.json_file);
    f << doc.dump(2) << "\n";
    if (!f) throw ConfigError(fmt::format("--json {}: cannot write the file", a.json_file));
    fmt::print("wrote {}\n", a.json_file);
  }
  return 0;
}

}  // namespace ampipe::cli
