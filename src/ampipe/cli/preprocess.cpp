#include "ampipe/cli/preprocess.h"

#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <vector>

#include "ampipe/cli/flag_registry.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/train/text_data.h"
#include "ampipe/train/tokenizer.h"

namespace ampipe::cli {

namespace {
constexpr int64_t kMinVocab = PreprocessArgs::kMinVocab;
}  // namespace

void PreprocessArgs::add_to(CLI::App& a) {
  app = &a;
  FlagTargets t;
  t.preprocess = this;
  add_flags(a, kPreprocess, t);
}

int run_preprocess(PreprocessArgs& args) {
  const comm::Runtime& rt = comm::Runtime::current();
  if (rt.size() > 1)  // every rank would write the same files
    throw ConfigError(fmt::format("ampipe preprocess runs as one process, not {} ranks: run it without mpirun",
                                  rt.size()));
  const CLI::Option* vs = args.app ? args.app->get_option_no_throw("--vocab-size") : nullptr;
  const bool vocab_given = vs != nullptr && vs->count() > 0;
  if (!args.tokenizer_model.empty() && vocab_given)
    throw ConfigError(fmt::format("--vocab-size {} cannot be used with --tokenizer-model {}: the model fixes the "
                                  "vocabulary; give one of them",
                                  args.vocab_size, args.tokenizer_model));
  if (args.tokenizer_model.empty() && (args.vocab_size < kMinVocab || args.vocab_size > train::kTokenFileMaxVocab))
    throw ConfigError(fmt::format("--vocab-size {} is out of range: it must be in [{}, {}] (256 byte pieces, 3 "
                                  "special pieces and at least one more; ids are stored as uint16)",
                                  args.vocab_size, kMinVocab, train::kTokenFileMaxVocab));
  if (!train::sentencepiece_available())
    throw ConfigError("ampipe preprocess: this ampipe was built without libsentencepiece (install "
                      "libsentencepiece-dev, e.g. with scripts/setup.sh, and rebuild)");
  const std::string text = train::read_text_file(args.input, "--input");
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto secs = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  std::string model = args.tokenizer_model;
  if (model.empty()) {
    model = args.output_prefix + ".model";
    fmt::print("preprocess: training a SentencePiece unigram model of {} pieces on {} ({} bytes)\n", args.vocab_size,
               args.input, text.size());
    std::fflush(stdout);
    train::train_sentencepiece(text, args.output_prefix, args.vocab_size);
    fmt::print("preprocess: wrote {} and {}.vocab ({:.1f} s)\n", model, args.output_prefix, secs());
  }
  const train::SentencePieceTokenizer tok(model, "--tokenizer-model");
  if (tok.vocab_size() > train::kTokenFileMaxVocab)
    throw ConfigError(fmt::format("--tokenizer-model {}: {} pieces do not fit the token file's uint16 ids (at most "
                                  "{})",
                                  model, tok.vocab_size(), train::kTokenFileMaxVocab));

  fmt::print("preprocess: tokenizing {} ({} bytes) with {} ({} pieces)\n", args.input, text.size(), model,
             tok.vocab_size());
  std::fflush(stdout);
  const std::vector<int32_t> ids = tok.encode(text);
  const std::string bin = args.output_prefix + ".bin";
  train::write_token_file(bin, ids, "--output-prefix");
  fmt::print("preprocess: wrote {}: {} tokens of a {}-piece vocabulary, {:.2f} bytes per token ({:.1f} s); train "
             "with --tokenizer-type SentencePieceTokenizer --tokenizer-model {} --data-path {}\n",
             bin, ids.size(), tok.vocab_size(), double(text.size()) / double(std::max<size_t>(ids.size(), 1)), secs(),
             model, bin);
  if (args.check_roundtrip) {
    const std::string back = tok.decode(ids);
    if (back != text) {
      size_t i = 0;
      while (i < back.size() && i < text.size() && back[i] == text[i]) ++i;
      std::fprintf(stderr, "ampipe: error: round trip of %s is not exact: the decoded text (%zu bytes) differs from "
                   "the input (%zu bytes) at byte %zu\n", args.input.c_str(), back.size(), text.size(), i);
      return 1;
    }
    fmt::print("preprocess: round trip exact: {} bytes -> {} ids -> the same {} bytes\n", text.size(), ids.size(),
               back.size());
  }
  return 0;
}

}  // namespace ampipe::cli
