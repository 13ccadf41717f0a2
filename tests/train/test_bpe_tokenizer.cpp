// The byte-level BPE tokenizers (train/bpe_tokenizer.h) on small hand-written files whose ids follow by hand from
// GPT-2's rules; and the refusals of bad files and flags. tests/train/check_bpe_tokenizers.py compares trained
// tokenizers with Hugging Face's tokenizers on many texts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/train/bpe_tokenizer.h"

using namespace ampipe;
using ::testing::HasSubstr;
using Ids = std::vector<int32_t>;

namespace {

// GPT-2's bytes_to_unicode, written here from its description (the printable Latin-1 bytes !..~, ¡..¬, ®..ÿ stand
// for themselves; the other bytes, in order, for U+0100, U+0101, ...), as UTF-8.
std::string gpt2_char(int b) {
  static std::vector<uint32_t> cps = [] {
    std::vector<uint32_t> v(256);
    uint32_t n = 0;
    for (int i = 0; i < 256; ++i)
      v[size_t(i)] = ((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174)) ? uint32_t(i) : 256 + n++;
    return v;
  }();
  const uint32_t cp = cps[size_t(b)];
  std::string s;
  if (cp < 0x80) s.push_back(char(cp));
  else s += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
  return s;
}

std::string dir() {
  const auto d = std::filesystem::temp_directory_path() / "ampipe_test_bpe_tokenizer";
  std::filesystem::create_directories(d);
  return d.string();
}

std::string write(const std::string& name, const std::string& text) {
  const std::string path = dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Ids 0..255: the bytes (id = byte value); then the merges' tokens in order; then <|endoftext|>.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"l", "d"},
    {"Ġwor", "ld"}, {"Ġ", "Ġ"}, {"a", "Ġ"}, {"x", "1"}};
constexpr int32_t kHello = 259, kSpaceWorld = 264, kTwoSpaces = 265, kASpace = 266, kOr = 261, kLd = 263, kEod = 268;

nlohmann::json vocab_json() {
  nlohmann::json v = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) v[gpt2_char(b)] = b;
  int32_t id = 256;
  for (const auto& [a, b] : kMerges) v[a + b] = id++;
  v["<|endoftext|>"] = id;
  return v;
}

std::string merges_txt(const std::vector<std::pair<std::string, std::string>>& m) {
  std::string s = "#version: 0.2\n";
  for (const auto& [a, b] : m) s += a + " " + b + "\n";
  return s;
}

train::GPT2BPETokenizer gpt2() {
  return train::GPT2BPETokenizer(write("vocab.json", vocab_json().dump()), write("merges.txt", merges_txt(kMerges)));
}

Ids bytes(const std::string& s) {
  Ids v;
  for (char c : s) v.push_back(int32_t(uint8_t(c)));
  return v;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

nlohmann::json hf_json() {
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : kMerges) m.push_back(a + " " + b);
  nlohmann::json v = vocab_json();
  v.erase("<|endoftext|>");
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", kEod}, {"content", "<|endoftext|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", v}, {"merges", m}}}};
}

}  // namespace

TEST(BpeTokenizer, ByteMapIsGpt2s) {
  EXPECT_EQ(train::bpe::byte_char(' '), "\xC4\xA0");     // U+0120 Ġ
  EXPECT_EQ(train::bpe::byte_char('\n'), "\xC4\x8A");    // U+010A Ċ
  EXPECT_EQ(train::bpe::byte_char(0), "\xC4\x80");       // U+0100 Ā
  EXPECT_EQ(train::bpe::byte_char(0x7F), "\xC4\xA1");    // U+0121 ġ
  EXPECT_EQ(train::bpe::byte_char(0xAD), "\xC5\x83");    // U+0143 Ń (the soft hyphen)
  EXPECT_EQ(train::bpe::byte_char('a'), "a");
  EXPECT_EQ(train::bpe::byte_char(0xE9), "\xC3\xA9");    // é stands for itself
  for (int b = 0; b < 256; ++b) EXPECT_EQ(train::bpe::byte_char(uint8_t(b)), gpt2_char(b)) << b;
}

// Python's bytes.decode("utf-8", errors="replace") on the same inputs.
TEST(BpeTokenizer, LossyUtf8IsPythonsReplace) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(train::bpe::utf8_lossy("h\xC3\xA9llo"), "h\xC3\xA9llo");
  EXPECT_EQ(train::bpe::utf8_lossy("\xED\xA0\x80" "a"), r + r + r + "a");  // a surrogate: 3 bytes, 3 replacements
  EXPECT_EQ(train::bpe::utf8_lossy("\xE2\x82" "a\xF0\x9F\x98"), r + "a" + r);  // truncated: one each
  EXPECT_EQ(train::bpe::utf8_lossy("\xC0\xAF\xF5"), r + r + r);                // never valid bytes
  EXPECT_EQ(train::bpe::utf8_lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");   // U+1F600
}

TEST(BpeTokenizer, Gpt2EncodesByItsPatternAndMerges) {
  const train::GPT2BPETokenizer t = gpt2();
  EXPECT_EQ(t.vocab_size(), 269);
  EXPECT_EQ(t.eod(), kEod);
  EXPECT_EQ(t.encode("hello world"), (Ids{kHello, kSpaceWorld}));
  // "a  b": pieces "a", " " (\s+(?!\S) leaves the last space to " b"), " b"; "a   b": "a", "  ", " b".
  EXPECT_EQ(t.encode("hello  world"), (Ids{kHello, ' ', kSpaceWorld}));
  EXPECT_EQ(t.encode("hello   world"), (Ids{kHello, kTwoSpaces, kSpaceWorld}));
  EXPECT_EQ(t.encode("hello world  "), (Ids{kHello, kSpaceWorld, kTwoSpaces}));  // trailing run: one piece
  EXPECT_EQ(t.encode("a b"), (Ids{'a', ' ', 'b'}));   // "a Ġ" never applies: the letters' piece ends before
  EXPECT_EQ(t.encode("x1"), (Ids{'x', '1'}));         // letters and digits are separate pieces
  EXPECT_EQ(t.encode("world"), (Ids{'w', kOr, kLd}));
  EXPECT_EQ(t.encode(""), Ids{});
  // GPT-2 gives <|endoftext|> in a text no special meaning: it is cut as any text.
  EXPECT_EQ(t.encode("<|endoftext|>"), bytes("<|endoftext|>"));
  EXPECT_EQ(t.decode({kHello, kTwoSpaces, kSpaceWorld, kEod}), "hello   world<|endoftext|>");
  for (const std::string s : {"don't", "Ωμέγα 12 345 ½", "tabs\t\tand\nlines\n\n", " é\xF0\x9F\x98\x80 "})
    EXPECT_EQ(t.decode(t.encode(s)), s) << s;
  // Bytes that are not UTF-8 are encoded exactly (their own pieces) and decode as U+FFFD.
  EXPECT_EQ(t.encode("\xFF\xFEhello"), (Ids{0xFF, 0xFE, kHello}));
  EXPECT_EQ(t.decode(t.encode("\xFF" "ab")), "\xEF\xBF\xBD" "ab");
  EXPECT_THAT(error_of([&] { t.decode({999}); }), HasSubstr("token id 999 is not in the vocabulary (ids 0..268)"));
}

TEST(BpeTokenizer, TheLowerRankedPairMergesFirst) {
  nlohmann::json v = vocab_json();
  v["ab"] = 300;
  v["bc"] = 301;
  const std::string vocab = write("vocab_abc.json", v.dump());
  const train::GPT2BPETokenizer ab_first(vocab, write("ab.txt", merges_txt({{"a", "b"}, {"b", "c"}})));
  const train::GPT2BPETokenizer bc_first(vocab, write("bc.txt", merges_txt({{"b", "c"}, {"a", "b"}})));
  EXPECT_EQ(ab_first.encode("abc"), (Ids{300, 'c'}));
  EXPECT_EQ(bc_first.encode("abc"), (Ids{'a', 301}));
  EXPECT_EQ(ab_first.encode("ababab"), (Ids{300, 300, 300}));  // every occurrence, left to right
}

TEST(BpeTokenizer, Gpt2RefusesBadFiles) {
  const std::string vocab = write("vocab.json", vocab_json().dump()), merges = write("merges.txt", merges_txt(kMerges));
  auto make = [](const std::string& v, const std::string& m) { train::GPT2BPETokenizer t(v, m); };
  EXPECT_THAT(error_of([&] { make(dir() + "/none.json", merges); }),
              HasSubstr("--vocab-file " + dir() + "/none.json: the file does not exist"));
  EXPECT_THAT(error_of([&] { make(vocab, dir()); }), HasSubstr("--merge-file " + dir() + ": is not a regular file"));
  EXPECT_THAT(error_of([&] { make(write("bad.json", "{\"a\": 1,"), merges); }), HasSubstr("is not valid JSON"));
  nlohmann::json v = vocab_json();
  v.erase(gpt2_char(0));
  EXPECT_THAT(error_of([&] { make(write("nobyte.json", v.dump()), merges); }),
              HasSubstr("has no token for byte 0x00"));
  v = vocab_json();
  v.erase("<|endoftext|>");
  EXPECT_THAT(error_of([&] { make(write("noeod.json", v.dump()), merges); }), HasSubstr("has no token <|endoftext|>"));
  v = vocab_json();
  v["dup"] = 5;
  EXPECT_THAT(error_of([&] { make(write("dup.json", v.dump()), merges); }), HasSubstr("id 5 is given to two tokens"));
  EXPECT_THAT(error_of([&] { make(vocab, write("three.txt", "#version: 0.2\na b c\n")); }),
              HasSubstr("--merge-file " + dir() + "/three.txt: line 2 is not two tokens separated by a space"));
  EXPECT_THAT(error_of([&] { make(vocab, write("unknown.txt", "#version: 0.2\nq z\n")); }),
              HasSubstr("merge 1 (\"q z\"): the merged token \"qz\" is not in the vocabulary"));
}

TEST(BpeTokenizer, HuggingFaceReadsTokenizerJson) {
  const std::string d = dir() + "/hf";
  std::filesystem::create_directories(d);
  write("hf/tokenizer.json", hf_json().dump());
  const train::HuggingFaceTokenizer t(d);  // a directory holding tokenizer.json
  EXPECT_EQ(t.vocab_size(), 269);
  EXPECT_EQ(t.eod(), kEod);
  // Added tokens are matched in the raw text, before the pattern.
  EXPECT_EQ(t.encode("hello<|endoftext|>world"), (Ids{kHello, kEod, 'w', kOr, kLd}));
  EXPECT_EQ(t.decode(t.encode("hello<|endoftext|> world")), "hello<|endoftext|> world");
  nlohmann::json j = hf_json();  // Llama-3's layout: Split by a pattern, then ByteLevel without one, and a BOS
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}|[^\\p{N}]+"}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<|endoftext|>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
                         {"special_tokens", {{"<|endoftext|>", {{"id", "<|endoftext|>"}, {"ids", {kEod}}}}}}};
  const train::HuggingFaceTokenizer l(write("llama_like.json", j.dump()));
  EXPECT_EQ(l.encode("a b"), (Ids{kEod, kASpace, 'b'}));  // one piece now: "a Ġ" merges
  EXPECT_EQ(l.encode("x1234"), (Ids{kEod, 'x', '1', '2', '3', '4'}));
}

TEST(BpeTokenizer, HuggingFaceRefusesWhatItDoesNotRead) {
  auto refusal = [](const std::string& name, const nlohmann::json& j) {
    const std::string path = write(name, j.dump());
    return error_of([&] { train::HuggingFaceTokenizer t(path); });
  };
  const std::string where = "--tokenizer-model " + dir() + "/";
  nlohmann::json j = hf_json();
  j["model"]["type"] = "WordPiece";
  EXPECT_THAT(refusal("wp.json", j), HasSubstr(where + "wp.json: the model is WordPiece; this engine reads BPE"));
  j = hf_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_THAT(refusal("ws.json", j), HasSubstr(where + "ws.json: the pre-tokenizer Whitespace is not one"));
  j = hf_json();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}};
  EXPECT_THAT(refusal("re.json", j), HasSubstr("the pattern '(a' is not a regular expression PCRE2 compiles"));
  j = hf_json();
  j["decoder"] = nullptr;
  EXPECT_THAT(refusal("dec.json", j), HasSubstr(where + "dec.json: the decoder null is not ByteLevel"));
  j = hf_json();
  j["model"]["dropout"] = 0.1;
  EXPECT_THAT(refusal("drop.json", j), HasSubstr("model.dropout is 0.1"));
  j = hf_json();
  j.erase("model");
  EXPECT_THAT(refusal("nomodel.json", j), HasSubstr(where + "nomodel.json: has no \"model\""));
  EXPECT_THAT(error_of([&] { train::HuggingFaceTokenizer t(write("cut.json", hf_json().dump().substr(0, 100))); }),
              HasSubstr(where + "cut.json: is not valid JSON"));
  const std::string empty_dir = dir() + "/empty";
  std::filesystem::create_directories(empty_dir);
  EXPECT_THAT(error_of([&] { train::HuggingFaceTokenizer t(empty_dir); }),
              HasSubstr("--tokenizer-model " + empty_dir + ": the directory holds no tokenizer.json"));
}

TEST(BpeTokenizer, MakeTokenizerChecksTheFlags) {
  const std::string vocab = write("vocab.json", vocab_json().dump()), merges = write("merges.txt", merges_txt(kMerges));
  EXPECT_EQ(train::make_tokenizer("", "", "", ""), nullptr);
  EXPECT_EQ(train::make_tokenizer("GPT2BPETokenizer", "", vocab, merges)->encode("hello"), Ids{kHello});
  EXPECT_THAT(error_of([&] { train::make_tokenizer("BertWordPieceLowerCase", "", "", ""); }),
              HasSubstr("--tokenizer-type BertWordPieceLowerCase: not a tokenizer this engine has"));
  EXPECT_THAT(error_of([&] { train::make_tokenizer("GPT2BPETokenizer", "", vocab, ""); }),
              HasSubstr("--tokenizer-type GPT2BPETokenizer needs --merge-file FILE"));
  EXPECT_THAT(error_of([&] { train::make_tokenizer("HuggingFaceTokenizer", dir(), vocab, ""); }),
              HasSubstr("--vocab-file " + vocab + ": not used by --tokenizer-type HuggingFaceTokenizer"));
  EXPECT_THAT(error_of([&] { train::make_tokenizer("", "", "", merges); }),
              HasSubstr("--merge-file " + merges + ": not used without --tokenizer-type"));
}
