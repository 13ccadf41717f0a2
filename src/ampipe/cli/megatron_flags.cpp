#include "ampipe/cli/megatron_flags.h"

#include "ampipe/core/error.h"

namespace ampipe::cli {

namespace {

// The value of a non-switch entry as given: one value, or Megatron's nargs joined by spaces.
std::string given_value(const RefusedFlags::Entry& e) {
  if (e.spec->grammar != Grammar::text_list) return e.value;
  std::string v;
  for (const std::string& x : e.values) v += (v.empty() ? "" : " ") + x;
  return v;
}

}  // namespace

void RefusedFlags::check() const {
  for (const Entry& e : entries) {
    if (e.opt == nullptr || e.opt->count() == 0 || e.spec->refused == nullptr) continue;
    const FlagSpec& s = *e.spec;
    if (s.grammar == Grammar::on_off) {
      if (!e.on) continue;  // --config "fp16": false
      throw ConfigError(fmt::format("{} is not supported: {}", s.name, s.refused));
    }
    // Megatron's nargs='*' given no value (CLI11 keeps one empty string): Megatron's default
    if (s.grammar == Grammar::text_list && given_value(e).empty()) continue;
    const std::string value = given_value(e);
    if (s.accepted != nullptr && value == s.accepted) continue;
    throw ConfigError(fmt::format("{} {} is not supported: {}{}", s.name, value, s.refused,
                                  s.accepted ? fmt::format(" (only {} is accepted)", s.accepted) : std::string()));
  }
}

std::string RefusedFlags::noop_note(const std::vector<std::string>& extra) const {
  std::vector<std::string> items;
  for (const Entry& e : entries) {
    if (e.opt == nullptr || e.opt->count() == 0 || e.spec->noop == nullptr) continue;
    const FlagSpec& s = *e.spec;
    if (s.grammar == Grammar::on_off && !e.on) continue;  // --config "log_throughput": false
    const std::string value = s.grammar == Grammar::on_off ? std::string() : given_value(e);
    items.push_back(fmt::format("{}{}{} ({})", s.name, value.empty() ? "" : " ", value, s.noop));
  }
  items.insert(items.end(), extra.begin(), extra.end());
  if (items.empty()) return "";
  std::string note = "no effect on this engine: ";
  for (size_t i = 0; i < items.size(); ++i) note += (i ? ", " : "") + items[i];
  return note;
}

}  // namespace ampipe::cli
