// Byte-level BPE tokenizers (train/tokenizer.h's interface):
//
// GPT2BPETokenizer (Megatron's --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt),
// exactly as OpenAI's GPT-2 encoder.py and Megatron's gpt2 tokenizer: the text is cut by the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// each piece's UTF-8 bytes become GPT-2's printable characters (bytes_to_unicode), and BPE merges adjacent symbols
// by the merges' order (the first line "#version ..." is skipped) until no pair has a rank; each symbol is a vocab
// id. The vocabulary size is the largest id + 1 (len(vocab) for GPT-2's files), `<|endoftext|>` is the eod. As in
// GPT-2, "<|endoftext|>" inside a text is not special: it is cut like any text (Megatron appends the eod id).
//
// HuggingFaceTokenizer (--tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json or its directory):
// a Hugging Face tokenizers file whose model is BPE over byte-level symbols, as GPT-2's, Llama-3's and Qwen2's are.
// Read: "added_tokens" (matched first in the raw text, leftmost-longest, with lstrip / rstrip / single_word),
// "normalizer" (null, NFC, NFD, NFKC, NFKD or a Sequence of them; libutf8proc), "pre_tokenizer" (ByteLevel with
// add_prefix_space and use_regex, Split with a Regex or String pattern and behavior Isolated or Removed, or a
// Sequence of them ending with ByteLevel), "model" (BPE: vocab, merges as "a b" or ["a", "b"], ignore_merges;
// dropout, continuing_subword_prefix, end_of_word_suffix and byte_fallback must be off), "post_processor" (null,
// ByteLevel, TemplateProcessing's "single" template, RobertaProcessing, BertProcessing, or a Sequence of them) and
// "decoder" (ByteLevel). Anything else (a WordPiece or Unigram model, a Metaspace pre-tokenizer, ...) is refused
// with a ConfigError naming the file and what it holds. encode(text) is tokenizers' encode(text).ids (with the
// post-processor's special tokens, as Megatron's tokenize); decode(ids) is its decode(ids,
// skip_special_tokens=False) without transformers' clean-up of spaces. vocab_size is the largest id of the
// vocabulary and the added tokens + 1 (len(tokenizer)); the eod is tokenizer_config.json's "eos_token" when that
// file lies beside tokenizer.json, else the first of <|endoftext|>, <|end_of_text|>, </s>, <eos> it has (-1: none).
// Added tokens are matched before normalization (tokenizers matches those with normalized=true after it: the same
// unless the normalizer changes them).
//
// Regular expressions (both tokenizers' patterns, Split's) run on PCRE2 (Debian's libpcre2-dev, 10.42: Unicode
// 14.0 properties, \p{L}, \p{N}, \s with PCRE2_UCP; the headers only in bpe_tokenizer.cpp), with the same
// leftmost-first alternation and backtracking as Python's regex module and tokenizers' Oniguruma. Text that is not
// valid UTF-8 is still encoded exactly: an invalid byte matches no pattern element, so it forms a piece of its own
// (its byte-level symbols); decode gives U+FFFD for bytes that do not form UTF-8 (Python's errors="replace").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ampipe/train/tokenizer.h"

namespace ampipe::train {

namespace bpe {
struct Pipeline;  // bpe_tokenizer.cpp: the tables and steps both tokenizers share

// GPT-2's bytes_to_unicode: the character (as UTF-8) that byte `b` is written as in a byte-level vocabulary.
const std::string& byte_char(uint8_t b);
// `bytes` as UTF-8 with each maximal invalid subpart replaced by U+FFFD (Python's errors="replace", Rust's
// from_utf8_lossy).
std::string utf8_lossy(std::string_view bytes);
}  // namespace bpe

// What both tokenizers are once their files are read: a bpe::Pipeline (the vocabulary, the merges and the steps) behind
// the Tokenizer interface. describe() gives "<type> (<files>: <n> ids, eod <id>)".
class ByteLevelBpeTokenizer : public Tokenizer {
 public:
  ~ByteLevelBpeTokenizer() override;
  int64_t vocab_size() const override;
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t eod() const override;
  std::string describe() const override;

 protected:
  ByteLevelBpeTokenizer();  // an empty pipeline, for the derived constructor to fill
  std::unique_ptr<bpe::Pipeline> p_;
};

class GPT2BPETokenizer : public ByteLevelBpeTokenizer {
 public:
  // Throws ConfigError naming --vocab-file or --merge-file and the path when a file is missing, unreadable or
  // malformed, a byte's character or a merge's token is not in the vocabulary, or there is no <|endoftext|>.
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file);
};

class HuggingFaceTokenizer : public ByteLevelBpeTokenizer {
 public:
  // `path`: a tokenizer.json, or a directory holding one. Throws ConfigError naming --tokenizer-model and the file
  // when it is missing, not JSON, or holds something this tokenizer does not read (see above).
  explicit HuggingFaceTokenizer(const std::string& path);
};

}  // namespace ampipe::train
