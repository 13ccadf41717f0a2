#include "ampipe/cli/train.h"

#include <filesystem>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unistd.h>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ampipe/cli/auto_degree.h"
#include "ampipe/cli/train_agreement.h"
#include "ampipe/comm/collectives.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/core/host_memory.h"
#include "ampipe/core/parallel.h"
#include "ampipe/train/memory_estimate.h"
#include "ampipe/train/checkpoint_args.h"
#include "ampipe/train/loss_plot.h"
#include "ampipe/train/megatron_args.h"
#include "ampipe/train/megatron_data.h"
#include "ampipe/train/stop_signal.h"
#include "ampipe/train/text_data.h"
#include "ampipe/train/tokenizer.h"
#include "ampipe/train/trainer.h"
#include "ampipe/train/vocab_size.h"

namespace ampipe::cli {

namespace {

// The one line of a run stopped by a signal (every rank agreed on it), and the exit code 128 + signal number.
int report_stop(const train::TrainResult& res, const train::TrainConfig& cfg, bool rank0) {
  const int64_t it = res.iterations.empty() ? res.start_iteration : res.iterations.back().iteration;
  if (rank0) {
    std::fflush(stdout);
    const std::string saved =
        cfg.save.empty() ? std::string("no --save given, nothing saved")
                         : fmt::format("checkpoint saved to {}/{}; resume with --load {}", cfg.save,
                                       train::checkpoint_subdir(it), cfg.save);
    fmt::print(stderr, "ampipe: stopped by {} after iteration {} of {} on every rank: {}\n",
               train::signal_name(res.stop_signal), it, cfg.train_iters, saved);
    std::fflush(stderr);
  }
  return 128 + res.stop_signal;
}

}  // namespace

namespace {

// The data, before any collective (a bad file fails identically on every rank); sizes the vocabulary
// (cfg.padded_vocab_size, train/vocab_size.h; `vocab` says how), and caps --eval-iters to what the validation split
// holds (a note), refusing a split below one global batch. `padded_origin`: where a --padded-vocab-size not given on
// the command line came from.
std::shared_ptr<const train::TextData> prepare_data(train::TrainConfig& cfg, TrainFlags& flags, int world,
                                                    train::VocabSizing& vocab, const std::string& padded_origin) {
  const std::unique_ptr<train::Tokenizer> tokenizer =
      train::make_tokenizer(cfg.tokenizer_type, cfg.tokenizer_model, cfg.vocab_file, cfg.merge_file);
  train::TrainingData loaded = train::load_training_data(cfg, tokenizer.get(), padded_origin);
  std::shared_ptr<const train::TextData> data = std::move(loaded.data);
  vocab = std::move(loaded.vocab);
  for (const std::string& n : vocab.notes) flags.layer.notices.push_back(n);
  const int64_t multiple = cfg.make_vocab_size_divisible_by * cfg.layer.tp();  // (validated: no overflow)
  if (!vocab.computed && flags.given("--make-vocab-size-divisible-by") && cfg.padded_vocab_size % multiple != 0)
    flags.layer.notices.push_back(fmt::format("--make-vocab-size-divisible-by {} has no effect: --padded-vocab-size "
                                              "{} is the model's vocabulary as given (Megatron pads only a "
                                              "vocabulary it computes)",
                                              cfg.make_vocab_size_divisible_by, cfg.padded_vocab_size));
  // Megatron evaluates nothing without validation data (per-split paths without --valid-data-path).
  if (cfg.evaluates() && data->valid_samples() == 0 && !cfg.train_data_path.empty() && cfg.valid_data_path.empty()) {
    flags.layer.notices.push_back("no --valid-data-path: no evaluation (as Megatron without validation data)");
    cfg.eval_iters = 0;
  }
  // Evaluation reads each validation sequence at most once: --eval-iters beyond the split is capped (a note), a
  // split below one global batch is refused. The test split (--split) gets what it holds, up to --eval-iters.
  const int64_t G = cfg.global_batch(world);
  const bool evaluates = cfg.evaluates();
  if (evaluates && cfg.eval_iters * G > data->valid_samples()) {
    const int64_t fit = data->valid_samples() / G;
    if (fit < 1)
      throw ConfigError(fmt::format("--eval-iters {}: the validation split holds {} sequences, fewer than one global "
                                    "batch of {}: give it more of the data (--split or --valid-fraction) or pass "
                                    "--eval-interval 0",
                                    cfg.eval_iters, data->valid_samples(), G));
    if (flags.given("--eval-iters"))  // Megatron's default of 100 is capped without a word
      flags.layer.notices.push_back(fmt::format("--eval-iters {} needs {} validation sequences, the validation "
                                                "split holds {}: evaluating on {} global batches",
                                                cfg.eval_iters, cfg.eval_iters * G, data->valid_samples(), fit));
    cfg.eval_iters = fit;
  }
  if (evaluates && data->test_samples() < G && train::data_split(cfg).test > 0 && flags.given("--split") &&
      cfg.train_data_path.empty())
    flags.layer.notices.push_back(fmt::format("the test split of --split {} holds {} sequences, fewer than one global "
                                              "batch of {}: no test evaluation",
                                              train::split_str(train::data_split(cfg)), data->test_samples(), G));
  return data;
}

// The token data's memory (train::data_memory, from the file's size) against --memory-limit, or against what the
// host can still give, before a byte of it is read: a token file that cannot fit is one line naming it and the
// sizes, not an allocation failure halfway through loading it (issue 27, item 4). A Megatron indexed dataset is
// memory-mapped and costs no heap.
void check_data_memory(const train::TrainConfig& cfg, const MemoryFlags& memory) {
  const bool single = cfg.train_data_path.empty() && cfg.valid_data_path.empty() && cfg.test_data_path.empty() &&
                      cfg.data_path.size() <= 1;
  if (!single) return;
  const train::DataMemory dm = train::data_memory(cfg.data_path.empty() ? std::string() : cfg.data_path.front());
  const int64_t limit = memory.limit_bytes();
  if (limit == 0 || dm.peak == 0) return;
  const int64_t now = std::max<int64_t>(core::current_rss_bytes(), 0);
  const std::string what = dm.path.empty() ? std::string("the bundled corpus") : "--data-path " + dm.path;
  // (a limit the process exceeds already is the whole estimate's refusal, after the data: the data are not the cause)
  if (limit > 0 && now <= limit && now + dm.peak > limit)
    throw ConfigError(fmt::format("{}: loading it takes {} ({}) on top of the {} this process holds, more than "
                                  "--memory-limit {} ({} bytes): use a Megatron indexed dataset (memory-mapped: "
                                  "ampipe preprocess writes one), a smaller file, or a larger --memory-limit (0 turns "
                                  "the check off)",
                                  what, core::format_bytes(double(dm.peak)), dm.describe,
                                  core::format_bytes(double(now)), core::format_bytes(double(limit)), limit));
  if (limit < 0) {
    const core::HostMemory host = core::available_memory();
    if (host.bytes >= 0 && dm.peak > host.bytes)
      throw ConfigError(fmt::format("{}: loading it takes {} ({}), more than the {} available ({}): use a Megatron "
                                    "indexed dataset (memory-mapped: ampipe preprocess writes one), a smaller file, or "
                                    "pass --memory-limit BYTES (0 turns the check off)",
                                    what, core::format_bytes(double(dm.peak)), dm.describe,
                                    core::format_bytes(double(host.bytes)), host.source));
  }
}

// Rank 0's lines before the first iteration: the model and layout, what AMPipe and cp guarantee, the data, the
// memory estimate, the checkpoint this run starts from.
struct RunInfo {
  const train::TrainConfig& cfg;
  const comm::Layout& layout;
  const train::TextData& data;
  const schedule::MemoryEstimate& mem;
  int64_t rss_now = 0, start = 0, n_params = 0, ckpt_iteration = 0;
  int world = 1;
};

void print_header(const RunInfo& r) {
  const train::TrainConfig& cfg = r.cfg;
  const model::LayerConfig& l = cfg.layer;
  const train::TextData* data = &r.data;
  const schedule::MemoryEstimate& mem = r.mem;
  const int64_t G = cfg.global_batch(r.world), rss_now = r.rss_now, start = r.start;
  std::string tp = l.tp() == 1 ? "" : fmt::format("tp={}{} ", l.tp(), l.sp() ? " (sequence parallel)" : "");
  if (l.cp() > 1) tp += fmt::format("cp={} ({}) ", l.cp(), l.context_parallel_algo);
  if (cfg.pp() > 1)
    tp += cfg.virtual_stages() > 1
              ? fmt::format("pp={} (interleaved, {} virtual stages per rank) ", cfg.pp(), cfg.virtual_stages())
              : fmt::format("pp={} (1F1B) ", cfg.pp());
  fmt::print("ampipe train: GPT-MoE L={} s={} h={} F={} heads={} E={} top-{} V={}{} ({:.2f} M parameters, {}) | "
             "ranks={} {}ep={} dp={} ampipe-degree={}{} | global batch {} x {} tokens, micro-batch {}\n",
             cfg.num_layers, l.seq_length, l.hidden_size, l.ffn_hidden_size, l.num_attention_heads, l.num_experts,
             l.moe_router_topk, cfg.padded_vocab_size, cfg.ffn_summary(), double(r.n_params) / 1e6, l.bf16 ? "bf16" : "fp32", r.world, tp,
             r.layout.ep, r.layout.dp, cfg.ampipe_degree, l.ampipe_tp_sp_comm_overlap ? " tp-overlap" : "", G,
             l.seq_length, l.micro_batch_size);
  fmt::print("  {}\n", threading_summary(r.world));
  if (cfg.ampipe_degree > 1)
    fmt::print("  AMPipe degree {} {}\n", cfg.ampipe_degree,
               l.dropless()
                   ? (l.moe_no_drop ? "equals degree 1 up to summation order: --moe-no-drop drops no token"
                                  : "equals degree 1 up to summation order: Megatron-Core's router drops no token")
                   : fmt::format("equals degree 1 only while no token is dropped: each chunk of s/M positions routes "
                                 "its tokens with its own capacity ({} {}), so its drops (the log's token drops) may "
                                 "differ from degree 1's; {} makes it exact",
                                 l.megatron_capacity() ? "--moe-expert-capacity-factor" : "--moe-train-capacity-factor",
                                 l.megatron_capacity() ? l.moe_expert_capacity_factor : l.moe_train_capacity_factor,
                                 l.megatron_capacity() ? "no capacity factor" : "--moe-no-drop"));
  if (l.cp() > 1)
    fmt::print("  context parallelism {} {}\n", l.cp(),
               l.dropless()
                   ? (l.moe_no_drop ? "equals cp 1 up to summation order: --moe-no-drop drops no token"
                                  : "equals cp 1 up to summation order: Megatron-Core's router drops no token")
                   : fmt::format("equals cp 1 only while no token is dropped: each cp rank routes its own s/cp = {} "
                                 "positions (chunk by chunk) with its own capacity, so its drops may differ from cp "
                                 "1's; {} makes it exact",
                                 l.seq_length / l.cp(), l.megatron_capacity() ? "no capacity factor" : "--moe-no-drop"));
  fmt::print("  data: {} ({} tokens) | split {}: {} training / {} validation / {} test sequences\n",
             data->source(), data->tokens(), data->split_description(train::data_split(cfg)), data->train_samples(),
             data->valid_samples(), data->test_samples());
  fmt::print("  memory: estimated peak {} per rank\n", mem.describe());
  if (!cfg.recompute_granularity.empty()) {  // the same estimate without recomputation, for comparison
    train::TrainConfig keep = cfg;
    keep.recompute_granularity.clear();
    keep.recompute_method.clear();
    keep.layer.recompute_attention = false;
    schedule::MemoryEstimate without = train::estimate_train_memory(keep, data->train_samples(), r.world);
    without.parts.insert(without.parts.begin(), {"process now (code, MPI, data)", rss_now});
    fmt::print("  recomputation ({}): estimated peak {} per rank, {} without\n", cfg.recompute_granularity,
               core::format_bytes(double(mem.total())), core::format_bytes(double(without.total())));
  }
  if (cfg.finetune)
    fmt::print("  finetuning the model of {} (iteration {}): a fresh optimizer, from iteration 0\n", cfg.load,
               r.ckpt_iteration);
  else if (!cfg.load.empty())
    fmt::print("  resumed from {} at iteration {}{}\n", cfg.load, start,
               cfg.no_load_optim ? " (the model only: a fresh optimizer, --no-load-optim)" : "");
  std::fflush(stdout);
}

// Rank 0's summary after the run: losses, speed, and where an iteration's time went.
void print_summary(const train::TrainResult& res, const train::TrainConfig& cfg, const comm::Layout& layout,
                   bool multi_host, int64_t start, int world) {
  const model::LayerConfig& l = cfg.layer;
  const int64_t G = cfg.global_batch(world);
  if (res.iterations.empty()) {  // --skip-train, or the checkpoint is already at --train-iters
    fmt::print("ampipe train: done: no iteration trained ({}; the model of iteration {})",
               cfg.skip_train ? "--skip-train" : fmt::format("--train-iters {} reached", cfg.train_iters), start);
    if (!res.evals.empty())
      fmt::print(" | validation loss {:.3f} (ppl {:.2f})", res.evals.back().lm_loss, std::exp(res.evals.back().lm_loss));
    if (!res.tests.empty())
      fmt::print(" | test loss {:.3f} (ppl {:.2f})", res.tests.back().lm_loss, std::exp(res.tests.back().lm_loss));
    fmt::print("\n");
    std::fflush(stdout);
  }
  if (!res.iterations.empty()) {
    const auto& its = res.iterations;
    // The first and the last 10 iterations; a run shorter than 20 compares its first and its second half, so the
    // two windows never overlap (one iteration: no comparison).
    const size_t n = its.size(), w = n >= 20 ? 10 : n / 2;
    double first = 0, last = 0;
    for (size_t i = 0; i < w; ++i) {
      first += its[i].lm_loss / double(w);
      last += its[n - w + i].lm_loss / double(w);
    }
    // Speed over the iterations after the first (which creates the oneDNN primitives).
    const size_t from = n > 1 ? 1 : 0;
    double iter = 0, layers = 0, head = 0, optim = 0, reduce = 0, flops = 0, a2a = 0, a2a_exp = 0, exposed = 0;
    for (size_t i = from; i < n; ++i) {
      iter += its[i].iter_ms;
      layers += its[i].layers_ms;
      head += its[i].head_ms;
      optim += its[i].optim_ms;
      reduce += its[i].reduce_ms;
      flops += its[i].flops;
      a2a += its[i].a2a_ms;
      a2a_exp += its[i].a2a_exposed_ms;
      exposed += its[i].exposed_comm_ms;
    }
    const double k = double(n - from);
    const double other = iter - layers - head - optim;
    fmt::print("ampipe train: done: iterations {}..{} in {:.1f} s | ", res.start_iteration + 1, its.back().iteration,
               res.wall_s);
    if (w > 0)
      fmt::print("lm loss {:.3f} -> {:.3f} (mean of the first / last {} iterations)", first, last, w);
    else
      fmt::print("lm loss {:.3f} (one iteration)", its.back().lm_loss);
    if (!res.evals.empty())
      fmt::print(" | validation loss {:.3f} (ppl {:.2f})", res.evals.back().lm_loss, std::exp(res.evals.back().lm_loss));
    if (!res.tests.empty())
      fmt::print(" | test loss {:.3f} (ppl {:.2f})", res.tests.back().lm_loss, std::exp(res.tests.back().lm_loss));
    fmt::print("\n  speed: {:.1f} ms/iteration, {:.0f} tokens/s, {:.4f} TFLOP/s per rank | exposed comm {:.2f} ms/iter",
               iter / k, double(G * l.seq_length) / (iter / k / 1e3), flops / (iter / 1e3) / 1e12, exposed / k);
    if (layout.ep > 1) fmt::print(" (all-to-all {:.2f})", a2a_exp / k);
    if (layout.ep > 1 && multi_host && a2a > 0)
      fmt::print(", all-to-all {:.2f} ms/iter on the EP lane of which {:.1f}% hidden", a2a / k,
                 100 * std::clamp(1 - a2a_exp / a2a, 0.0, 1.0));
    fmt::print("\n  time per iteration: layer steps {:.1f} ms ({:.1f}%), embedding + LM head + loss {:.1f} ms ({:.1f}%), "
               "gradient all-reduce {:.1f} ms + norm, clip, AdamW {:.1f} ms ({:.1f}% together), other {:.1f} ms ({:.1f}%) | loop overhead over the "
               "model's compute (layers + head): {:.1f}%\n",
               layers / k, 100 * layers / iter, head / k, 100 * head / iter, reduce / k, (optim - reduce) / k, 100 * optim / iter, other / k,
               100 * other / iter, 100 * (iter - layers - head) / (layers + head));
    std::fflush(stdout);
  }
}

}  // namespace

namespace {

// Megatron's start-or-resume: a --load directory without a checkpoint (no marker file, or no directory yet) starts
// from scratch with a note, so one launch script both starts and resumes a run (--load DIR --save DIR); the options
// that shape a load then have nothing to act on, as in Megatron. A marker that exists is loaded and verified (a
// corrupt one is an error, never a fresh start).
// With --exit-on-missing-checkpoint (Megatron's) a --load without a checkpoint is an error instead.
void start_or_resume(train::TrainConfig& cfg, TrainFlags& flags) {
  std::vector<std::string>& notices = flags.layer.notices;
  std::error_code ec;
  if (!cfg.load.empty() && std::filesystem::exists(cfg.load, ec) && !std::filesystem::is_directory(cfg.load, ec))
    throw ConfigError(fmt::format("--load {}: not a directory ({}): --load names a checkpoint directory, the one "
                                  "--save wrote",
                                  cfg.load,
                                  std::filesystem::is_regular_file(cfg.load, ec) ? "a regular file"
                                                                                 : "not a regular file"));
  if (!cfg.load.empty() && !train::checkpoint_exists(cfg.load)) {
    const std::string why = std::filesystem::is_directory(cfg.load)
                                ? std::string(train::kLatestMarker) + " is missing"
                                : "the directory does not exist";
    if (flags.exit_on_missing_checkpoint)
      throw ConfigError(fmt::format("--load {}: no checkpoint there ({}); --exit-on-missing-checkpoint: exiting "
                                    "instead of starting from iteration 0",
                                    cfg.load, why));
    notices.push_back(fmt::format("--load {}: no checkpoint there ({}): starting from iteration 0, as Megatron does",
                                  cfg.load, why));
    cfg.load.clear();
  }
  if (!cfg.load.empty()) return;
  for (const auto& [flag, on] : {std::pair{"--no-load-optim", cfg.no_load_optim}, {"--finetune", cfg.finetune},
                                 {"--use-checkpoint-args", cfg.use_checkpoint_args},
                                 {"--use-checkpoint-opt-param-scheduler", flags.use_checkpoint_opt_param_scheduler}})
    if (on) notices.push_back(fmt::format("{} has no effect: no checkpoint is loaded", flag));
  cfg.no_load_optim = cfg.finetune = cfg.use_checkpoint_args = false;
  flags.use_checkpoint_opt_param_scheduler = false;
}

}  // namespace

int run_train(TrainFlags& flags) {
  // SIGTERM / SIGINT from here on finish the current iteration on every rank and save (train/stop_signal.h).
  const train::StopSignalGuard stop_guard;
  train::TrainConfig cfg = flags.finish();
  (void)flags.memory.limit_bytes();  // a bad --memory-limit is refused before anything runs
  comm::Runtime& rt = comm::Runtime::current();
  flags.resolve(cfg, rt.size());
  // The checkpoint's configuration (files only, every rank): --use-checkpoint-args takes its model flags, and
  // every other setting this run changes is said (load_checkpoint refuses a different model shape).
  start_or_resume(cfg, flags);
  std::optional<train::CheckpointInfo> ckpt;
  const bool from_checkpoint = cfg.use_checkpoint_args || flags.use_checkpoint_opt_param_scheduler;
  if (!cfg.load.empty()) ckpt = train::read_checkpoint_info(cfg.load, from_checkpoint);
  if (ckpt && cfg.use_checkpoint_args)
    for (const std::string& line : train::apply_checkpoint_model_args(cfg, ckpt->config))
      flags.layer.notices.push_back("--use-checkpoint-args: " + line + " (from the checkpoint)");
  if (ckpt && flags.use_checkpoint_opt_param_scheduler)
    for (const std::string& line : train::apply_checkpoint_schedule(cfg, ckpt->config))
      flags.layer.notices.push_back("--use-checkpoint-opt-param-scheduler: " + line + " (from the checkpoint)");
  cfg.validate(rt.size());
  std::vector<std::string> resume_notes;  // said once the checkpoint has loaded (a model mismatch is an error)
  if (ckpt)
    for (const std::string& line : train::describe_resume_changes(ckpt->config, train::to_json(cfg)))
      resume_notes.push_back(fmt::format("--load {} (iteration {}): this run changes {}", cfg.load, ckpt->iteration,
                                         line));
  flags.comm.apply();

  check_data_memory(cfg, flags.memory);
  train::VocabSizing vocab;
  const bool padded_from_checkpoint = ckpt && cfg.use_checkpoint_args && ckpt->config.contains("padded_vocab_size");
  const std::shared_ptr<const train::TextData> data =
      prepare_data(cfg, flags, rt.size(), vocab,
                   padded_from_checkpoint ? " (the --load checkpoint's, --use-checkpoint-args)" : "");
  // The checkpoint's model has this run's vocabulary, or one line says how to get it (before any collective).
  if (ckpt) train::check_checkpoint_vocab(cfg.load, ckpt->iteration, ckpt->config, vocab);
  // --use-checkpoint-args: the weights' shapes (their safetensors header) are the model the metadata describes,
  // before anything is built from it.
  if (ckpt && cfg.use_checkpoint_args)
    train::check_checkpoint_shapes(cfg.load + "/" + train::checkpoint_subdir(ckpt->iteration) + "/model.safetensors",
                                   cfg);
  if (rt.rank() == 0) {
    for (const std::string& n : flags.layer.notices) fmt::print(stderr, "ampipe: note: {}\n", n);
    if (!vocab.log_line().empty()) fmt::print("{}\n", vocab.log_line());  // Megatron's line
  }
  const comm::Layout layout =
      comm::Layout::make(rt.size(), cfg.layer.tensor_model_parallel_size, cfg.layer.context_parallel_size,
                         cfg.layer.expert_model_parallel_size, cfg.pipeline_model_parallel_size);
  const comm::Groups groups = rt.make_groups(layout);
  // The agreement exchange runs without --check-collectives fingerprints: a rank started without that flag sends
  // none, and the comparison is what names the difference.
  rt.set_check_collectives(false);
  check_ranks_agree(train_agreement(cfg, flags, *data, ckpt ? ckpt->iteration : -1,
                                    ckpt ? ckpt->manifest_checksum : std::string("none")),
                    groups.world);
  rt.set_check_collectives(flags.comm.check_collectives);
  check_output_file("--trace", cfg.trace, groups.world);
  check_output_file("--loss-plot", cfg.loss_plot, groups.world);
  if (!cfg.save.empty()) train::check_writable_dir("--save", cfg.save, groups.world);
  if (!cfg.tensorboard_dir.empty()) train::check_writable_dir("--tensorboard-dir", cfg.tensorboard_dir, groups.world);
  if (flags.auto_degree) {  // every degree the trainer accepts, predicted on the simulator; rank 0's choice
    const int world = rt.size();
    const DegreeChoice choice = choose_degree(cfg.layer, cfg.num_layers, groups, flags.sim_profile, [&](int M) {
      train::TrainConfig c = cfg;
      c.ampipe_degree = M;
      try {
        c.validate(world);
      } catch (const ConfigError& e) {
        return std::string(e.what());
      }
      return std::string();
    });
    cfg.ampipe_degree = choice.degree;
    train::drop_idle_pipe_experts(cfg.layer, {choice.degree});  // validate accepted the degree
    cfg.validate(world);
    if (rt.rank() == 0) fmt::print("{}\n", choice.describe());
  }

  // Ranks on more than one host: the all-to-alls cross a wire and the share of them hidden means something.
  bool multi_host = false;
  {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    for (const std::string& h : comm::all_gather_strings(groups.world, host, "train.hosts")) multi_host |= h != host;
  }
  // This rank's peak memory from the shapes, before the model is built; refused when it does not fit (every rank).
  schedule::MemoryEstimate mem = train::estimate_train_memory(cfg, data->train_samples(), groups.world.size());
  const int64_t rss_now = std::max<int64_t>(core::current_rss_bytes(), 0);
  mem.parts.insert(mem.parts.begin(), {"process now (code, MPI, data)", rss_now});
  check_memory_fits(mem, rss_now, flags.memory, groups.world);
  train::Trainer trainer(cfg, groups, data);
  trainer.set_report_a2a_hidden(multi_host);
  const int64_t start = trainer.maybe_load();
  rt.end_startup();  // every rank loaded its checkpoint; waits are bounded by --comm-timeout from here on
  // --trace-iteration K is the K-th iteration of this run: after a resume it must still be one this run trains.
  if (!cfg.trace.empty() && start + cfg.trace_iteration > trainer.end_iteration())
    throw ConfigError(fmt::format("--trace-iteration {} is invalid for this run: it trains iterations {}..{} (K counts "
                                  "from the start of this run{}), so the {}-th is never reached",
                                  cfg.trace_iteration, start + 1, trainer.end_iteration(),
                                  start > 0 ? fmt::format(", resumed at {}", start) : std::string(),
                                  cfg.trace_iteration));
  if (rt.rank() == 0)
    for (const std::string& n : resume_notes) fmt::print(stderr, "ampipe: note: {}\n", n);
  const bool rank0 = rt.rank() == 0;
  const model::LayerConfig& l = cfg.layer;
  int64_t n_params = 0;
  for (auto& p : trainer.model().params())
    n_params += p.param.numel() * (p.expert ? l.expert_model_parallel_size : 1) * (p.tp_sharded(l) ? l.tp() : 1);
  if (cfg.pp() > 1) {  // every stage's (a collective of the pp group; each rank adds its own stage's once)
    comm::Group pp = groups.pp;
    Tensor t = Tensor::empty({1});
    t.set(0, float(n_params));
    comm::all_reduce_sync(pp, t, comm::Reduce::sum, "n_params.pp");
    n_params = int64_t(t.get(0));
  }
  if (rank0) {
    RunInfo info{cfg, layout, *data, mem};
    info.rss_now = rss_now;
    info.start = start;
    info.n_params = n_params;
    info.ckpt_iteration = ckpt ? ckpt->iteration : 0;
    info.world = rt.size();
    print_header(info);
  }
  const train::TrainResult res = trainer.train([](const std::string& line) {
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  });

  if (res.stop_signal != 0) return report_stop(res, cfg, rank0);
  if (rank0 && !cfg.loss_plot.empty())
    fmt::print("ampipe train: loss curves written to {}: {}\n", cfg.loss_plot,
               train::write_loss_plot(cfg.loss_plot, res, train::loss_plot_title(cfg, rt.size())));
  if (rank0) print_summary(res, cfg, layout, multi_host, start, rt.size());
  return 0;
}

}  // namespace ampipe::cli
