#include "ampipe/train/megatron_data.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "ampipe/core/checksum.h"
#include "ampipe/core/error.h"
#include "ampipe/core/philox.h"
#include "ampipe/train/megatron_args.h"
#include "ampipe/train/tokenizer.h"
#include "ampipe/train/train_config.h"

namespace ampipe::train {

namespace {

std::string strip(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n\r\f\v") - b + 1);
}

// Python's float(): the whole string (surrounding whitespace allowed) is one number.
bool parse_number(const std::string& text, double& v) {
  const std::string t = strip(text);
  if (t.empty() || t.find_first_of("xX") != std::string::npos) return false;
  char* end = nullptr;
  v = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

constexpr const char* kSplitNames[3] = {"training", "validation", "test"};

}  // namespace

Blend parse_blend(const std::vector<std::string>& values, const std::string& flag) {
  if (values.empty())
    throw ConfigError(fmt::format("{} is empty: give a dataset prefix, prefixes, or weights and prefixes (0.7 A 0.3 B)",
                                  flag));
  Blend b;
  std::vector<int> numbers;  // of the values 0, 2, 4, ...: which are numbers
  if (values.size() % 2 == 0)
    for (size_t i = 0; i < values.size(); i += 2) {
      double v = 0;
      if (parse_number(values[i], v)) {
        numbers.push_back(int(i));
        b.weights.push_back(v);
      }
    }
  if (!numbers.empty() && numbers.size() * 2 != values.size()) {
    size_t other = 0;  // the first of the values 0, 2, 4, ... that is not a number
    while (std::find(numbers.begin(), numbers.end(), int(other)) != numbers.end()) other += 2;
    throw ConfigError(fmt::format("{} {}: give weights and prefixes (0.7 A 0.3 B) or prefixes alone (A B): \"{}\" is "
                                  "a weight but \"{}\" in the same place of its pair is not",
                                  flag, join(values), values[size_t(numbers.front())], values[other]));
  }
  if (numbers.empty()) {
    b.weights.clear();
    for (const std::string& v : values) b.prefixes.push_back(strip(v));
  } else {
    for (size_t i = 1; i < values.size(); i += 2) b.prefixes.push_back(strip(values[i]));
  }
  for (size_t i = 0; i < b.weights.size(); ++i)
    if (!std::isfinite(b.weights[i]) || !(b.weights[i] > 0))
      throw ConfigError(fmt::format("{} {}: the weight {} of {} is invalid: weights must be finite and > 0 (as "
                                    "Megatron's BlendedDataset asserts)",
                                    flag, join(values), strip(values[2 * i]), b.prefixes[i]));
  for (const std::string& p : b.prefixes)
    if (p.empty()) throw ConfigError(fmt::format("{} {}: a dataset prefix is empty", flag, join(values)));
  return b;
}

std::vector<double> normalize_weights(const std::vector<double>& w) {
  double sum = 0;
  for (double x : w) sum += x;
  std::vector<double> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = w[i] / sum;
  return out;
}

std::array<SplitRange, 3> split_ranges(const DataSplit& split, int64_t n) {
  const std::vector<double> w = normalize_weights({split.train, split.valid, split.test});
  const double e[4] = {0, w[0], w[0] + w[1], w[0] + w[1] + w[2]};
  std::array<SplitRange, 3> out;
  for (int k = 0; k < 3; ++k) {
    if (!(e[k + 1] > e[k])) continue;  // weight 0: Megatron builds no such split
    // Python's round() of a float: to nearest, half to even (the default rounding mode of nearbyint).
    out[size_t(k)].begin = int64_t(std::nearbyint(e[k] * double(n)));
    out[size_t(k)].end = int64_t(std::nearbyint(e[k + 1] * double(n)));
  }
  return out;
}

BlendIndex::BlendIndex(std::vector<double> weights) : w_(std::move(weights)) {
  AMPIPE_CHECK(!w_.empty(), "a blend of no dataset");
  counts_.assign(w_.size(), 0);
  saved_.push_back(counts_);
}

int32_t BlendIndex::choose(int64_t g) const {
  // helpers.cpp build_blending_indices: the dataset whose share lags its weight most, the first on ties.
  const double x = std::max(double(g), 1.0);
  int32_t best = 0;
  double best_error = w_[0] * x - double(counts_[0]);
  for (size_t d = 1; d < w_.size(); ++d) {
    const double error = w_[d] * x - double(counts_[d]);
    if (error > best_error) {
      best_error = error;
      best = int32_t(d);
    }
  }
  return best;
}

void BlendIndex::step() const {
  ++counts_[size_t(choose(pos_))];
  ++pos_;
  if (pos_ % kStride == 0 && int64_t(saved_.size()) == pos_ / kStride) saved_.push_back(counts_);
}

BlendIndex::Pick BlendIndex::at(int64_t g) const {
  AMPIPE_CHECK(g >= 0, "blend sample {}", g);
  if (w_.size() == 1) return {0, g};
  // From the cursor when it is at or before g and no saved counts are nearer, else from the nearest saved counts.
  const int64_t from = std::min<int64_t>(g / kStride, int64_t(saved_.size()) - 1);
  if (pos_ > g || pos_ < from * kStride) {
    pos_ = from * kStride;
    counts_ = saved_[size_t(from)];
  }
  while (pos_ < g) step();
  const int32_t d = choose(g);
  return {d, counts_[size_t(d)]};
}

BlendedSamples::BlendedSamples(std::vector<Part> parts, std::vector<double> weights, int64_t seq_length,
                               bool shuffled, uint64_t seed)
    : parts_(std::move(parts)), index_(std::move(weights)), s_(seq_length), shuffled_(shuffled), seed_(seed) {
  AMPIPE_CHECK(parts_.size() == index_.weights().size(), "{} parts, {} weights", parts_.size(),
               index_.weights().size());
  for (const Part& p : parts_) AMPIPE_CHECK(p.windows >= 1, "a part without a window");
  perm_epoch_.assign(parts_.size(), -1);
  perm_.resize(parts_.size());
  buf_.resize(size_t(s_ + 1));
  if (shuffled_) {
    for (const Part& p : parts_) samples_ += p.windows;
  } else {  // the samples before the blend asks a part for one more than it has
    int64_t bound = 0;
    for (const Part& p : parts_) bound += p.windows;
    while (samples_ <= bound) {
      const BlendIndex::Pick pick = index_.at(samples_);
      if (pick.sample >= parts_[size_t(pick.dataset)].windows) break;
      ++samples_;
    }
  }
}

int64_t BlendedSamples::window(int32_t part, int64_t i) const {
  const int64_t n = parts_[size_t(part)].windows;
  if (!shuffled_) return i % n;
  const int64_t epoch = i / n;
  std::vector<int64_t>& perm = perm_[size_t(part)];
  if (perm_epoch_[size_t(part)] != epoch) {
    perm.resize(size_t(n));
    for (int64_t w = 0; w < n; ++w) perm[size_t(w)] = w;
    const core::PhiloxKey key{seed_, uint32_t(1 + part), core::RngPurpose::data};
    for (int64_t w = n - 1; w > 0; --w) {
      const uint64_t r = core::philox_u32(key, (uint64_t(1) << 32) + uint64_t(epoch), uint64_t(w));
      std::swap(perm[size_t(w)], perm[size_t(r % uint64_t(w + 1))]);
    }
    perm_epoch_[size_t(part)] = epoch;
  }
  return perm[size_t(i % n)];
}

void BlendedSamples::sample(int64_t j, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  const BlendIndex::Pick pick = index_.at(j);
  const Part& p = parts_[size_t(pick.dataset)];
  p.dataset->read(p.first_token + window(pick.dataset, pick.sample) * s_, buf_);
  std::copy(buf_.begin(), buf_.end() - 1, inputs.begin());
  std::copy(buf_.begin() + 1, buf_.end(), targets.begin());
}

bool is_indexed_prefix(const std::string& value) {
  std::error_code ec;
  if (std::filesystem::exists(value, ec) && !std::filesystem::is_directory(value, ec)) return false;  // a file
  return std::filesystem::exists(value + ".bin", ec) || std::filesystem::exists(value + ".idx", ec);
}

namespace {

// The datasets of a blend, each opened once however often the flags name it.
struct Opener {
  std::map<std::string, std::shared_ptr<const IndexedDataset>> open;
  std::vector<std::shared_ptr<const IndexedDataset>> order;
  std::shared_ptr<const IndexedDataset> get(const std::string& prefix, const std::string& flag, bool blend) {
    auto it = open.find(prefix);
    if (it != open.end()) return it->second;
    std::error_code ec;
    if (std::filesystem::is_regular_file(prefix, ec))
      throw ConfigError(fmt::format("{} {}: is a file, not the prefix of a Megatron indexed dataset (PREFIX.bin and "
                                    "PREFIX.idx): {}",
                                    flag, prefix,
                                    blend ? "plain text and llm.c token files are read alone, a blend's datasets "
                                            "must be indexed datasets"
                                          : "--train-data-path, --valid-data-path and --test-data-path take indexed "
                                            "datasets only"));
    auto ds = std::make_shared<const IndexedDataset>(prefix, flag);
    open[prefix] = ds;
    order.push_back(ds);
    return ds;
  }
};

// One split of a blend: a part per dataset (the sequences of `ranges[d]`) and the weights; null when `k` is the test
// split and a part holds no window.
std::unique_ptr<BlendedSamples> make_split(const std::vector<std::shared_ptr<const IndexedDataset>>& ds,
                                           const std::vector<SplitRange>& ranges, const Blend& blend, int k,
                                           const MegatronDataArgs& args, const std::string& flag) {
  const int64_t s = args.seq_length;
  std::vector<BlendedSamples::Part> parts;
  std::vector<double> sizes;
  for (size_t d = 0; d < ds.size(); ++d) {
    BlendedSamples::Part p;
    p.dataset = ds[d];
    p.first_token = ds[d]->sequence_start(ranges[d].begin);
    p.tokens = ds[d]->sequence_start(ranges[d].end) - p.first_token;
    p.windows = p.tokens > s ? (p.tokens - 1) / s : 0;
    if (p.windows < 1) {
      if (k == 2) return nullptr;  // no test samples (the run says so when --split asks for some)
      throw ConfigError(fmt::format("{} {}: its {} split (sequences [{}, {}) of {}, {} tokens) holds no window of "
                                    "--seq-length {} + 1 tokens: give that split more of the data{} or a shorter "
                                    "--seq-length",
                                    flag, ds[d]->prefix(), kSplitNames[k], ranges[d].begin, ranges[d].end,
                                    ds[d]->sequences(), p.tokens, s, flag == "--data-path" ? " (--split)" : ""));
    }
    sizes.push_back(double(p.windows));
    parts.push_back(p);
  }
  // Megatron normalises given weights twice (the builder, then BlendedDataset) and the sizes of an unweighted blend
  // once (BlendedDataset).
  std::vector<double> w = blend.weights.empty() ? normalize_weights(sizes)
                                                : normalize_weights(normalize_weights(blend.weights));
  return std::make_unique<BlendedSamples>(std::move(parts), std::move(w), s, k == 0, args.seed);
}

std::string describe_blend(const Blend& b, const std::vector<std::shared_ptr<const IndexedDataset>>& ds) {
  if (ds.size() == 1)
    return fmt::format("Megatron indexed dataset {} ({}, {} documents)", ds[0]->prefix(),
                       token_dtype_name(ds[0]->dtype()), ds[0]->documents());
  std::string s = fmt::format("blend of {} Megatron indexed datasets{}:", ds.size(),
                              b.weights.empty() ? " weighted by their sizes" : "");
  const std::vector<double> w = b.weights.empty() ? std::vector<double>() : normalize_weights(b.weights);
  for (size_t d = 0; d < ds.size(); ++d)
    s += fmt::format("{} {}{} ({})", d > 0 ? "," : "", w.empty() ? "" : fmt::format("{:.4g} ", w[d]),
                     ds[d]->prefix(), ds[d]->describe());
  return s;
}

}  // namespace

MegatronData::MegatronData(const MegatronDataArgs& args) {
  Opener opener;
  const std::vector<std::string>* per_split[3] = {&args.train_data_path, &args.valid_data_path,
                                                  &args.test_data_path};
  const char* per_split_flag[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  std::unique_ptr<BlendedSamples>* out[3] = {&train_, &valid_, &test_};
  if (!args.data_path.empty()) {
    const Blend blend = parse_blend(args.data_path, "--data-path");
    std::vector<std::shared_ptr<const IndexedDataset>> ds;
    for (const std::string& p : blend.prefixes) ds.push_back(opener.get(p, "--data-path", blend.prefixes.size() > 1));
    const double w[3] = {args.split.train, args.split.valid, args.split.test};
    for (int k = 0; k < 3; ++k) {
      if (!(w[k] > 0)) continue;
      std::vector<SplitRange> ranges;
      for (const auto& d : ds) ranges.push_back(split_ranges(args.split, d->sequences())[size_t(k)]);
      *out[k] = make_split(ds, ranges, blend, k, args, "--data-path");
    }
    describe_ = describe_blend(blend, ds);
    split_desc_ = fmt::format("{} per dataset, over its documents", split_str(args.split));
  } else {
    if (args.train_data_path.empty())
      throw ConfigError(fmt::format("{} is given without --train-data-path: the per-split data paths need the "
                                    "training data too (or give --data-path with --split)",
                                    !args.valid_data_path.empty() ? "--valid-data-path" : "--test-data-path"));
    for (int k = 0; k < 3; ++k) {
      if (per_split[k]->empty()) continue;
      const Blend blend = parse_blend(*per_split[k], per_split_flag[k]);
      std::vector<std::shared_ptr<const IndexedDataset>> ds;
      std::vector<SplitRange> ranges;
      for (const std::string& p : blend.prefixes) {
        ds.push_back(opener.get(p, per_split_flag[k], false));
        ranges.push_back({0, ds.back()->sequences()});
      }
      *out[k] = make_split(ds, ranges, blend, k, args, per_split_flag[k]);
      describe_ += fmt::format("{}{}: {}", describe_.empty() ? "" : " | ", kSplitNames[k], describe_blend(blend, ds));
    }
    split_desc_ = "from --train-data-path, --valid-data-path, --test-data-path";
  }
  datasets_ = opener.order;
  for (const auto& d : datasets_) {
    tokens_ += d->tokens();
    max_token_ = std::max(max_token_, d->max_token());
  }
}

std::string MegatronData::fingerprint() const {
  std::vector<uint64_t> sums;
  for (const auto& d : datasets_) sums.push_back(d->checksum());
  return fmt::format("{} indexed datasets, {} tokens, {}", datasets_.size(), tokens_,
                     core::checksum_string(core::xxh64(sums.data(), sums.size() * sizeof(uint64_t))));
}

std::string MegatronData::split_description() const { return split_desc_; }

const IndexedDataset* MegatronData::outside_vocab(int64_t vocab) const {
  for (const auto& d : datasets_)
    if (d->max_token() >= vocab) return d.get();
  return nullptr;
}

TrainingData load_training_data(TrainConfig& cfg, const Tokenizer* tokenizer, const std::string& padded_origin) {
  DataVocab need;  // what the ids of the data need, for size_vocabulary
  if (tokenizer != nullptr) {
    need.ids = tokenizer->vocab_size();
    need.source = "the tokenizer is " + tokenizer->describe();
    need.tokenizer = true;
    need.tokenizer_type = cfg.tokenizer_type;
  }
  TrainingData out;
  const bool per_split = !cfg.train_data_path.empty() || !cfg.valid_data_path.empty() || !cfg.test_data_path.empty();
  const bool megatron =
      per_split || cfg.data_path.size() > 1 || (cfg.data_path.size() == 1 && is_indexed_prefix(cfg.data_path[0]));
  if (!megatron) {
    const std::string path = cfg.data_path.empty() ? std::string() : cfg.data_path.front();
    const Corpus corpus = load_corpus(path, tokenizer);
    const std::string source = path.empty() ? std::string(kBundledCorpusDir) : path;
    if (tokenizer == nullptr) {
      need.ids = corpus.vocab_size;
      need.source = corpus.format.rfind("llm.c tokens", 0) == 0
                        ? fmt::format("--data-path {} holds token id {}", path, corpus.vocab_size - 1)
                        : fmt::format("{} is byte-level text", path.empty() ? "the bundled corpus" : path);
    }
    out.vocab = size_vocabulary(cfg, need, padded_origin);
    out.data = std::make_shared<const TextData>(corpus, cfg.layer.seq_length, data_split(cfg), cfg.layer.seed,
                                                source + ", " + corpus.format);
    return out;
  }
  MegatronDataArgs a;
  a.data_path = cfg.data_path;
  a.train_data_path = cfg.train_data_path;
  a.valid_data_path = cfg.valid_data_path;
  a.test_data_path = cfg.test_data_path;
  a.split = data_split(cfg);
  a.seq_length = cfg.layer.seq_length;
  a.seed = cfg.layer.seed;
  auto data = std::make_shared<const MegatronData>(a);
  if (tokenizer != nullptr) {
    if (const IndexedDataset* d = data->outside_vocab(need.ids))
      throw ConfigError(fmt::format("{} {}: its largest token id {} is outside the vocabulary of {} (ids must be < "
                                    "{}): the data were tokenized with another tokenizer",
                                    d->flag(), d->prefix(), d->max_token(), tokenizer->describe(), need.ids));
  } else {
    need.ids = std::max<int64_t>(1, int64_t(data->max_token()) + 1);
    const IndexedDataset* d = data->outside_vocab(data->max_token());  // the first dataset holding the largest id
    need.source = d != nullptr ? fmt::format("{} {} holds token id {}", d->flag(), d->prefix(), d->max_token())
                               : std::string("the datasets hold no token");
  }
  out.vocab = size_vocabulary(cfg, need, padded_origin);
  std::string source = data->describe();
  if (tokenizer != nullptr) source += ", " + tokenizer->describe();
  out.data = std::make_shared<const TextData>(data, source);
  return out;
}

}  // namespace ampipe::train
