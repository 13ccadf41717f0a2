#include "ampipe/train/gpt_model.h"

#include <chrono>
#include <cstring>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/trace.h"
#include "ampipe/core/philox.h"
#include "ampipe/kernels/cross_entropy.h"
#include "ampipe/kernels/gemm.h"
#include "ampipe/kernels/layernorm.h"
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
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = float(cfg.layer.init_method_std * double(core::philox_normal(key, id, uint64_t(i))));
  return t;
}

}  // namespace

GptModel::GptModel(const TrainConfig& cfg, int ep_rank, const comm::Groups* groups)
    : cfg_(cfg),
      s_(cfg.layer.seq_length),
      b_(cfg.layer.micro_batch_size),
      T_(s_ * b_),
      h_(cfg.layer.hidden_size),
      V_(cfg.vocab_size),
      stack_(cfg.layer, cfg.num_layers, cfg.ampipe_degree, ep_rank, groups),
      groups_(groups) {
  stack_.set_recompute(cfg.recompute_layers());  // --recompute-granularity full
  wte_ = normal_init({V_, h_}, cfg, 1);
  wpe_ = normal_init({s_, h_}, cfg, 2);
  lnf_w_ = Tensor::empty({h_});
  lnf_w_.fill(1.0f);
  lnf_b_ = Tensor::zeros({h_});
  dwte_ = Tensor::zeros({V_, h_});
  dwpe_ = Tensor::zeros({s_, h_});
  dlnf_w_ = Tensor::zeros({h_});
  dlnf_b_ = Tensor::zeros({h_});
  params_.push_back({"embedding.word_embeddings.weight", wte_, dwte_, false, true, ""});
  params_.push_back({"embedding.position_embeddings.weight", wpe_, dwpe_, false, true, ""});
  for (int i = 0; i < stack_.num_layers(); ++i) {
    auto p = stack_.params(i).named(), g = stack_.grads(i).named();
    for (size_t k = 0; k < p.size(); ++k)
      params_.push_back({fmt::format("layers.{}.{}", i, p[k].first), p[k].second, g[k].second,
                         model::LayerParams::is_expert(p[k].first), p[k].second.dim() >= 2, p[k].first});
  }
  params_.push_back({"final_layernorm.weight", lnf_w_, dlnf_w_, false, false, ""});
  params_.push_back({"final_layernorm.bias", lnf_b_, dlnf_b_, false, false, ""});
  if (cfg.untie_embeddings_and_output_weights) {
    wout_ = normal_init({V_, h_}, cfg, 3);
    dwout_ = Tensor::zeros({V_, h_});
    params_.push_back({"output_layer.weight", wout_, dwout_, false, true, ""});
  }
  x0_ = Tensor::empty({s_, b_, h_});
  xn_ = Tensor::empty({T_, h_});
  lnf_mean_ = Tensor::empty({T_});
  lnf_rstd_ = Tensor::empty({T_});
  logits_ = Tensor::empty({T_, V_});
  ce_loss_ = Tensor::empty({T_});
  lse_ = Tensor::empty({T_});
  dloss_ = Tensor::empty({T_});
  dxn_ = Tensor::empty({T_, h_});
  dy_ = Tensor::empty({s_, b_, h_});
}

void GptModel::zero_grads() {
  for (NamedParam& p : params_) std::memset(p.grad.raw(), 0, p.grad.nbytes());  // contiguous fp32
}

// x0[t] = wte[token[t]] + wpe[t / b]   ([s, b] layout: token t sits at sequence position t / b)
void GptModel::embed(std::span<const int32_t> tokens) {
  AMPIPE_CHECK(int64_t(tokens.size()) == T_, "tokens {} vs s*b {}", tokens.size(), T_);
  const float* e = wte_.data<float>();
  const float* pe = wpe_.data<float>();
  float* x = x0_.data<float>();
  for (int64_t t = 0; t < T_; ++t) {
    const int32_t tok = tokens[size_t(t)];
    AMPIPE_CHECK(tok >= 0 && tok < V_, "token {} at {} outside [0, {})", tok, t, V_);
    const float* er = e + int64_t(tok) * h_;
    const float* pr = pe + (t / b_) * h_;
    float* xr = x + t * h_;
    for (int64_t j = 0; j < h_; ++j) xr[j] = er[j] + pr[j];
  }
}

// y [T, h] -> LN -> xn -> logits [T, V] = xn W^T -> per-token cross-entropy; returns the mean.
Tensor GptModel::to_layers(const Tensor& full, Tensor& local) {
  if (!cfg_.layer.sp()) return full;
  const int t = cfg_.layer.tp();
  if (!local.defined()) local = Tensor::empty({s_ / t, b_, h_});
  model::sequence_shard_into(full, local, stack_.degree(), t, stack_.tp_rank());
  return local;
}

Tensor GptModel::from_layers(const Tensor& local, Tensor& full) {
  if (!cfg_.layer.sp()) return local;
  if (!gathered_.defined()) gathered_ = Tensor::empty({s_, b_, h_});
  if (!full.defined()) full = Tensor::empty({s_, b_, h_});
  comm::all_gather_sync(groups_->tp, local, gathered_, "sp.gather");
  model::sequence_unshard_into(gathered_, full, stack_.degree(), cfg_.layer.tp());
  return full;
}

double GptModel::head_forward(std::span<const int32_t> targets) {
  y_ = from_layers(stack_.layer(stack_.num_layers() - 1).output(), y_full_);
  const Tensor y = y_.view({T_, h_});
  kernels::layernorm_forward(y, lnf_w_, lnf_b_, cfg_.layer.layernorm_epsilon, xn_, lnf_mean_, lnf_rstd_);
  const Tensor& w = wout_.defined() ? wout_ : wte_;
  kernels::gemm(xn_, kernels::Trans::n, w, kernels::Trans::t, logits_);
  kernels::cross_entropy_forward(logits_, targets, ce_loss_, lse_);
  double sum = 0;
  const float* l = ce_loss_.data<float>();
  for (int64_t t = 0; t < T_; ++t) sum += l[t];
  return sum / double(T_);
}

double GptModel::forward(std::span<const int32_t> tokens, std::span<const int32_t> targets, uint64_t token_base) {
  auto t0 = Clock::now();
  tokens_.assign(tokens.begin(), tokens.end());
  targets_.assign(targets.begin(), targets.end());
  embed(tokens);
  times_.head_us += us_since(t0);
  trace_since("embedding.fwd", t0);
  t0 = Clock::now();
  stack_.forward(to_layers(x0_, x_local_), token_base);
  times_.layers_us += us_since(t0);
  t0 = Clock::now();
  const double loss = head_forward(targets);
  times_.head_us += us_since(t0);
  trace_since("head.fwd (final LayerNorm, LM head, loss)", t0);
  return loss;
}

double GptModel::evaluate(std::span<const int32_t> tokens, std::span<const int32_t> targets, uint64_t token_base) {
  embed(tokens);
  stack_.set_training(false);  // validation: no dropout, no gate noise
  stack_.forward(to_layers(x0_, x_local_), token_base);
  stack_.set_training(true);
  return head_forward(targets);
}

void GptModel::backward(float loss_scale, float d_aux, const std::function<void(int)>& after_layer) {
  auto t0 = Clock::now();
  // d(loss_scale * mean_t ce_t) / d ce_t = loss_scale / T
  dloss_.fill(loss_scale / float(T_));
  kernels::cross_entropy_backward(dloss_, logits_, targets_, lse_, logits_);  // logits_ now holds dlogits
  const Tensor& dlogits = logits_;
  const Tensor& w = wout_.defined() ? wout_ : wte_;
  Tensor& dw = dwout_.defined() ? dwout_ : dwte_;
  kernels::gemm(dlogits, kernels::Trans::t, xn_, kernels::Trans::n, dw, /*accumulate=*/true);  // [V, h] +=
  kernels::gemm(dlogits, kernels::Trans::n, w, kernels::Trans::n, dxn_);                       // [T, h]
  const Tensor y = y_.view({T_, h_});
  Tensor dy2 = dy_.view({T_, h_});
  kernels::layernorm_backward(dxn_, y, lnf_w_, lnf_mean_, lnf_rstd_, dy2, dlnf_w_, dlnf_b_);
  times_.head_us += us_since(t0);
  trace_since("head.bwd (loss, LM head, final LayerNorm)", t0);
  t0 = Clock::now();
  const Tensor dx0 = from_layers(stack_.backward(to_layers(dy_, dy_local_), d_aux, after_layer), dx_full_);
  times_.layers_us += us_since(t0);
  t0 = Clock::now();
  // Embedding backward: dwte[token[t]] += dx0[t], dwpe[t / b] += dx0[t].
  const float* g = dx0.data<float>();
  float* de = dwte_.data<float>();
  float* dp = dwpe_.data<float>();
  for (int64_t t = 0; t < T_; ++t) {
    const float* gr = g + t * h_;
    float* er = de + int64_t(tokens_[size_t(t)]) * h_;
    float* pr = dp + (t / b_) * h_;
    for (int64_t j = 0; j < h_; ++j) {
      er[j] += gr[j];
      pr[j] += gr[j];
    }
  }
  last_flops_ = stack_.flops() + 3.0 * 2.0 * double(T_) * double(h_) * double(V_);
  times_.head_us += us_since(t0);
  trace_since("embedding.bwd", t0);
}

}  // namespace ampipe::train
