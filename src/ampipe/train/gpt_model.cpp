#include "ampipe/train/gpt_model.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/trace.h"
#include "ampipe/core/error.h"
#include "ampipe/core/parallel.h"
#include "ampipe/core/philox.h"
#include "ampipe/kernels/cross_entropy.h"
#include "ampipe/kernels/embedding.h"
#include "ampipe/kernels/gemm.h"
#include "ampipe/model/norm.h"
#include "ampipe/model/context_parallel.h"
#include "ampipe/model/sequence_shard.h"
#include "ampipe/train/text_data.h"

namespace ampipe::train {

namespace {

using Clock = std::chrono::steady_clock;
int64_t us_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
}
// The step's work outside the layers, as compute tasks of the training trace (--trace), next to the layers' own.
void trace_since(const char* name, Clock::time_point t0) {
  comm::Trace::record(comm::Lane::compute, name, -1, comm::Trace::to_us(t0), comm::Trace::now_us());
}

constexpr uint32_t kModelKeyLayer = 0xFFFFFF;  // Philox layer field of the embedding-level parameters

Tensor normal_init(const Shape& shape, const TrainConfig& cfg, uint64_t id) {
  Tensor t = Tensor::empty(shape);
  const core::PhiloxKey key{cfg.layer.seed, kModelKeyLayer, core::RngPurpose::init};
  float* p = t.data<float>();
  parallel_for(t.numel(), kElementGrain, [&](int64_t i0, int64_t i1) {  // counter-based: any split
    for (int64_t i = i0; i < i1; ++i)
      p[i] = float(cfg.layer.init_method_std * double(core::philox_normal(key, id, uint64_t(i))));
  });
  return t;
}

}  // namespace

PipelineStage pipeline_stage(const TrainConfig& cfg, int stage) {
  PipelineStage st;
  st.rank = stage;
  st.size = cfg.pp();
  st.chunks = cfg.virtual_stages();
  st.layers = cfg.stage_layers(stage);
  return st;
}

int PipelineStage::local(int model_layer) const {
  const auto it = std::find(layers.begin(), layers.end(), model_layer);
  return it == layers.end() ? -1 : int(it - layers.begin());
}

namespace {
// This stage's layer configs (each keeps its model-wide layer_index).
std::vector<model::LayerConfig> stage_configs(const TrainConfig& cfg, const PipelineStage& st) {
  const std::vector<model::LayerConfig> all = cfg.layer_configs();
  std::vector<model::LayerConfig> out;
  for (int i : st.layers) out.push_back(all[size_t(i)]);
  return out;
}
}  // namespace

GptModel::GptModel(const TrainConfig& cfg, int ep_rank, const comm::Groups* groups)
    : cfg_(cfg),
      stage_(pipeline_stage(cfg, groups ? groups->layout.coord(groups->world.rank()).pp : 0)),
      s_(cfg.layer.seq_length),
      b_(cfg.layer.micro_batch_size),
      T_(s_ * b_),
      h_(cfg.layer.hidden_size),
      V_(cfg.padded_vocab_size),
      cp_(cfg.layer.cp()),
      sl_(s_ / cp_),
      Tl_(sl_ * b_),
      stack_(stage_configs(cfg, stage_), cfg.ampipe_degree, ep_rank, groups, /*first_layer=*/-1),
      groups_(groups) {
  AMPIPE_CHECK(V_ >= 1, "the vocabulary is not sized: padded_vocab_size {} (train::size_vocabulary sets it)", V_);
  stack_.set_chunks(stage_.chunks);
  // --recompute-granularity full (its block method counts the layers of each model chunk)
  stack_.set_recompute(cfg.stage_recompute(stage_.rank));
  const bool learned_positions = cfg.layer.position_embedding == model::PositionEmbedding::learned_absolute;
  if (stage_.first()) {
    wte_ = normal_init({V_, h_}, cfg, 1);
    if (learned_positions) wpe_ = normal_init({s_, h_}, cfg, 2);  // rope, none: no table
    dwte_ = Tensor::zeros({V_, h_});
    if (learned_positions) dwpe_ = Tensor::zeros({s_, h_});
    params_.push_back({"embedding.word_embeddings.weight", wte_, dwte_, false, true, ""});
    if (learned_positions) params_.push_back({"embedding.position_embeddings.weight", wpe_, dwpe_, false, true, ""});
  }
  for (int i = 0; i < stack_.num_layers(); ++i) {
    auto p = stack_.params(i).named(), g = stack_.grads(i).named();
    for (size_t k = 0; k < p.size(); ++k)
      params_.push_back({fmt::format("layers.{}.{}", stage_.global(i), p[k].first), p[k].second, g[k].second,
                         model::LayerParams::is_expert(p[k].first),
                         (p[k].second.dim() >= 2 && !p[k].first.ends_with(".bias")) ||  // the experts' [L, *] biases
                             (cfg.apply_wd_to_qk_layernorm && model::LayerParams::is_qk_norm(p[k].first)),
                         p[k].first, &stack_.config(i)});
  }
  if (stage_.last()) {
    lnf_w_ = Tensor::empty({h_});
    lnf_w_.fill(1.0f);
    if (!cfg.layer.rmsnorm()) lnf_b_ = Tensor::zeros({h_});  // RMSNorm: no bias
    dlnf_w_ = Tensor::zeros({h_});
    if (!cfg.layer.rmsnorm()) dlnf_b_ = Tensor::zeros({h_});
    params_.push_back({"final_layernorm.weight", lnf_w_, dlnf_w_, false, false, ""});
    if (lnf_b_.defined()) params_.push_back({"final_layernorm.bias", lnf_b_, dlnf_b_, false, false, ""});
    if (cfg.untie_embeddings_and_output_weights) {
      wout_ = normal_init({V_, h_}, cfg, 3);
      dwout_ = Tensor::zeros({V_, h_});
      params_.push_back({"output_layer.weight", wout_, dwout_, false, true, ""});
    } else if (!stage_.first()) {  // tied, on another stage than the embedding: a copy, initialised alike
      wout_ = normal_init({V_, h_}, cfg, 1);
      dwout_ = Tensor::zeros({V_, h_});
    }
  }
  AMPIPE_CHECK(s_ % cp_ == 0, "--seq-length {} is not divisible by --context-parallel-size {}", s_, cp_);
  if (stage_.first()) x0_ = Tensor::empty({sl_, b_, h_});
  if (stage_.last()) {
    xn_ = Tensor::empty({Tl_, h_});
    lnf_mean_ = Tensor::empty({Tl_});
    lnf_rstd_ = Tensor::empty({Tl_});
    logits_ = Tensor::empty({Tl_, V_});
    ce_loss_ = Tensor::empty({Tl_});
    lse_ = Tensor::empty({Tl_});
    dloss_ = Tensor::empty({Tl_});
    dxn_ = Tensor::empty({Tl_, h_});
    dy_ = Tensor::empty({sl_, b_, h_});
  }
  tokens_.resize(size_t(Tl_));
  targets_.resize(size_t(Tl_));
}

std::vector<std::pair<std::string, Tensor>> GptModel::buffers() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (int i = 0; i < stack_.num_layers(); ++i)
    if (const Tensor& b = stack_.params(i).expert_bias; b.defined())
      out.push_back({fmt::format("layers.{}.moe.gate.expert_bias", stage_.global(i)), b});
  return out;
}

void GptModel::zero_grads() {
  for (NamedParam& p : params_) std::memset(p.grad.raw(), 0, p.grad.nbytes());  // contiguous fp32
  if (Tensor g = tied_grad(); g.defined() && !stage_.first()) g.zero();  // the last stage's copy
}

Tensor GptModel::tied_weight() const {
  if (stage_.size == 1 || cfg_.untie_embeddings_and_output_weights) return {};
  return stage_.first() ? wte_ : stage_.last() ? wout_ : Tensor{};
}

Tensor GptModel::tied_grad() const {
  if (stage_.size == 1 || cfg_.untie_embeddings_and_output_weights) return {};
  return stage_.first() ? dwte_ : stage_.last() ? dwout_ : Tensor{};
}

Shape GptModel::stage_activation_shape() const {
  return {cfg_.layer.sp() ? sl_ / cfg_.layer.tp() : sl_, b_, h_};
}

void GptModel::take_batch(std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  take_rows(tokens, targets);
}

void GptModel::forward_layers(int chunk) {
  const int n = stack_.num_layers() / stack_.chunks();
  for (const schedule::StepTask& t : stack_.step_plan().tasks)
    if (t.op == schedule::StepOp::layer && t.dir == model::Dir::fwd && t.layer / n == chunk) run_layer(t);
}

// FLOPs of the last micro-batch's forward + backward on this stage (its model chunk): model::Layer::flops of its
// layers, and after the last one the LM head's three GEMMs 3 x 2 T h V (docs/training.md).
double GptModel::flops_per_micro_batch() const {
  const bool head = stage_.last() && stack_.chunk_layers().second == stack_.num_layers();
  return stack_.flops() + (head ? 3.0 * 2.0 * double(Tl_) * double(h_) * double(V_) : 0.0);
}

// Context parallel: local row i holds global position pos_[i] (the layer's row order at the stack's degree now;
// the trainer may re-plan the degree between steps, so the order is checked on every micro-batch).
void GptModel::take_rows(std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  AMPIPE_CHECK(int64_t(tokens.size()) == T_ && int64_t(targets.size()) == T_, "tokens {}, targets {} vs s*b {}",
               tokens.size(), targets.size(), T_);
  const int M = stack_.degree();
  if (pos_M_ != M) {
    pos_.resize(size_t(sl_));
    const model::CpLayout l = cp_ > 1 ? model::CpLayout::make(s_, cp_, stack_.cp_rank(), M) : model::CpLayout{};
    for (int64_t i = 0; i < sl_; ++i) pos_[size_t(i)] = cp_ > 1 ? l.position(i) : i;
    pos_M_ = M;
  }
  for (int64_t i = 0; i < sl_; ++i) {
    const size_t from = size_t(pos_[size_t(i)] * b_), to = size_t(i * b_);
    std::copy_n(tokens.begin() + ptrdiff_t(from), b_, tokens_.begin() + ptrdiff_t(to));
    std::copy_n(targets.begin() + ptrdiff_t(from), b_, targets_.begin() + ptrdiff_t(to));
  }
}

// x0[t] = wte[token[t]] + wpe[pos[t / b]]   ([s, b] layout: local token t sits at local row t / b)
void GptModel::embed() { kernels::embedding_forward(wte_, wpe_, tokens_, pos_, b_, x0_); }

Tensor GptModel::to_layers(const Tensor& full, Tensor& local) {
  if (!cfg_.layer.sp()) return full;
  const int t = cfg_.layer.tp();
  if (!local.defined()) local = Tensor::empty({sl_ / t, b_, h_});
  model::sequence_shard_into(full, local, stack_.degree(), t, stack_.tp_rank());
  return local;
}

Tensor GptModel::from_layers(const Tensor& local, Tensor& full) {
  if (!cfg_.layer.sp()) return local;
  if (!gathered_.defined()) gathered_ = Tensor::empty({sl_, b_, h_});
  if (!full.defined()) full = Tensor::empty({sl_, b_, h_});
  comm::all_gather_sync(groups_->tp, local, gathered_, "sp.gather");
  model::sequence_unshard_into(gathered_, full, stack_.degree(), cfg_.layer.tp());
  return full;
}

void GptModel::embedding_forward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                 uint64_t token_base, int micro_batch) {
  const auto t0 = Clock::now();
  take_rows(tokens, targets);
  embed();
  Tensor in = to_layers(x0_, x_local_);
  if (const int n = stack_.slots(); n > 1) {  // layer 0 keeps its input to the micro-batch's backward
    x_in_.resize(size_t(n));
    Tensor& kept = x_in_[size_t(micro_batch % n)];
    if (!kept.defined()) kept = Tensor::empty(in.shape());
    kept.copy_from(in);
    in = kept;
  }
  stack_.set_input(in, token_base);
  times_.head_us += us_since(t0);
  trace_since("embedding.fwd", t0);
}

void GptModel::run_layer(const schedule::StepTask& t) {
  const auto t0 = Clock::now();
  stack_.run(t);
  times_.layers_us += us_since(t0);
}

void GptModel::sp_gather(model::Dir d) {
  AMPIPE_CHECK(cfg_.layer.sp(), "sp_gather without sequence parallelism");
  const auto t0 = Clock::now();
  if (d == model::Dir::fwd)
    y_ = from_layers(stack_.output(), y_full_);
  else
    dx0_ = from_layers(stack_.input_grad(), dx_full_);
  times_.head_us += us_since(t0);
  trace_since(d == model::Dir::fwd ? "sp_gather.fwd" : "sp_gather.bwd", t0);
}

// y [Tl, h] -> LN -> xn -> logits [Tl, V] = xn W^T -> per-token cross-entropy; returns their sum / T (the mean
// over the micro-batch; context parallel: this rank's share of it).
double GptModel::head_forward() {
  const auto t0 = Clock::now();
  if (!cfg_.layer.sp()) y_ = stack_.output();  // sequence parallel: sp_gather(fwd) set it
  const Tensor y = y_.view({Tl_, h_});
  model::norm_forward(cfg_.layer, y, lnf_w_, lnf_b_, xn_, lnf_mean_, lnf_rstd_);
  const Tensor& w = wout_.defined() ? wout_ : wte_;
  kernels::gemm(xn_, kernels::Trans::n, w, kernels::Trans::t, logits_, false, 1.0f, stack_.context());
  kernels::cross_entropy_forward(logits_, targets_, ce_loss_, lse_);
  double sum = 0;
  const float* l = ce_loss_.data<float>();
  for (int64_t t = 0; t < Tl_; ++t) sum += l[t];
  times_.head_us += us_since(t0);
  trace_since("head.fwd (final LayerNorm, LM head, loss)", t0);
  return sum / double(T_);
}

void GptModel::head_backward(float loss_scale, float d_aux) {
  const auto t0 = Clock::now();
  // d(loss_scale * mean_t ce_t) / d ce_t = loss_scale / T (the whole micro-batch's T, also for this cp rank's tokens)
  dloss_.fill(loss_scale / float(T_));
  kernels::cross_entropy_backward(dloss_, logits_, targets_, lse_, logits_);  // logits_ now holds dlogits
  const Tensor& dlogits = logits_;
  const Tensor& w = wout_.defined() ? wout_ : wte_;
  Tensor& dw = dwout_.defined() ? dwout_ : dwte_;
  kernels::gemm(dlogits, kernels::Trans::t, xn_, kernels::Trans::n, dw, /*accumulate=*/true, 1.0f,
                stack_.context());  // [V, h] +=
  kernels::gemm(dlogits, kernels::Trans::n, w, kernels::Trans::n, dxn_, false, 1.0f, stack_.context());  // [T, h]
  const Tensor y = y_.view({Tl_, h_});
  Tensor dy2 = dy_.view({Tl_, h_});
  model::norm_backward(cfg_.layer, dxn_, y, lnf_w_, lnf_mean_, lnf_rstd_, dy2, dlnf_w_, dlnf_b_, false);
  stack_.set_output_grad(to_layers(dy_, dy_local_), d_aux);
  times_.head_us += us_since(t0);
  trace_since("head.bwd (loss, LM head, final LayerNorm)", t0);
}

// Embedding backward: dwte[token[t]] += dx0[t], dwpe[pos[t / b]] += dx0[t].
void GptModel::embedding_backward() {
  const auto t0 = Clock::now();
  if (!cfg_.layer.sp()) dx0_ = stack_.input_grad();  // sequence parallel: sp_gather(bwd) set it
  kernels::embedding_backward(dx0_, tokens_, pos_, b_, dwte_, dwpe_);
  times_.head_us += us_since(t0);
  trace_since("embedding.bwd", t0);
}

// One micro-batch in the step Plan's order (the stack's layers-only step Plan between the model's parts).
double GptModel::forward(std::span<const int32_t> tokens, std::span<const int32_t> targets, uint64_t token_base) {
  AMPIPE_CHECK(stage_.size == 1, "GptModel::forward runs the whole model: one pipeline stage");
  embedding_forward(tokens, targets, token_base);
  forward_layers();
  if (cfg_.layer.sp()) sp_gather(model::Dir::fwd);
  return head_forward();
}

double GptModel::evaluate(std::span<const int32_t> tokens, std::span<const int32_t> targets, uint64_t token_base) {
  stack_.set_training(false);  // validation: no dropout, no gate noise
  const double loss = forward(tokens, targets, token_base);
  stack_.set_training(true);
  return loss;
}

void GptModel::backward(float loss_scale, float d_aux, const std::function<void(int)>& after_layer) {
  AMPIPE_CHECK(stage_.size == 1, "GptModel::backward runs the whole model: one pipeline stage");
  head_backward(loss_scale, d_aux);
  for (const schedule::StepTask& t : stack_.step_plan().tasks) {
    if (!t.is_layer() || (t.op == schedule::StepOp::layer && t.dir == model::Dir::fwd)) continue;
    run_layer(t);
    if (after_layer && t.op == schedule::StepOp::layer) after_layer(t.layer);
  }
  if (cfg_.layer.sp()) sp_gather(model::Dir::bwd);
  embedding_backward();
}

}  // namespace ampipe::train
