// Generates a synthetic model and measures loading it (until the `tandem` CLI wraps this).
//   gguf_synthetic write PRESET DTYPE PATH [SEED]   e.g. write llama-3.1-8b q4_0 /tmp/8b.gguf
//   gguf_synthetic inspect PATH                     config, tensors, and host RSS when mapping
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "tandem/error.h"
#include "tandem/model/gguf.h"
#include "tandem/model/llama_config.h"
#include "tandem/model/synthetic.h"

namespace {

using namespace tandem;

// kB values from /proc/self/status.
long status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::stol(line.substr(n + 1));
    }
  }
  return -1;
}

void print_rss(const char* when) {
  std::printf("%-28s VmRSS %8.1f MiB  RssAnon %8.1f MiB  RssFile %8.1f MiB\n", when,
              status_kb("VmRSS") / 1024.0, status_kb("RssAnon") / 1024.0,
              status_kb("RssFile") / 1024.0);
}

int write_model(const std::string& preset, const std::string& dtype_str, const std::string& path,
                uint64_t seed) {
  auto dtype = dtype_from_name(dtype_str);
  if (!dtype)
    throw_error(ErrorCode::InvalidArgument, "gguf_synthetic", "unknown dtype " + dtype_str);
  SyntheticSpec spec = synthetic_preset(preset, *dtype, seed);
  auto start = std::chrono::steady_clock::now();
  int last = -1;
  write_synthetic_model(spec, path, [&](size_t done, size_t total) {
    int pct = int(100.0 * double(done) / double(total));
    if (pct / 10 != last / 10) std::fprintf(stderr, "\r%3d%%", pct);
    last = pct;
  });
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  double gb = double(in.tellg()) / 1e9;
  std::printf("\nwrote %s: %.3f GB in %.2f s (%.2f GB/s)\n", path.c_str(), gb, s, gb / s);
  return 0;
}

int inspect(const std::string& path) {
  print_rss("before open");
  auto start = std::chrono::steady_clock::now();
  gguf::File f = gguf::File::open(path);
  double open_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  print_rss("after open (mapped)");
  LlamaConfig c = LlamaConfig::from_gguf(f);
  size_t bytes = 0;
  for (const auto& t : f.tensors()) bytes += t.bytes;
  std::printf("%s: GGUF v%u, %zu keys, %zu tensors, %.3f GB of tensor data, opened in %.1f ms\n",
              path.c_str(), f.version(), f.metadata().size(), f.tensors().size(), bytes / 1e9,
              open_ms);
  std::printf(
      "llama: vocab %lld embd %lld layers %lld ff %lld heads %lld/%lld head_dim %lld "
      "rope %g ctx %lld tied %d\n",
      (long long)c.n_vocab, (long long)c.n_embd, (long long)c.n_layer, (long long)c.n_ff,
      (long long)c.n_head, (long long)c.n_head_kv, (long long)c.head_dim, double(c.rope_freq_base),
      (long long)c.context_length, int(c.tied_embeddings));
  // Touch one byte per page of every tensor: the pages are the file's, not copies.
  unsigned sum = 0;
  for (const auto& t : f.tensors()) {
    for (size_t k = 0; k < t.bytes; k += 4096) sum += t.data[k];
  }
  print_rss("after reading every page");
  std::printf("(checksum %u)\n", sum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "write" && (argc == 5 || argc == 6)) {
      return write_model(argv[2], argv[3], argv[4], argc == 6 ? std::stoull(argv[5]) : 0);
    }
    if (cmd == "inspect" && argc == 3) return inspect(argv[2]);
    std::fprintf(stderr,
                 "usage: %s write PRESET DTYPE PATH [SEED]\n       %s inspect PATH\n"
                 "presets: tiny llama-3.2-1b llama-3.1-8b; dtypes: f32 f16 q8_0 q4_0\n",
                 argv[0], argv[0]);
    return 2;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
