#include "ampipe/cli/convert.h"

#include <fmt/format.h>

#include <filesystem>

#include "ampipe/cli/flag_registry.h"
#include "ampipe/comm/layout.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/train/checkpoint.h"
#include "ampipe/train/checkpoint_args.h"
#include "ampipe/train/hf_checkpoint.h"

namespace ampipe::cli {

void ConvertArgs::add_to(CLI::App& a) {
  FlagTargets t;
  t.convert = this;
  add_flags(a, kConvert, t);
}

int run_convert(ConvertArgs& args) {
  comm::Runtime& rt = comm::Runtime::current();
  if (rt.size() != 1)
    throw ConfigError(fmt::format("ampipe convert runs on one rank (this job has {}): run it without mpirun",
                                  rt.size()));
  const comm::Groups groups = rt.make_groups(comm::Layout::make(1, 1, 1, 1));
  std::error_code ec;
  if (!std::filesystem::is_directory(args.load_dir, ec))
    throw ConfigError(fmt::format("--load-dir {}: the directory does not exist", args.load_dir));
  if (!train::is_hf_dir(args.load_dir) && !train::checkpoint_exists(args.load_dir))
    throw ConfigError(fmt::format("--load-dir {}: neither a Hugging Face model directory (config.json) nor an ampipe "
                                  "checkpoint ({}) is there",
                                  args.load_dir, train::kLatestMarker));
  std::string line;
  if (train::is_hf_dir(args.load_dir)) {
    train::HfConvertOptions o;
    o.seq_length = args.seq_length;
    o.make_vocab_size_divisible_by = args.make_vocab_size_divisible_by;
    line = train::hf_to_ampipe(args.load_dir, args.save_dir, o, groups);
  } else {
    line = train::ampipe_to_hf(args.load_dir, args.save_dir, groups);
  }
  fmt::print("{}\n", line);
  return 0;
}

}  // namespace ampipe::cli
