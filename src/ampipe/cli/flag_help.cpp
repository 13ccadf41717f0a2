#include "ampipe/cli/flag_help.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <vector>

#include "ampipe/cli/flag_registry.h"

namespace ampipe::cli {

namespace {

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
    const std::vector<std::string>& order = help_group_order();
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
    if (const char* group = flag_group("--" + o->get_lnames().front())) o->group(group);
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

namespace {

// `name` ("--no-use-rts") without its leading switch words: "rts".
std::string toggle_stem(const std::string& name) {
  std::string stem = name.substr(2);
  for (bool again = true; again;) {
    again = false;
    for (const char* w : {"no-", "disable-", "enable-", "add-", "use-"}) {
      const std::string word = w;
      if (stem.size() > word.size() && stem.compare(0, word.size(), word) == 0) {
        stem = stem.substr(word.size());
        again = true;
      }
    }
  }
  return stem;
}

}  // namespace

std::string closest_flag(const CLI::App& app, const std::string& flag) {
  const std::string name = flag.substr(0, flag.find('='));
  if (name.size() < 3) return "";
  const std::string stem = toggle_stem(name);
  const size_t limit = std::max<size_t>(2, name.size() / 4);
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& l : o->get_lnames()) {
      const std::string candidate = "--" + l;
      if (candidate == name || toggle_stem(candidate) == stem) continue;  // itself, or its opposite
      const size_t d = edit_distance(name, candidate);
      const bool prefix = name.size() >= 7 && candidate.compare(0, name.size(), name) == 0;
      if ((d <= limit || prefix) && d < best_d) {
        best_d = d;
        best = candidate;
      }
    }
  return best;
}

}  // namespace ampipe::cli
