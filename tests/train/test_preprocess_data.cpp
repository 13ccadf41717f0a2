// `ampipe preprocess` of JSON lines (train/preprocess_data.h), Megatron's preprocess_data.py: read back, each document
// is its tokenized text plus the end-of-document id, an empty text an empty document, a list of sentences one
// sequence each; the output does not depend on --workers; bad lines are refused naming --input, the line and the
// rule, and leave no dataset behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampipe/core/error.h"
#include "ampipe/train/indexed_dataset.h"
#include "ampipe/train/preprocess_data.h"

using namespace ampipe;

namespace {

// Words to ids: "w<number>" is that number, anything else 1; end of document kEod. Stands for any train::Tokenizer.
constexpr int32_t kEod = 69999;
class WordTokenizer : public train::Tokenizer {
 public:
  int64_t vocab_size() const override { return 70000; }  // int32 ids (Megatron's choice from 65500 up)
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    std::istringstream in(text);
    for (std::string w; in >> w;) ids.push_back(w.size() > 1 && w[0] == 'w' ? std::stoi(w.substr(1)) : 1);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids) s += (s.empty() ? "w" : " w") + std::to_string(id);
    return s;
  }
  int32_t eod() const override { return kEod; }
  std::string describe() const override { return "words"; }
};

std::string write_input(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/pp_" + name + ".jsonl";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<std::vector<int32_t>> documents(const std::string& prefix, int64_t* sequences = nullptr) {
  const train::IndexedDataset ds(prefix, "--data-path");
  if (sequences) *sequences = ds.sequences();
  std::vector<std::vector<int32_t>> out;
  for (int64_t k = 0; k < ds.documents(); ++k) {
    const int64_t a = ds.sequence_start(ds.document_index(k)), b = ds.sequence_start(ds.document_index(k + 1));
    std::vector<int32_t>& d = out.emplace_back(size_t(b - a));
    ds.read(a, d);
  }
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

train::PreprocessJsonResult run(const std::string& input, const std::string& out, const train::Tokenizer& t,
                                bool eod, int workers = 1, std::vector<std::string> keys = {"text"}) {
  train::PreprocessJsonOptions o;
  o.input = input;
  o.output_prefix = ::testing::TempDir() + "/pp_" + out;
  o.json_keys = std::move(keys);
  o.append_eod = eod;
  o.workers = workers;
  return train::preprocess_json(o, t, [](const std::string&) {});
}

}  // namespace

TEST(PreprocessData, DocumentsAreTheTokenizedTextsPlusEod) {
  const std::string in = write_input("docs",
                                     "{\"text\": \"w5 w6 w7\", \"title\": \"w1\"}\n"
                                     "\n"
                                     "{\"text\": \"\", \"title\": \"w2\"}\n"
                                     "{\"text\": [\"w10 w11\", \"\", \"w12\"], \"title\": \"\"}\n"
                                     "{\"text\": \"w70000 x\", \"title\": \"w3 w4\"}");  // no final newline
  const WordTokenizer words;
  const train::PreprocessJsonResult r = run(in, "words", words, true, 1, {"text", "title"});
  EXPECT_EQ(r.lines, 5);
  EXPECT_EQ(r.blank_lines, 1);
  ASSERT_EQ(r.outputs.size(), 2u);
  EXPECT_EQ(r.outputs[0].prefix, ::testing::TempDir() + "/pp_words_text_document");  // Megatron's names
  EXPECT_EQ(r.outputs[1].prefix, ::testing::TempDir() + "/pp_words_title_document");
  int64_t sequences = 0;
  EXPECT_EQ(documents(r.outputs[0].prefix, &sequences),
            (std::vector<std::vector<int32_t>>{{5, 6, 7, kEod}, {}, {10, 11, 12, kEod}, {70000, 1, kEod}}));
  EXPECT_EQ(sequences, 4);  // the sentences of document 2 are two sequences (the empty one is dropped)
  EXPECT_EQ(documents(r.outputs[1].prefix), (std::vector<std::vector<int32_t>>{{1, kEod}, {2, kEod}, {}, {3, 4, kEod}}));
  EXPECT_EQ(train::IndexedDataset(r.outputs[0].prefix, "--data-path").dtype(), train::TokenDType::int32);
  // Without --append-eod; byte-level: the UTF-8 bytes, uint16.
  const train::ByteLevelTokenizer bytes;
  const train::PreprocessJsonResult b = run(in, "bytes", bytes, false);
  EXPECT_EQ(documents(b.outputs[0].prefix)[0], (std::vector<int32_t>{'w', '5', ' ', 'w', '6', ' ', 'w', '7'}));
  EXPECT_EQ(train::IndexedDataset(b.outputs[0].prefix, "--data-path").dtype(), train::TokenDType::uint16);
}

TEST(PreprocessData, OutputDoesNotDependOnWorkers) {
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "{\"text\": \"w" + std::to_string(i) + " w" + std::to_string(i * 7) + "\"}\n";
  const std::string in = write_input("many", text);
  const WordTokenizer words;
  const std::string one = run(in, "w1", words, true, 1).outputs[0].prefix;
  const std::string four = run(in, "w4", words, true, 4).outputs[0].prefix;
  EXPECT_EQ(slurp(one + ".bin"), slurp(four + ".bin"));
  EXPECT_EQ(slurp(one + ".idx"), slurp(four + ".idx"));
  EXPECT_EQ(documents(four).size(), 3000u);
}

TEST(PreprocessData, BadLinesAreRefusedAndLeaveNoDataset) {
  const WordTokenizer words;
  const train::ByteLevelTokenizer bytes;
  struct Case {
    const char* name;
    const char* text;
    const train::Tokenizer& tok;
    const char* expect;
  };
  const Case cases[] = {
      {"json", "{\"text\": \"w1\"}\nnot json\n", words, "line 2: not valid JSON"},
      {"object", "[1, 2]\n", words, "line 1: not a JSON object"},
      {"key", "{\"body\": \"w1\"}\n", words, "line 1: the object has no key \"text\" (--json-keys text)"},
      {"type", "{\"text\": 5}\n", words, "line 1: the value of \"text\" is not a string or a list of strings"},
      {"nul", "{\"text\": \"a\\u0000b\"}\n", bytes, "line 1: the text of \"text\" holds the end-of-document id 0"},
  };
  for (const Case& c : cases) {
    const std::string in = write_input(std::string("bad_") + c.name, c.text);
    std::string e = "(no error)";
    try {
      run(in, std::string("bad_") + c.name, c.tok, true);
    } catch (const ConfigError& ex) {
      e = ex.what();
    }
    EXPECT_EQ(e.rfind("--input " + in + ": ", 0), 0u) << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.name << ": " << e;
    EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "/pp_bad_" + c.name + "_text_document.bin"));
  }
  // The byte-level tokenizer decodes its ids back to the text (invalid UTF-8 as U+FFFD, Python's errors="replace").
  EXPECT_EQ(bytes.decode(bytes.encode("Ünï ✓")), "Ünï ✓");
  EXPECT_EQ(bytes.decode({0x66, 0xff}), "f\xef\xbf\xbd");
  EXPECT_THROW(bytes.decode({256}), ConfigError);
}
