#include "ampipe/train/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "ampipe/core/json.h"
#include "ampipe/core/error.h"

namespace ampipe::train {

namespace bpe {

namespace {

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else if (cp < 0x800) {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(char(0xE0 | (cp >> 12)));
    s.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(char(0xF0 | (cp >> 18)));
    s.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
  return s;
}

// The length of the valid UTF-8 character at s[i] (1..4), or 0 when the bytes there do not start one; `prefix`
// gets the length of the longest valid beginning of a character (the "maximal subpart", at least 1).
size_t utf8_char(std::string_view s, size_t i, size_t* prefix = nullptr) {
  const auto b = uint8_t(s[i]);
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b < 0x80) {
    if (prefix) *prefix = 1;
    return 1;
  }
  if (b >= 0xC2 && b <= 0xDF) need = 1;
  else if (b == 0xE0) need = 2, lo = 0xA0;
  else if (b == 0xED) need = 2, hi = 0x9F;
  else if (b >= 0xE1 && b <= 0xEF) need = 2;
  else if (b == 0xF0) need = 3, lo = 0x90;
  else if (b == 0xF4) need = 3, hi = 0x8F;
  else if (b >= 0xF1 && b <= 0xF3) need = 3;
  size_t k = 0;
  for (; need > 0 && k < need && i + 1 + k < s.size(); ++k) {
    const auto c = uint8_t(s[i + 1 + k]);
    if (k == 0 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
  }
  if (prefix) *prefix = 1 + k;
  return need > 0 && k == need ? need + 1 : 0;
}

uint32_t code_point(std::string_view s, size_t i, size_t n) {
  if (n == 1) return uint8_t(s[i]);
  uint32_t cp = uint8_t(s[i]) & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  return cp;
}

struct ByteMap {
  std::array<std::string, 256> chars;
  std::unordered_map<uint32_t, uint8_t> byte_of;  // code point -> byte
  ByteMap() {
    // GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the others in order for 256 + n.
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? uint32_t(b) : 256 + n++;
      chars[size_t(b)] = utf8(cp);
      byte_of[cp] = uint8_t(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

bool is_white_space(uint32_t cp) {  // Unicode's White_Space property
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool is_word(uint32_t cp) {  // letters, numbers and '_' (tokenizers' single_word boundaries)
  if (cp == '_') return true;
  const utf8proc_category_t c = utf8proc_category(utf8proc_int32_t(cp));
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

}  // namespace

const std::string& byte_char(uint8_t b) { return byte_map().chars[b]; }

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    size_t prefix = 1;
    const size_t n = utf8_char(bytes, i, &prefix);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal subpart
      i += prefix;
    }
  }
  return out;
}

// A compiled PCRE2 pattern (UTF, Unicode properties, invalid UTF-8 allowed in subjects).
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE at = 0;
    const uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0u);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &at, nullptr);
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      throw ConfigError(fmt::format("{}: the pattern '{}' is not a regular expression PCRE2 compiles: {} (at offset {})",
                                    where, pattern, reinterpret_cast<const char*>(msg.data()), at));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) the interpreter runs it
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // [start, end) of every match, left to right and not overlapping (after an empty match the search moves on by
  // one character).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
        pcre2_match_data_create_from_pattern(code_, nullptr), pcre2_match_data_free);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    for (size_t start = 0; start <= s.size();) {
      int rc = pcre2_match(code_, subject, s.size(), start, 0, md.get(), nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // a very long run: the interpreter keeps its backtracking on the heap
        rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_JIT, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(rc, msg.data(), msg.size());
        throw ConfigError(fmt::format("the pattern '{}' cannot be matched on a text of {} bytes: {}", pattern_,
                                      s.size(), reinterpret_cast<const char*>(msg.data())));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      out.emplace_back(size_t(ov[0]), size_t(ov[1]));
      start = size_t(ov[1]);
      if (ov[1] == ov[0]) {
        if (start >= s.size()) break;
        const size_t n = utf8_char(s, start);
        start += n > 0 ? n : 1;
      }
    }
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
  std::string pattern_;
};

struct PreStep {
  enum class Kind { split, byte_level } kind = Kind::byte_level;
  std::shared_ptr<const Regex> re;  // split: its pattern; byte_level: GPT-2's pattern, or none (use_regex false)
  bool removed = false;             // split: the matches are dropped (Removed) rather than kept (Isolated)
  bool add_prefix_space = false;    // byte_level
};

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false;
};

struct Pipeline {
  std::string name, files;  // for messages: "GPT2BPETokenizer", "--vocab-file A, --merge-file B"
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_token;  // every id's token ("" where no token has the id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left id, right id) -> (rank, merged id)
  std::array<int32_t, 256> byte_id{};
  bool ignore_merges = false;
  std::vector<AddedToken> added;          // longest first
  std::vector<utf8proc_option_t> norms;   // normalizers, in order
  std::vector<PreStep> pre;               // the last one is byte_level
  std::vector<int32_t> prefix, suffix;    // the post-processor's ids around the text's
  int32_t eod = -1;
  mutable std::mutex mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // piece -> ids

  static uint64_t key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

  // The model's tables from a vocabulary (token -> id) and the merges in rank order; `vocab_where`,
  // `merges_where` start the messages.
  void set_model(const nlohmann::json& v, const std::vector<std::pair<std::string, std::string>>& m,
                 const std::string& vocab_where, const std::string& merges_where);
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_segment(std::string_view seg, std::vector<int32_t>& out) const;
  // The first added token in text[from, ...): [start, end) (with lstrip / rstrip whitespace) and its id.
  bool find_added(std::string_view text, size_t from, size_t& start, size_t& end, int32_t& id) const;
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
};

void Pipeline::set_model(const nlohmann::json& v, const std::vector<std::pair<std::string, std::string>>& m,
                         const std::string& vocab_where, const std::string& merges_where) {
  if (!v.is_object()) throw ConfigError(fmt::format("{}: the vocabulary is not a JSON object of token: id", vocab_where));
  for (const auto& [token, id] : v.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX)
      throw ConfigError(fmt::format("{}: the id of token \"{}\" is {}, not an integer in [0, 2^31 - 1)", vocab_where,
                                    token, id.dump()));
    const auto i = id.get<int32_t>();
    if (size_t(i) >= id_token.size()) id_token.resize(size_t(i) + 1);
    if (!id_token[size_t(i)].empty())
      throw ConfigError(fmt::format("{}: id {} is given to two tokens, \"{}\" and \"{}\"", vocab_where, i,
                                    id_token[size_t(i)], token));
    id_token[size_t(i)] = token;
    vocab[token] = i;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab.find(byte_char(uint8_t(b)));
    if (it == vocab.end())
      throw ConfigError(fmt::format("{}: has no token for byte 0x{:02X} (\"{}\"): a byte-level BPE vocabulary holds "
                                    "all 256, so that every text can be encoded",
                                    vocab_where, b, byte_char(uint8_t(b))));
    byte_id[size_t(b)] = it->second;
  }
  for (size_t r = 0; r < m.size(); ++r) {
    const auto& [a, b] = m[r];
    int32_t ids[3];
    const std::string parts[3] = {a, b, a + b};
    for (int k = 0; k < 3; ++k) {
      const auto it = vocab.find(parts[k]);
      if (it == vocab.end())
        throw ConfigError(fmt::format("{}: merge {} (\"{} {}\"): {} \"{}\" is not in the vocabulary", merges_where,
                                      r + 1, a, b, k == 2 ? "the merged token" : "the token", parts[k]));
      ids[k] = it->second;
    }
    merges[key(ids[0], ids[1])] = {int32_t(r), ids[2]};  // a repeated pair: the later rank, as GPT-2's dict
  }
}

void Pipeline::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const std::string k(piece);
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(k);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> sym;
  std::string whole;
  for (char c : piece) {
    sym.push_back(byte_id[uint8_t(c)]);
    if (ignore_merges) whole += byte_char(uint8_t(c));
  }
  const auto direct = ignore_merges ? vocab.find(whole) : vocab.end();
  if (direct != vocab.end()) {
    sym.assign(1, direct->second);
  } else {
    for (;;) {  // GPT-2's bpe: merge every occurrence of the lowest-ranked pair, left to right, until none ranks
      int32_t best = INT32_MAX, a = 0, b = 0, merged = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        const auto it = merges.find(key(sym[i], sym[i + 1]));
        if (it != merges.end() && it->second.first < best)
          best = it->second.first, a = sym[i], b = sym[i + 1], merged = it->second.second;
      }
      if (best == INT32_MAX) break;
      size_t w = 0;
      for (size_t i = 0; i < sym.size(); ++w) {
        if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
          sym[w] = merged;
          i += 2;
        } else {
          sym[w] = sym[i++];
        }
      }
      sym.resize(w);
    }
  }
  out.insert(out.end(), sym.begin(), sym.end());
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= (1u << 18)) cache.clear();
  cache.emplace(k, std::move(sym));
}

namespace {

// Applies a utf8proc normalization to the valid UTF-8 runs of `s` (invalid bytes stay as they are).
std::string normalize(std::string_view s, utf8proc_option_t opts) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    for (size_t n; j < s.size() && (n = utf8_char(s, j)) > 0;) j += n;
    if (j > i) {
      utf8proc_uint8_t* dst = nullptr;
      const utf8proc_ssize_t n =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i), utf8proc_ssize_t(j - i), &dst, opts);
      if (n >= 0) out.append(reinterpret_cast<const char*>(dst), size_t(n));
      else out.append(s.substr(i, j - i));
      std::free(dst);
    }
    if (j < s.size()) out.push_back(s[j++]);  // an invalid byte
    i = j;
  }
  return out;
}

// Cuts `pieces` by `re`: the matches become pieces of their own (or are dropped), and so do the parts between.
std::vector<std::string> split(const std::vector<std::string>& pieces, const Regex& re, bool removed) {
  std::vector<std::string> out;
  for (const std::string& p : pieces) {
    size_t prev = 0;
    for (const auto& [s, e] : re.find_all(p)) {
      if (s > prev) out.push_back(p.substr(prev, s - prev));
      if (e > s && !removed) out.push_back(p.substr(s, e - s));
      prev = e;
    }
    if (prev < p.size()) out.push_back(p.substr(prev));
  }
  return out;
}

}  // namespace

void Pipeline::encode_segment(std::string_view seg, std::vector<int32_t>& out) const {
  if (seg.empty()) return;
  std::string text(seg);
  for (utf8proc_option_t o : norms) text = normalize(text, o);
  std::vector<std::string> pieces{text};
  for (const PreStep& st : pre) {
    if (st.kind == PreStep::Kind::byte_level && st.add_prefix_space)
      for (std::string& p : pieces)
        if (p.empty() || p[0] != ' ') p.insert(p.begin(), ' ');
    if (st.re) pieces = split(pieces, *st.re, st.removed);
  }
  for (const std::string& p : pieces)
    if (!p.empty()) encode_piece(p, out);
}

bool Pipeline::find_added(std::string_view text, size_t from, size_t& start, size_t& end, int32_t& id) const {
  auto white_before = [&](size_t i) {  // the start of the whitespace run ending at i (not before `from`)
    while (i > from) {
      size_t k = i - 1;
      while (k > from && (uint8_t(text[k]) & 0xC0) == 0x80) --k;
      const size_t n = utf8_char(text, k);
      if (n == 0 || k + n != i || !is_white_space(code_point(text, k, n))) break;
      i = k;
    }
    return i;
  };
  auto white_after = [&](size_t i) {
    for (size_t n; i < text.size() && (n = utf8_char(text, i)) > 0 && is_white_space(code_point(text, i, n));) i += n;
    return i;
  };
  auto word_at = [&](size_t i) {  // whether the character starting at i (or ending at i, back) is a word character
    const size_t n = i < text.size() ? utf8_char(text, i) : 0;
    return n > 0 && is_word(code_point(text, i, n));
  };
  auto word_before = [&](size_t i) {
    if (i == 0) return false;
    size_t k = i - 1;
    while (k > 0 && (uint8_t(text[k]) & 0xC0) == 0x80) --k;
    return k + utf8_char(text, k) == i && word_at(k);
  };
  for (size_t i = from; i < text.size(); ++i)
    for (const AddedToken& t : added) {  // longest first: the leftmost match, and the longest there
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      const size_t e = i + t.content.size();
      if (t.single_word && (word_before(i) || word_at(e))) continue;
      start = t.lstrip ? white_before(i) : i;
      end = t.rstrip ? white_after(e) : e;
      id = t.id;
      return true;
    }
  return false;
}

std::vector<int32_t> Pipeline::encode(const std::string& text) const {
  std::vector<int32_t> out = prefix;
  const std::string_view t(text);
  size_t at = 0, s = 0, e = 0;
  int32_t id = 0;
  while (!added.empty() && find_added(t, at, s, e, id)) {
    encode_segment(t.substr(at, s - at), out);
    out.push_back(id);
    at = e;
  }
  encode_segment(t.substr(at), out);
  out.insert(out.end(), suffix.begin(), suffix.end());
  return out;
}

std::string Pipeline::decode(const std::vector<int32_t>& ids) const {
  const ByteMap& m = byte_map();
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= id_token.size() || id_token[size_t(id)].empty())
      throw ConfigError(fmt::format("{} ({}): token id {} is not in the vocabulary (ids 0..{})", name, files, id,
                                    id_token.size() - 1));
    const std::string& tok = id_token[size_t(id)];
    std::string mapped;  // the token's bytes when every character of it stands for a byte (tokenizers' rule)
    bool all = true;
    for (size_t i = 0; i < tok.size() && all;) {
      const size_t n = utf8_char(tok, i);
      const auto it = n > 0 ? m.byte_of.find(code_point(tok, i, n)) : m.byte_of.end();
      if (it == m.byte_of.end()) all = false;
      else mapped.push_back(char(it->second)), i += n;
    }
    bytes += all ? mapped : tok;
  }
  return utf8_lossy(bytes);
}

}  // namespace bpe

namespace {

using bpe::Pipeline;

std::string read_file(const std::string& path, const std::string& flag, const char* what) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw ConfigError(fmt::format("{} {}: the file does not exist", flag, path));
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError(fmt::format("{} {}: is not a regular file, expected {}", flag, path, what));
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  if (!f) throw ConfigError(fmt::format("{} {}: cannot be read", flag, path));
  return ss.str();
}

nlohmann::json parse_json(const std::string& text, const std::string& where, const char* what) {
  try {
    return core::parse_json(text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("{}: is not valid JSON ({}), expected {}", where, e.what(), what));
  }
}

}  // namespace

// ---- ByteLevelBpeTokenizer: what both share ----

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer() : p_(std::make_unique<Pipeline>()) {}
ByteLevelBpeTokenizer::~ByteLevelBpeTokenizer() = default;
int64_t ByteLevelBpeTokenizer::vocab_size() const { return int64_t(p_->id_token.size()); }
std::vector<int32_t> ByteLevelBpeTokenizer::encode(const std::string& text) const { return p_->encode(text); }
std::string ByteLevelBpeTokenizer::decode(const std::vector<int32_t>& ids) const { return p_->decode(ids); }
int32_t ByteLevelBpeTokenizer::eod() const { return p_->eod; }
std::string ByteLevelBpeTokenizer::describe() const {
  return fmt::format("{} ({}: {} ids, eod {})", p_->name, p_->files, vocab_size(), p_->eod);
}

// ---- GPT2BPETokenizer ----

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file) {
  p_->name = "GPT2BPETokenizer";
  p_->files = fmt::format("--vocab-file {}, --merge-file {}", vocab_file, merge_file);
  const std::string vw = "--vocab-file " + vocab_file, mw = "--merge-file " + merge_file;
  const nlohmann::json vocab =
      parse_json(read_file(vocab_file, "--vocab-file", "GPT-2's vocab.json"), vw, "GPT-2's vocab.json");
  const std::string text = read_file(merge_file, "--merge-file", "GPT-2's merges.txt");
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream lines(text);
  std::string line;
  for (int no = 1; std::getline(lines, line); ++no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if ((no == 1 && line.rfind("#version", 0) == 0) || line.find_first_not_of(" \t") == std::string::npos) continue;
    std::istringstream parts(line);
    std::string a, b, extra;
    if (!(parts >> a >> b) || (parts >> extra))
      throw ConfigError(fmt::format("{}: line {} is not two tokens separated by a space: \"{}\"", mw, no, line));
    merges.emplace_back(a, b);
  }
  p_->set_model(vocab, merges, vw, mw);
  const auto eod = p_->vocab.find("<|endoftext|>");
  if (eod == p_->vocab.end())
    throw ConfigError(fmt::format("{}: has no token <|endoftext|>, which GPT2BPETokenizer uses as the end of a "
                                  "document (the eod)",
                                  vw));
  p_->eod = eod->second;
  p_->pre.push_back({bpe::PreStep::Kind::byte_level,
                     std::make_shared<const bpe::Regex>(bpe::kGpt2Pattern, false, "GPT-2's pattern"), false, false});
}

// ---- HuggingFaceTokenizer ----

namespace {

std::string type_of(const nlohmann::json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}
bool flag_of(const nlohmann::json& j, const char* key, bool dflt = false) {
  return j.is_object() && j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : dflt;
}
bool is_null_or(const nlohmann::json& j, const char* key, const nlohmann::json& ok) {
  return !j.contains(key) || j[key].is_null() || j[key] == ok;
}

void check_model_type(const nlohmann::json& m, const std::string& where) {
  const std::string type = m.is_object() && m.contains("type") ? type_of(m) : (m.contains("merges") ? "BPE" : "");
  if (type != "BPE")
    throw ConfigError(fmt::format("{}: the model is {}; this engine reads BPE models only (byte-level, as GPT-2's, "
                                  "Llama-3's and Qwen2's tokenizer.json)",
                                  where, type.empty() ? std::string("missing") : type));
}

// The file's model: BPE over byte-level symbols, without the options that make it something else.
void read_model(Pipeline& p, const nlohmann::json& m, const std::string& where) {
  if (!is_null_or(m, "dropout", 0.0) && !is_null_or(m, "dropout", 0))
    throw ConfigError(fmt::format("{}: model.dropout is {}: BPE dropout makes encoding random; only null or 0", where,
                                  m["dropout"].dump()));
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!is_null_or(m, k, ""))
      throw ConfigError(fmt::format("{}: model.{} is {}: not a byte-level BPE (only null or \"\")", where, k,
                                    m[k].dump()));
  if (flag_of(m, "byte_fallback"))
    throw ConfigError(fmt::format("{}: model.byte_fallback is true: a SentencePiece-style BPE, not byte-level", where));
  if (!m.contains("vocab") || !m.contains("merges") || !m["merges"].is_array())
    throw ConfigError(fmt::format("{}: the BPE model needs \"vocab\" (an object) and \"merges\" (an array)", where));
  std::vector<std::pair<std::string, std::string>> merges;
  for (const nlohmann::json& e : m["merges"]) {
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos) {
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        continue;
      }
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      continue;
    }
    throw ConfigError(fmt::format("{}: model.merges[{}] is {}, not \"a b\" or [\"a\", \"b\"]", where, merges.size(),
                                  e.dump()));
  }
  p.ignore_merges = flag_of(m, "ignore_merges");
  p.set_model(m["vocab"], merges, where + ": model.vocab", where + ": model.merges");
}

void read_added(Pipeline& p, const nlohmann::json& j, const std::string& where) {
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return;
  if (!j["added_tokens"].is_array()) throw ConfigError(fmt::format("{}: \"added_tokens\" is not an array", where));
  for (const nlohmann::json& t : j["added_tokens"]) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
        t["id"].get<int64_t>() >= INT32_MAX || !t.contains("content") || !t["content"].is_string() ||
        t["content"].get<std::string>().empty())
      throw ConfigError(fmt::format("{}: added token {} has no id in [0, 2^31 - 1) and non-empty content", where,
                                    t.dump()));
    bpe::AddedToken a{t["id"].get<int32_t>(), t["content"].get<std::string>(), flag_of(t, "single_word"),
                      flag_of(t, "lstrip"), flag_of(t, "rstrip")};
    if (size_t(a.id) >= p.id_token.size()) p.id_token.resize(size_t(a.id) + 1);
    p.id_token[size_t(a.id)] = a.content;  // decoded as its content, as tokenizers does
    p.added.push_back(std::move(a));
  }
  std::stable_sort(p.added.begin(), p.added.end(),
                   [](const bpe::AddedToken& x, const bpe::AddedToken& y) { return x.content.size() > y.content.size(); });
}

void read_normalizer(Pipeline& p, const nlohmann::json& n, const std::string& where) {
  if (n.is_null()) return;
  const std::string type = type_of(n);
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const nlohmann::json& e : n["normalizers"]) read_normalizer(p, e, where);
    return;
  }
  const auto stable = UTF8PROC_STABLE;
  if (type == "NFC") p.norms.push_back(utf8proc_option_t(stable | UTF8PROC_COMPOSE));
  else if (type == "NFD") p.norms.push_back(utf8proc_option_t(stable | UTF8PROC_DECOMPOSE));
  else if (type == "NFKC") p.norms.push_back(utf8proc_option_t(stable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  else if (type == "NFKD") p.norms.push_back(utf8proc_option_t(stable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  else
    throw ConfigError(fmt::format("{}: the normalizer {} is not one this engine runs (null, NFC, NFD, NFKC, NFKD or a "
                                  "Sequence of them)",
                                  where, type.empty() ? n.dump() : type));
}

void read_pre_tokenizer(Pipeline& p, const nlohmann::json& t, const std::string& where) {
  const std::string type = type_of(t);
  if (type == "Sequence" && t.contains("pretokenizers") && t["pretokenizers"].is_array()) {
    for (const nlohmann::json& e : t["pretokenizers"]) read_pre_tokenizer(p, e, where);
    return;
  }
  if (!p.pre.empty() && p.pre.back().kind == bpe::PreStep::Kind::byte_level)
    throw ConfigError(fmt::format("{}: the pre-tokenizer {} follows ByteLevel; this engine runs ByteLevel last", where,
                                  type));
  bpe::PreStep st;
  if (type == "ByteLevel") {
    st.add_prefix_space = flag_of(t, "add_prefix_space");
    if (flag_of(t, "use_regex", true))
      st.re = std::make_shared<const bpe::Regex>(bpe::kGpt2Pattern, false, where + ": ByteLevel");
  } else if (type == "Split") {
    st.kind = bpe::PreStep::Kind::split;
    const nlohmann::json pat = t.value("pattern", nlohmann::json());
    const bool literal = pat.is_object() && pat.contains("String") && pat["String"].is_string();
    if (!literal && !(pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()))
      throw ConfigError(fmt::format("{}: the Split pre-tokenizer's pattern {} is not {{\"Regex\": ...}} or "
                                    "{{\"String\": ...}}",
                                    where, pat.dump()));
    const std::string behavior = t.value("behavior", std::string());
    if ((behavior != "Isolated" && behavior != "Removed") || flag_of(t, "invert"))
      throw ConfigError(fmt::format("{}: the Split pre-tokenizer's behavior {}{} is not one this engine runs "
                                    "(Isolated or Removed, not inverted)",
                                    where, behavior, flag_of(t, "invert") ? " (inverted)" : ""));
    st.removed = behavior == "Removed";
    st.re = std::make_shared<const bpe::Regex>(pat[literal ? "String" : "Regex"].get<std::string>(), literal,
                                               where + ": the Split pre-tokenizer");
  } else {
    throw ConfigError(fmt::format("{}: the pre-tokenizer {} is not one this engine runs (ByteLevel, Split, or a "
                                  "Sequence of them ending with ByteLevel: a byte-level BPE)",
                                  where, type.empty() ? t.dump() : type));
  }
  p.pre.push_back(std::move(st));
}

// The ids of a post-processor's special token: TemplateProcessing's "special_tokens" entry, or Roberta's and
// Bert's ["token", id].
void read_post(Pipeline& p, const nlohmann::json& t, const std::string& where) {
  const std::string type = type_of(t);
  if (t.is_null() || type == "ByteLevel") return;
  if (type == "Sequence" && t.contains("processors") && t["processors"].is_array()) {
    for (const nlohmann::json& e : t["processors"]) read_post(p, e, where);
    return;
  }
  auto pair_id = [&](const char* k) {
    if (!t.contains(k) || !t[k].is_array() || t[k].size() != 2 || !t[k][1].is_number_integer())
      throw ConfigError(fmt::format("{}: the {} post-processor's \"{}\" is not [token, id]", where, type, k));
    return t[k][1].get<int32_t>();
  };
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    p.prefix.push_back(pair_id("cls"));
    p.suffix.insert(p.suffix.begin(), pair_id("sep"));
    return;
  }
  if (type != "TemplateProcessing" || !t.contains("single") || !t["single"].is_array())
    throw ConfigError(fmt::format("{}: the post-processor {} is not one this engine runs (null, ByteLevel, "
                                  "TemplateProcessing, RobertaProcessing, BertProcessing, or a Sequence of them)",
                                  where, type.empty() ? t.dump() : type));
  bool seen_a = false;
  for (const nlohmann::json& piece : t["single"]) {
    if (piece.contains("Sequence")) {
      seen_a = true;
      continue;
    }
    const std::string name = piece.contains("SpecialToken") ? piece["SpecialToken"].value("id", std::string()) : "";
    const nlohmann::json sp = t.value("special_tokens", nlohmann::json::object());
    if (name.empty() || !sp.contains(name) || !sp[name].contains("ids") || !sp[name]["ids"].is_array())
      throw ConfigError(fmt::format("{}: TemplateProcessing's single template holds {}, which special_tokens does "
                                    "not define",
                                    where, piece.dump()));
    for (const nlohmann::json& id : sp[name]["ids"]) (seen_a ? p.suffix : p.prefix).push_back(id.get<int32_t>());
  }
}

void read_decoder(const nlohmann::json& d, const std::string& where) {
  const std::string type = type_of(d);
  if (type == "ByteLevel") return;
  if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array() && !d["decoders"].empty()) {
    for (const nlohmann::json& e : d["decoders"]) read_decoder(e, where);
    return;
  }
  throw ConfigError(fmt::format("{}: the decoder {} is not ByteLevel: this engine reads byte-level BPE only", where,
                                d.is_null() ? std::string("null") : type.empty() ? d.dump() : type));
}

// tokenizer_config.json's "eos_token" beside the file, else a conventional end-of-text token of the vocabulary.
int32_t find_eod(const Pipeline& p, const std::filesystem::path& file) {
  auto id_of = [&](const std::string& t) -> int32_t {
    for (const bpe::AddedToken& a : p.added)
      if (a.content == t) return a.id;
    const auto it = p.vocab.find(t);
    return it == p.vocab.end() ? -1 : it->second;
  };
  const std::filesystem::path cfg = file.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(cfg, ec)) {
    const nlohmann::json c = parse_json(read_file(cfg.string(), "--tokenizer-model", "tokenizer_config.json"),
                                        "--tokenizer-model " + cfg.string(), "a tokenizer_config.json");
    const nlohmann::json eos = c.value("eos_token", nlohmann::json());
    const std::string name = eos.is_string() ? eos.get<std::string>() : eos.is_object() ? eos.value("content", "") : "";
    if (!name.empty()) {
      const int32_t id = id_of(name);
      if (id < 0)
        throw ConfigError(fmt::format("--tokenizer-model {}: eos_token \"{}\" is not a token of {}", cfg.string(), name,
                                      file.string()));
      return id;
    }
  }
  for (const char* t : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
    if (id_of(t) >= 0) return id_of(t);
  return -1;
}

}  // namespace

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& path) {
  std::error_code ec;
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(file, ec)) {
    file /= "tokenizer.json";
    if (!std::filesystem::exists(file, ec))
      throw ConfigError(fmt::format("--tokenizer-model {}: the directory holds no tokenizer.json", path));
  }
  const std::string where = "--tokenizer-model " + file.string();
  p_->name = "HuggingFaceTokenizer";
  p_->files = where;
  const nlohmann::json j = parse_json(read_file(file.string(), "--tokenizer-model", "a tokenizer.json"), where,
                                      "a Hugging Face tokenizer.json");
  if (!j.is_object() || !j.contains("model"))
    throw ConfigError(fmt::format("{}: has no \"model\": not a Hugging Face tokenizer.json", where));
  // What kind of tokenizer it is first (model, pre-tokenizer, decoder), so a refusal names that, then the tables.
  check_model_type(j["model"], where);
  read_normalizer(*p_, j.value("normalizer", nlohmann::json()), where);
  const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  if (!pre.is_null()) read_pre_tokenizer(*p_, pre, where);
  if (p_->pre.empty() || p_->pre.back().kind != bpe::PreStep::Kind::byte_level)
    throw ConfigError(fmt::format("{}: the pre-tokenizer has no ByteLevel step: this engine reads byte-level BPE "
                                  "only (GPT-2's, Llama-3's, Qwen2's)",
                                  where));
  read_decoder(j.value("decoder", nlohmann::json()), where);
  read_model(*p_, j["model"], where);
  read_added(*p_, j, where);
  read_post(*p_, j.value("post_processor", nlohmann::json()), where);
  for (const std::vector<int32_t>* v : {&p_->prefix, &p_->suffix})
    for (int32_t id : *v)
      if (id < 0 || size_t(id) >= p_->id_token.size() || p_->id_token[size_t(id)].empty())
        throw ConfigError(fmt::format("{}: the post-processor adds id {}, which no token has", where, id));
  p_->eod = find_eod(*p_, file);
}

}  // namespace ampipe::train
