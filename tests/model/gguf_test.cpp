// GGUF writer -> reader round trips, typed accessors, zero-copy mapping, writer validation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "tandem/error.h"
#include "tandem/model/gguf.h"

namespace tandem {
namespace {

using gguf::File;
using gguf::Value;
using gguf::ValueType;
using gguf::Writer;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("tandem_gguf_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class F>
ErrorCode error_code_of(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "no error thrown";
  return ErrorCode::Internal;
}

Value scalar(ValueType type, uint64_t u, int64_t i) {
  Value v;
  v.type = type;
  v.u = u;
  v.i = i;
  return v;
}

struct TensorCase {
  std::string name;
  DType dtype;
  std::vector<int64_t> ne;
  std::vector<uint8_t> bytes;
};

std::vector<TensorCase> tensor_cases(uint32_t seed) {
  std::mt19937 rng(seed);
  auto random_bytes = [&](DType dtype, const std::vector<int64_t>& ne) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& v : values) v = dist(rng);
    std::vector<uint8_t> out(
        size_t(n / dtype_traits(dtype).block_elements * dtype_traits(dtype).block_bytes));
    if (dtype == DType::I32 || dtype == DType::I8) {
      for (auto& b : out) b = uint8_t(rng());
    } else {
      from_f32(dtype, values.data(), out.data(), n);
    }
    return out;
  };
  std::vector<TensorCase> cases = {
      {"t.f32", DType::F32, {3, 2}, {}},      {"t.f16", DType::F16, {5}, {}},
      {"t.bf16", DType::BF16, {2, 2, 2}, {}}, {"t.i32", DType::I32, {4}, {}},
      {"t.i8", DType::I8, {7, 1, 1, 2}, {}},  {"t.q8_0", DType::Q8_0, {64, 3}, {}},
      {"t.q4_0", DType::Q4_0, {32, 2}, {}},
  };
  for (auto& c : cases) c.bytes = random_bytes(c.dtype, c.ne);
  return cases;
}

Writer full_writer(size_t alignment, const std::vector<TensorCase>& tensors) {
  Writer w(alignment);
  w.set_string("general.architecture", "test");
  w.set_string("empty.string", "");
  w.set_string("unicode", "\xE2\x96\x81h\xC3\xA9llo");
  w.set("u8", scalar(ValueType::U8, 255, 0));
  w.set("i8", scalar(ValueType::I8, 0, -128));
  w.set("u16", scalar(ValueType::U16, 65535, 0));
  w.set("i16", scalar(ValueType::I16, 0, -32768));
  w.set_u32("u32", 4000000000u);
  w.set_i32("i32", -2000000000);
  w.set("u64", Value::make_u64(~uint64_t(0)));
  w.set("i64", Value::make_i64(INT64_MIN));
  w.set_f32("f32", 0.15625f);
  w.set("f64", Value::make_f64(-1e300));
  w.set_bool("bool.true", true);
  w.set_bool("bool.false", false);
  w.set_string_array("strings", {"a", "", "\xE2\x96\x81the", std::string(300, 'z')});
  w.set_string_array("strings.empty", {});
  w.set_f32_array("f32s", {1.5f, -2.25f, 0.0f});
  w.set_i32_array("i32s", {-1, 0, 2147483647});
  w.set("u8s", Value::make_number_array(ValueType::U8, {0, 255}));
  w.set("i16s", Value::make_number_array(ValueType::I16, {-32768, 32767}));
  w.set("u64s", Value::make_number_array(ValueType::U64, {0, 9007199254740992.0}));
  w.set("f64s", Value::make_number_array(ValueType::F64, {1e-300, 3.5}));
  w.set("bools", Value::make_number_array(ValueType::Bool, {1, 0, 1}));
  for (const auto& t : tensors) w.add_tensor(t.name, t.dtype, t.ne, t.bytes);
  return w;
}

void expect_round_trip(const File& f, size_t alignment, const std::vector<TensorCase>& tensors) {
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.data_offset() % alignment, 0u);
  // Metadata: exact values in insertion order (the alignment key, when present, first).
  const auto& md = f.metadata();
  size_t first = alignment == gguf::kDefaultAlignment ? 0 : 1;
  if (first == 1) {
    EXPECT_EQ(md[0].first, "general.alignment");
    EXPECT_EQ(f.get_uint("general.alignment"), alignment);
  }
  ASSERT_EQ(md.size(), first + 24);
  EXPECT_EQ(md[first].first, "general.architecture");
  EXPECT_EQ(md.back().first, "bools");
  EXPECT_EQ(f.get_string("unicode"), "\xE2\x96\x81h\xC3\xA9llo");
  EXPECT_EQ(f.get_string("empty.string"), "");
  EXPECT_EQ(f.get_uint("u8"), 255u);
  EXPECT_EQ(f.get_int("i8"), -128);
  EXPECT_EQ(f.get_uint("u16"), 65535u);
  EXPECT_EQ(f.get_int("i16"), -32768);
  EXPECT_EQ(f.get_uint("u32"), 4000000000u);
  EXPECT_EQ(f.get_int("i32"), -2000000000);
  EXPECT_EQ(f.get_uint("u64"), ~uint64_t(0));
  EXPECT_EQ(f.get_int("i64"), INT64_MIN);
  EXPECT_EQ(f.get_float("f32"), 0.15625);
  EXPECT_EQ(f.get_float("f64"), -1e300);
  EXPECT_TRUE(f.get_bool("bool.true"));
  EXPECT_FALSE(f.get_bool("bool.false"));
  EXPECT_EQ(f.get_string_array("strings"),
            (std::vector<std::string>{"a", "", "\xE2\x96\x81the", std::string(300, 'z')}));
  EXPECT_TRUE(f.get_string_array("strings.empty").empty());
  EXPECT_EQ(f.get_number_array("f32s"), (std::vector<double>{1.5, -2.25, 0.0}));
  EXPECT_EQ(f.get_number_array("i32s"), (std::vector<double>{-1, 0, 2147483647}));
  EXPECT_EQ(f.get_number_array("u8s"), (std::vector<double>{0, 255}));
  EXPECT_EQ(f.get_number_array("i16s"), (std::vector<double>{-32768, 32767}));
  EXPECT_EQ(f.get_number_array("u64s"), (std::vector<double>{0, 9007199254740992.0}));
  EXPECT_EQ(f.get_number_array("f64s"), (std::vector<double>{1e-300, 3.5}));
  EXPECT_EQ(f.get_number_array("bools"), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(f.find("bools")->array_type, ValueType::Bool);
  EXPECT_EQ(f.find("u64s")->array_type, ValueType::U64);
  // Tensors: same order, shapes, dtypes and bytes; offsets aligned and disjoint.
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const auto& t = f.tensors()[k];
    SCOPED_TRACE(tensors[k].name);
    EXPECT_EQ(t.name, tensors[k].name);
    EXPECT_EQ(t.dtype, tensors[k].dtype);
    EXPECT_EQ(t.n_dims, int(tensors[k].ne.size()));
    for (int d = 0; d < kMaxDims; ++d) {
      EXPECT_EQ(t.ne[d], d < int(tensors[k].ne.size()) ? tensors[k].ne[d] : 1);
    }
    EXPECT_EQ(t.offset % alignment, 0u);
    ASSERT_EQ(t.bytes, tensors[k].bytes.size());
    EXPECT_EQ(std::memcmp(t.data, tensors[k].bytes.data(), t.bytes), 0);
    EXPECT_EQ(f.find_tensor(t.name), &t);
  }
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
}

TEST(GgufRoundTrip, MetadataAndTensorsAreExact) {
  auto tensors = tensor_cases(std::random_device{}());
  for (size_t alignment : {size_t(32), size_t(1), size_t(64), size_t(4096)}) {
    SCOPED_TRACE("alignment " + std::to_string(alignment));
    Writer w = full_writer(alignment, tensors);
    std::vector<uint8_t> bytes = w.to_bytes();
    File f = File::parse(bytes);
    expect_round_trip(f, alignment, tensors);
    // Every tensor's data pointer lies in the caller's buffer: nothing was copied.
    for (const auto& t : f.tensors()) {
      EXPECT_EQ(t.data, bytes.data() + f.data_offset() + t.offset);
    }
  }
}

TEST(GgufRoundTrip, FileOnDiskMatchesBytesAndIsMapped) {
  auto tensors = tensor_cases(7);
  Writer w = full_writer(64, tensors);
  std::string path = temp_path("disk.gguf");
  std::vector<size_t> progress;
  w.write(path, [&](size_t done, size_t total) {
    progress.push_back(done);
    EXPECT_LE(done, total);
  });
  std::vector<uint8_t> on_disk = read_file(path);
  EXPECT_EQ(on_disk, w.to_bytes());
  ASSERT_EQ(progress.size(), tensors.size() + 1);
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  {
    File f = File::open(path);
    EXPECT_EQ(f.path(), path);
    expect_round_trip(f, 64, tensors);
    // Zero-copy: the data section sits at a page-aligned mapping base + data_offset.
    const auto& t0 = f.tensors()[0];
    uintptr_t base = uintptr_t(t0.data) - f.data_offset() - t0.offset;
    EXPECT_EQ(base % uintptr_t(sysconf(_SC_PAGESIZE)), 0u);
    // Moving the File keeps the mapping and the pointers into it.
    const uint8_t* before = f.tensors()[3].data;
    File moved = std::move(f);
    EXPECT_EQ(moved.tensors()[3].data, before);
    EXPECT_EQ(std::memcmp(before, tensors[3].bytes.data(), tensors[3].bytes.size()), 0);
  }
  std::filesystem::remove(path);
}

TEST(GgufRoundTrip, Version2IsAccepted) {
  Writer w;
  w.set_u32("a", 1);
  w.add_tensor("t", DType::F32, std::vector<int64_t>{2}, std::vector<uint8_t>(8, 1));
  std::vector<uint8_t> bytes = w.to_bytes();
  bytes[4] = 2;  // v2 has v3's layout (v3 only added big-endian files)
  File f = File::parse(bytes);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get_uint("a"), 1u);
  EXPECT_EQ(f.tensors().at(0).bytes, 8u);
}

TEST(GgufRoundTrip, LazyTensorsFillInPlace) {
  Writer w;
  std::vector<int64_t> ne = {64, 2};
  size_t seen_bytes = 0;
  w.add_tensor_lazy("lazy", DType::Q8_0, ne, [&](uint8_t* dst, size_t n) {
    seen_bytes = n;
    for (size_t k = 0; k < n; ++k) dst[k] = uint8_t(k * 13);
  });
  std::vector<uint8_t> bytes = w.to_bytes();
  EXPECT_EQ(seen_bytes, 4 * sizeof(BlockQ8_0));
  File f = File::parse(bytes);
  const auto* t = f.find_tensor("lazy");
  ASSERT_NE(t, nullptr);
  for (size_t k = 0; k < t->bytes; ++k) ASSERT_EQ(t->data[k], uint8_t(k * 13));
}

TEST(GgufRoundTrip, MultiPageTensorsSurviveTheMappedWrite) {
  // The writer drops finished pages from its mapping; the data must still reach the file.
  Writer w(64);
  std::vector<int64_t> ne = {4096, 9};
  for (int t = 0; t < 3; ++t) {
    w.add_tensor_lazy("big." + std::to_string(t), DType::F32, ne, [t](uint8_t* dst, size_t n) {
      for (size_t k = 0; k < n; ++k) dst[k] = uint8_t(k * 31 + size_t(t) * 7 + (k >> 12));
    });
  }
  std::string path = temp_path("pages.gguf");
  w.write(path);
  EXPECT_EQ(read_file(path), w.to_bytes());
  std::filesystem::remove(path);
}

TEST(GgufRoundTrip, FailedWriteLeavesNoFile) {
  Writer w;
  w.add_tensor_lazy("bad", DType::F32, std::vector<int64_t>{4}, [](uint8_t*, size_t) {
    throw_error(ErrorCode::Internal, "test", "generator failed");
  });
  std::string path = temp_path("failed.gguf");
  EXPECT_EQ(error_code_of([&] { w.write(path); }), ErrorCode::Internal);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(error_code_of([&] { w.write("/nonexistent-dir/x.gguf"); }), ErrorCode::Io);
}

TEST(GgufRoundTrip, SetReplacesInPlace) {
  Writer w;
  w.set_u32("a", 1);
  w.set_u32("b", 2);
  w.set_string("a", "now a string");
  File f = File::parse(w.to_bytes());
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata()[0].first, "a");
  EXPECT_EQ(f.get_string("a"), "now a string");
}

TEST(GgufAccessors, CheckTheStoredType) {
  Writer w;
  w.set_u32("u", 5);
  w.set_i32("neg", -3);
  w.set("big", Value::make_u64(~uint64_t(0)));
  w.set_string("s", "x");
  w.set_f32_array("fa", {1});
  w.set_bool("b", true);
  std::vector<uint8_t> bytes = w.to_bytes();
  File f = File::parse(bytes, "acc");
  std::string msg;
  EXPECT_EQ(error_code_of([&] { f.get_string("u"); }, &msg), ErrorCode::Format);
  EXPECT_NE(msg.find("'u'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(f.key_offset("u"))), std::string::npos) << msg;
  EXPECT_NE(msg.find("[gguf acc]"), std::string::npos) << msg;
  EXPECT_EQ(error_code_of([&] { f.get_uint("neg"); }, &msg), ErrorCode::Format);
  EXPECT_NE(msg.find("'neg'"), std::string::npos) << msg;
  EXPECT_EQ(f.get_int("neg"), -3);
  EXPECT_EQ(error_code_of([&] { f.get_int("big"); }), ErrorCode::Format);
  EXPECT_EQ(error_code_of([&] { f.get_float("u"); }), ErrorCode::Format);
  EXPECT_EQ(error_code_of([&] { f.get_bool("u"); }), ErrorCode::Format);
  EXPECT_EQ(error_code_of([&] { f.get_uint("b"); }), ErrorCode::Format);
  EXPECT_EQ(error_code_of([&] { f.get_string_array("fa"); }), ErrorCode::Format);
  EXPECT_EQ(error_code_of([&] { f.get_number_array("s"); }), ErrorCode::Format);
  EXPECT_EQ(error_code_of([&] { f.get_uint("missing.key"); }, &msg), ErrorCode::Format);
  EXPECT_NE(msg.find("missing.key"), std::string::npos) << msg;
  EXPECT_TRUE(f.has("u"));
  EXPECT_FALSE(f.has("missing.key"));
  EXPECT_EQ(f.find("missing.key"), nullptr);
}

TEST(GgufWriter, RejectsInvalidInput) {
  Writer w;
  std::vector<int64_t> ne = {32};
  w.add_tensor("t", DType::F32, ne, std::vector<uint8_t>(128));
  EXPECT_EQ(error_code_of([&] { w.add_tensor("t", DType::F32, ne, std::vector<uint8_t>(128)); }),
            ErrorCode::InvalidArgument);
  EXPECT_EQ(error_code_of([&] { w.add_tensor("short", DType::F32, ne, std::vector<uint8_t>(4)); }),
            ErrorCode::InvalidArgument);
  std::vector<int64_t> zero = {0};
  EXPECT_EQ(error_code_of([&] { w.add_tensor_lazy("z", DType::F32, zero, nullptr); }),
            ErrorCode::InvalidArgument);
  std::vector<int64_t> odd = {33};
  EXPECT_EQ(error_code_of([&] { w.add_tensor_lazy("q", DType::Q4_0, odd, nullptr); }),
            ErrorCode::InvalidArgument);
  std::vector<int64_t> five = {1, 1, 1, 1, 1};
  EXPECT_EQ(error_code_of([&] { w.add_tensor_lazy("5d", DType::F32, five, nullptr); }),
            ErrorCode::InvalidArgument);
  EXPECT_EQ(error_code_of([&] { w.set_u32("", 1); }), ErrorCode::InvalidArgument);
  EXPECT_EQ(error_code_of([&] { w.set_u32("general.alignment", 64); }), ErrorCode::InvalidArgument);
  EXPECT_EQ(error_code_of([] { Writer bad(48); }), ErrorCode::InvalidArgument);
  EXPECT_EQ(error_code_of([] { Writer bad(size_t(2) << 20); }), ErrorCode::InvalidArgument);
  Writer range;
  range.set("u8", scalar(ValueType::U8, 300, 0));
  EXPECT_EQ(error_code_of([&] { range.to_bytes(); }), ErrorCode::InvalidArgument);
  Writer frac;
  frac.set("i32s", Value::make_number_array(ValueType::I32, {1.5}));
  EXPECT_EQ(error_code_of([&] { frac.to_bytes(); }), ErrorCode::InvalidArgument);
  Writer huge;
  huge.set("u64s", Value::make_number_array(ValueType::U64, {18446744073709551616.0}));
  EXPECT_EQ(error_code_of([&] { huge.to_bytes(); }), ErrorCode::InvalidArgument);
}

TEST(GgufRealFiles, LlamaCppVocabFilesParseAndRewriteByteForByte) {
  // Vocabulary-only GGUFs written by llama.cpp's own tools, in shared/ beside the checkout.
  // TANDEM_SHARED_DIR overrides where shared/ is (default: beside the checkout).
  const char* shared = std::getenv("TANDEM_SHARED_DIR");
  std::filesystem::path dir =
      (shared ? std::filesystem::path(shared)
              : std::filesystem::path(TANDEM_SOURCE_DIR) / ".." / "shared") /
      "data" / "vocab";
  if (!std::filesystem::exists(dir / "ggml-vocab-llama-spm.gguf")) {
    GTEST_SKIP() << "llama.cpp vocab files not found in " << dir;
  }
  for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"}) {
    SCOPED_TRACE(name);
    std::string path = (dir / name).string();
    File f = File::open(path);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_TRUE(f.tensors().empty());
    const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
    EXPECT_EQ(f.get_number_array("tokenizer.ggml.token_type").size(), tokens.size());
    EXPECT_GT(tokens.size(), 30000u);
    // Our writer lays the same metadata out exactly as llama.cpp did.
    Writer w(f.alignment());
    for (const auto& [key, value] : f.metadata()) w.set(key, value);
    EXPECT_EQ(w.to_bytes(), read_file(path));
  }
}

TEST(GgufOpen, MissingFileIsIo) {
  EXPECT_EQ(error_code_of([] { File::open("/nonexistent/model.gguf"); }), ErrorCode::Io);
  EXPECT_EQ(error_code_of([] { File::open("/tmp"); }), ErrorCode::Io);
}

TEST(GgufDtypes, IdsMatchGgml) {
  EXPECT_EQ(gguf::dtype_to_gguf(DType::F32), 0u);
  EXPECT_EQ(gguf::dtype_to_gguf(DType::F16), 1u);
  EXPECT_EQ(gguf::dtype_to_gguf(DType::Q4_0), 2u);
  EXPECT_EQ(gguf::dtype_to_gguf(DType::Q8_0), 8u);
  EXPECT_EQ(gguf::dtype_to_gguf(DType::I8), 24u);
  EXPECT_EQ(gguf::dtype_to_gguf(DType::I32), 26u);
  EXPECT_EQ(gguf::dtype_to_gguf(DType::BF16), 30u);
  EXPECT_EQ(gguf::dtype_to_gguf(DType::Q4_K), 12u);
  EXPECT_EQ(gguf::dtype_to_gguf(DType::Q5_K), 13u);
  EXPECT_EQ(gguf::dtype_to_gguf(DType::Q6_K), 14u);
  for (DType d : kAllDTypes) EXPECT_EQ(gguf::dtype_from_gguf(gguf::dtype_to_gguf(d)), d);
  for (uint32_t id : {3u, 6u, 7u, 9u, 10u, 11u, 15u, 25u, 27u, 28u, 31u, 1000u}) {
    EXPECT_FALSE(gguf::dtype_from_gguf(id).has_value()) << id;
  }
}

}  // namespace
}  // namespace tandem
