// Hostile input: the checked-in malformed corpus, every truncation and thousands of byte flips
// of a valid file, and the fuzzer's seeds. Each must give Error{Format} (or, for mutations that
// happen to stay valid, a clean parse) and never crash; run it under the asan preset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "malformed_corpus.h"
#include "tandem/error.h"
#include "tandem/model/gguf.h"
#include "tandem/model/llama_config.h"

namespace tandem {
namespace {

std::vector<uint8_t> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Parses and, when the parse succeeds, reads every tensor byte (ASan catches a stray pointer)
// and tries the llama config; returns the Format message, or "" for a valid file.
std::string parse_message(std::span<const uint8_t> bytes) {
  try {
    gguf::File f = gguf::File::parse(bytes, "mem");
    unsigned sum = 0;
    for (const auto& t : f.tensors()) {
      for (size_t k = 0; k < t.bytes; ++k) sum += t.data[k];
    }
    try {
      LlamaConfig::from_gguf(f);
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::Format || e.code() == ErrorCode::Unsupported) << e.what();
    }
    return sum == 0xffffffffu ? "unreachable" : "";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Format) << e.what();
    std::string m = e.what();
    EXPECT_FALSE(m.empty());
    return m;
  }
}

TEST(GgufMalformed, CorpusOnDiskIsTheGeneratedOne) {
  auto corpus = testing::malformed_corpus();
  EXPECT_GE(corpus.size(), 40u);
  std::set<std::string> names;
  for (const auto& c : corpus) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate " << c.name;
    auto path = std::filesystem::path(TANDEM_GGUF_CORPUS_DIR) / c.name;
    ASSERT_TRUE(std::filesystem::exists(path))
        << path << " missing: run gguf_make_corpus tests/data/gguf tests/fuzz/corpus/gguf";
    EXPECT_EQ(read_file(path), c.bytes) << c.name << " differs from the generator";
  }
  size_t on_disk = 0;
  for (const auto& e : std::filesystem::directory_iterator(TANDEM_GGUF_CORPUS_DIR)) {
    if (e.path().extension() == ".gguf") {
      ++on_disk;
      EXPECT_TRUE(names.count(e.path().filename().string())) << "stray file " << e.path();
    }
  }
  EXPECT_EQ(on_disk, corpus.size());
}

TEST(GgufMalformed, EveryCorpusFileIsAFormatErrorNamingWhereAndOffset) {
  for (const auto& c : testing::malformed_corpus()) {
    SCOPED_TRACE(c.name);
    auto path = std::filesystem::path(TANDEM_GGUF_CORPUS_DIR) / c.name;
    try {
      gguf::File::open(path.string());
      ADD_FAILURE() << c.name << " parsed without error";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_EQ(e.code(), ErrorCode::Format) << m;
      EXPECT_NE(m.find(c.must_mention), std::string::npos) << m;
      EXPECT_NE(m.find(" at offset "), std::string::npos) << m;
      EXPECT_NE(m.find(c.name), std::string::npos) << "path missing: " << m;
    }
  }
}

TEST(GgufMalformed, ValidBaseParses) {
  auto bytes = testing::valid_base_file();
  EXPECT_EQ(parse_message(bytes), "");
  gguf::File f = gguf::File::parse(bytes);
  EXPECT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.get_string_array("test.words").size(), 3u);
}

TEST(GgufMalformed, EveryTruncationIsAFormatError) {
  auto bytes = testing::valid_base_file();
  // The valid file ends with the last tensor's data, so every proper prefix is malformed.
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + long(n));  // exact-size heap block
    std::string m = parse_message(prefix);
    ASSERT_NE(m, "") << "prefix of " << n << " bytes parsed";
    ASSERT_NE(m.find("offset"), std::string::npos) << m;
  }
}

TEST(GgufMalformed, RandomByteFlipsNeverCrash) {
  auto base = testing::valid_base_file();
  for (uint32_t seed : {20261121u, std::random_device{}()}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    int errors = 0;
    for (int iter = 0; iter < 2000; ++iter) {
      std::vector<uint8_t> bytes = base;
      int flips = 1 + int(rng() % 4);
      for (int k = 0; k < flips; ++k) {
        size_t at = rng() % bytes.size();
        bytes[at] = rng() % 2 ? uint8_t(bytes[at] ^ (1u << (rng() % 8))) : uint8_t(rng());
      }
      errors += parse_message(bytes).empty() ? 0 : 1;
    }
    // Flips in the tensor data or in string contents keep the file valid; most others do not.
    EXPECT_GT(errors, 100);
  }
}

TEST(GgufMalformed, FuzzSeedsAreTheGeneratedOnesAndParse) {
  for (const auto& c : testing::fuzz_seed_corpus()) {
    SCOPED_TRACE(c.name);
    auto path = std::filesystem::path(TANDEM_GGUF_FUZZ_SEED_DIR) / c.name;
    EXPECT_EQ(read_file(path), c.bytes);
    EXPECT_EQ(parse_message(c.bytes), "");
  }
  // Whatever else the fuzzer left in the corpus must also parse or fail cleanly.
  for (const auto& e : std::filesystem::directory_iterator(TANDEM_GGUF_FUZZ_SEED_DIR)) {
    parse_message(read_file(e.path()));
  }
}

TEST(GgufMalformed, TotalMetadataIsCapped) {
  // Two arrays of 2^24 u8 decode to 2 x 128 MiB of doubles: over the 256 MiB budget.
  std::vector<uint8_t> b;
  auto put = [&b](auto v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  };
  put(gguf::kMagic);
  put(uint32_t(3));
  put(uint64_t(0));
  put(uint64_t(2));
  for (const char* key : {"a.first", "a.second"}) {
    put(uint64_t(std::strlen(key)));
    b.insert(b.end(), key, key + std::strlen(key));
    put(uint32_t(gguf::ValueType::Array));
    put(uint32_t(gguf::ValueType::U8));
    put(uint64_t(gguf::kMaxArrayElements));
    b.resize(b.size() + gguf::kMaxArrayElements, 1);
  }
  std::string m = parse_message(b);
  EXPECT_NE(m.find("key 'a.second'"), std::string::npos) << m;
  EXPECT_NE(m.find("metadata exceeds"), std::string::npos) << m;
}

}  // namespace
}  // namespace tandem
