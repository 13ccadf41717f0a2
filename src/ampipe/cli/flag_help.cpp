#include "ampipe/cli/flag_help.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <vector>

namespace ampipe::cli {

namespace {

constexpr const char* kModel = "Model";
constexpr const char* kMoe = "MoE and AMPipe";
constexpr const char* kParallel = "Parallelism";
constexpr const char* kTraining = "Training";
constexpr const char* kLr = "Learning rate";
constexpr const char* kCheckpoint = "Checkpointing";
constexpr const char* kData = "Data and evaluation";
constexpr const char* kLogging = "Logging and output";
constexpr const char* kRefused = "Megatron flags this engine refuses (each says why)";
constexpr const char* kNotRun = "MindSpeed features parsed but refused (not run by this engine; with --ampipe-degree > 1 "
                                "also incompatible)";

const std::map<std::string, const char*>& group_of() {
  static const std::map<std::string, const char*> m = [] {
    std::map<std::string, const char*> g;
    auto put = [&](const char* group, std::initializer_list<const char*> flags) {
      for (const char* f : flags) g[f] = group;
    };
    put(kModel, {"--num-layers", "--seq-length", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                 "--swiglu", "--hidden-dropout", "--attention-dropout", "--init-method-std",
                 "--untie-embeddings-and-output-weights", "--max-position-embeddings", "--use-flash-attn", "--bf16",
                 "--seed", "--vocab-size"});
    put(kMoe, {"--num-experts", "--moe-router-topk", "--moe-train-capacity-factor", "--moe-min-capacity",
               "--moe-no-drop", "--no-use-rts", "--noisy-gate-policy", "--moe-aux-loss-coeff", "--moe-model-type",
               "--ampipe-degree", "--sim-profile", "--use-pipe-experts", "--pipe-experts-multi-stream",
               "--pipe-experts-multi-data"});
    put(kParallel, {"--expert-model-parallel-size", "--tensor-model-parallel-size", "--context-parallel-size",
                    "--context-parallel-algo", "--sequence-parallel", "--ampipe-tp-sp-comm-overlap",
                    "--distributed-backend", "--check-collectives", "--comm-timeout", "--world-size", "--nodes"});
    put(kTraining, {"--recompute-granularity", "--recompute-method", "--recompute-num-layers",
                    "--micro-batch-size", "--global-batch-size", "--train-iters", "--train-samples",
                    "--exit-interval", "--exit-signal-handler", "--skip-train", "--weight-decay", "--adam-beta1", "--adam-beta2",
                    "--adam-eps", "--clip-grad", "--config"});
    put(kLr, {"--lr", "--min-lr", "--lr-warmup-iters", "--lr-decay-style", "--lr-decay-iters"});
    put(kCheckpoint, {"--save", "--load", "--save-interval", "--no-load-optim", "--finetune", "--use-checkpoint-args"});
    put(kData, {"--data-path", "--split", "--valid-fraction", "--eval-interval", "--eval-iters"});
    put(kLogging, {"--log-interval", "--trace", "--trace-iteration", "--json", "--tensorboard-dir",
                   "--tensorboard-log-interval", "--moe-per-layer-logging"});
    put(kNotRun, {"--use-ascend-mc2", "--overlap-grad-reduce", "--overlap-param-gather", "--use-nanopipe",
                  "--recompute-in-bubble", "--recompute-in-advance", "--adaptive-recompute-device-swap",
                  "--adaptive-recompute-device-size", "--adaptive-memory-optimization", "--add-bias-linear"});
    return g;
  }();
  return m;
}

class GroupedFormatter : public CLI::Formatter {
 public:
  // CLI::Formatter::make_help with the groups in our order (make_groups is not virtual).
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    std::stringstream out;
    out << make_description(app) << make_usage(app, name) << make_positionals(app) << ordered_groups(app, mode)
        << make_subcommands(app, mode) << '\n'
        << make_footer(app);
    return out.str();
  }

 private:
  std::string ordered_groups(const CLI::App* app, CLI::AppFormatMode mode) const {
    std::vector<std::string> groups = app->get_groups();
    static const std::vector<std::string> order = {"Options",   kModel, kMoe,  kParallel, kTraining, kLr,
                                                   kCheckpoint, kData,  kLogging, kNotRun, kRefused};
    auto rank = [&](const std::string& g) {
      const auto it = std::find(order.begin(), order.end(), g);
      return it == order.end() ? order.size() : size_t(it - order.begin());
    };
    std::stable_sort(groups.begin(), groups.end(),
                     [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
    std::stringstream out;
    for (const std::string& group : groups) {
      std::vector<const CLI::Option*> opts = app->get_options([app, mode, &group](const CLI::Option* opt) {
        return opt->get_group() == group && opt->nonpositional() &&
               (mode != CLI::AppFormatMode::Sub || (app->get_help_ptr() != opt && app->get_help_all_ptr() != opt));
      });
      if (!group.empty() && !opts.empty()) out << make_group(group, false, opts);
    }
    return out.str();
  }
};

}  // namespace

void group_flags(CLI::App& sub) {
  for (CLI::Option* o : sub.get_options()) {
    if (o->get_lnames().empty()) continue;
    const auto it = group_of().find("--" + o->get_lnames().front());
    if (it != group_of().end()) o->group(it->second);
  }
}

std::shared_ptr<CLI::Formatter> grouped_formatter() { return std::make_shared<GroupedFormatter>(); }

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_flag(const CLI::App& app, const std::string& flag) {
  const std::string name = flag.substr(0, flag.find('='));
  std::string best;
  size_t best_d = std::max<size_t>(2, name.size() / 3) + 1;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& l : o->get_lnames()) {
      const size_t d = edit_distance(name, "--" + l);
      if (d < best_d) {
        best_d = d;
        best = "--" + l;
      }
    }
  return best;
}

}  // namespace ampipe::cli
