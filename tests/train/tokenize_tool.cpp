// The tokenizers of train/tokenizer.h for tests/train/check_bpe_tokenizers.py, which compares them with Hugging
// Face's tokenizers. Usage: tokenize_tool TYPE MODEL VOCAB_FILE MERGE_FILE ("" for none) < {"texts": [...],
// "decode": [[ids], ...]}; prints {"vocab_size", "eod", "encoded": [[ids] per text], "decoded": [text per id
// list], "roundtrip": [decode(encode(text)) per text]}. A ConfigError: its message on stderr, exit code 2.
#include <iostream>
#include <nlohmann/json.hpp>

#include "ampipe/core/error.h"
#include "ampipe/train/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: tokenize_tool TYPE MODEL VOCAB_FILE MERGE_FILE < input.json\n";
    return 64;
  }
  try {
    const auto tok = ampipe::train::make_tokenizer(argv[1], argv[2], argv[3], argv[4]);
    if (!tok) throw ampipe::ConfigError("no --tokenizer-type given");
    const nlohmann::json in = nlohmann::json::parse(std::cin);
    nlohmann::json out = {{"vocab_size", tok->vocab_size()}, {"eod", tok->eod()}, {"describe", tok->describe()}};
    out["encoded"] = nlohmann::json::array();
    out["roundtrip"] = nlohmann::json::array();
    out["decoded"] = nlohmann::json::array();
    for (const auto& t : in.value("texts", nlohmann::json::array())) {
      const std::vector<int32_t> ids = tok->encode(t.get<std::string>());
      out["encoded"].push_back(ids);
      out["roundtrip"].push_back(tok->decode(ids));
    }
    for (const auto& ids : in.value("decode", nlohmann::json::array()))
      out["decoded"].push_back(tok->decode(ids.get<std::vector<int32_t>>()));
    std::cout << out.dump() << "\n";
  } catch (const ampipe::ConfigError& e) {
    std::cerr << "ampipe: error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
