#include "ampipe/core/json.h"

#include <fmt/format.h>

namespace ampipe::core {

void check_json_text(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\0')
      throw JsonError(fmt::format("a NUL byte at byte {}: JSON text holds none (everything after it would be "
                                  "ignored)",
                                  i));
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw JsonError(fmt::format("nested deeper than {} levels at byte {}", kMaxJsonDepth, i));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

nlohmann::json parse_json(std::string_view text, nlohmann::json::parser_callback_t cb) {
  check_json_text(text);
  return nlohmann::json::parse(text.begin(), text.end(), cb);
}

}  // namespace ampipe::core
