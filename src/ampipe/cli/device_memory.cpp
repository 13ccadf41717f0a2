#include "ampipe/cli/device_memory.h"

#include <fmt/format.h>

#include <functional>

#include "ampipe/core/error.h"
#include "ampipe/core/host_memory.h"
#include "ampipe/train/memory_estimate.h"

namespace ampipe::cli {

namespace {
constexpr double kGiB = double(int64_t(1) << 30);
}  // namespace

int64_t DeviceMemory::peak_bytes() const { return stages[size_t(largest)].total() + reserve_bytes; }

std::string DeviceMemory::describe() const {
  const schedule::MemoryEstimate& e = stages[size_t(largest)];
  std::string where = stages.size() > 1 ? fmt::format("stage {} of {}; ", largest, stages.size()) : std::string();
  std::string text = e.describe();  // "1.23 GiB (parameters ..., ...)"
  const size_t open = text.find(" (");
  if (open != std::string::npos) text.insert(open + 2, where);
  if (!checked()) return text + " (the profile gives no device_memory_gib: not checked)";
  return fmt::format("{} + {} framework reserve = {} of {}: {}", text, core::format_bytes(double(reserve_bytes)),
                     core::format_bytes(double(peak_bytes())), core::format_bytes(double(device_bytes)),
                     fits() ? "fits" : fmt::format("does NOT fit ({} over)",
                                                   core::format_bytes(double(peak_bytes() - device_bytes))));
}

DeviceMemory device_memory(const train::TrainConfig& cfg, int world, const sim::Profile& prof) {
  DeviceMemory m;
  for (int q = 0; q < cfg.pp(); ++q) {
    m.stages.push_back(train::estimate_train_memory(cfg, 0, world, q));
    if (m.stages.back().total() > m.stages[size_t(m.largest)].total()) m.largest = q;
  }
  m.reserve_bytes = int64_t(prof.memory_reserve_gib * kGiB);
  m.device_bytes = int64_t(prof.device_memory_gib * kGiB);
  return m;
}

std::string setting_that_fits(const train::TrainConfig& cfg, int world, const sim::Profile& prof) {
  struct Change {
    const char* flags;
    std::function<bool(train::TrainConfig&)> apply;  // false: not applicable to this configuration
  };
  const std::vector<Change> changes = {
      {"--use-distributed-optimizer",
       [world](train::TrainConfig& c) {
         const bool applies = !c.use_distributed_optimizer && c.data_parallel_size(world) * c.layer.cp() > 1;
         c.use_distributed_optimizer = true;
         return applies;
       }},
      {"--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
       [](train::TrainConfig& c) {
         const bool applies =
             c.recompute_granularity != "full" || c.recompute_method != "uniform" || c.recompute_num_layers != 1;
         c.recompute_granularity = "full";
         c.recompute_method = "uniform";
         c.recompute_num_layers = 1;
         return applies;
       }},
  };
  // Fewer extra pipeline stages first (they cost a bubble), and within each the fewest other changes.
  for (int doublings = 0; doublings <= 3; ++doublings)
    for (int count = doublings == 0 ? 1 : 0; count <= int(changes.size()); ++count)
      for (unsigned mask = 0; mask < (1u << changes.size()); ++mask) {
        if (__builtin_popcount(mask) != count) continue;
        train::TrainConfig c = cfg;
        std::string flags;
        bool applies = true;
        for (size_t i = 0; i < changes.size(); ++i)
          if (mask >> i & 1u) {
            applies = changes[i].apply(c) && applies;
            flags += fmt::format("{}{}", flags.empty() ? "" : " ", changes[i].flags);
          }
        if (!applies) continue;
        if (doublings > 0) {
          c.pipeline_model_parallel_size = cfg.pp() << doublings;
          c.num_layers_per_virtual_pipeline_stage = 0;  // the stages' own split: no virtual-stage rule to meet
          c.num_virtual_stages_per_pipeline_rank = 0;
          flags += fmt::format("{}--pipeline-model-parallel-size {}", flags.empty() ? "" : " ", c.pp());
        }
        try {
          c.validate(world);
          const DeviceMemory m = device_memory(c, world, prof);
          if (m.fits()) return fmt::format("{} ({})", flags, core::format_bytes(double(m.peak_bytes())));
        } catch (const ConfigError&) {  // a rule the changed setting breaks: not a way to fit
        }
      }
  return "";
}

}  // namespace ampipe::cli
