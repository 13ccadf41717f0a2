#include "ampipe/train/preprocess_data.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ampipe/core/json.h"
#include "ampipe/core/error.h"
#include "ampipe/train/bpe_tokenizer.h"
#include "ampipe/train/indexed_dataset.h"

namespace ampipe::train {

std::vector<int32_t> ByteLevelTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = int32_t(static_cast<unsigned char>(text[i]));
  return ids;
}

std::string ByteLevelTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > 255)
      throw ConfigError(fmt::format("byte-level tokenizer: token id {} is not a byte (ids 0..255)", ids[i]));
    bytes[i] = char(ids[i]);
  }
  return bpe::utf8_lossy(bytes);
}

namespace {

// One line's documents, a tokens and a lengths vector per key, or the rule it breaks.
struct Encoded {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int64_t>> lengths;
  std::string error;
};

Encoded encode_line(const std::string& line, int64_t lineno, const PreprocessJsonOptions& o, const Tokenizer& tok) {
  Encoded e;
  auto fail = [&](const std::string& rule) {
    e.error = fmt::format("--input {}: line {}: {}", o.input, lineno, rule);
    return e;
  };
  nlohmann::json j;
  try {
    j = core::parse_json(line);
  } catch (const nlohmann::json::exception& ex) {
    return fail(fmt::format("not valid JSON ({}); each line must be one JSON object", ex.what()));
  }
  if (!j.is_object()) return fail("not a JSON object; each line must be one JSON object");
  const bool add_eod = o.append_eod && tok.eod() >= 0;
  const int32_t eod = add_eod ? tok.eod() : -1;
  // A NUL in a byte-level text would read as a document end; a subword tokenizer's eod inside a text (a tokenizer.json
  // that parses its special tokens) stays, as in Megatron.
  const bool refuse_eod = add_eod && dynamic_cast<const ByteLevelTokenizer*>(&tok) != nullptr;
  for (const std::string& key : o.json_keys) {
    if (!j.contains(key)) return fail(fmt::format("the object has no key \"{}\" (--json-keys {})", key, key));
    const nlohmann::json& v = j[key];
    std::vector<std::string> sentences;
    if (v.is_string()) {
      sentences.push_back(v.get<std::string>());
    } else if (v.is_array() && std::all_of(v.begin(), v.end(), [](const nlohmann::json& x) { return x.is_string(); })) {
      for (const nlohmann::json& x : v) sentences.push_back(x.get<std::string>());
    } else {
      return fail(fmt::format("the value of \"{}\" is not a string or a list of strings", key));
    }
    std::vector<int32_t>& ids = e.tokens.emplace_back();
    std::vector<int64_t>& lens = e.lengths.emplace_back();
    for (const std::string& s : sentences) {
      const std::vector<int32_t> t = tok.encode(s);
      if (t.empty()) continue;
      if (refuse_eod && std::find(t.begin(), t.end(), eod) != t.end())
        return fail(fmt::format("the text of \"{}\" holds the end-of-document id {} of {} (with --append-eod it "
                                "would read as the end of a document)",
                                key, eod, tok.describe()));
      ids.insert(ids.end(), t.begin(), t.end());
      lens.push_back(int64_t(t.size()));
    }
    if (add_eod && !ids.empty()) {
      ids.push_back(eod);
      ++lens.back();
    }
  }
  return e;
}

}  // namespace

namespace {
void write_datasets(std::istream& in, const PreprocessJsonOptions& o, const Tokenizer& tok,
                    const std::function<void(const std::string&)>& say, PreprocessJsonResult& r);
}  // namespace

PreprocessJsonResult preprocess_json(const PreprocessJsonOptions& o, const Tokenizer& tok,
                                     const std::function<void(const std::string&)>& say) {
  std::error_code ec;
  if (!std::filesystem::exists(o.input, ec))
    throw ConfigError(fmt::format("--input {}: the file does not exist", o.input));
  if (!std::filesystem::is_regular_file(o.input, ec))
    throw ConfigError(fmt::format("--input {}: is not a regular file", o.input));
  std::ifstream in(o.input, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("--input {}: the file cannot be read", o.input));
  if (o.append_eod && tok.eod() < 0)
    throw ConfigError(fmt::format("--append-eod: the tokenizer {} has no end-of-document id", tok.describe()));
  const std::filesystem::path dir = std::filesystem::path(o.output_prefix).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
    throw ConfigError(fmt::format("--output-prefix {}: the directory {} does not exist", o.output_prefix,
                                  dir.string()));
  PreprocessJsonResult r;
  try {
    write_datasets(in, o, tok, say, r);
  } catch (...) {  // no half-written dataset stays behind
    for (const PreprocessJsonResult::Output& out : r.outputs)
      for (const char* ext : {".bin", ".idx"}) std::filesystem::remove(out.prefix + ext, ec);
    throw;
  }
  return r;
}

namespace {

void write_datasets(std::istream& in, const PreprocessJsonOptions& o, const Tokenizer& tok,
                    const std::function<void(const std::string&)>& say, PreprocessJsonResult& r) {
  const TokenDType dtype = optimal_token_dtype(tok.vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const std::string& key : o.json_keys) {  // an output joins r.outputs once its files are created
    const std::string prefix = fmt::format("{}_{}_document", o.output_prefix, key);
    writers.push_back(std::make_unique<IndexedDatasetWriter>(prefix, dtype, "--output-prefix"));
    r.outputs.push_back({key, prefix});
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const size_t workers = size_t(std::max(o.workers, 1));
  const size_t batch = 256 * workers;
  std::vector<std::pair<int64_t, std::string>> lines;  // (line number, text)
  std::vector<Encoded> encoded;
  int64_t docs = 0, lineno = 0;
  bool more = true;
  while (more) {
    lines.clear();
    std::string line;
    while (lines.size() < batch && (more = bool(std::getline(in, line)))) {
      ++lineno;
      r.bytes += int64_t(line.size()) + 1;
      if (line.find_first_not_of(" \t\r\n") == std::string::npos) {
        ++r.blank_lines;
        continue;
      }
      lines.emplace_back(lineno, std::move(line));
    }
    encoded.assign(lines.size(), Encoded{});
    std::vector<std::thread> pool;
    for (size_t w = 0; w < std::min(workers, lines.size()); ++w)
      pool.emplace_back([&, w] {
        for (size_t i = w; i < lines.size(); i += workers) {
          try {
            encoded[i] = encode_line(lines[i].second, lines[i].first, o, tok);
          } catch (const std::exception& ex) {
            encoded[i].error = fmt::format("--input {}: line {}: {}", o.input, lines[i].first, ex.what());
          }
        }
      });
    for (std::thread& t : pool) t.join();
    for (const Encoded& e : encoded) {
      if (!e.error.empty()) throw ConfigError(e.error);
      for (size_t k = 0; k < writers.size(); ++k) {
        writers[k]->add_document(e.tokens[k], e.lengths[k]);
        r.outputs[k].tokens += int64_t(e.tokens[k].size());
      }
      if (++docs % std::max<int64_t>(o.log_interval, 1) == 0) {
        const double s = std::max(std::chrono::duration<double>(Clock::now() - t0).count(), 1e-9);
        say(fmt::format("Processed {} documents ({:.1f} docs/s, {:.2f} MB/s).", docs, double(docs) / s,
                        double(r.bytes) / s / 1024 / 1024));
      }
    }
  }
  if (in.bad()) throw ConfigError(fmt::format("--input {}: the file cannot be read", o.input));
  for (size_t k = 0; k < writers.size(); ++k) {
    writers[k]->finalize();
    r.outputs[k].documents = writers[k]->documents();
  }
  r.lines = lineno;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

}  // namespace ampipe::train
