#include "ampipe/train/layer_pattern.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>

#include "ampipe/core/error.h"

namespace ampipe::train {

namespace {

// A recursive-descent reader of the list expressions Megatron's scripts pass (Megatron evaluates them as Python):
//   expr := term ('+' term)* ; term := atom ('*' int)* ; atom := '[' [int (',' int)*] ']' | '(' expr ')' | int
class ListExpr {
 public:
  explicit ListExpr(const std::string& text) : s_(text) {}

  std::vector<int64_t> parse() {
    std::vector<int64_t> v = expr();
    skip();
    if (i_ != s_.size()) fail("unexpected text at character " + std::to_string(i_ + 1));
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw ConfigError(fmt::format("--moe-layer-freq {} is invalid: {} (it is an integer k, or a list of 0/1 per "
                                  "layer written with [...], * and +, e.g. \"([0]+[1]*23)\")",
                                  s_, why));
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  int64_t integer() {
    skip();
    const size_t start = i_;
    int64_t v = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      v = v * 10 + (s_[i_] - '0');
      if (v > (int64_t(1) << 20)) fail("a number is too large");
      ++i_;
    }
    if (i_ == start) fail("a number is expected at character " + std::to_string(start + 1));
    return v;
  }
  std::vector<int64_t> atom() {
    if (eat('(')) {
      std::vector<int64_t> v = expr();
      if (!eat(')')) fail("a ')' is missing");
      return v;
    }
    if (!eat('[')) fail("a list '[...]' is expected at character " + std::to_string(i_ + 1));
    std::vector<int64_t> v;
    if (eat(']')) return v;
    do v.push_back(integer());
    while (eat(','));
    if (!eat(']')) fail("a ']' is missing");
    return v;
  }
  std::vector<int64_t> term() {
    std::vector<int64_t> v = atom();
    while (eat('*')) {
      const int64_t n = integer();
      if (int64_t(v.size()) * n > (int64_t(1) << 20)) fail("the list is too long");
      std::vector<int64_t> r;
      for (int64_t k = 0; k < n; ++k) r.insert(r.end(), v.begin(), v.end());
      v = std::move(r);
    }
    return v;
  }
  std::vector<int64_t> expr() {
    std::vector<int64_t> v = term();
    while (eat('+')) {
      const std::vector<int64_t> r = term();
      v.insert(v.end(), r.begin(), r.end());
    }
    return v;
  }

  const std::string& s_;
  size_t i_ = 0;
};

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

std::vector<bool> moe_layer_pattern(const std::string& moe_layer_freq, int first_k_dense_replace, int num_layers) {
  std::vector<bool> moe(size_t(std::max(num_layers, 0)), true);
  if (all_digits(moe_layer_freq)) {
    const int64_t k = moe_layer_freq.size() > 7 ? 0 : std::stoll(moe_layer_freq);
    if (k < 1)
      throw ConfigError(fmt::format("--moe-layer-freq {} is invalid: an integer frequency must be >= 1", moe_layer_freq));
    for (int i = 0; i < num_layers; ++i) moe[size_t(i)] = i % k == 0;  // Megatron: layer i has experts if i % k == 0
  } else {
    const std::vector<int64_t> v = ListExpr(moe_layer_freq).parse();
    if (int64_t(v.size()) != num_layers)
      throw ConfigError(fmt::format("--moe-layer-freq {} has {} entries: it must have one per layer (--num-layers {})",
                                    moe_layer_freq, v.size(), num_layers));
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] != 0 && v[i] != 1)
        throw ConfigError(fmt::format("--moe-layer-freq {}: entry {} is {}: each entry is 1 (experts) or 0 (dense)",
                                      moe_layer_freq, i, v[i]));
      moe[i] = v[i] == 1;
    }
  }
  if (first_k_dense_replace < 0 || first_k_dense_replace > num_layers)
    throw ConfigError(fmt::format("--first-k-dense-replace {} is invalid: it must be in [0, --num-layers {}]",
                                  first_k_dense_replace, num_layers));
  for (int i = 0; i < first_k_dense_replace; ++i) moe[size_t(i)] = false;
  return moe;
}

}  // namespace ampipe::train
