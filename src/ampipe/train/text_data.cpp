#include "ampipe/train/text_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampipe/core/error.h"
#include "ampipe/core/philox.h"

namespace ampipe::train {

namespace {

std::string read_all(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ConfigError(fmt::format("{} {}: the file does not exist", what, path));
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(fmt::format("{} {}: is a directory, expected a plain-text file", what, path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{} {}: the file cannot be read", what, path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
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

}  // namespace

std::string load_corpus(const std::string& data_path) {
  if (!data_path.empty()) {
    std::string text = read_all(data_path, "--data-path");
    check_text(text, data_path, "--data-path");
    return text;
  }
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

TextData::TextData(std::string text, int64_t seq_length, double valid_fraction, uint64_t seed,
                   const std::string& source)
    : tokens_(text.begin(), text.end()), s_(seq_length), seed_(seed), source_(source) {
  const int64_t n = int64_t(tokens_.size());
  const int64_t n_valid_tokens = int64_t(double(n) * valid_fraction);
  n_train_tokens_ = n - n_valid_tokens;
  n_train_ = (n_train_tokens_ - 1) / s_;
  n_valid_ = (n_valid_tokens - 1) / s_;
  if (n_train_ < 1 || n_valid_ < 1)
    throw ConfigError(fmt::format("{}: {} bytes are too few for --seq-length {}: the training and the validation "
                                  "split ({} of the text) each need at least {} tokens",
                                  source_, n, s_, valid_fraction, s_ + 1));
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
    inputs[size_t(i)] = tokens_[size_t(start + i)];
    targets[size_t(i)] = tokens_[size_t(start + i + 1)];
  }
}

void TextData::train_sample(int64_t g, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  const int64_t w = permutation(g / n_train_)[size_t(g % n_train_)];
  window(w * s_, inputs, targets);
}

void TextData::valid_sample(int64_t j, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  window(n_train_tokens_ + (j % n_valid_) * s_, inputs, targets);
}

}  // namespace ampipe::train
