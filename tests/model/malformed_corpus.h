// The handcrafted malformed GGUF corpus (tests/data/gguf) and the fuzzer's seed files, built
// byte by byte so each file carries exactly one hazard. `gguf_make_corpus` writes them; the
// test checks that the checked-in files are exactly what this code generates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::testing {

struct CorpusFile {
  std::string name;  // file name, e.g. "key_length_huge.gguf"
  std::vector<uint8_t> bytes;
  std::string must_mention;  // the key, tensor or section the Format error must name
};

// A small valid GGUF v3 file (metadata of every kind, tensors of four dtypes).
std::vector<uint8_t> valid_base_file();

// At least 40 files, each malformed by one hazard.
std::vector<CorpusFile> malformed_corpus();

// Valid seed files for the fuzzer (must_mention is empty).
std::vector<CorpusFile> fuzz_seed_corpus();

}  // namespace tandem::testing
