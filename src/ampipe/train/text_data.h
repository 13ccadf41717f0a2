// Training data: a text corpus, a byte-level tokenizer, a held-out validation split and deterministic shuffled
// sampling.
//
// Corpus: --data-path FILE (UTF-8 / ASCII plain text), or by default the bundled corpus: the license texts in
// /usr/share/common-licenses (Debian's `base-files`, an Essential package, so present offline on every Debian
// machine; about 250 KB of English prose), concatenated in file-name order, symlinks skipped (see data/README.md).
//
// Tokenizer: byte-level, vocabulary V = 256 (token = byte value). Exact and reversible for any text.
//
// Pre-tokenized data: --data-path FILE in llm.c's token-file format (github.com/karpathy/llm.c, dev/data): a header
// of 256 little-endian int32 (magic 20240520, version 1, token count n, the rest 0), then n little-endian uint16
// token ids, as written by llm.c's data scripts (GPT-2 tokenizer: ids < 50257). The file is recognised by its
// magic number; its vocabulary is the largest id + 1 (train/vocab_size.h pads it as Megatron does), so the LM head
// has a row for every id.
//
// Subword tokens: with a SentencePiece model (--tokenizer-type SentencePieceTokenizer --tokenizer-model FILE,
// train/tokenizer.h), plain text is tokenized with the model at load, and a token file must hold ids below the
// model's piece count; the vocabulary is then the model's piece count.
// `ampipe preprocess` writes token files (write_token_file) that the model's ids fit in: at most 65536 pieces.
//
// Split: the token stream's last valid_fraction is the validation split; the rest is the training split. A
// sample is a window of s + 1 tokens (inputs = window[0, s), targets = window[1, s]); the training split has
// N = (n_train - 1) / s windows at stride s. Training sample g (g = 0, 1, 2, ... over the whole run, the
// "consumed samples" counter) is window perm_e[g % N] of epoch e = g / N, where perm_e is a Fisher-Yates
// shuffle driven by Philox(seed, purpose data, token = 2^32 + e, feature = i). So the order depends only on the
// seed and the sample index: any rank can compute any sample, and a resumed run continues the same sequence.
// Validation sample j is window j % N_valid of the validation split, unshuffled.
//
// --split (Megatron's spelling, e.g. 969,30,1): weights of the training, validation and test splits, in that order
// along the token stream: the validation split gets floor(n w1 / sum) tokens, the test split floor(n w2 / sum), the
// training split the rest (--valid-fraction f is the split 1-f, f, 0). Test sample j is window j % N_test of the
// test split, unshuffled; a test split shorter than s + 1 tokens has no sample (test_samples() == 0).
//
// Megatron's indexed datasets (--data-path PREFIX, blends, --train-data-path ...): TextData over a MegatronData
// (train/megatron_data.h), whose splits, blends and sample order are described there.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ampipe::train {

inline constexpr int64_t kVocabSize = 256;  // the byte-level tokenizer's vocabulary
inline constexpr const char* kBundledCorpusDir = "/usr/share/common-licenses";
inline constexpr int32_t kTokenFileMagic = 20240520;  // llm.c token files
inline constexpr int32_t kTokenFileVersion = 1;       // uint16 ids
inline constexpr int kTokenFileHeaderInts = 256;      // int32 header words
inline constexpr int64_t kTokenFileMaxVocab = 65536;  // uint16 ids

class Tokenizer;
class MegatronData;

// A token stream and the vocabulary it needs (before padding: train/vocab_size.h): 256 for byte-level text, the
// largest id + 1 of a token file, a tokenizer's count.
struct Corpus {
  std::vector<int32_t> tokens;
  int64_t vocab_size = kVocabSize;
  std::string format;  // "text (byte-level)" or "llm.c tokens (uint16)"
};

// The bundled corpus, or the file: a pre-tokenized llm.c token file (by its magic number) or plain text.
// Throws ConfigError naming --data-path and the path when the file is missing, unreadable, empty, a token file
// with a bad header or size, or neither (a NUL byte, or more than 1% control characters).
Corpus load_corpus(const std::string& data_path);
// The same with a SentencePiece model: text is tokenized with it; a token file with an id >= the model's piece
// count is refused (ConfigError naming --data-path, the id and --tokenizer-model). tokenizer == nullptr: as above.
Corpus load_corpus(const std::string& data_path, const Tokenizer* tokenizer);

// What loading --data-path FILE (or the bundled corpus: "") costs in memory, from the file's size alone, before a
// byte of it is read: the peak while it loads (the file read whole, its tokens parsed as int32, then held in their
// own width by TextData) and what stays held. A Megatron indexed dataset is memory-mapped (page cache, not the
// heap): 0. describe: "llm.c token file, 1048576 tokens (2.00 MiB)".
struct DataMemory {
  int64_t peak = 0, held = 0;
  std::string path, describe;
};
DataMemory data_memory(const std::string& data_path);
// The bundled corpus's text (kBundledCorpusDir's files in name order, each followed by a newline).
std::string bundled_corpus_text();
// A plain-text file, checked as --data-path's text is (missing, unreadable, empty, binary: ConfigError naming
// `flag` and the path).
std::string read_text_file(const std::string& path, const std::string& flag);
// Writes tokens as an llm.c token file (the format load_corpus reads). Throws ConfigError naming `flag` and the path
// when it cannot be written, and when an id does not fit uint16.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, const std::string& flag);
// Byte-level tokenization of a text (token = byte value, V = 256).
Corpus text_corpus(const std::string& text);

// Weights of the training, validation and test splits (--split); parse_split reads "969,30,1" (1 to 3 numbers, the
// missing ones 0) and throws ConfigError naming --split when it is not that, a weight is negative, or the validation
// weight is 0.
struct DataSplit {
  double train = 0.95, valid = 0.05, test = 0;
};
DataSplit parse_split(const std::string& text);
std::string split_str(const DataSplit& s);  // "969,30,1"

class TextData {
 public:
  // seq_length: s. Throws ConfigError when either split has no complete window of s + 1 tokens.
  TextData(const Corpus& corpus, int64_t seq_length, double valid_fraction, uint64_t seed, const std::string& source);
  TextData(const Corpus& corpus, int64_t seq_length, const DataSplit& split, uint64_t seed, const std::string& source);
  // Megatron's indexed datasets: the splits and the order of `data`.
  TextData(std::shared_ptr<const MegatronData> data, const std::string& source);

  // Distinct samples: the training split's windows (of every dataset of a blend: one epoch each), the validation
  // and test splits' before one repeats.
  int64_t train_samples() const;
  int64_t valid_samples() const;
  int64_t test_samples() const;
  int64_t tokens() const;
  const std::string& source() const { return source_; }
  // What the ranks compare ("N tokens, xxh64:..."), how the splits are cut, and the training order, in words.
  std::string fingerprint() const;
  std::string split_description(const DataSplit& split) const;
  std::string order() const;

  // Sample g of the training stream / validation sample j: inputs and targets, s tokens each.
  void train_sample(int64_t g, std::span<int32_t> inputs, std::span<int32_t> targets) const;
  void valid_sample(int64_t j, std::span<int32_t> inputs, std::span<int32_t> targets) const;
  void test_sample(int64_t j, std::span<int32_t> inputs, std::span<int32_t> targets) const;  // needs test_samples() > 0

 private:
  const std::vector<int64_t>& permutation(int64_t epoch) const;
  void window(int64_t start, std::span<int32_t> inputs, std::span<int32_t> targets) const;

  std::shared_ptr<const MegatronData> megatron_;  // null: the token stream below
  // The token stream in its own width: uint16 when every id fits (byte-level text, llm.c token files, tokenizers
  // of at most 65536 pieces), else int32; the other vector is empty.
  std::vector<uint16_t> tokens16_;
  std::vector<int32_t> tokens_;
  int64_t n_tokens_ = 0;
  int32_t token(int64_t i) const { return tokens16_.empty() ? tokens_[size_t(i)] : int32_t(tokens16_[size_t(i)]); }
  int64_t s_ = 0, n_train_tokens_ = 0, n_valid_tokens_ = 0, n_train_ = 0, n_valid_ = 0, n_test_ = 0;
  uint64_t seed_ = 0;
  std::string source_;
  mutable int64_t perm_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

}  // namespace ampipe::train
