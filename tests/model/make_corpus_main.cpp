// Regenerates the checked-in GGUF corpora:
//   gguf_make_corpus tests/data/gguf tests/fuzz/corpus/gguf
#include <cstdio>
#include <fstream>
#include <string>

#include "malformed_corpus.h"

namespace {

bool write_all(const std::string& dir, const std::vector<tandem::testing::CorpusFile>& files) {
  for (const auto& f : files) {
    std::ofstream out(dir + "/" + f.name, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(f.bytes.data()), std::streamsize(f.bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), f.name.c_str());
      return false;
    }
  }
  std::printf("%zu files in %s\n", files.size(), dir.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MALFORMED_DIR FUZZ_SEED_DIR\n", argv[0]);
    return 2;
  }
  bool ok = write_all(argv[1], tandem::testing::malformed_corpus()) &&
            write_all(argv[2], tandem::testing::fuzz_seed_corpus());
  return ok ? 0 : 1;
}
