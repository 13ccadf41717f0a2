// `ampipe simulate`'s memory check (docs/simulator.md, "Memory per device"): the peak memory of every pipeline stage
// of a training configuration on W devices, from the very estimate `ampipe train` prints in its banner
// (train/memory_estimate.h; without the "process now" part, which is this process's, and the data order, which
// needs the data), plus the profile's framework reserve, against the profile's device memory; and, when it does not
// fit, the nearest setting that would: the distributed optimizer, full recomputation, more pipeline stages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampipe/schedule/memory_estimate.h"
#include "ampipe/sim/profile.h"
#include "ampipe/train/train_config.h"

namespace ampipe::cli {

struct DeviceMemory {
  std::vector<schedule::MemoryEstimate> stages;  // per pipeline stage, as the trainer's banner counts it
  int largest = 0;                               // the stage with the largest estimate
  int64_t reserve_bytes = 0, device_bytes = 0;   // the profile's (device_bytes 0: the profile gives none)
  int64_t peak_bytes() const;                    // the largest stage's estimate plus the reserve
  bool checked() const { return device_bytes > 0; }
  bool fits() const { return !checked() || peak_bytes() <= device_bytes; }
  // "71.2 GiB (stage 0 of 2; parameters ..., ...) + 2.00 GiB framework reserve = 73.2 GiB of 80.0 GiB: fits"
  std::string describe() const;
};

// cfg at the degree to cost (cfg.ampipe_degree), validated for `world` devices.
DeviceMemory device_memory(const train::TrainConfig& cfg, int world, const sim::Profile& prof);

// When cfg does not fit: the first of these that does, tried alone and then together, each as its flags and the
// peak it reaches ("--use-distributed-optimizer (61.3 GiB)"): --use-distributed-optimizer (dp x cp > 1),
// --recompute-granularity full --recompute-method uniform --recompute-num-layers 1, and --pipeline-model-parallel-
// size doubled (up to 8 times, while the rules allow it). "" when none does.
std::string setting_that_fits(const train::TrainConfig& cfg, int world, const sim::Profile& prof);

}  // namespace ampipe::cli
