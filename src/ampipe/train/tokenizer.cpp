#include "ampipe/train/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <unordered_map>

#include "ampipe/core/error.h"
#include "ampipe/train/bpe_tokenizer.h"

#if AMPIPE_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

namespace ampipe::train {

namespace {
[[maybe_unused]] constexpr const char* kNoLibrary =
    "this ampipe was built without libsentencepiece (install libsentencepiece-dev, e.g. with scripts/setup.sh, and "
    "rebuild)";
}  // namespace

#if AMPIPE_HAVE_SENTENCEPIECE

bool sentencepiece_available() { return true; }

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path, const std::string& flag, bool add_bos)
    : impl_(std::make_unique<Impl>()), path_(model_path), add_bos_(add_bos) {
  std::error_code ec;
  if (!std::filesystem::exists(model_path, ec))
    throw ConfigError(fmt::format("{} {}: the file does not exist", flag, model_path));
  if (!std::filesystem::is_regular_file(model_path, ec))
    throw ConfigError(fmt::format("{} {}: is not a regular file, expected a SentencePiece model", flag, model_path));
  const auto status = impl_->sp.Load(model_path);
  if (!status.ok() || impl_->sp.GetPieceSize() < 1)
    throw ConfigError(fmt::format("{} {}: is not a SentencePiece model (a .model file written by its trainer or "
                                  "by ampipe preprocess)",
                                  flag, model_path));
  if (add_bos_ && impl_->sp.bos_id() < 0)
    throw ConfigError(fmt::format("{} {}: Llama2Tokenizer puts <s> before each text, and this SentencePiece model has "
                                  "no <s> piece",
                                  flag, model_path));
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok())
    throw ConfigError(fmt::format("--tokenizer-model {}: cannot encode the text: {}", path_, status.ToString()));
  std::vector<int32_t> out;
  out.reserve(ids.size() + 1);
  if (add_bos_) out.push_back(int32_t(impl_->sp.bos_id()));
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

int32_t SentencePieceTokenizer::eod() const { return int32_t(impl_->sp.eos_id()); }

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  const auto status = impl_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  if (!status.ok())
    throw ConfigError(fmt::format("--tokenizer-model {}: cannot decode: {}", path_, status.ToString()));
  return out;
}

namespace {
// The text's lines, the sentences SentencePiece trains on.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::string& text) : text_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    if (pos_ >= text_.size()) {
      done_ = true;
      return;
    }
    size_t end = text_.find('\n', pos_);
    if (end == std::string::npos) end = text_.size();
    line_.assign(text_, pos_, end - pos_);
    pos_ = end + 1;
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::string& text_;
  size_t pos_ = 0;
  std::string line_;
  bool done_ = false;
};
}  // namespace

void train_sentencepiece(const std::string& text, const std::string& prefix, int64_t vocab_size) {
  const std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
  std::error_code ec;
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
    throw ConfigError(fmt::format("--output-prefix {}: the directory {} does not exist", prefix, dir.string()));
  const std::unordered_map<std::string, std::string> args = {
      {"model_prefix", prefix},
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", "unigram"},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},  // exact round trip: no NFKC, whitespace as it is
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"max_sentence_length", "65536"},
      {"num_threads", std::to_string(std::clamp(int(std::thread::hardware_concurrency()), 1, 4))},
      {"minloglevel", "2"},  // the trainer's progress log (hundreds of lines) off; errors come back as a status
  };
  LineIterator lines(text);
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines);
  if (!status.ok()) {
    std::string msg = status.ToString();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    if (status.code() == sentencepiece::util::StatusCode::kPermissionDenied ||
        status.code() == sentencepiece::util::StatusCode::kNotFound)
      throw ConfigError(fmt::format("--output-prefix {}: cannot write the model: {}", prefix, msg));
    throw ConfigError(fmt::format("--vocab-size {}: SentencePiece cannot train a model of this size on this text: {}",
                                  vocab_size, msg));
  }
}

#else  // !AMPIPE_HAVE_SENTENCEPIECE

bool sentencepiece_available() { return false; }
struct SentencePieceTokenizer::Impl {};
SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path, const std::string& flag, bool)
    : path_(model_path) {
  throw ConfigError(fmt::format("{} {}: {}", flag, model_path, kNoLibrary));
}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;
int64_t SentencePieceTokenizer::vocab_size() const { return 0; }
std::vector<int32_t> SentencePieceTokenizer::encode(const std::string&) const { throw ConfigError(kNoLibrary); }
int32_t SentencePieceTokenizer::eod() const { return -1; }
std::string SentencePieceTokenizer::decode(const std::vector<int32_t>&) const { throw ConfigError(kNoLibrary); }
void train_sentencepiece(const std::string&, const std::string& prefix, int64_t) {
  throw ConfigError(fmt::format("--output-prefix {}: {}", prefix, kNoLibrary));
}

#endif

std::string SentencePieceTokenizer::describe() const {
  return fmt::format("{} ({}: {} ids)", add_bos_ ? "Llama2Tokenizer" : "SentencePieceTokenizer", path_, vocab_size());
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model,
                                          const std::string& vocab_file, const std::string& merge_file) {
  const bool llama2 = type == "Llama2Tokenizer";
  const bool spm = type == "SentencePieceTokenizer" || llama2, gpt2 = type == "GPT2BPETokenizer",
             hf = type == "HuggingFaceTokenizer";
  if (!type.empty() && !spm && !gpt2 && !hf)
    throw ConfigError(fmt::format("--tokenizer-type {}: not a tokenizer this engine has; it has "
                                  "SentencePieceTokenizer, Llama2Tokenizer, GPT2BPETokenizer and HuggingFaceTokenizer "
                                  "(without the "
                                  "flag: bytes of plain text, ids of a token file)",
                                  type));
  const std::string shown = type.empty() ? std::string("without --tokenizer-type") : "by --tokenizer-type " + type;
  auto refuse_unused = [&](const char* flag, const std::string& value, const char* users) {
    if (!value.empty())
      throw ConfigError(fmt::format("{} {}: not used {} ({} is for {})", flag, value, shown, flag,
                                    users));
  };
  auto need = [&](const char* flag, const std::string& value, const char* what) {
    if (value.empty()) throw ConfigError(fmt::format("--tokenizer-type {} needs {} FILE ({})", type, flag, what));
  };
  if (!spm && !hf)
    refuse_unused("--tokenizer-model", model,
                  "--tokenizer-type SentencePieceTokenizer, Llama2Tokenizer or HuggingFaceTokenizer");
  if (!gpt2) {
    refuse_unused("--vocab-file", vocab_file, "--tokenizer-type GPT2BPETokenizer");
    refuse_unused("--merge-file", merge_file, "--tokenizer-type GPT2BPETokenizer");
  }
  if (spm) {
    need("--tokenizer-model", model, "a SentencePiece model");
    return std::make_unique<SentencePieceTokenizer>(model, "--tokenizer-model", llama2);
  }
  if (gpt2) {
    need("--vocab-file", vocab_file, "GPT-2's vocab.json");
    need("--merge-file", merge_file, "GPT-2's merges.txt");
    return std::make_unique<GPT2BPETokenizer>(vocab_file, merge_file);
  }
  if (hf) {
    need("--tokenizer-model", model, "a tokenizer.json, or a directory holding one");
    return std::make_unique<HuggingFaceTokenizer>(model);
  }
  return nullptr;
}

}  // namespace ampipe::train
