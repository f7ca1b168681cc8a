// Tokenizer on small hand-made vocabs: the SPM and BPE algorithms, special tokens, BOS/EOS,
// decoding, streaming and invalid vocabs. The llama.cpp vectors are in vocab_files_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/error.h"
#include "tandem/model/tokenizer.h"
#include "tokenizer_impl.h"

namespace tandem {
namespace {

using Ids = std::vector<int32_t>;

std::string byte_token(unsigned b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

// <unk> <s> </s>, 256 byte tokens (ids 3..258), then pieces whose scores make "hello" merge
// as he -> ll -> llo -> ▁he -> ▁hello (each step the best-scoring pair).
Vocab spm_vocab() {
  Vocab v;
  v.kind = VocabKind::Spm;
  auto add = [&](std::string text, float score, TokenType type) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, TokenType::Unknown);
  add("<s>", 0, TokenType::Control);
  add("</s>", 0, TokenType::Control);
  for (unsigned b = 0; b < 256; ++b) add(byte_token(b), 0, TokenType::Byte);
  add("\xE2\x96\x81", -1, TokenType::Normal);  // 259 ▁
  for (const char* c : {"h", "e", "l", "o", "w", "r", "d"})
    add(c, -2, TokenType::Normal);                  // 260..266
  add("ll", -3, TokenType::Normal);                 // 267
  add("\xE2\x96\x81h", -4, TokenType::Normal);      // 268 ▁h
  add("he", -1.5f, TokenType::Normal);              // 269
  add("\xE2\x96\x81he", -5, TokenType::Normal);     // 270 ▁he
  add("llo", -3.5f, TokenType::Normal);             // 271
  add("\xE2\x96\x81hello", -6, TokenType::Normal);  // 272 ▁hello
  add("<tool>", 0, TokenType::UserDefined);         // 273
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  v.add_bos = true;
  return v;
}

constexpr int32_t kSpmByte0 = 3;

TEST(SpmTokenizer, MergesHighestScoringPairsFirst) {
  const Tokenizer t(spm_vocab());
  EXPECT_EQ(t.encode("hello", EncodeOptions{}), (Ids{272}));
  // "▁h" (-4) loses to "he" (-1.5), so "▁he" is built from ▁ + he, not ▁h + e.
  EXPECT_EQ(t.encode("he", EncodeOptions{}), (Ids{270}));
  EXPECT_EQ(t.encode("hell", EncodeOptions{}), (Ids{270, 267}));
  EXPECT_EQ(t.encode("", EncodeOptions{}), Ids{});
}

TEST(SpmTokenizer, UnknownCharactersFallBackToBytes) {
  const Tokenizer t(spm_vocab());
  EXPECT_EQ(t.encode("h\xC3\xA9", EncodeOptions{}), (Ids{268, kSpmByte0 + 0xC3, kSpmByte0 + 0xA9}));
  EXPECT_EQ(t.encode("\n", EncodeOptions{}), (Ids{259, kSpmByte0 + 0x0A}));
  EXPECT_EQ(t.decode(Ids{268, kSpmByte0 + 0xC3, kSpmByte0 + 0xA9}), "h\xC3\xA9");
}

TEST(SpmTokenizer, BosEosAndSpecialTokens) {
  const Tokenizer t(spm_vocab());
  EXPECT_EQ(t.encode("hello"), (Ids{1, 272})) << "the vocab's add_bos applies by default";
  EncodeOptions both;
  both.add_bos = true;
  both.add_eos = true;
  EXPECT_EQ(t.encode("hello", both), (Ids{1, 272, 2}));
  // User-defined tokens are always matched; text after a special token gets the space prefix.
  EXPECT_EQ(t.encode("hello<tool>hello", EncodeOptions{}), (Ids{272, 273, 272}));
  // Control tokens only with parse_special; otherwise "<s>" is text (here: bytes).
  EncodeOptions special;
  special.parse_special = true;
  EXPECT_EQ(t.encode("<s>hello", special), (Ids{1, 272}));
  const Ids plain = t.encode("<s>", EncodeOptions{});
  EXPECT_EQ(plain, (Ids{259, kSpmByte0 + '<', kSpmByte0 + 's', kSpmByte0 + '>'}));
}

TEST(SpmTokenizer, DecodeUndoesTheSpacePrefix) {
  const Tokenizer t(spm_vocab());
  EXPECT_EQ(t.decode(Ids{272}), "hello");
  EXPECT_EQ(t.decode(Ids{259, 272}), " hello");
  EXPECT_EQ(t.decode(Ids{1, 272, 2}), "hello") << "control tokens print nothing";
  DecodeOptions render;
  render.render_special = true;
  EXPECT_EQ(t.decode(Ids{1, 272, 2}, render), "<s>hello</s>");
  DecodeOptions keep_space;
  keep_space.remove_leading_space = false;
  EXPECT_EQ(t.decode(Ids{272}, keep_space), " hello");
  EXPECT_EQ(t.token_to_piece(272), " hello");
  EXPECT_EQ(t.token_to_piece(0), "\xE2\x96\x85") << "unknown prints as U+2585, like llama.cpp";
  EXPECT_EQ(t.token_to_piece(kSpmByte0 + 0xC3), "\xC3");
}

TEST(SpmTokenizer, StreamHoldsBackPartialCharacters) {
  const Tokenizer t(spm_vocab());
  TokenStream stream(t, DecodeOptions{});
  EXPECT_EQ(stream.push(1), "");
  EXPECT_EQ(stream.push(272), "hello");
  EXPECT_EQ(stream.push(kSpmByte0 + 0xE2), "");
  EXPECT_EQ(stream.push(kSpmByte0 + 0x82), "");
  EXPECT_EQ(stream.push(kSpmByte0 + 0xAC), "\xE2\x82\xAC");  // €
  EXPECT_EQ(stream.push(kSpmByte0 + 0xF0), "");
  EXPECT_EQ(stream.flush(), "\xF0") << "an unfinished character comes out at the end";
  EXPECT_EQ(stream.flush(), "");
}

TEST(SpmTokenizer, StreamAfterAPromptKeepsTheFirstSpace) {
  const Tokenizer t(spm_vocab());
  const std::vector<int32_t> prompt = t.encode("hello");
  EXPECT_EQ(t.decode(prompt), "hello");
  TokenStream stream(t);  // continues the printed prompt
  EXPECT_EQ(stream.push(272), " hello");
  EXPECT_EQ(stream.push(272), " hello");
  EXPECT_EQ(stream.push(2), "") << "EOS prints nothing";
}

// GPT-2 style: ids 0..255 are the byte characters in byte order, then merged pieces.
Vocab bpe_vocab() {
  Vocab v;
  v.kind = VocabKind::Bpe;
  v.add_space_prefix = false;
  for (unsigned b = 0; b < 256; ++b) {
    std::string s;
    const uint32_t cp = gpt2_byte_to_codepoint(static_cast<uint8_t>(b));
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    v.tokens.push_back(s);
  }
  for (const char* t : {"he", "ll", "hell", "hello", "\xC4\xA0h", "el"}) v.tokens.push_back(t);
  v.tokens.push_back("<|endoftext|>");  // 262
  v.types.assign(v.tokens.size(), TokenType::Normal);
  v.types.back() = TokenType::Control;
  v.merges = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 h", "e l"};
  v.bos_id = v.eos_id = 262;
  return v;
}

TEST(BpeTokenizer, MergesByRank) {
  const Tokenizer t(bpe_vocab());
  EXPECT_EQ(t.encode("hello"), (Ids{259}));
  // "Ġ h" has rank 4, below "h e" (0): the space stays alone.
  EXPECT_EQ(t.encode(" hello"), (Ids{' ', 259}));
  EXPECT_EQ(t.encode(" h"), (Ids{260}));
  // "l l" (rank 1) wins over "e l" (rank 5), which applies only where no better merge is left.
  EXPECT_EQ(t.encode("ell"), (Ids{'e', 257}));
  EXPECT_EQ(t.encode("elo"), (Ids{261, 'o'}));
  EXPECT_EQ(t.encode("hello world!\n"), (Ids{259, ' ', 'w', 'o', 'r', 'l', 'd', '!', '\n'}));
}

TEST(BpeTokenizer, RoundTripsArbitraryBytes) {
  const Tokenizer t(bpe_vocab());
  std::string all_bytes;
  for (int b = 255; b >= 0; --b) all_bytes += static_cast<char>(b);
  const Ids ids = t.encode(all_bytes);
  EXPECT_EQ(ids.size(), 256u);
  EXPECT_EQ(t.decode(ids), all_bytes);
  EXPECT_EQ(t.decode(t.encode("hello there \xFF\xFE")), "hello there \xFF\xFE");
}

TEST(BpeTokenizer, SpecialTokensAndEndOfGeneration) {
  const Tokenizer t(bpe_vocab());
  EncodeOptions special;
  special.parse_special = true;
  EXPECT_EQ(t.encode("hello<|endoftext|>", special), (Ids{259, 262}));
  EXPECT_EQ(t.encode("<|endoftext|>").size(), 13u) << "plain text without parse_special";
  EXPECT_TRUE(t.is_end_of_generation(262));
  EXPECT_FALSE(t.is_end_of_generation(259));
  EXPECT_EQ(t.find_token("hello"), 259);
  EXPECT_EQ(t.find_token("nope"), -1);
}

TEST(Gpt2ByteMapping, IsTheReversibleGpt2Table) {
  EXPECT_EQ(gpt2_byte_to_codepoint('A'), uint32_t{'A'});
  EXPECT_EQ(gpt2_byte_to_codepoint(' '), 0x120u);   // Ġ
  EXPECT_EQ(gpt2_byte_to_codepoint('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(gpt2_byte_to_codepoint(0), 0x100u);
  EXPECT_EQ(gpt2_byte_to_codepoint(0x7F), 0x121u);
  EXPECT_EQ(gpt2_byte_to_codepoint(0xAD), 0x143u);
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(gpt2_codepoint_to_byte(gpt2_byte_to_codepoint(static_cast<uint8_t>(b))), b);
  }
  EXPECT_EQ(gpt2_codepoint_to_byte(0x20), -1);
  EXPECT_EQ(gpt2_codepoint_to_byte(0x144), -1);
}

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> words;
  for (std::string_view w : gpt2_pre_tokenize(text)) words.emplace_back(w);
  return words;
}

using Words = std::vector<std::string>;

TEST(Gpt2PreTokenizer, FollowsTheRegex) {
  EXPECT_EQ(split("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("I've 'told he's"), (Words{"I", "'ve", " '", "told", " he", "'s"}));
  EXPECT_EQ(split("a  b"), (Words{"a", " ", " b"}));
  EXPECT_EQ(split("a   "), (Words{"a", "   "}));
  EXPECT_EQ(split("x\n\n y"), (Words{"x", "\n\n", " y"}));
  EXPECT_EQ(split("3.14 42"), (Words{"3", ".", "14", " 42"}));
  EXPECT_EQ(split("  ??x"), (Words{" ", " ??", "x"}));
  EXPECT_EQ(split("'RE"), (Words{"'", "RE"})) << "contractions are lowercase only";
  EXPECT_EQ(split("\xD0\x9F\xD1\x80\xD0\xB8 \xD9\xA3\xD9\xA4"),  // "При ٣٤"
            (Words{"\xD0\x9F\xD1\x80\xD0\xB8", " \xD9\xA3\xD9\xA4"}));
  EXPECT_EQ(split("\xFF"
                  "ab"),
            (Words{"\xFF", "ab"}))
      << "invalid bytes are kept as symbols";
  EXPECT_EQ(split(""), Words{});
}

// Expected words from the regex itself (Python's `regex` module, which has \p{L} and \p{N}).
TEST(Llama3PreTokenizer, FollowsTheRegex) {
  auto split3 = [](std::string_view text) {
    std::vector<std::string> words;
    for (std::string_view w : llama3_pre_tokenize(text)) words.emplace_back(w);
    return words;
  };
  EXPECT_EQ(split3("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split3("I'VE 'Told 1234567"),
            (Words{"I", "'VE", " '", "Told", " ", "123", "456", "7"}));
  EXPECT_EQ(split3("x  \n\n  y"), (Words{"x", "  \n\n", " ", " y"}));
  EXPECT_EQ(split3("(hello)!!\n\nok"), (Words{"(hello", ")!!\n\n", "ok"}));
  EXPECT_EQ(split3("$100.50"), (Words{"$", "100", ".", "50"}));
  EXPECT_EQ(split3(" \xE3\x80\x80"
                   "end  "),
            (Words{" ",
                   "\xE3\x80\x80"
                   "end",
                   "  "}));
  EXPECT_EQ(split3("a\r\n\tb"), (Words{"a", "\r\n", "\tb"}));
}

TEST(BpeTokenizer, Llama3VocabsTakeWholeWordTokensWithoutMerging) {
  Vocab v = bpe_vocab();
  v.merges = {"h e", "l l", "he ll"};  // no "hell o": merging alone cannot build "hello"
  const Tokenizer gpt2(v);
  EXPECT_EQ(gpt2.encode("hello"), (Ids{258, 'o'}));
  v.pre_tokenizer = "llama-bpe";
  const Tokenizer llama3(v);
  EXPECT_EQ(llama3.encode("hello"), (Ids{259}));
  EXPECT_EQ(llama3.encode("hellos"), (Ids{258, 'o', 's'}));
  v.pre_tokenizer = "qwen2";
  try {
    Tokenizer t(v);
    ADD_FAILURE() << "accepted an unknown pre-tokenizer";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Unsupported);
  }
}

// Any byte string, valid UTF-8 or not, comes back unchanged: SPM through byte fallback, BPE
// through its byte alphabet. (Not with user-defined tokens: SPM puts a space after them.)
TEST(TokenizerRoundTrip, RandomBytesSurviveEncodeDecode) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  const std::vector<std::string> pieces = {
      "hello", " ", "  ", "\n", "\t", "'s", "3", "\xC3\xA9", "\xF0\x9F\xA6\x99", "<s>"};
  const Tokenizer spm(spm_vocab());
  const Tokenizer bpe(bpe_vocab());
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      if (rng() % 3 == 0) {
        text += static_cast<char>(rng() & 0xFF);
      } else {
        text += pieces[rng() % pieces.size()];
      }
    }
    EXPECT_EQ(spm.decode(spm.encode(text, EncodeOptions{})), text) << "seed " << seed;
    EXPECT_EQ(bpe.decode(bpe.encode(text)), text) << "seed " << seed;
  }
}

// The fuzzer's corpus (tests/fuzz/corpus/tokenizer, byte 0 of each file is its mode byte): the
// text comes back unchanged through both BPE word splits, and SPM ids stay in range.
TEST(TokenizerRoundTrip, FuzzCorpusSurvivesEncodeDecode) {
  const Tokenizer spm(spm_vocab());
  const Tokenizer gpt2(bpe_vocab());
  Vocab llama3_vocab = bpe_vocab();
  llama3_vocab.pre_tokenizer = "llama-bpe";
  const Tokenizer llama3(std::move(llama3_vocab));
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TANDEM_TOKENIZER_FUZZ_DIR)) {
    std::ifstream f(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << f.rdbuf();
    const std::string text = bytes.str().empty() ? "" : bytes.str().substr(1);
    SCOPED_TRACE(entry.path().filename().string());
    ++files;
    EXPECT_EQ(gpt2.decode(gpt2.encode(text)), text);
    EXPECT_EQ(llama3.decode(llama3.encode(text)), text);
    for (int32_t id : spm.encode(text)) ASSERT_TRUE(id >= 0 && id < spm.n_tokens());
  }
  EXPECT_GT(files, 0u);
}

TEST(TokenizerErrors, InvalidVocabsAreRejected) {
  auto expect_invalid = [](Vocab v, const char* what) {
    try {
      Tokenizer t(std::move(v));
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << what;
    }
  };
  expect_invalid(Vocab{}, "empty vocab");
  Vocab v = spm_vocab();
  v.scores.pop_back();
  expect_invalid(v, "scores shorter than tokens");
  v = spm_vocab();
  v.bos_id = 100000;
  expect_invalid(v, "BOS out of range");
  v = spm_vocab();
  v.types[5] = static_cast<TokenType>(9);
  expect_invalid(v, "unknown token type");
  Vocab b = bpe_vocab();
  b.merges.push_back("nospace");
  expect_invalid(b, "merge without a space");
}

TEST(TokenizerErrors, OutOfRangeIdsAreRejected) {
  const Tokenizer t(spm_vocab());
  EXPECT_THROW((void)t.decode(Ids{272, 100000}), Error);
  EXPECT_THROW((void)t.token_to_piece(-1), Error);
  TokenStream stream(t);
  EXPECT_THROW((void)stream.push(1 << 30), Error);
}

}  // namespace
}  // namespace tandem
