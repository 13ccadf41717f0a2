#include "ampipe/cli/megatron_flags.h"

#include <algorithm>
#include <stdexcept>

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

// Whether `value` is one of `accepted` ("a|b"): numerically for Megatron's numbers (1e-5 is 0.00001), else as text.
bool is_accepted(const FlagSpec& s, const std::string& value) {
  const std::string list = s.accepted;
  for (size_t from = 0; from <= list.size();) {
    const size_t bar = std::min(list.find('|', from), list.size());
    const std::string a = list.substr(from, bar - from);
    from = bar + 1;
    if (value == a) return true;
    if (s.grammar != Grammar::number && s.grammar != Grammar::integer) continue;
    try {
      size_t used_v = 0, used_a = 0;
      const double x = std::stod(value, &used_v), y = std::stod(a, &used_a);
      if (used_v == value.size() && used_a == a.size() && x == y) return true;
    } catch (const std::exception&) {
    }
  }
  return false;
}

// "1e-5", "single or cyclic"
std::string accepted_list(const char* accepted) {
  std::string out = accepted;
  for (size_t bar = out.find('|'); bar != std::string::npos; bar = out.find('|', bar)) out.replace(bar, 1, " or ");
  return out;
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
    if (s.accepted != nullptr && is_accepted(s, value)) continue;
    throw ConfigError(fmt::format("{} {} is not supported: {}{}", s.name, value, s.refused,
                                  s.accepted ? fmt::format(" (only {} is accepted)", accepted_list(s.accepted))
                                             : std::string()));
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
