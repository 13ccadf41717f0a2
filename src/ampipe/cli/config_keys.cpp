#include "ampipe/cli/config_keys.h"

#include <map>
#include <set>

#include "ampipe/core/json.h"
#include "ampipe/core/error.h"

namespace ampipe::cli {

std::string config_key_flag(const std::string& key) {
  std::string flag = key.rfind("--", 0) == 0 ? key : "--" + key;
  for (char& ch : flag)
    if (ch == '_') ch = '-';
  return flag;
}

void check_config_keys_once(const std::string& text, const nlohmann::json& j, const std::string& file,
                            const CLI::App& app) {
  // The same key twice in the text: only a parser callback sees both (the parsed object keeps the last).
  std::set<std::string> seen;
  std::string twice;
  nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const std::string k = parsed.get<std::string>();
      if (!seen.insert(k).second && twice.empty()) twice = k;
    }
    return true;
  };
  try {
    const nlohmann::json parsed = core::parse_json(text, on_event);
    (void)parsed;
  } catch (const nlohmann::json::exception&) {
    return;  // the caller has parsed it already; nothing more to say here
  }
  if (!twice.empty())
    throw ConfigError(fmt::format("--config {}: key \"{}\" is set twice; give each flag once", file, twice));
  // Two spellings of one flag, or two names of one option.
  std::map<const CLI::Option*, std::string> by_option;
  for (const auto& [key, value] : j.items()) {
    const std::string flag = config_key_flag(key);
    const CLI::Option* opt = flag == "--config" ? nullptr : app.get_option_no_throw(flag);
    if (opt == nullptr) continue;
    const auto [it, fresh] = by_option.emplace(opt, key);
    if (!fresh)
      throw ConfigError(fmt::format("--config {}: keys \"{}\" and \"{}\" both set {}; give each flag once", file,
                                    it->second, key, opt->get_name()));
  }
}

}  // namespace ampipe::cli
