// Megatron's data pipeline over indexed datasets (train/indexed_dataset.h): --data-path blends split by --split, and
// the per-split --train-data-path / --valid-data-path / --test-data-path (megatron/core/datasets:
// blended_megatron_dataset_builder.py, blended_dataset.py, gpt_dataset.py, utils.py).
//
// Grammar (Megatron's get_blend_from_list): one prefix; weights and prefixes, `0.7 A 0.3 B` (an even count whose
// every other value, from the first, is a number); or prefixes alone, `A B`. Weights must be finite and > 0
// (BlendedDataset's assertion); they are normalised (w / sum). Without weights each dataset
// weighs its number of samples in that split, as in Megatron.
//
// Split (--data-path only): per dataset, over its sequences (the documents, unless preprocessing split sentences):
// with the --split weights normalised to w0, w1, w2 and n sequences, split k is sequences
// [round(e_k n), round(e_(k+1) n)) with e = 0, w0, w0 + w1, w0 + w1 + w2 (round half to even, Python's round), so the
// training split comes first in the file, the test split last. A split of weight 0 is not built. The per-split flags
// take every sequence of their datasets (Megatron's split_spoof of (0, 1)).
//
// Samples (GPTDataset's, without its shuffling): a split of one dataset is its sequences concatenated, EOD tokens
// included when the data were written with them (a range of the .bin); sample i of it is the window of s + 1 tokens
// starting at token i*s (inputs the first s, targets the last s), and it has N = (tokens - 1) / s of them.
//
// Blend (BlendedDataset's rule, helpers.cpp build_blending_indices): sample g of a blended split comes from dataset
// d = argmax_d (w_d * max(g, 1) - c_d), first on ties, c_d being the samples drawn from d before g; it is that
// dataset's sample c_d. So the dataset of every sample index is Megatron's (to the last bit of the normalised
// weights), and after n samples each dataset has given w_d n of them to within one sample for two datasets, within two
// for more (the rule is greedy; the tests check both bounds). Megatron sizes each dataset to the run and fails when
// the blend asks one for more; here a dataset that runs out starts its next epoch.
//
// Order, where this engine differs from Megatron: Megatron shuffles the documents of each epoch and then the samples
// (numpy RandomState(seed)) and builds as many epochs as --train-iters needs. Here the documents stay in file order
// and a training split's sample i of dataset d is window perm_(d,e)[i mod N_d] of epoch e = i / N_d, perm a
// Fisher-Yates permutation driven by Philox(seed, data, layer 1 + d, token 2^32 + e); validation and test samples are
// unshuffled (window i mod N_d). The windows and the dataset of each sample index are Megatron's; which window a
// sample index gets is not. Any rank computes any sample, and a resumed run continues the same order.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ampipe/train/indexed_dataset.h"
#include "ampipe/train/text_data.h"
#include "ampipe/train/vocab_size.h"

namespace ampipe::train {

class Tokenizer;

// A --data-path value (or a per-split flag's): prefixes, and weights as given (empty: none given).
struct Blend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;
};
// Throws ConfigError naming `flag` when the values are empty, a weight is not > 0 or not finite, or weights and
// prefixes are mixed up (an even count where only some of the first, third, ... values are numbers).
Blend parse_blend(const std::vector<std::string>& values, const std::string& flag);
// Megatron's utils.normalize: w / sum(w), in double.
std::vector<double> normalize_weights(const std::vector<double>& w);

// Megatron's split of n elements: [begin, end) of the training, validation and test splits (empty where the weight
// is 0).
struct SplitRange {
  int64_t begin = 0, end = 0;
};
std::array<SplitRange, 3> split_ranges(const DataSplit& split, int64_t n);

// Megatron's blending rule over normalised weights: the dataset of sample g and the index of that sample in it.
// Sequential by nature: it keeps the counts every 2^16 samples and a cursor, so reading forward costs O(datasets) a
// sample and a jump back at most 2^16 steps.
class BlendIndex {
 public:
  explicit BlendIndex(std::vector<double> weights);
  struct Pick {
    int32_t dataset = 0;
    int64_t sample = 0;
  };
  Pick at(int64_t g) const;
  const std::vector<double>& weights() const { return w_; }

 private:
  static constexpr int64_t kStride = int64_t(1) << 16;
  int32_t choose(int64_t g) const;  // with counts_ the counts before g
  void step() const;

  std::vector<double> w_;
  mutable std::vector<std::vector<int64_t>> saved_;  // saved_[k]: the counts before sample k * kStride
  mutable std::vector<int64_t> counts_;              // the counts before sample pos_
  mutable int64_t pos_ = 0;
};

// The samples of one split: a blend of parts, each a token range of one dataset.
class BlendedSamples {
 public:
  struct Part {
    std::shared_ptr<const IndexedDataset> dataset;
    int64_t first_token = 0, tokens = 0;
    int64_t windows = 0;  // (tokens - 1) / s
  };
  // weights: normalised, one per part; every part has at least one window. shuffled: the training order (above).
  BlendedSamples(std::vector<Part> parts, std::vector<double> weights, int64_t seq_length, bool shuffled,
                 uint64_t seed);
  const std::vector<Part>& parts() const { return parts_; }
  const std::vector<double>& weights() const { return index_.weights(); }
  // Training: the windows of every part (one epoch each). Validation, test: the samples before a part repeats one.
  int64_t samples() const { return samples_; }
  void sample(int64_t j, std::span<int32_t> inputs, std::span<int32_t> targets) const;

 private:
  int64_t window(int32_t part, int64_t i) const;  // the window of the part's i-th sample

  std::vector<Part> parts_;
  BlendIndex index_;
  int64_t s_;
  bool shuffled_;
  uint64_t seed_;
  int64_t samples_ = 0;
  mutable std::vector<int64_t> perm_epoch_;          // per part: the epoch of perm_ (-1: none yet)
  mutable std::vector<std::vector<int64_t>> perm_;   // per part
  mutable std::vector<int32_t> buf_;
};

// What the data flags say (train::TrainConfig's data_path, train_data_path, ...).
struct MegatronDataArgs {
  std::vector<std::string> data_path, train_data_path, valid_data_path, test_data_path;
  DataSplit split;
  int64_t seq_length = 0;
  uint64_t seed = 0;
};

// Whether `value` (one --data-path value) names an indexed dataset rather than a file: no file of that name (a
// directory of that name does not count), and PREFIX.bin or PREFIX.idx exists.
bool is_indexed_prefix(const std::string& value);

// The three splits. train always; valid and test null where there is none (per-split flags not given, a --split
// weight of 0, or a test part too short for one window).
class MegatronData {
 public:
  // Opens every dataset and builds the splits. Throws ConfigError naming the flag and the dataset when a dataset is
  // bad (IndexedDataset), a training or validation part has no window of s + 1 tokens, or the flags are empty.
  explicit MegatronData(const MegatronDataArgs& args);
  const BlendedSamples& train() const { return *train_; }
  const BlendedSamples* valid() const { return valid_.get(); }
  const BlendedSamples* test() const { return test_.get(); }
  int64_t tokens() const { return tokens_; }           // of every dataset, once each
  int32_t max_token() const { return max_token_; }     // over every dataset
  const std::string& describe() const { return describe_; }  // for the start-up line
  std::string fingerprint() const;                     // what the ranks compare: datasets, tokens, XXH64s
  std::string split_description() const;               // "969,30,1 per dataset" or "per-split paths"
  // The first dataset with a token >= vocab, or null.
  const IndexedDataset* outside_vocab(int64_t vocab) const;

 private:
  std::vector<std::shared_ptr<const IndexedDataset>> datasets_;
  std::unique_ptr<BlendedSamples> train_, valid_, test_;
  int64_t tokens_ = 0;
  int32_t max_token_ = -1;
  std::string describe_, split_desc_;
};

// The data of a run: Megatron's (a per-split path, several --data-path values, or one naming an indexed dataset) or
// else the plain text / llm.c token file / bundled corpus of load_corpus, and the model's vocabulary for them
// (train/vocab_size.h: size_vocabulary sets cfg.padded_vocab_size) from the vocabulary the data need: the
// tokenizer's pieces (every id of the data must be below them, else a ConfigError naming the file and the
// tokenizer), or else the largest id + 1 (256 for byte-level text). `padded_origin`: size_vocabulary's.
struct TrainingData {
  std::shared_ptr<const TextData> data;
  VocabSizing vocab;
};
TrainingData load_training_data(TrainConfig& cfg, const Tokenizer* tokenizer, const std::string& padded_origin = "");

}  // namespace ampipe::train
