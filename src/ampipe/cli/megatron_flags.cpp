#include "ampipe/cli/megatron_flags.h"

#include "ampipe/core/error.h"

namespace ampipe::cli {

void RefusedFlags::check() const {
  for (const Entry& e : entries) {
    if (e.opt == nullptr || e.opt->count() == 0) continue;
    const FlagSpec& s = *e.spec;
    if (s.grammar == Grammar::on_off) {
      if (!e.on) continue;  // --config "fp16": false
      throw ConfigError(fmt::format("{} is not supported: {}", s.name, s.refused));
    }
    if (s.accepted != nullptr && e.value == s.accepted) continue;
    throw ConfigError(fmt::format("{} {} is not supported: {}{}", s.name, e.value, s.refused,
                                  s.accepted ? fmt::format(" (only {} is accepted)", s.accepted) : std::string()));
  }
}

}  // namespace ampipe::cli
