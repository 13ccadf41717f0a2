// Megatron's indexed dataset (train/indexed_dataset.h): the writer's bytes are the format's (header fields at their
// offsets, pointers the running byte sums, the document index from 0), every dtype reads back, and each rule a bad
// file breaks is one ConfigError naming the flag, the file and the rule. (tests/train/indexed_dataset.py writes the
// format independently from its description; the CLI tests train on its files and compare preprocess's bytes.)
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampipe/core/error.h"
#include "ampipe/train/indexed_dataset.h"

using namespace ampipe;
using train::TokenDType;

namespace {

std::string temp_prefix(const std::string& name) { return ::testing::TempDir() + "/ids_" + name; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spill(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

template <typename T>
T at(const std::string& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}

// Three documents: two sequences, none (an empty document), one sequence.
std::string write_three(const std::string& name, TokenDType d) {
  const std::string p = temp_prefix(name);
  train::IndexedDatasetWriter w(p, d, "--output-prefix");
  const std::vector<int32_t> a = {5, 0, 7, 100, 3}, c = {9, 127};
  const std::vector<int64_t> la = {2, 3}, lc = {2};
  w.add_document(a, la);
  w.add_document({}, {});
  w.add_document(c, lc);
  w.finalize();
  EXPECT_EQ(w.documents(), 3);
  EXPECT_EQ(w.tokens(), 7);
  return p;
}

std::string error_of(const std::string& prefix) {
  try {
    train::IndexedDataset ds(prefix, "--data-path");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(IndexedDataset, WriterBytesAreMegatronsFormat) {
  const std::string p = write_three("format", TokenDType::uint16);
  const std::string idx = slurp(p + ".idx"), bin = slurp(p + ".bin");
  ASSERT_EQ(idx.size(), size_t(34 + 3 * 4 + 3 * 8 + 4 * 8));  // 3 sequences, 4 document-index entries
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(at<uint64_t>(idx, 9), 1u);   // version
  EXPECT_EQ(uint8_t(idx[17]), 8);        // uint16
  EXPECT_EQ(at<uint64_t>(idx, 18), 3u);  // sequences
  EXPECT_EQ(at<uint64_t>(idx, 26), 4u);  // document index entries: documents + 1
  const int32_t lengths[3] = {2, 3, 2};
  const int64_t pointers[3] = {0, 4, 10}, doc_index[4] = {0, 2, 2, 3};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(at<int32_t>(idx, size_t(34 + 4 * i)), lengths[i]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(at<int64_t>(idx, size_t(46 + 8 * i)), pointers[i]);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at<int64_t>(idx, size_t(70 + 8 * i)), doc_index[i]);
  ASSERT_EQ(bin.size(), 14u);
  EXPECT_EQ(at<uint16_t>(bin, 6), 100);
  EXPECT_EQ(train::optimal_token_dtype(65499), TokenDType::uint16);  // Megatron: uint16 below 65500
  EXPECT_EQ(train::optimal_token_dtype(65500), TokenDType::int32);
}

TEST(IndexedDataset, EveryDtypeReadsBack) {
  for (uint8_t code = 1; code <= 8; ++code) {
    const TokenDType d = TokenDType(code);
    const std::string p = write_three(std::string("dtype_") + train::token_dtype_name(d), d);
    EXPECT_EQ(std::filesystem::file_size(p + ".bin"), uint64_t(7 * train::token_dtype_bytes(d)));
    const train::IndexedDataset ds(p, "--data-path");
    EXPECT_EQ(ds.dtype(), d);
    EXPECT_EQ(ds.sequences(), 3);
    EXPECT_EQ(ds.documents(), 3);
    EXPECT_EQ(ds.tokens(), 7);
    EXPECT_EQ(ds.document_index(2), 2);
    EXPECT_EQ(ds.sequence_start(2), 5);
    EXPECT_EQ(ds.sequence_start(3), 7);
    EXPECT_EQ(ds.max_token(), 127);
    std::vector<int32_t> all(7);
    ds.read(0, all);
    EXPECT_EQ(all, (std::vector<int32_t>{5, 0, 7, 100, 3, 9, 127})) << train::token_dtype_name(d);
    std::vector<int32_t> mid(3);
    ds.read(3, mid);
    EXPECT_EQ(mid, (std::vector<int32_t>{100, 3, 9}));
  }
}

TEST(IndexedDataset, WriterRefusesAnIdTheDtypeCannotHold) {
  train::IndexedDatasetWriter w(temp_prefix("toolarge"), TokenDType::uint16, "--output-prefix");
  const std::vector<int32_t> t = {70000};
  const std::vector<int64_t> l = {1};
  EXPECT_THROW(w.add_document(t, l), ConfigError);
}

TEST(IndexedDataset, BadFilesAreRefusedNamingFileAndRule) {
  const std::string good = write_three("good", TokenDType::int32);
  const std::string idx = slurp(good + ".idx"), bin = slurp(good + ".bin");
  struct Case {
    const char* name;
    std::string idx, bin;
    const char* expect;
  };
  std::string bad_magic = idx, version = idx, dtype = idx, pointer = idx, docs = idx, negative = bin, modes = idx;
  bad_magic[3] = 'X';
  version[9] = 2;
  dtype[17] = 9;
  pointer[46 + 8] = 6;  // sequence 1 at byte 6 instead of 8
  docs[70 + 8 * 3] = 2;  // the document index ends at 2, not 3
  negative[0] = char(0xff), negative[1] = char(0xff), negative[2] = char(0xff), negative[3] = char(0xff);
  modes += std::string(3, '\0');  // a multimodal index: n int8 modes at the end, accepted
  const Case cases[] = {
      {"magic", bad_magic, bin, ".idx: bad magic: not a Megatron index file"},
      {"version", version, bin, ".idx: index version 2 is not supported"},
      {"dtype", dtype, bin, ".idx: dtype code 9 is not one of Megatron's 1..8"},
      {"short_idx", idx.substr(0, 20), bin, ".idx: truncated: 20 bytes, shorter than the index header's 34"},
      {"cut_idx", idx.substr(0, idx.size() - 8), bin, "the file is truncated or its header is corrupt"},
      {"cut_bin", idx, bin.substr(0, bin.size() - 4), ".bin: truncated: 24 bytes, but the index's 3 sequences hold 7 "
                                                     "int32 tokens (28 bytes)"},
      {"long_bin", idx, bin + "xxxx", "the .bin and the .idx do not belong together"},
      {"pointer", pointer, bin, "sequence 1's pointer is 6, but the sequences before it end at byte 8"},
      {"doc_index", docs, bin, "the document index ends at 2, not at the sequence count 3"},
      {"negative", idx, negative, ".bin: token 0 is -1, not a token id"},
      {"modes", modes, bin, "(no error)"},
  };
  for (const Case& c : cases) {
    const std::string p = temp_prefix(std::string("bad_") + c.name);
    spill(p + ".idx", c.idx);
    spill(p + ".bin", c.bin);
    const std::string e = error_of(p);
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.name << ": " << e;
    if (std::string(c.expect) != "(no error)") {
      EXPECT_EQ(e.rfind("--data-path " + p + ": ", 0), 0u) << e;
    }
  }
  const std::string lonely = temp_prefix("lonely");
  spill(lonely + ".bin", bin);
  EXPECT_NE(error_of(lonely).find(lonely + ".idx does not exist"), std::string::npos) << error_of(lonely);
  // A float dtype holding a value that is not an integer id.
  const std::string f = write_three("float", TokenDType::float32);
  std::string fbin = slurp(f + ".bin");
  const float half = 1.5f;
  std::memcpy(fbin.data() + 4, &half, 4);
  spill(f + ".bin", fbin);
  EXPECT_NE(error_of(f).find("token 1 is 1.5, not a token id"), std::string::npos) << error_of(f);
}
