#include "ampipe/train/text_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampipe/core/checksum.h"
#include "ampipe/core/error.h"
#include "ampipe/core/host_memory.h"
#include "ampipe/core/philox.h"
#include "ampipe/train/megatron_data.h"
#include "ampipe/train/tokenizer.h"

namespace ampipe::train {

namespace {

std::string read_all(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ConfigError(fmt::format("{} {}: the file does not exist", what, path));
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(fmt::format("{} {}: is a directory, expected a plain-text file", what, path));
  // A regular file of known size, read up to that size: a device such as /dev/zero would be read without bound.
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError(fmt::format("{} {}: is not a regular file (a device, a pipe or a socket)", what, path));
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw ConfigError(fmt::format("{} {}: the file cannot be read ({})", what, path, ec.message()));
  constexpr uintmax_t kMaxBytes = uintmax_t(16) << 30;  // 16 GiB: more than any corpus this engine trains on here
  if (size > kMaxBytes)
    throw ConfigError(fmt::format("{} {}: {} bytes is more than the {} bytes this engine reads into memory", what,
                                  path, size, kMaxBytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{} {}: the file cannot be read", what, path));
  std::string bytes(size_t(size), '\0');
  in.read(bytes.data(), std::streamsize(size));
  bytes.resize(size_t(in.gcount()));
  return bytes;
}

// Bytes that are not text: NUL, or control characters other than tab, newline, carriage return, form feed.
void check_text(const std::string& text, const std::string& path, const std::string& what) {
  if (text.empty()) throw ConfigError(fmt::format("{} {}: the file is empty, expected plain text", what, path));
  int64_t bad = 0;
  for (unsigned char c : text) {
    if (c == 0)
      throw ConfigError(fmt::format("{} {}: the file is binary (it contains NUL bytes), expected plain text", what,
                                    path));
    bad += (c < 32 && c != '\t' && c != '\n' && c != '\r' && c != '\f') || c == 127;
  }
  if (bad * 100 > int64_t(text.size()))
    throw ConfigError(fmt::format("{} {}: the file is binary ({} of {} bytes are control characters), expected "
                                  "plain text",
                                  what, path, bad, text.size()));
}

int32_t le_i32(const std::string& b, size_t i) {
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) v |= uint32_t(uint8_t(b[i * 4 + size_t(k)])) << (8 * k);
  return int32_t(v);
}

// An llm.c token file: 256 int32 header (magic, version 1, count), then `count` uint16 ids.
Corpus parse_token_file(const std::string& b, const std::string& path) {
  constexpr size_t kHeader = kTokenFileHeaderInts * 4;
  if (b.size() < kHeader)
    throw ConfigError(fmt::format("--data-path {}: truncated token file: {} bytes, the header alone is {}", path,
                                  b.size(), kHeader));
  const int32_t version = le_i32(b, 1), count = le_i32(b, 2);
  if (version != kTokenFileVersion)
    throw ConfigError(fmt::format("--data-path {}: token file version {} is not supported (only version 1: uint16 "
                                  "ids)",
                                  path, version));
  if (count < 0 || b.size() != kHeader + 2 * size_t(count))
    throw ConfigError(fmt::format("--data-path {}: the header says {} tokens ({} bytes of ids) but the file has {} "
                                  "bytes after the header",
                                  path, count, 2 * int64_t(count), b.size() - kHeader));
  Corpus c;
  c.format = "llm.c tokens (uint16)";
  c.tokens.resize(size_t(count));
  int32_t max_id = 0;
  for (size_t i = 0; i < size_t(count); ++i) {
    const int32_t id = int32_t(uint8_t(b[kHeader + 2 * i])) | int32_t(uint8_t(b[kHeader + 2 * i + 1])) << 8;
    c.tokens[i] = id;
    max_id = std::max(max_id, id);
  }
  c.vocab_size = int64_t(max_id) + 1;
  return c;
}


}  // namespace

Corpus text_corpus(const std::string& text) {
  Corpus c;
  c.format = "text (byte-level)";
  c.tokens.reserve(text.size());
  for (unsigned char ch : text) c.tokens.push_back(int32_t(ch));
  return c;
}

std::string read_text_file(const std::string& path, const std::string& flag) {
  std::string bytes = read_all(path, flag);
  check_text(bytes, path, flag);
  return bytes;
}

std::string bundled_corpus_text() {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kBundledCorpusDir, ec))
    if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
  if (ec || files.empty())
    throw ConfigError(fmt::format("the bundled corpus {} is missing (Debian's base-files package provides it); pass "
                                  "--data-path FILE with a plain-text file",
                                  kBundledCorpusDir));
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) text += read_all(f.string(), "bundled corpus file") + "\n";
  return text;
}

Corpus load_corpus(const std::string& data_path) { return load_corpus(data_path, nullptr); }

DataMemory data_memory(const std::string& data_path) {
  DataMemory m;
  m.path = data_path;
  std::error_code ec;
  int64_t bytes = 0;
  bool token_file = false;
  if (data_path.empty()) {
    for (const auto& e : std::filesystem::directory_iterator(kBundledCorpusDir, ec))
      if (e.is_regular_file() && !e.is_symlink()) bytes += int64_t(e.file_size(ec)) + 1;
  } else {
    if (!std::filesystem::is_regular_file(data_path, ec)) return m;  // load_corpus names what is wrong
    bytes = int64_t(std::filesystem::file_size(data_path, ec));
    if (ec) return m;
    std::ifstream in(data_path, std::ios::binary);
    char magic[4] = {};
    token_file = in.read(magic, 4) && le_i32(std::string(magic, 4), 0) == kTokenFileMagic;
  }
  // Byte-level text: one token per byte (a tokenizer makes fewer); an llm.c token file: 2 bytes per token after
  // its header. Loading reads the file whole, parses every token as int32 (Corpus), then TextData keeps them at 2
  // bytes each and the file's bytes are gone: the peak is the larger of file + int32 and int32 + uint16.
  const int64_t n = token_file ? std::max<int64_t>(0, (bytes - kTokenFileHeaderInts * 4) / 2) : bytes;
  m.held = 2 * n;
  m.peak = std::max(bytes + 4 * n, 4 * n + 2 * n);
  m.describe = fmt::format("{}, {} bytes: {} tokens, held at 2 bytes each ({}), {} while loading",
                           token_file ? "an llm.c token file" : "text", bytes, n,
                           core::format_bytes(double(m.held)), core::format_bytes(double(m.peak)));
  return m;
}

Corpus load_corpus(const std::string& data_path, const Tokenizer* tokenizer) {
  std::string text;
  if (!data_path.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(data_path, ec))
      throw ConfigError(fmt::format("--data-path {}: the file does not exist, nor {}.bin and {}.idx (a Megatron "
                                    "indexed dataset)",
                                    data_path, data_path, data_path));
    std::string bytes = read_all(data_path, "--data-path");
    if (bytes.size() >= 4 && le_i32(bytes, 0) == kTokenFileMagic) {
      Corpus c = parse_token_file(bytes, data_path);
      if (tokenizer != nullptr) {
        const int64_t V = tokenizer->vocab_size();
        for (size_t i = 0; i < c.tokens.size(); ++i)
          if (c.tokens[i] >= V)
            throw ConfigError(fmt::format("--data-path {}: token {} has id {}, outside the vocabulary of {} (ids "
                                          "must be < {}): the file was tokenized with another tokenizer",
                                          data_path, i, c.tokens[i], tokenizer->describe(), V));
        c.vocab_size = V;
        c.format += ", " + tokenizer->describe();
      }
      return c;
    }
    const std::filesystem::path p(data_path);
    if (p.extension() == ".bin" && std::filesystem::exists(std::filesystem::path(p).replace_extension(".idx"), ec))
      throw ConfigError(fmt::format("--data-path {}: is the .bin of a Megatron indexed dataset: pass its prefix {} "
                                    "(without .bin), as Megatron's --data-path takes it",
                                    data_path, std::filesystem::path(p).replace_extension("").string()));
    check_text(bytes, data_path, "--data-path");
    text = std::move(bytes);
  } else {
    text = bundled_corpus_text();
  }
  if (tokenizer == nullptr) return text_corpus(text);
  Corpus c;
  c.tokens = tokenizer->encode(text);
  c.vocab_size = tokenizer->vocab_size();
  c.format = "text (" + tokenizer->describe() + ")";
  return c;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, const std::string& flag) {
  if (tokens.size() > size_t(INT32_MAX))
    throw ConfigError(fmt::format("{} {}: {} tokens do not fit the token file's int32 count", flag, path,
                                  tokens.size()));
  std::string b(size_t(kTokenFileHeaderInts) * 4 + 2 * tokens.size(), '\0');
  auto put32 = [&](size_t word, int32_t v) {
    for (int k = 0; k < 4; ++k) b[word * 4 + size_t(k)] = char(uint32_t(v) >> (8 * k) & 0xff);
  };
  put32(0, kTokenFileMagic);
  put32(1, kTokenFileVersion);
  put32(2, int32_t(tokens.size()));
  const size_t h = size_t(kTokenFileHeaderInts) * 4;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    if (id < 0 || id >= kTokenFileMaxVocab)
      throw ConfigError(fmt::format("{} {}: token id {} does not fit the token file's uint16 ids (< {})", flag, path,
                                    id, kTokenFileMaxVocab));
    b[h + 2 * i] = char(id & 0xff);
    b[h + 2 * i + 1] = char(id >> 8 & 0xff);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(b.data(), std::streamsize(b.size()));
  out.close();
  if (!out) throw ConfigError(fmt::format("{} {}: the file cannot be written", flag, path));
}

DataSplit parse_split(const std::string& text) {
  DataSplit out{0, 0, 0};
  double* w[3] = {&out.train, &out.valid, &out.test};
  std::stringstream ss(text);
  std::string item;
  int n = 0;
  bool ok = !text.empty() && text.back() != ',';
  while (ok && std::getline(ss, item, ',')) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    ok = n < 3 && used > 0 && used == item.size() && std::isfinite(v) && v >= 0;
    if (ok) *w[n++] = v;
  }
  if (!ok)
    throw ConfigError(fmt::format("--split {} is invalid: give up to three non-negative weights for the training, "
                                  "validation and test splits, e.g. 969,30,1",
                                  text));
  if (!std::isfinite(out.train + out.valid + out.test))  // normalised by their sum: every weight would become 0
    throw ConfigError(fmt::format("--split {} is invalid: the weights' sum overflows a double; give weights whose sum "
                                  "is finite (only their ratios count, e.g. 969,30,1)",
                                  text));
  if (!(out.valid > 0) || !(out.train > 0))
    throw ConfigError(fmt::format("--split {} is invalid: the training and the validation weight must be > 0 "
                                  "(evaluation and training each need their own tokens)",
                                  text));
  return out;
}

std::string split_str(const DataSplit& s) { return fmt::format("{},{},{}", s.train, s.valid, s.test); }

TextData::TextData(const Corpus& corpus, int64_t seq_length, double valid_fraction, uint64_t seed,
                   const std::string& source)
    : TextData(corpus, seq_length, DataSplit{1.0 - valid_fraction, valid_fraction, 0.0}, seed, source) {}

TextData::TextData(const Corpus& corpus, int64_t seq_length, const DataSplit& split, uint64_t seed,
                   const std::string& source)
    : s_(seq_length), seed_(seed), source_(source) {
  const int64_t n = int64_t(corpus.tokens.size());
  n_tokens_ = n;
  if (std::all_of(corpus.tokens.begin(), corpus.tokens.end(), [](int32_t t) { return t >= 0 && t <= 65535; }))
    tokens16_.assign(corpus.tokens.begin(), corpus.tokens.end());  // 2 bytes per token
  else
    tokens_ = corpus.tokens;
  const double sum = split.train + split.valid + split.test;
  n_valid_tokens_ = int64_t(double(n) * (split.valid / sum));
  const int64_t n_test_tokens = int64_t(double(n) * (split.test / sum));
  n_train_tokens_ = n - n_valid_tokens_ - n_test_tokens;
  n_train_ = (n_train_tokens_ - 1) / s_;
  n_valid_ = (n_valid_tokens_ - 1) / s_;
  n_test_ = n_test_tokens > 0 ? (n_test_tokens - 1) / s_ : 0;
  if (n_train_ < 1 || n_valid_ < 1)
    throw ConfigError(fmt::format("{}: {} tokens are too few for --seq-length {}: the training and the validation "
                                  "split ({} of the text) each need at least {} tokens",
                                  source_, n, s_, split.valid / sum, s_ + 1));
}

const std::vector<int64_t>& TextData::permutation(int64_t epoch) const {
  if (perm_epoch_ == epoch) return perm_;
  perm_.resize(size_t(n_train_));
  for (int64_t i = 0; i < n_train_; ++i) perm_[size_t(i)] = i;
  const core::PhiloxKey key{seed_, 0, core::RngPurpose::data};
  for (int64_t i = n_train_ - 1; i > 0; --i) {
    const uint64_t r = uint64_t(core::philox_u32(key, (uint64_t(1) << 32) + uint64_t(epoch), uint64_t(i)));
    std::swap(perm_[size_t(i)], perm_[size_t(r % uint64_t(i + 1))]);
  }
  perm_epoch_ = epoch;
  return perm_;
}

void TextData::window(int64_t start, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  for (int64_t i = 0; i < s_; ++i) {
    inputs[size_t(i)] = token(start + i);
    targets[size_t(i)] = token(start + i + 1);
  }
}

TextData::TextData(std::shared_ptr<const MegatronData> data, const std::string& source)
    : megatron_(std::move(data)), source_(source) {}

int64_t TextData::train_samples() const { return megatron_ ? megatron_->train().samples() : n_train_; }

int64_t TextData::valid_samples() const {
  if (!megatron_) return n_valid_;
  return megatron_->valid() ? megatron_->valid()->samples() : 0;
}

int64_t TextData::test_samples() const {
  if (!megatron_) return n_test_;
  return megatron_->test() ? megatron_->test()->samples() : 0;
}

int64_t TextData::tokens() const { return megatron_ ? megatron_->tokens() : n_tokens_; }

std::string TextData::fingerprint() const {
  if (megatron_) return megatron_->fingerprint();
  const uint64_t h = tokens16_.empty() ? core::xxh64(tokens_.data(), tokens_.size() * sizeof(int32_t))
                                       : core::xxh64(tokens16_.data(), tokens16_.size() * sizeof(uint16_t));
  return fmt::format("{} tokens, {}", n_tokens_, core::checksum_string(h));
}

std::string TextData::split_description(const DataSplit& split) const {
  return megatron_ ? megatron_->split_description() : split_str(split);
}

std::string TextData::order() const {
  if (megatron_)
    return "sample g = the blend's dataset d and its sample i (Megatron's rule), window perm_(d,e)[i % N_d], e = i / "
           "N_d, perm Philox(seed, data, layer 1 + d, 2^32 + e)";
  return "sample g = window perm_e[g % N], e = g / N, perm_e Philox(seed, data, 2^32 + e)";
}

void TextData::train_sample(int64_t g, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  if (megatron_) return megatron_->train().sample(g, inputs, targets);
  const int64_t w = permutation(g / n_train_)[size_t(g % n_train_)];
  window(w * s_, inputs, targets);
}

void TextData::valid_sample(int64_t j, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  if (megatron_) {
    AMPIPE_CHECK(megatron_->valid() != nullptr, "no validation split");
    return megatron_->valid()->sample(j, inputs, targets);
  }
  window(n_train_tokens_ + (j % n_valid_) * s_, inputs, targets);
}

void TextData::test_sample(int64_t j, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  if (megatron_) {
    AMPIPE_CHECK(megatron_->test() != nullptr, "no test split");
    return megatron_->test()->sample(j, inputs, targets);
  }
  window(n_train_tokens_ + n_valid_tokens_ + (j % n_test_) * s_, inputs, targets);
}

}  // namespace ampipe::train
