// Strict JSON for every file the engine reads (--config, checkpoint metadata, safetensors headers, simulator
// profiles, tokenizer.json, preprocess's JSON lines): parse_json refuses what nlohmann's parser would accept
// silently or crash on, before it parses:
//  - a NUL byte anywhere (the parser stops there and ignores the rest: unknown keys, a second value);
//  - nesting deeper than kMaxJsonDepth (the parsed value's destructor and dump() recurse once per level, so
//    `{"hidden_size": [[[...]]]}` 100000 deep overflowed the stack);
// and, like the parser, anything after the one value but whitespace. Errors are JsonError, a
// nlohmann::json::exception, so the callers' handlers name the file as for any other parse error.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace ampipe::core {

inline constexpr int kMaxJsonDepth = 64;

class JsonError : public nlohmann::json::exception {
 public:
  explicit JsonError(const std::string& what) : nlohmann::json::exception(0, what.c_str()) {}
};

// Throws JsonError (a NUL byte, too deep) or nlohmann::json::parse_error (the rest of the grammar).
nlohmann::json parse_json(std::string_view text, nlohmann::json::parser_callback_t cb = nullptr);

// The same checks without parsing (for callers that parse with their own options).
void check_json_text(std::string_view text);

}  // namespace ampipe::core
