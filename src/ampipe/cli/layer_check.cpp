// `ampipe layer-check`: one forward and backward of one MoE layer on seeded random input and a seeded random
// upstream gradient, on one rank or under mpirun with expert, tensor (and sequence) and context parallelism, with
// optional safetensors export.
//
// The global batch (--global-batch-size sequences, default micro-batch x data-parallel ranks) is cut into
// micro-batches of --micro-batch-size; data-parallel rank r processes micro-batches [r*K, (r+1)*K). Micro-batch
// m's loss is <grad_y_m, y_m> + coeff * l_aux_m; the exported gradients (x's and the parameters') are those of the
// mean over all micro-batches (the data-parallel mean), so one rank with K micro-batches equals K ranks with one
// each. Tensor and context parallelism split each micro-batch: every rank of a data-parallel rank's tp x cp block
// runs the same micro-batches on its rows (model::layer_rows), the outputs are put back in the natural order (tp,
// then cp) and the parameter gradients summed over the rows' ranks, so the export equals one rank's.
#include "ampipe/cli/layer_check.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "ampipe/cli/flag_registry.h"
#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/comm/trace.h"
#include "ampipe/core/host_memory.h"
#include "ampipe/core/parallel.h"
#include "ampipe/core/philox.h"
#include "ampipe/core/safetensors.h"
#include "ampipe/model/context_parallel.h"
#include "ampipe/model/layer_params.h"
#include "ampipe/model/layer.h"
#include "ampipe/model/sequence_shard.h"
#include "ampipe/model/size_check.h"
#include "ampipe/schedule/layer_stack.h"
#include "ampipe/schedule/plan.h"
#include "ampipe/train/checkpoint.h"

namespace ampipe::cli {

void LayerCheckArgs::add_to(CLI::App& app) {
  FlagTargets t;
  t.layer = &layer;
  t.comm = &comm;
  t.memory = &memory;
  t.layer_check = this;
  add_flags(app, kLayerCheck, t);
}

namespace {

using Clock = std::chrono::steady_clock;

// Element (i, g, j) of a full [s, G, h] tensor drawn from the seed: philox_normal(seed, data, id, flat index).
Tensor micro_batch_slice(const model::LayerConfig& cfg, int64_t G, int64_t m, uint64_t id) {
  const int64_t s = cfg.seq_length, b = cfg.micro_batch_size, h = cfg.hidden_size;
  Tensor t = Tensor::empty({s, b, h});
  const core::PhiloxKey key{cfg.seed, 0, core::RngPurpose::data};
  float* p = t.data<float>();
  parallel_for(s, rows_grain(b * h), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t j = 0; j < h; ++j)
          p[(i * b + bb) * h + j] = core::philox_normal(key, id, uint64_t((i * G + m * b + bb) * h + j));
  });
  return t;
}

// Full [s, G, h] tensor from every data-parallel rank's K micro-batches ([K, s, b, h] each, in data-parallel
// rank order: the dp group of this rank's tp and cp coordinates).
Tensor gather_batch(const std::vector<Tensor>& mine, const comm::Group& world, int64_t G) {
  const int64_t K = int64_t(mine.size()), s = mine[0].size(0), b = mine[0].size(1), h = mine[0].size(2);
  Tensor packed = Tensor::empty({K, s, b, h});
  for (int64_t j = 0; j < K; ++j) packed.rows(j, j + 1).view({s, b, h}).copy_from(mine[size_t(j)]);
  Tensor all = Tensor::empty({int64_t(world.size()) * K, s, b, h});
  comm::all_gather_sync(world, packed, all, "export_gather");
  Tensor full = Tensor::empty({s, G, h});
  for (int64_t m = 0; m < G / b; ++m)
    for (int64_t i = 0; i < s; ++i)
      for (int64_t bb = 0; bb < b; ++bb)
        std::memcpy(full.data<float>() + (i * G + m * b + bb) * h, all.data<float>() + ((m * s + i) * b + bb) * h,
                    size_t(h) * 4);
  return full;
}

double norm(const Tensor& t) {
  double s = 0;
  for (float v : t.to_vector()) s += double(v) * v;
  return std::sqrt(s);
}

}  // namespace

namespace {

  // This rank's peak memory before anything is allocated: the layer (schedule/memory_estimate.h), and the inputs,
  // upstream gradients, outputs and input gradients of its K micro-batches ([s, b, h] each, kept for the export
  // and the summary); with --export also the gathered [s, G, h] batches (x, dy, y, dx and the gather buffers).
void check_layer_check_memory(const LayerCheckArgs& a, const model::LayerConfig& cfg, int M, int64_t K, int64_t G,
                              const comm::Groups& groups) {
  const int64_t b = cfg.micro_batch_size;
  schedule::MemoryEstimate mem = schedule::estimate_layer_stack(cfg, 1, M);
  const model::SizeFactor s{"--seq-length", cfg.seq_length}, h{"--hidden-size", cfg.hidden_size};
  mem.add("micro-batch inputs and outputs",
          model::checked_elements("the micro-batches' [s, b, h] tensors",
                                  {{nullptr, 4 * 4}, {"the micro-batches per rank (--global-batch-size)", K}, s,
                                   {"--micro-batch-size", b}, h},
                                  1));
  if (!a.export_dir.empty())
    mem.add("export (gathered batches)",
            model::checked_elements("the exported [s, G, h] tensors", {{nullptr, 6 * 4}, {"--global-batch-size", G}, s, h}, 1));
  const int64_t rss_now = std::max<int64_t>(core::current_rss_bytes(), 0);
  mem.parts.insert(mem.parts.begin(), {"process now (code, MPI)", rss_now});
  check_memory_fits(mem, rss_now, a.memory, groups.world);
}

}  // namespace

int run_layer_check(LayerCheckArgs& a) {
  model::LayerConfig cfg = a.layer.finish();
  comm::Runtime& rt = comm::Runtime::current();
  a.comm.apply();
  (void)a.memory.limit_bytes();  // a bad --memory-limit is refused before anything runs
  const int M = a.ampipe_degree;
  LayerFlags::check_degree(cfg, M);
  cfg.check_tensor_parallel(M);
  a.layer.check_pipe_experts(cfg, {M});
  if (rt.rank() == 0)
    for (const std::string& n : a.layer.notices) fmt::print(stderr, "ampipe: note: {}\n", n);
  // world = tp x cp x dp (Layout::make refuses a world not divisible by tp x cp, in one line)
  const comm::Layout layout = comm::Layout::make(rt.size(), cfg.tp(), cfg.cp(), cfg.expert_model_parallel_size);
  const int64_t b = cfg.micro_batch_size, dp = layout.dp;
  const int64_t G = a.global_batch_size > 0 ? a.global_batch_size : b * dp;
  if (G % (b * dp) != 0)
    throw ConfigError(fmt::format("--global-batch-size {} is not divisible by --micro-batch-size {} x data-parallel "
                                  "size {}: every rank must process the same number of micro-batches",
                                  G, b, dp));
  comm::Groups groups = rt.make_groups(layout);
  {
    nlohmann::json agree = a.layer.to_json(cfg);
    agree["seed"] = cfg.seed;
    agree["ampipe_degree"] = M;
    agree["global_batch_size"] = G;
    agree["hidden_dropout"] = cfg.hidden_dropout;
    check_ranks_agree(agree, groups.world);
  }
  check_output_file("--trace", a.trace_file, groups.world);
  if (!a.export_dir.empty()) train::check_writable_dir("--export", a.export_dir, groups.world);
  const comm::Layout::Coord me = layout.coord(rt.rank());
  const int64_t K = G / (b * dp);
  comm::Trace::set_enabled(!a.trace_file.empty());
  check_layer_check_memory(a, cfg, M, K, G, groups);
  schedule::LayerStack stack(cfg, 1, M, me.ep, &groups, cfg.layer_index);
  model::LayerParams& params = stack.params(0);
  model::LayerParams& grads = stack.grads(0);
  const model::Layer& layer = stack.layer(0);
  std::vector<Tensor> xs, dys, ys, dxs;
  std::vector<float> aux;
  int64_t dropped = 0, choices = 0;
  double step_s = 0, flops = 0;
  // Context and sequence parallelism: each rank feeds its rows (model::layer_rows: its cp blocks, then of those its
  // tp rows with SP) and the outputs are put back in the natural order (all-gather over tp and sequence_unshard,
  // then over cp and context_unshard).
  auto rows_of = [&](const Tensor& full) {
    return model::layer_rows(full, cfg.cp(), cfg.tp(), cfg.sp(), M, me.cp, me.tp);
  };
  auto whole = [&](const Tensor& mine) {
    Tensor v = mine.clone();
    if (cfg.sp()) {
      Tensor all = Tensor::empty({v.size(0) * cfg.tp(), b, cfg.hidden_size});
      comm::all_gather_sync(groups.tp, v, all, "sp_gather");
      v = model::sequence_unshard(all, M, cfg.tp());
    }
    if (cfg.cp() > 1) {
      Tensor all = Tensor::empty({v.size(0) * cfg.cp(), b, cfg.hidden_size});
      comm::all_gather_sync(groups.cp, v, all, "cp_gather");
      v = model::context_unshard(all, M, cfg.cp());
    }
    return v;
  };
  rt.end_startup();  // the steps: waits are bounded by --comm-timeout from here on
  for (int64_t j = 0; j < K; ++j) {
    const int64_t m = me.dp * K + j;
    xs.push_back(micro_batch_slice(cfg, G, m, 0));
    dys.push_back(micro_batch_slice(cfg, G, m, 1));
    const Tensor x = rows_of(xs.back()), dy = rows_of(dys.back());
    const auto t0 = Clock::now();
    const Tensor y = stack.forward(x, uint64_t(m * cfg.tokens()));
    const Tensor dx = stack.backward(dy, float(a.layer.moe_aux_loss_coeff));
    step_s += std::chrono::duration<double>(Clock::now() - t0).count();
    ys.push_back(whole(y));
    dxs.push_back(whole(dx));
    flops += layer.flops();
    aux.push_back(float(layer.aux_loss_value()));
    for (int c = 0; c < M; ++c)
      for (int32_t sl : layer.gate_ctx(c).routing.slot) {
        dropped += sl < 0;
        ++choices;
      }
  }
  // Data-parallel mean of the gradients: sum over the ranks that hold the same parameter, divide by the number
  // of micro-batches of the global batch (expert gradients already sum over the EP group's tokens). A cp rank's
  // gradients are sums over its rows' tokens, so the cp ranks are summed like the dp ranks (the dp_cp group; the
  // edp group spans dp x cp too).
  const float inv = 1.0f / float(G / b);
  for (Tensor& dx : dxs)  // the loss is the mean over micro-batches, so x's gradient carries the factor too
    for (int64_t i = 0; i < dx.numel(); ++i) dx.data<float>()[i] *= inv;
  for (auto& [name, g] : grads.named()) {
    if (model::LayerParams::tp_partial_grad(cfg, name))  // each tp rank saw its rows (or heads) only
      comm::all_reduce_sync(groups.tp, g, comm::Reduce::sum, "grad.tp." + name);
    const comm::Group& grp = model::LayerParams::is_expert(name) ? groups.edp : groups.dp_cp;
    if (grp.size() > 1) comm::all_reduce_sync(grp, g, comm::Reduce::sum, "grad." + name);
    float* p = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) p[i] *= inv;
  }
  const int64_t total_dropped = comm::all_reduce_max(groups.world, dropped, "dropped");

  if (!a.export_dir.empty()) {
    // Every rank of a tp x cp block holds the same whole micro-batches: gather over dp only.
    Tensor x_full = gather_batch(xs, groups.dp, G), dy_full = gather_batch(dys, groups.dp, G);
    Tensor y_full = gather_batch(ys, groups.dp, G), dx_full = gather_batch(dxs, groups.dp, G);
    Tensor aux_mine = Tensor::from(aux, {K});
    Tensor aux_all = Tensor::empty({G / b});
    comm::all_gather_sync(groups.dp, aux_mine, aux_all, "export_aux");
    core::TensorMap pmap, gmap;
    for (auto& [name, t] : params.named()) pmap[name] = t;
    for (auto& [name, t] : grads.named()) gmap[name] = t;
    for (core::TensorMap* mp : {&pmap, &gmap})
      for (auto& [name, t] : *mp) t = train::full_layer_tensor(t, name, cfg, groups, "export." + name);
    if (rt.rank() == 0) {
      gmap["x"] = dx_full;
      const std::map<std::string, std::string> meta{{"format", "ampipe layer-check"},
                                                    {"ampipe_degree", std::to_string(M)},
                                                    {"expert_model_parallel_size", std::to_string(layout.ep)},
                                                    {"tensor_model_parallel_size", std::to_string(layout.tp)},
                                                    {"context_parallel_size", std::to_string(layout.cp)},
                                                    {"sequence_parallel", cfg.sp() ? "1" : "0"}};
      core::save_safetensors(a.export_dir + "/params.safetensors", pmap, meta);
      core::save_safetensors(a.export_dir + "/inputs.safetensors", {{"x", x_full}, {"grad_y", dy_full}}, meta);
      core::save_safetensors(a.export_dir + "/outputs.safetensors", {{"y", y_full}, {"aux_loss", aux_all}}, meta);
      core::save_safetensors(a.export_dir + "/grads.safetensors", gmap, meta);
    }
  }
  if (!a.trace_file.empty()) comm::Trace::write_chrome_trace(a.trace_file);

  if (rt.rank() == 0) {
    fmt::print("ampipe layer-check: s={} b={} h={} F={} heads={} E={} top-{} {} | ranks={} tp={}{} cp={} ep={} dp={} "
               "micro-batches/rank={} ampipe-degree={}{}\n",
               cfg.seq_length, b, cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_attention_heads, cfg.num_experts,
               cfg.moe_router_topk, cfg.bf16 ? "bf16" : "fp32", rt.size(), layout.tp, cfg.sp() ? " (sequence parallel)" : "",
               layout.cp, layout.ep, dp, K, M, cfg.ampipe_tp_sp_comm_overlap ? " tp-overlap" : "");
    fmt::print("  forward+backward: {:.1f} ms per micro-batch, {:.3f} TFLOP/s per rank, exposed comm {:.1f} ms\n",
               1e3 * step_s / double(K), flops / step_s / 1e12, stack.executor().stats().blocked_us / 1e3 / double(K));
    fmt::print("  |y| = {:.6g}   aux loss = {:.6g}   |dx| = {:.6g}   tokens dropped (max over ranks) = {} of {} "
               "choices\n",
               norm(ys[0]), aux[0], norm(dxs[0]), total_dropped, choices);
    for (auto& [name, g] : grads.named()) fmt::print("  |grad {}| = {:.6g}\n", name, norm(g));
    if (!a.export_dir.empty()) fmt::print("  exported to {}/{{params,inputs,outputs,grads}}.safetensors\n", a.export_dir);
    if (!a.trace_file.empty()) fmt::print("  trace written to {}\n", a.trace_file);
  }
  return 0;
}

}  // namespace ampipe::cli
