// Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py): the pre-tokenized data that Megatron's
// --data-path PREFIX names and tools/preprocess_data.py writes, read here memory-mapped and written by
// `ampipe preprocess --input FILE.jsonl`.
//
// PREFIX.bin: the token ids of every sequence, one sequence after the other, little-endian in the index's dtype.
// PREFIX.idx (all little-endian):
//   bytes 0-8    the magic "MMIDIDX\x00\x00"
//   9-16         the version, uint64, 1
//   17           the dtype code, uint8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
//   18-25        the sequence count n, uint64
//   26-33        the document count m, uint64: the entries of the document index, one more than the documents
//   34-          n int32 sequence lengths (tokens); n int64 sequence pointers (byte offsets into the .bin); m int64
//                document indices (document k is sequences [idx[k], idx[k+1]); idx[0] = 0 and idx[m-1] = n); and,
//                in a multimodal dataset only, n int8 sequence modes (ignored here)
// A sequence is a document's tokens (a sentence of it when preprocess_data.py split sentences), with the
// end-of-document id at its end when the data were written with --append-eod.
//
// Megatron's writer (IndexedDatasetBuilder) lays the sequences out one after the other: pointer[0] = 0, pointer[i+1]
// = pointer[i] + length[i] * itemsize, and the .bin holds exactly the lengths' sum times itemsize. This reader
// requires that layout (a range of sequences is then one range of tokens) and refuses anything else, as it refuses a
// bad magic, version or dtype, a truncated .idx or .bin, pointers beyond the .bin, document indices out of order, and
// token ids that are negative, not integers (float dtypes) or above 2^31 - 1: one ConfigError each, naming the flag,
// the file and the rule.
//
// Memory: both files are memory-mapped read-only. Opening reads each once (the checks above, the largest id for the
// vocabulary, the XXH64 the ranks compare) and then hands their pages back (madvise DONTNEED): the process holds none
// of the data until training reads its windows, and those pages are the kernel's page cache, not the heap.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace ampipe::train {

// Megatron's DType codes.
enum class TokenDType : uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8,
};
bool valid_token_dtype(uint8_t code);
int64_t token_dtype_bytes(TokenDType d);
const char* token_dtype_name(TokenDType d);  // "uint16"
// Megatron's DType.optimal_dtype (preprocess_data.py's choice from the tokenizer's vocabulary): uint16 when the
// vocabulary has fewer than 65500 ids, else int32.
TokenDType optimal_token_dtype(int64_t vocab_size);

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr int64_t kIndexHeaderBytes = 34;

class IndexedDataset {
 public:
  // Opens and checks PREFIX.idx and PREFIX.bin. `flag` names the flag in every error ("--data-path").
  IndexedDataset(const std::string& prefix, const std::string& flag);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  const std::string& flag() const { return flag_; }
  TokenDType dtype() const { return dtype_; }
  int64_t sequences() const { return n_; }
  int64_t documents() const { return m_ - 1; }
  int64_t tokens() const { return tokens_; }
  int32_t sequence_length(int64_t i) const;
  // The token offset of sequence i in the .bin (its pointer / itemsize); i == sequences(): tokens().
  int64_t sequence_start(int64_t i) const;
  int64_t document_index(int64_t k) const;  // k in [0, documents()]
  int32_t max_token() const { return max_token_; }  // the largest id (-1 when there is no token)
  uint64_t checksum() const { return checksum_; }   // XXH64 of the .idx, then of the .bin seeded with it
  // Tokens [first, first + out.size()) of the .bin (all sequences concatenated), as int32.
  void read(int64_t first, std::span<int32_t> out) const;
  std::string describe() const;  // "uint16, 12 documents, 12 sequences, 3456 tokens"

 private:
  struct Map {  // a read-only memory map of a whole file
    const unsigned char* data = nullptr;
    int64_t bytes = 0;
    void* base = nullptr;  // mmap's address (null for an empty file)
    Map() = default;
    Map(const Map&) = delete;
    Map& operator=(const Map&) = delete;
    ~Map();
  };
  void map_file(const std::string& path, Map& m) const;
  void check_index(const std::string& idx_path);
  void scan_tokens(const std::string& bin_path);

  std::string prefix_, flag_;
  Map idx_, bin_;
  TokenDType dtype_ = TokenDType::int32;
  int64_t n_ = 0, m_ = 0, tokens_ = 0, item_ = 4;
  int32_t max_token_ = -1;
  uint64_t checksum_ = 0;
};

// Writes PREFIX.bin and PREFIX.idx as Megatron's IndexedDatasetBuilder does (add_document, then finalize): byte for
// byte what Megatron writes for the same documents and dtype.
class IndexedDatasetWriter {
 public:
  // Creates PREFIX.bin. Throws ConfigError naming `flag` and the file when it cannot be written.
  IndexedDatasetWriter(const std::string& prefix, TokenDType dtype, const std::string& flag);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One document: its tokens, cut into sequences of the given lengths (their sum is tokens.size(); no lengths:
  // an empty document, as Megatron writes for a text with no token). Throws ConfigError when an id does not fit the
  // dtype.
  void add_document(std::span<const int32_t> tokens, std::span<const int64_t> sequence_lengths);
  // Writes PREFIX.idx and closes both files.
  void finalize();
  int64_t documents() const { return int64_t(doc_index_.size()) - 1; }
  int64_t tokens() const { return tokens_; }

 private:
  std::string prefix_, flag_;
  TokenDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_index_{0};
  int64_t tokens_ = 0;
  std::vector<unsigned char> buf_;
};

}  // namespace ampipe::train
