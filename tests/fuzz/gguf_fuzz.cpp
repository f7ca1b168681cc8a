// libFuzzer target for the GGUF reader. Any input must parse or throw Error{Format}; a parsed
// file must have all tensor bytes readable, answer every typed accessor with a value or a
// Format error, and survive a writer round trip unchanged.
//   cmake --preset fuzz && ninja -C build/fuzz gguf_fuzz
//   mkdir -p /tmp/corpus && cp tests/fuzz/corpus/gguf/* tests/data/gguf/*.gguf /tmp/corpus
//   ./build/fuzz/tests/fuzz/gguf_fuzz -max_total_time=600 -print_final_stats=1 /tmp/corpus
// The checked-in corpus holds the generated seeds (gguf_make_corpus) plus the files under 2 KB
// of a `-merge=1` minimization of earlier runs; model_test replays all of them.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "tandem/error.h"
#include "tandem/model/gguf.h"
#include "tandem/model/llama_config.h"

namespace {

using namespace tandem;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

template <class F>
void expect_format_or_value(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    require(e.code() == ErrorCode::Format);
  }
}

void check_round_trip(const gguf::File& f) {
  gguf::Writer w(f.alignment());
  try {
    for (const auto& [key, value] : f.metadata()) w.set(key, value);
    for (const auto& t : f.tensors()) {
      std::span<const int64_t> ne(t.ne.data(), size_t(t.n_dims));
      w.add_tensor(t.name, t.dtype, ne, {t.data, t.bytes});
    }
  } catch (const Error& e) {
    // Only values the writer's typed slots cannot hold exactly (u64/i64 arrays widened to
    // double) may be refused.
    require(e.code() == ErrorCode::InvalidArgument);
    return;
  }
  std::vector<uint8_t> bytes;
  try {
    bytes = w.to_bytes();
  } catch (const Error& e) {
    require(e.code() == ErrorCode::InvalidArgument);
    return;
  }
  gguf::File g = gguf::File::parse(bytes, "round-trip");
  require(g.tensors().size() == f.tensors().size());
  require(g.metadata().size() == f.metadata().size());
  for (const auto& t : f.tensors()) {
    const gguf::TensorInfo* u = g.find_tensor(t.name);
    require(u != nullptr && u->dtype == t.dtype && u->ne == t.ne && u->bytes == t.bytes);
    require(std::memcmp(u->data, t.data, t.bytes) == 0);
  }
  for (const auto& [key, value] : f.metadata()) {
    const gguf::Value* v = g.find(key);
    require(v != nullptr && v->type == value.type && v->str == value.str &&
            v->strings == value.strings && v->numbers.size() == value.numbers.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<gguf::File> file;
  try {
    file.emplace(gguf::File::parse({data, size}, "fuzz"));
  } catch (const Error& e) {
    require(e.code() == ErrorCode::Format);
    return 0;
  }
  const gguf::File& f = *file;
  unsigned sum = 0;
  for (const auto& t : f.tensors()) {
    require(t.data >= data && t.data + t.bytes <= data + size);
    sum += t.data[0] + t.data[t.bytes - 1];
  }
  for (const auto& entry : f.metadata()) {
    const std::string& key = entry.first;  // (clang 14 cannot capture structured bindings)
    require(f.find(key) == &entry.second);
    expect_format_or_value([&] { f.get_string(key); });
    expect_format_or_value([&] { f.get_uint(key); });
    expect_format_or_value([&] { f.get_int(key); });
    expect_format_or_value([&] { f.get_float(key); });
    expect_format_or_value([&] { f.get_bool(key); });
    expect_format_or_value([&] { f.get_string_array(key); });
    expect_format_or_value([&] { f.get_number_array(key); });
  }
  try {
    LlamaConfig::from_gguf(f);
  } catch (const Error& e) {
    require(e.code() == ErrorCode::Format || e.code() == ErrorCode::Unsupported);
  }
  check_round_trip(f);
  return sum == 0xdeadbeef ? 1 : 0;
}
