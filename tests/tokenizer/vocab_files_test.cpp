// The llama.cpp tokenizer test vectors (../shared/data/vocab): every case must encode to exactly
// the listed ids (no BOS) and decode back to its text.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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
  for (int32_t id : ids) s += " " + std::to_string(id);
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

TEST(VocabFromGguf, StreamsByteTokensAsWholeCharacters) {
  const fs::path spm_path = vocab_dir() / "ggml-vocab-llama-spm.gguf";
  if (!fs::exists(spm_path)) GTEST_SKIP() << "vocab file not found: " << spm_path;
  const Tokenizer spm = Tokenizer::from_gguf(gguf::File::open(spm_path.string()));
  // "🦙" is not in the vocab: it becomes four byte tokens.
  const std::vector<int32_t> ids = spm.encode(" this is 🦙", EncodeOptions{});
  TokenStream stream(spm);
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

}  // namespace
}  // namespace tandem
