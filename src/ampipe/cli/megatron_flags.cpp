#include "ampipe/cli/megatron_flags.h"

#include "ampipe/core/error.h"

namespace ampipe::cli {

namespace {
constexpr const char* kNoPipeline =
    "this engine has no pipeline parallelism (AMPipe pipelines inside a block); use data and expert parallelism";
constexpr const char* kTokenizer = RefusedFlags::kTokenizerReason;
}  // namespace

void RefusedFlags::add_to(CLI::App& app, const std::string& group) {
  auto E = [](const char* flag, const char* accepted, const char* reason) {
    Entry e;
    e.flag = flag;
    e.accepted = accepted;
    e.reason = reason;
    return e;
  };
  entries = {
      E("--pipeline-model-parallel-size", "1", kNoPipeline),
      E("--num-layers-per-virtual-pipeline-stage", nullptr, kNoPipeline),
      E("--fp16", nullptr, "fp16 training needs loss scaling, which this engine does not have; use --bf16"),
      E("--loss-scale", nullptr, "loss scaling belongs to fp16 training, which this engine does not have; use --bf16"),
      E("--use-distributed-optimizer", nullptr,
        "the optimizer state is not sharded: every data-parallel rank keeps the whole AdamW state"),
      E("--vocab-file", nullptr, kTokenizer),
      E("--merge-file", nullptr, kTokenizer),
      E("--position-embedding-type", "learned_absolute",
        "the model has learned absolute position embeddings only (no rope)"),
      E("--normalization", "LayerNorm", "the blocks use LayerNorm only (no RMSNorm)"),
      E("--group-query-attention", nullptr, "the attention is multi-head attention only (no grouped queries)"),
      E("--num-query-groups", nullptr, "the attention is multi-head attention only (no grouped queries)"),
      E("--moe-grouped-gemm", nullptr, "the experts run as one GEMM each; there is no grouped GEMM"),
  };

  // Switches take no value; the others take one.
  for (Entry& e : entries) {
    const std::string f = e.flag;
    const bool sw = f == "--fp16" || f == "--recompute-activations" || f == "--use-distributed-optimizer" ||
                    f == "--group-query-attention" || f == "--moe-grouped-gemm";
    const std::string help = std::string("not supported: ") + e.reason;
    e.is_switch = sw;
    e.opt = sw ? app.add_flag(e.flag, e.on, help) : app.add_option(e.flag, e.value, help);
    e.opt->group(group);
  }
}

void RefusedFlags::check() const {
  for (const Entry& e : entries) {
    if (e.opt == nullptr || e.opt->count() == 0) continue;
    if (e.is_switch) {
      if (!e.on) continue;  // --config "fp16": false
      throw ConfigError(fmt::format("{} is not supported: {}", e.flag, e.reason));
    }
    if (e.accepted != nullptr && e.value == e.accepted) continue;
    throw ConfigError(fmt::format("{} {} is not supported: {}{}", e.flag, e.value, e.reason,
                                  e.accepted ? fmt::format(" (only {} is accepted)", e.accepted) : std::string()));
  }
}

void RefusedFlags::release(CLI::App& app, const std::string& flag) {
  // The entry stays (the other options hold references into `entries`); without its option check() skips it.
  for (Entry& e : entries)
    if (flag == e.flag && e.opt != nullptr) {
      app.remove_option(e.opt);
      e.opt = nullptr;
    }
}

}  // namespace ampipe::cli
