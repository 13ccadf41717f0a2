#include "ampipe/cli/preprocess.h"

#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ampipe/cli/flag_registry.h"
#include "ampipe/comm/runtime.h"
#include "ampipe/core/error.h"
#include "ampipe/train/indexed_dataset.h"
#include "ampipe/train/preprocess_data.h"
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

namespace {

bool given(const PreprocessArgs& args, const char* flag) {
  const CLI::Option* o = args.app ? args.app->get_option_no_throw(flag) : nullptr;
  return o != nullptr && o->count() > 0;
}

// preprocess_data.py's flags: any of them given selects the JSON-lines interface.
constexpr const char* kJsonFlags[] = {"--json-keys",   "--tokenizer-type", "--append-eod",   "--workers",
                                      "--log-interval", "--split-sentences", "--keep-newlines", "--lang",
                                      "--partitions",  "--keep-sequential-samples", "--vocab-file", "--merge-file"};

// The files this run writes must not be the ones it reads: `--input x.bin --output-prefix x` used to overwrite its
// own input. Compared as files (links and other spellings of one path included), before anything is written.
void refuse_overwriting_inputs(const PreprocessArgs& args, const std::vector<std::string>& outputs) {
  const std::pair<const char*, const std::string*> inputs[] = {{"--input", &args.input},
                                                               {"--tokenizer-model", &args.tokenizer_model},
                                                               {"--vocab-file", &args.vocab_file},
                                                               {"--merge-file", &args.merge_file}};
  for (const std::string& out : outputs)
    for (const auto& [flag, in] : inputs) {
      std::error_code ec;
      if (in->empty() || !std::filesystem::exists(out, ec)) continue;
      if (std::filesystem::equivalent(out, *in, ec))
        throw ConfigError(fmt::format("--output-prefix {}: this run would write {}, which is its {} {}: refusing to "
                                      "overwrite an input; choose another --output-prefix",
                                      args.output_prefix, out, flag, *in));
    }
}

bool json_lines_input(const PreprocessArgs& args) {
  const std::string ext = std::filesystem::path(args.input).extension().string();
  if (ext == ".json" || ext == ".jsonl") return true;
  return std::any_of(std::begin(kJsonFlags), std::end(kJsonFlags), [&](const char* f) { return given(args, f); });
}

// Megatron's tools/preprocess_data.py (train/preprocess_data.h).
int run_preprocess_json(PreprocessArgs& args) {
  for (const char* f : {"--vocab-size", "--check-roundtrip"})
    if (given(args, f))
      throw ConfigError(fmt::format("{} is for a plain-text --input; {} is JSON lines (Megatron's preprocess_data.py "
                                    "interface: give --tokenizer-type and its files, or no tokenizer for bytes)",
                                    f, args.input));
  if (args.split_sentences)
    throw ConfigError("--split-sentences is not supported: Megatron splits sentences with NLTK's punkt models, which "
                      "this engine does not have; leave it out (one sequence per document, what GPT training reads)");
  if (args.partitions != 1)
    throw ConfigError(fmt::format("--partitions {} is not supported: this engine reads one --input file in one "
                                  "partition (give 1, the default)",
                                  args.partitions));
  if (args.workers < 1) throw ConfigError(fmt::format("--workers {} is invalid: it must be >= 1", args.workers));
  if (args.log_interval < 1)
    throw ConfigError(fmt::format("--log-interval {} is invalid: it must be >= 1", args.log_interval));
  for (const std::string& k : args.json_keys)
    if (k.empty()) throw ConfigError("--json-keys: a key is empty");
  // Megatron's tokenizer flags (make_tokenizer refuses a type's missing files and the files it does not use); none:
  // the UTF-8 bytes.
  std::unique_ptr<train::Tokenizer> tok =
      train::make_tokenizer(args.tokenizer_type, args.tokenizer_model, args.vocab_file, args.merge_file);
  if (!tok) tok = std::make_unique<train::ByteLevelTokenizer>();
  for (const auto& [flag, on] : {std::pair{"--keep-newlines", args.keep_newlines},
                                 {"--lang", given(args, "--lang")},
                                 {"--keep-sequential-samples", args.keep_sequential_samples}})
    if (on) fmt::print("preprocess: note: {} has no effect here (no sentence splitting, one partition)\n", flag);
  fmt::print("preprocess: {} -> {}_{{{}}}_document.bin/.idx, tokenizer {}, {} worker{}{}\n", args.input,
             args.output_prefix, fmt::join(args.json_keys, ","), tok->describe(), args.workers,
             args.workers == 1 ? "" : "s", args.append_eod ? ", --append-eod" : "");
  std::fflush(stdout);
  std::vector<std::string> outputs;
  for (const std::string& key : args.json_keys)
    for (const char* ext : {".bin", ".idx"})
      outputs.push_back(fmt::format("{}_{}_document{}", args.output_prefix, key, ext));
  refuse_overwriting_inputs(args, outputs);
  train::PreprocessJsonOptions o;
  o.input = args.input;
  o.output_prefix = args.output_prefix;
  o.json_keys = args.json_keys;
  o.append_eod = args.append_eod;
  o.workers = args.workers;
  o.log_interval = args.log_interval;
  const train::PreprocessJsonResult r = train::preprocess_json(o, *tok, [](const std::string& line) {
    fmt::print("preprocess: {}\n", line);
    std::fflush(stdout);
  });
  const train::TokenDType dtype = train::optimal_token_dtype(tok->vocab_size());
  const std::string blank =
      r.blank_lines > 0 ? fmt::format(", {} blank line{} skipped", r.blank_lines, r.blank_lines == 1 ? "" : "s") : "";
  // What train takes with the data (it reads SentencePiece models; other tokenizers' ids train as they are).
  const std::string with = args.tokenizer_type == "SentencePieceTokenizer"
                               ? fmt::format(" --tokenizer-type SentencePieceTokenizer --tokenizer-model {}",
                                             args.tokenizer_model)
                               : "";
  for (const auto& out : r.outputs)
    fmt::print("preprocess: wrote {}.bin and {}.idx: {} documents, {} tokens ({}){}; train with{} --data-path {}\n",
               out.prefix, out.prefix, out.documents, out.tokens, train::token_dtype_name(dtype), blank, with,
               out.prefix);
  fmt::print("preprocess: {} lines, {} bytes in {:.1f} s\n", r.lines, r.bytes, r.seconds);
  return 0;
}

}  // namespace

int run_preprocess(PreprocessArgs& args) {
  const comm::Runtime& rt = comm::Runtime::current();
  if (rt.size() > 1)  // every rank would write the same files
    throw ConfigError(fmt::format("ampipe preprocess runs as one process, not {} ranks: run it without mpirun",
                                  rt.size()));
  if (json_lines_input(args)) return run_preprocess_json(args);
  const bool vocab_given = given(args, "--vocab-size");
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
  refuse_overwriting_inputs(args, {args.output_prefix + ".bin", args.output_prefix + ".model",
                                   args.output_prefix + ".vocab"});
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
