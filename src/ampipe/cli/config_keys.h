// --config FILE: a key must set a flag once. A JSON object that names one flag twice, as the same key twice (a
// JSON parser silently keeps the last) or under two spellings ("hidden_size" and "hidden-size", "--hidden-size",
// or two names of one option), is refused with one line naming the file, both keys and the flag.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

namespace ampipe::cli {

// `text`: the file's contents; `j`: their parse (an object). Keys that name no flag are left to the caller.
// Throws ConfigError.
void check_config_keys_once(const std::string& text, const nlohmann::json& j, const std::string& file,
                            const CLI::App& app);

// The flag a --config key names: "--" + the key without leading dashes, underscores as dashes.
std::string config_key_flag(const std::string& key);

}  // namespace ampipe::cli
