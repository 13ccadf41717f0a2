// The training loop of `ampipe train` (docs/training.md).
//
// One iteration: the global batch of G sequences is cut into G/b micro-batches of b; data-parallel rank r runs
// micro-batches [r*K, (r+1)*K), K = G/(b*dp), each forward and backward through GptModel (gradients accumulate).
// The cp ranks of a data-parallel rank share its micro-batches (each runs its s/C positions, gpt_model.h), so the
// data is cut by the dp rank alone and a micro-batch counts once however many cp ranks hold parts of it.
// Micro-batch m of the iteration holds training samples consumed + m*b + [0, b) (text_data.h), and its token 0 has
// global index (consumed + m*b) * s, which keys dropout and gate noise: so neither the AMPipe degree, nor the EP
// size, nor the number of ranks, nor an interruption changes any random number. Then the gradients are summed over
// the ranks that hold the same parameter (non-expert: dp_cp group; expert: edp group; each as one flat buffer)
// and divided by G/b (the cp ranks' parts of a micro-batch's gradient add up to it): the gradient of the mean over the global batch of (mean token cross-entropy +
// --moe-aux-loss-coeff x aux loss). Global gradient norm (each parameter counted once: non-expert tensors are
// identical on every rank, expert shards are summed over the EP group), clipping to --clip-grad, AdamW step.
#pragma once

#include "ampipe/comm/event.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <string>
#include <vector>

#include "ampipe/comm/group.h"
#include "ampipe/schedule/step_plan.h"
#include "ampipe/train/adamw.h"
#include "ampipe/train/checkpoint.h"
#include "ampipe/train/gpt_model.h"
#include "ampipe/train/grad_layout.h"
#include "ampipe/train/text_data.h"
#include "ampipe/train/train_config.h"

namespace ampipe::train {

class EventWriter;  // train/tensorboard.h

struct IterationStats {
  int64_t iteration = 0;  // 1-based, after the step
  double lm_loss = 0, aux_loss = 0, grad_norm = 0, lr = 0;
  double z_loss = 0;  // the routers' z-loss (--moe-z-loss-coeff, coefficient included), mean over micro-batches
  double drop_fraction = 0;  // expert choices (token, k) over capacity / all choices, every layer and rank
  double iter_ms = 0, layers_ms = 0, head_ms = 0, optim_ms = 0;  // this rank
  double reduce_ms = 0;  // part of optim_ms: gradient and loss all-reduce
  double flops = 0;                                            // this rank, forward + backward
  double exposed_comm_ms = 0;  // compute blocked on any collective (all-to-alls and the gradient all-reduce)
  double a2a_ms = 0, a2a_exposed_ms = 0;  // all-to-all time on the EP lane, and the part compute waited for
};

// Expert load of one layer over a logging window (the training micro-batches of --log-interval iterations, every
// chunk, summed over the data-parallel ranks, and over the tp ranks with sequence parallelism, where each routes
// its own rows; without it the tp ranks route the same tokens and count once).
struct MoeLayerStats {
  std::vector<int64_t> tokens;  // [E] token choices each expert kept (within its capacity)
  int64_t dropped = 0;          // token choices (token, k) that found their expert full
  int64_t choices = 0;          // all token choices: tokens x top-k
  // max / mean of `tokens` over the experts (1: balanced; 0 when nothing was kept)
  double load_imbalance() const;
  double dropped_fraction() const { return choices > 0 ? double(dropped) / double(choices) : 0.0; }
};

struct MoeLog {
  int64_t iteration = 0;  // the log point
  std::vector<MoeLayerStats> layers;
};

struct EvalStats {
  int64_t iteration = 0;
  double lm_loss = 0;
};

struct TrainResult {
  std::vector<IterationStats> iterations;
  std::vector<EvalStats> evals;
  std::vector<MoeLog> moe;        // at every log point
  std::vector<EvalStats> tests;  // the test split's loss at the end (when --split gives it a global batch)
  double wall_s = 0;
  int64_t start_iteration = 0;
  int stop_signal = 0;  // the SIGTERM / SIGINT that stopped the run early on every rank (stop_signal.h); 0: none
};

class Trainer {
 public:
  // cfg must be validated for groups.world.size(). The groups' layout must have cfg's EP size.
  Trainer(const TrainConfig& cfg, const comm::Groups& groups, std::shared_ptr<const TextData> data);
  ~Trainer();

  // Loads --load when set (collective). Returns the iteration it resumes from (0 without --load or with
  // --finetune; --no-load-optim and --finetune keep the fresh optimizer).
  int64_t maybe_load();
  // Trains from the current iteration to --train-iters (or the next multiple of --exit-interval, or
  // max_iterations when > 0, whichever comes first); the last iteration of the call is evaluated and saved as the
  // end of a run is. With nothing to train (--skip-train, or already at --train-iters) it evaluates only.
  // `print`: called on rank 0 with each output line (log, evaluation, checkpoint); may be empty.
  TrainResult train(const std::function<void(const std::string&)>& print = {}, int64_t max_iterations = 0);
  // The iteration train(print, max_iterations) would stop after (the current one when it trains nothing).
  int64_t end_iteration(int64_t max_iterations = 0) const;
  // Mean validation loss over --eval-iters global batches (collective). test: over the test split of --split
  // instead, on min(--eval-iters, test_eval_iters()) global batches.
  double evaluate(bool test = false);
  // Global batches the test split holds (0: no test evaluation).
  int64_t test_eval_iters() const;
  // Every parameter as the full tensor (expert tensors gathered over EP), by name (collective), and the model's
  // saved state that is not trained (GptModel::buffers: the routers' expert biases).
  std::map<std::string, Tensor> full_params();

  int64_t iteration() const { return iteration_; }
  int64_t consumed_samples() const { return consumed_; }
  GptModel& model() { return model_; }
  void set_save_options(SaveOptions o) { save_opts_ = o; }
  // Whether the log states the share of the all-to-all time hidden behind compute: only where the all-to-alls
  // cross a wire (ranks on more than one host). On shared memory the all-to-all is a copy on the same cores, and
  // its time grows with the degree, so the share misleads; exposed times are printed always (docs/training.md).
  void set_report_a2a_hidden(bool on) { report_a2a_hidden_ = on; }
  void save(int64_t iteration);  // collective

 private:
  IterationStats train_step();
  void count_drops(double& dropped, double& choices);
  // Adds the last forward's routing (every layer and chunk) to the window's expert loads (moe_counts_).
  void count_expert_loads();
  // The window's expert loads summed over the ranks (one all-reduce; collective), then reset.
  MoeLog reduce_expert_loads(int64_t iteration);
  // Megatron's log line for a window of iterations, the MoE lines and the TensorBoard scalars (collective).
  MoeLog log_window(const std::vector<IterationStats>& window, const IterationStats& st, bool tty,
                    const std::function<void(const std::string&)>& say);
  // The test split's loss at the end of a run (when it holds a global batch), printed through `say`.
  // Rank 0 with --tensorboard-dir: the loss and perplexity of an evaluation ("validation" or "test").
  void write_eval_scalars(int64_t iteration, double loss, const char* split);
  void evaluate_test(TrainResult& res, const std::function<void(const std::string&)>& say);
  enum class Split { train, valid, test };
  void fill_batch(int64_t first_sample, Split which);
  // The iteration as the step Plan's tasks (schedule/step_plan.h), built by plan_step() and rebuilt when the
  // layers are re-planned; run_step_task runs one, in the Plan's order.
  struct StepState {
    IterationStats st;
    double loss_sum = 0, aux_sum = 0, dropped = 0, choices = 0, z_sum = 0;
    std::chrono::steady_clock::time_point t_opt{};
  };
  void plan_step();
  void run_step_task(const schedule::StepTask& t, StepState& s);
  // Data-parallel reduction of the gradients, bucket by bucket where the step Plan issues it (each layer's during
  // the last micro-batch's backward): pack_bucket, reduce_bucket; finished by reduce_gradients() (wait, scale, sums
  // over tp, sums of squares).
  template <class F>
  void for_bucket_runs(int layer, schedule::Bucket b, F&& f);
  // The distributed optimizer (grad_layout.h): gathers of sharded runs, the parameters after the step, and the
  // whole optimizer state for checkpoints.
  // gather_run: one run's gather, its event added to `into`; param_gather: a bucket's updated parameters, if the
  // optimizer changed them since their last gather; param_unpack / unpack_params: waits for the gathers of a layer
  // (-1: of every bucket in flight) and copies its parameters out; sync_params: every parameter whole again (before
  // anything outside the step reads them: --overlap-param-gather leaves the layers' gathers to the next step).
  template <class Src>
  void gather_run(const GradRun& r, Src&& src, const char* what, std::vector<comm::Event>& into);
  void param_gather(int layer, schedule::Bucket b);
  void param_unpack(int layer, StepState& s);
  void unpack_params(int layer);
  void sync_params();
  AdamW whole_optimizer_state();
  void take_optimizer_state(AdamW& whole);
  void pack_bucket(int layer, schedule::Bucket b);
  void reduce_bucket(int layer, schedule::Bucket b);
  void reduce_gradients();
  void finish_gradients(StepState& s);  // grad_finish: reduce_gradients, losses, norm, the finite check
  void optimizer_step(StepState& s);
  double grad_norm();
  // Pipeline parallelism (--pipeline-model-parallel-size > 1; the step Plan's pp tasks): receives posted into the
  // micro-batch's slot, waited for and handed to the layers; sends from a copy of the stage's output or input
  // gradient (so a later forward may overwrite them); the tied embedding between the first and last stage; the stage's share of the step's statistics after each forward.
  void pp_recv(const schedule::StepTask& t);
  void pp_wait(const schedule::StepTask& t);
  void pp_send(const schedule::StepTask& t, StepState& s);
  void exchange_tied(bool grad);  // tied_grad (last -> first stage, added) or tied_param (first -> last, copied)
  void after_forward(StepState& s);
  int64_t first_sample(int micro_batch) const { return consumed_ + (dp_rank_ * K_ + micro_batch) * b_; }
  double evaluate_pipeline(bool test, int64_t iters);

  TrainConfig cfg_;
  const comm::Groups& g_;
  std::shared_ptr<const TextData> data_;
  GptModel model_;
  AdamW opt_;
  int64_t s_, b_, G_, K_, dp_rank_;
  int64_t iteration_ = 0, consumed_ = 0;
  std::vector<int32_t> tokens_, targets_;
  std::vector<size_t> dense_idx_, expert_idx_;
  GradLayout layout_;  // the flat buffers' runs and this rank's shards
  Tensor dense_buf_, expert_buf_;
  bool gathers_params_ = false;        // the step Plan gathers the parameters after the optimizer (param_unpack)
  std::set<std::pair<int, bool>> stale_;  // (layer, expert) buckets updated by the optimizer and not yet gathered
  std::map<std::pair<int, bool>, std::vector<comm::Event>> param_gathers_;  // gathered, not yet unpacked
  Tensor scalars_;  // [2] the step's few all-reduced scalars (losses, norms), allocated once
  std::vector<int> layer_of_;    // per parameter: the block it belongs to ("layers.{i}."), -1 for the others
  std::vector<comm::Event> pending_;  // reductions in flight
  schedule::StepPlan step_;
  uint64_t step_generation_ = 0;  // the stack's generation step_ was built for (0: not yet)
  double dense_sumsq_ = 0, expert_sumsq_ = 0, tp_sharded_sumsq_ = 0;
  double expert_whole_sumsq_ = 0;  // expert tensors every tp rank holds whole (the experts' fc2 bias)
  // Per layer: E kept counts, then dropped, then choices (E + 2 per layer), over the current logging window.
  std::vector<int64_t> moe_counts_;
  Tensor moe_buf_;  // their all-reduce, allocated once: [2 x size] as low and high 12-bit-shifted parts
  std::unique_ptr<EventWriter> tb_;  // rank 0 with --tensorboard-dir, opened by the first train()
  SaveOptions save_opts_;
  bool report_a2a_hidden_ = false;
  // pipeline slots: received activations (per model chunk: the layers' inputs, kept to the backward: one per
  // micro-batch in flight, plus the one being received), received gradients (the one taken and the one coming, in
  // the order received), and the send copies (each reused once its send is done, in the order sent)
  std::vector<std::vector<Tensor>> pp_in_;
  std::vector<Tensor> pp_grad_in_, pp_out_, pp_grad_out_;
  std::vector<comm::Event> pp_out_ev_, pp_grad_out_ev_;
  int64_t pp_sent_[2] = {0, 0}, pp_grads_received_ = 0;  // per direction (bwd, fwd); gradient receives posted
  struct PpReceive {
    comm::Event ev;
    Tensor buf;
  };
  std::map<std::tuple<int, int, bool>, PpReceive> pp_recv_ev_;  // (micro-batch, chunk, forward?) -> its receive
  Tensor tied_buf_;                                          // the first stage's receive of the tied gradient
};

}  // namespace ampipe::train
