// The llama.cpp tokenizer test vectors (../shared/data/vocab): every case must encode to exactly
// the listed ids (no BOS) and decode back to its text.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/error.h"
#include "tandem/model/gguf.h"
#include "tandem/model/tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

fs::path vocab_dir() {
  if (const char* env = std::getenv("TANDEM_VOCAB_DIR")) return env;
  return TANDEM_VOCAB_DIR;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<Case> load_cases(const fs::path& gguf_path) {
  const std::string inp = read_all(gguf_path.string() + ".inp");
  const std::string out = read_all(gguf_path.string() + ".out");
  std::vector<Case> cases;
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0;;) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    cases.push_back({inp.substr(pos, next - pos), {}});
    pos = next + sep.size();
  }
  std::istringstream lines(out);
  std::string line;
  for (size_t i = 0; i < cases.size() && std::getline(lines, line); ++i) {
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) cases[i].ids.push_back(id);
  }
  return cases;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

class VocabFile : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabFile, EncodesAndDecodesEveryCase) {
  const fs::path path = vocab_dir() / GetParam();
  if (!fs::exists(path)) GTEST_SKIP() << "vocab file not found: " << path;
  const Tokenizer tokenizer = Tokenizer::from_gguf(gguf::File::open(path.string()));
  const std::vector<Case> cases = load_cases(path);
  ASSERT_EQ(cases.size(), 46u) << "the vectors hold 46 cases";
  EncodeOptions no_bos;
  int encoded = 0;
  int decoded = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::vector<int32_t> ids = tokenizer.encode(c.text, no_bos);
    EXPECT_EQ(ids, c.ids) << "case " << i << " \"" << c.text << "\"\n got:" << show(ids)
                          << "\nwant:" << show(c.ids);
    encoded += ids == c.ids;
    const std::string text = tokenizer.decode(c.ids);
    EXPECT_EQ(text, c.text) << "case " << i << " decode";
    decoded += text == c.text;
  }
  std::printf("%s: encode %d/%zu, decode %d/%zu\n", GetParam(), encoded, cases.size(), decoded,
              cases.size());
}

INSTANTIATE_TEST_SUITE_P(LlamaCppVectors, VocabFile,
                         ::testing::Values("ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"));

TEST(VocabFromGguf, ReadsSpecialTokensAndFlags) {
  const fs::path spm_path = vocab_dir() / "ggml-vocab-llama-spm.gguf";
  const fs::path bpe_path = vocab_dir() / "ggml-vocab-gpt-2.gguf";
  if (!fs::exists(spm_path) || !fs::exists(bpe_path)) {
    GTEST_SKIP() << "vocab files not found in " << vocab_dir();
  }
  const Tokenizer spm = Tokenizer::from_gguf(gguf::File::open(spm_path.string()));
  EXPECT_EQ(spm.vocab().kind, VocabKind::Spm);
  EXPECT_EQ(spm.n_tokens(), 32000);
  EXPECT_EQ(spm.bos_id(), 1);
  EXPECT_EQ(spm.eos_id(), 2);
  EXPECT_TRUE(spm.vocab().add_bos);  // tokenizer.ggml.add_bos_token = true
  EXPECT_EQ(spm.encode("Hello world"), (std::vector<int32_t>{1, 15043, 3186}));
  EXPECT_TRUE(spm.is_end_of_generation(2));
  EncodeOptions special;
  special.parse_special = true;
  EXPECT_EQ(spm.encode("<s>Hello", special), (std::vector<int32_t>{1, 15043}));

  const Tokenizer bpe = Tokenizer::from_gguf(gguf::File::open(bpe_path.string()));
  EXPECT_EQ(bpe.vocab().kind, VocabKind::Bpe);
  EXPECT_EQ(bpe.n_tokens(), 50257);
  EXPECT_EQ(bpe.vocab().merges.size(), 50000u);
  EXPECT_EQ(bpe.eos_id(), 50256);
  EXPECT_FALSE(bpe.vocab().add_bos);
  EXPECT_EQ(bpe.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(bpe.encode("Hello<|endoftext|>", special), (std::vector<int32_t>{15496, 50256}));
  // Without parse_special the control token's text is plain text.
  EXPECT_NE(bpe.encode("Hello<|endoftext|>").back(), 50256);
  EXPECT_EQ(bpe.decode(std::vector<int32_t>{15496, 50256}), "Hello");
  DecodeOptions render;
  render.render_special = true;
  EXPECT_EQ(bpe.decode(std::vector<int32_t>{15496, 50256}, render), "Hello<|endoftext|>");
}

TEST_P(VocabFile, RandomTextRoundTrips) {
  const fs::path path = vocab_dir() / GetParam();
  if (!fs::exists(path)) GTEST_SKIP() << "vocab file not found: " << path;
  const Tokenizer tokenizer = Tokenizer::from_gguf(gguf::File::open(path.string()));
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  const std::vector<std::string> pieces = {"The",
                                           " quick",
                                           "  ",
                                           "\n\n",
                                           "\t",
                                           "'ll",
                                           "42",
                                           ".",
                                           "\xC3\xA9t\xC3\xA9",
                                           "\xE4\xB8\xAD",
                                           "\xF0\x9F\xA6\x99",
                                           "\xD0\x9F\xD1\x80"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 16);
    for (int i = 0; i < n; ++i) {
      if (rng() % 4 == 0) {
        text += static_cast<char>(rng() & 0xFF);  // often invalid UTF-8
      } else {
        text += pieces[rng() % pieces.size()];
      }
    }
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(text, EncodeOptions{})), text)
        << "seed " << seed << " trial " << trial;
  }
}

TEST(VocabFromGguf, StreamsByteTokensAsWholeCharacters) {
  const fs::path spm_path = vocab_dir() / "ggml-vocab-llama-spm.gguf";
  if (!fs::exists(spm_path)) GTEST_SKIP() << "vocab file not found: " << spm_path;
  const Tokenizer spm = Tokenizer::from_gguf(gguf::File::open(spm_path.string()));
  // "🦙" is not in the vocab: it becomes four byte tokens.
  const std::vector<int32_t> ids = spm.encode(" this is 🦙", EncodeOptions{});
  TokenStream stream(spm, DecodeOptions{});
  std::vector<std::string> printed;
  for (int32_t id : ids) printed.push_back(stream.push(id));
  printed.push_back(stream.flush());
  std::string all;
  for (const std::string& p : printed) {
    all += p;
    // Every chunk handed out is valid UTF-8 on its own: no lone lead or continuation bytes.
    for (size_t i = 0; i < p.size(); ++i) {
      const auto b = static_cast<uint8_t>(p[i]);
      if (b >= 0xF0) {
        ASSERT_LE(i + 4, p.size()) << "split 4-byte character";
        i += 3;
      } else {
        ASSERT_LT(b, 0x80) << "unexpected byte in a chunk";
      }
    }
  }
  EXPECT_EQ(all, " this is 🦙");
}

// Small vocabs written with gguf::Writer: what vocab_from_gguf reads and what it refuses.
// The bytes stay alive as long as the file parsed from them.
struct WrittenVocab {
  explicit WrittenVocab(const gguf::Writer& writer)
      : bytes(writer.to_bytes()), file(gguf::File::parse(bytes, "test.gguf")) {}
  std::vector<uint8_t> bytes;
  gguf::File file;
};

gguf::Writer spm_writer() {
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "llama");
  // "▁hi" = "▁" + "hi"; ids 3.. are ▁hi h i ▁ hi.
  w.set_string_array("tokenizer.ggml.tokens",
                     {"<unk>", "<s>", "</s>", "\xE2\x96\x81hi", "h", "i", "\xE2\x96\x81", "hi"});
  w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -2, -2, -1.5f});
  w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1});
  return w;
}

gguf::Writer bpe_writer() {
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string_array("tokenizer.ggml.tokens", {"h", "i", "hi", "<|endoftext|>"});
  w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 3});
  w.set_string_array("tokenizer.ggml.merges", {"h i"});
  w.set_u32("tokenizer.ggml.eos_token_id", 3);
  return w;
}

void expect_error(gguf::Writer writer, ErrorCode code, const std::string& fragment) {
  const WrittenVocab w(writer);
  try {
    (void)Tokenizer::from_gguf(w.file);
    ADD_FAILURE() << "accepted; expected an error mentioning " << fragment;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(VocabFromGguf, AppliesDefaultsAndOverrides) {
  {
    const WrittenVocab w(spm_writer());
    const Tokenizer t = Tokenizer::from_gguf(w.file);
    EXPECT_EQ(t.bos_id(), 1) << "llama.cpp's SentencePiece defaults: BOS 1, EOS 2, unknown 0";
    EXPECT_EQ(t.eos_id(), 2);
    EXPECT_EQ(t.vocab().unk_id, 0);
    EXPECT_TRUE(t.vocab().add_bos);
    EXPECT_EQ(t.encode("hi"), (std::vector<int32_t>{1, 3}));
    EXPECT_EQ(t.decode(std::vector<int32_t>{1, 3}), "hi");
  }
  {
    gguf::Writer writer = spm_writer();
    writer.set_bool("tokenizer.ggml.add_bos_token", false);
    writer.set_bool("tokenizer.ggml.add_eos_token", true);
    writer.set_bool("tokenizer.ggml.add_space_prefix", false);
    const WrittenVocab w(writer);
    const Tokenizer t = Tokenizer::from_gguf(w.file);
    EXPECT_EQ(t.encode("hi"), (std::vector<int32_t>{7, 2}));
  }
  {
    const WrittenVocab w(bpe_writer());
    const Tokenizer t = Tokenizer::from_gguf(w.file);
    EXPECT_EQ(t.vocab().kind, VocabKind::Bpe);
    EXPECT_FALSE(t.vocab().add_bos);
    EXPECT_EQ(t.eos_id(), 3);
    EXPECT_EQ(t.encode("hi"), (std::vector<int32_t>{2}));
  }
}

TEST(VocabFromGguf, RefusesBrokenOrUnknownVocabs) {
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "bert");
  w.set_string_array("tokenizer.ggml.tokens", {"a"});
  expect_error(w, ErrorCode::Unsupported, "bert");

  gguf::Writer no_model;
  no_model.set_string_array("tokenizer.ggml.tokens", {"a"});
  expect_error(no_model, ErrorCode::Format, "tokenizer.ggml.model");

  gguf::Writer no_tokens;
  no_tokens.set_string("tokenizer.ggml.model", "llama");
  expect_error(no_tokens, ErrorCode::Format, "tokenizer.ggml.tokens");

  w = spm_writer();
  w.set_f32_array("tokenizer.ggml.scores", {0, 0});
  expect_error(w, ErrorCode::Format, "tokenizer.ggml.scores");

  w = spm_writer();
  w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 9, 1, 1, 1});
  expect_error(w, ErrorCode::Format, "token_type[4]");

  w = spm_writer();
  w.set_u32("tokenizer.ggml.bos_token_id", 8);
  expect_error(w, ErrorCode::Format, "bos_token_id");

  gguf::Writer no_merges;
  no_merges.set_string("tokenizer.ggml.model", "gpt2");
  no_merges.set_string_array("tokenizer.ggml.tokens", {"a"});
  expect_error(no_merges, ErrorCode::Format, "tokenizer.ggml.merges");

  w = bpe_writer();
  w.set_string_array("tokenizer.ggml.merges", {"hi"});
  expect_error(w, ErrorCode::Format, "merge");

  w = bpe_writer();
  w.set_string("tokenizer.ggml.pre", "qwen2");
  expect_error(w, ErrorCode::Unsupported, "qwen2");
}

}  // namespace
}  // namespace tandem
