// Megatron's Llama2Tokenizer (train/tokenizer.h): a SentencePiece model whose tokenize puts <s> before every text;
// the end of document is </s>. Checked against the plain SentencePieceTokenizer of the same model, trained here.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/train/tokenizer.h"

using namespace ampipe;

TEST(Llama2Tokenizer, PutsBosBeforeEachTextOfTheSentencePieceIds) {
  if (!train::sentencepiece_available()) GTEST_SKIP() << "built without libsentencepiece";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "ampipe_llama2_tokenizer_test";
  std::filesystem::create_directories(dir);
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\nlorem ipsum dolor sit amet\n";
  const std::string prefix = (dir / "m").string();
  train::train_sentencepiece(text, prefix, 300);
  const auto plain = train::make_tokenizer("SentencePieceTokenizer", prefix + ".model", "", "");
  const auto llama2 = train::make_tokenizer("Llama2Tokenizer", prefix + ".model", "", "");
  ASSERT_NE(llama2, nullptr);
  EXPECT_EQ(llama2->vocab_size(), plain->vocab_size());
  EXPECT_EQ(llama2->eod(), plain->eod());
  for (const std::string s : {"the lazy fox", "", "dolor 42"}) {
    const std::vector<int32_t> a = plain->encode(s), b = llama2->encode(s);
    ASSERT_EQ(b.size(), a.size() + 1) << s;
    EXPECT_NE(b[0], llama2->eod());
    EXPECT_NE(b[0], a.empty() ? -2 : a[0]);  // <s> is not a piece of the text
    EXPECT_EQ(std::vector<int32_t>(b.begin() + 1, b.end()), a) << s;
    EXPECT_EQ(plain->decode(a), s);
  }
  EXPECT_NE(llama2->describe().find("Llama2Tokenizer"), std::string::npos);
  // a file given to a type that does not read it is refused, never ignored
  EXPECT_THROW(train::make_tokenizer("Llama2Tokenizer", prefix + ".model", "v.json", ""), ConfigError);
  std::filesystem::remove_all(dir);
}
