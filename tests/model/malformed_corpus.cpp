#include "malformed_corpus.h"

#include <cstring>
#include <functional>
#include <optional>

#include "tandem/bytes.h"
#include "tandem/model/gguf.h"
#include "tandem/model/synthetic.h"

namespace tandem::testing {
namespace {

// Value type ids (gguf ValueType) and tensor type ids (ggml) spelled out so the corpus does
// not depend on the code under test.
enum : uint32_t { kU8 = 0, kI8 = 1, kU16 = 2, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7 };
enum : uint32_t { kString = 8, kArray = 9, kU64 = 10, kF64 = 12 };
enum : uint32_t { kTypeF32 = 0, kTypeF16 = 1, kTypeQ4_0 = 2, kTypeQ8_0 = 8 };

class Bytes {
 public:
  template <class T>
  Bytes& put(T v) {
    size_t at = b_.size();
    b_.resize(at + sizeof(T));
    std::memcpy(b_.data() + at, &v, sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::vector<uint8_t>& v) {
    b_.insert(b_.end(), v.begin(), v.end());
    return *this;
  }
  std::vector<uint8_t> take() { return std::move(b_); }

 private:
  std::vector<uint8_t> b_;
};

struct RawKv {
  std::string key;
  uint32_t type;
  std::vector<uint8_t> value;  // the bytes after the type id
};

struct RawTensor {
  std::string name;
  uint32_t n_dims;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};

// A GGUF file described field by field; serialize() lays it out like the spec, and each
// malformed case changes one field (or the bytes afterwards).
struct RawFile {
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors;  // overrides tensors.size()
  std::optional<uint64_t> n_kv;       // overrides kvs.size()
  std::vector<RawKv> kvs;
  std::vector<RawTensor> tensors;
  size_t alignment = 32;
  size_t data_bytes = 0;  // size of the data section (filled with a pattern)

  std::vector<uint8_t> serialize() const {
    Bytes b;
    b.put(magic).put(version);
    b.put<uint64_t>(n_tensors.value_or(tensors.size()));
    b.put<uint64_t>(n_kv.value_or(kvs.size()));
    for (const auto& kv : kvs) b.str(kv.key).put(kv.type).raw(kv.value);
    for (const auto& t : tensors) {
      b.str(t.name).put(t.n_dims);
      for (uint64_t d : t.dims) b.put(d);
      b.put(t.type).put(t.offset);
    }
    std::vector<uint8_t> out = b.take();
    out.resize(align_up(out.size(), alignment), 0);
    for (size_t k = 0; k < data_bytes; ++k) out.push_back(uint8_t(k * 7 + 1));
    return out;
  }
};

template <class T>
std::vector<uint8_t> le(T v) {
  return Bytes().put(v).take();
}
std::vector<uint8_t> string_value(const std::string& s) {
  return Bytes().str(s).take();
}

RawFile base() {
  RawFile f;
  f.kvs.push_back({"general.architecture", kString, string_value("llama")});
  f.kvs.push_back({"general.name", kString, string_value("corpus")});
  f.kvs.push_back({"test.count", kU32, le<uint32_t>(7)});
  f.kvs.push_back({"test.flag", kBool, le<uint8_t>(1)});
  f.kvs.push_back({"test.scale", kF32, le<float>(0.5f)});
  f.kvs.push_back({"test.words", kArray,
                   Bytes().put(kString).put<uint64_t>(3).str("a").str("bc").str("def").take()});
  f.kvs.push_back({"test.numbers", kArray,
                   Bytes()
                       .put(kI32)
                       .put<uint64_t>(4)
                       .put<int32_t>(-1)
                       .put<int32_t>(2)
                       .put<int32_t>(3)
                       .put<int32_t>(4)
                       .take()});
  // Data section: f32 [8, 2] at 0 (64 B), q8_0 [32, 2] at 64 (68 B), f16 [5] at 160 (10 B),
  // q4_0 [32] at 192 (18 B).
  f.tensors.push_back({"w.f32", 2, {8, 2}, kTypeF32, 0});
  f.tensors.push_back({"w.q8_0", 2, {32, 2}, kTypeQ8_0, 64});
  f.tensors.push_back({"w.f16", 1, {5}, kTypeF16, 160});
  f.tensors.push_back({"w.q4_0", 1, {32}, kTypeQ4_0, 192});
  f.data_bytes = 210;
  return f;
}

// Appends a file made from the base by `mutate`, or by `mutate_bytes` on the serialized base.
struct CorpusBuilder {
  std::vector<CorpusFile> files;
  void add(std::string name, std::string mention, const std::function<void(RawFile&)>& mutate) {
    RawFile f = base();
    mutate(f);
    files.push_back({std::move(name) + ".gguf", f.serialize(), std::move(mention)});
  }
  void add_bytes(std::string name, std::string mention,
                 const std::function<void(std::vector<uint8_t>&)>& mutate) {
    std::vector<uint8_t> b = base().serialize();
    mutate(b);
    files.push_back({std::move(name) + ".gguf", std::move(b), std::move(mention)});
  }
};

RawKv& kv(RawFile& f, const std::string& key) {
  for (auto& e : f.kvs) {
    if (e.key == key) return e;
  }
  f.kvs.push_back({key, kU8, {}});
  return f.kvs.back();
}

}  // namespace

size_t first_tensor_info_offset() {
  RawFile f = base();
  f.tensors.clear();
  f.data_bytes = 0;
  f.alignment = 1;
  return f.serialize().size();
}

std::vector<uint8_t> valid_base_file() {
  return base().serialize();
}

std::vector<CorpusFile> malformed_corpus() {
  CorpusBuilder c;
  const uint64_t huge = uint64_t(1) << 62;
  // Header.
  c.add_bytes("empty", "header", [](auto& b) { b.clear(); });
  c.add_bytes("magic_truncated", "header", [](auto& b) { b.resize(3); });
  c.add("magic_wrong", "header", [](RawFile& f) { f.magic = 0x4c4d4747; });  // "GGML"
  c.add("version_1", "header", [](RawFile& f) { f.version = 1; });
  c.add("version_0", "header", [](RawFile& f) { f.version = 0; });
  c.add("version_4", "header", [](RawFile& f) { f.version = 4; });
  c.add("version_big_endian", "header", [](RawFile& f) { f.version = 0x03000000; });
  c.add_bytes("tensor_count_truncated", "header", [](auto& b) { b.resize(12); });
  c.add("tensor_count_huge", "header", [&](RawFile& f) { f.n_tensors = huge; });
  c.add("kv_count_huge", "header", [&](RawFile& f) { f.n_kv = huge; });
  c.add("kv_count_past_entries", "metadata entry 7", [](RawFile& f) {
    f.n_kv = f.kvs.size() + 1;
    f.tensors.clear();
    f.data_bytes = 0;
    f.alignment = 1;
  });
  // Keys.
  c.add("key_empty", "metadata entry 1", [](RawFile& f) { f.kvs[1].key.clear(); });
  c.add("key_duplicate", "key 'general.name'", [](RawFile& f) { f.kvs[2].key = "general.name"; });
  c.add("value_type_unknown", "key 'test.count'",
        [](RawFile& f) { kv(f, "test.count").type = 13; });
  c.add("value_type_max", "key 'test.count'",
        [](RawFile& f) { kv(f, "test.count").type = 0xffffffffu; });
  c.add("value_truncated", "key 'test.tail'", [](RawFile& f) {
    f.tensors.clear();
    f.data_bytes = 0;
    f.alignment = 1;
    f.kvs.push_back({"test.tail", kU64, {1, 2, 3}});
  });
  c.add("string_length_huge", "key 'general.name'",
        [&](RawFile& f) { kv(f, "general.name").value = le<uint64_t>(huge); });
  c.add("string_length_over_cap", "key 'general.name'",
        [](RawFile& f) { kv(f, "general.name").value = le<uint64_t>(2u << 20); });
  c.add("string_past_end", "key 'general.name'",
        [](RawFile& f) { kv(f, "general.name").value = le<uint64_t>(100000); });
  c.add("bool_value_2", "key 'test.flag'", [](RawFile& f) { kv(f, "test.flag").value = {2}; });
  c.add("array_count_huge", "key 'test.numbers'", [&](RawFile& f) {
    kv(f, "test.numbers").value = Bytes().put(kI32).put<uint64_t>(huge).take();
  });
  c.add("array_count_over_cap", "key 'test.numbers'", [](RawFile& f) {
    kv(f, "test.numbers").value = Bytes().put(kU8).put<uint64_t>((uint64_t(1) << 24) + 1).take();
  });
  c.add("array_past_end", "key 'test.numbers'", [](RawFile& f) {
    kv(f, "test.numbers").value = Bytes().put(kU32).put<uint64_t>(1000000).take();
  });
  c.add("array_nested", "key 'test.numbers'", [](RawFile& f) {
    kv(f, "test.numbers").value =
        Bytes().put(kArray).put<uint64_t>(1).put(kU8).put<uint64_t>(1).put<uint8_t>(0).take();
  });
  c.add("array_element_type_unknown", "key 'test.numbers'", [](RawFile& f) {
    kv(f, "test.numbers").value =
        Bytes().put<uint32_t>(99).put<uint64_t>(1).put<uint32_t>(0).take();
  });
  c.add("array_string_length_huge", "key 'test.words'", [&](RawFile& f) {
    kv(f, "test.words").value = Bytes().put(kString).put<uint64_t>(2).str("a").put(huge).take();
  });
  c.add("array_bool_value_9", "key 'test.bools'", [](RawFile& f) {
    f.kvs.push_back({"test.bools", kArray,
                     Bytes().put(kBool).put<uint64_t>(2).put<uint8_t>(1).put<uint8_t>(9).take()});
  });
  c.add("alignment_zero", "key 'general.alignment'", [](RawFile& f) {
    f.kvs.insert(f.kvs.begin(), {"general.alignment", kU32, le<uint32_t>(0)});
  });
  c.add("alignment_not_power_of_two", "key 'general.alignment'", [](RawFile& f) {
    f.kvs.insert(f.kvs.begin(), {"general.alignment", kU32, le<uint32_t>(48)});
  });
  c.add("alignment_over_cap", "key 'general.alignment'", [](RawFile& f) {
    f.kvs.insert(f.kvs.begin(), {"general.alignment", kU32, le<uint32_t>(2u << 20)});
  });
  c.add("alignment_wrong_type_u64", "key 'general.alignment'", [](RawFile& f) {
    f.kvs.insert(f.kvs.begin(), {"general.alignment", kU64, le<uint64_t>(32)});
  });
  c.add("alignment_wrong_type_string", "key 'general.alignment'", [](RawFile& f) {
    f.kvs.insert(f.kvs.begin(), {"general.alignment", kString, string_value("32")});
  });
  // Tensor infos.
  c.add("tensor_name_empty", "tensor info 1", [](RawFile& f) { f.tensors[1].name.clear(); });
  c.add("tensor_name_duplicate", "tensor 'w.f32'", [](RawFile& f) { f.tensors[2].name = "w.f32"; });
  c.add("tensor_count_past_entries", "tensor info 4", [](RawFile& f) {
    f.n_tensors = 5;
    f.data_bytes = 0;
  });
  c.add("tensor_dims_zero", "tensor 'w.f16'", [](RawFile& f) {
    f.tensors[2].n_dims = 0;
    f.tensors[2].dims.clear();
  });
  c.add("tensor_dims_five", "tensor 'w.f16'", [](RawFile& f) {
    f.tensors[2].n_dims = 5;
    f.tensors[2].dims = {5, 1, 1, 1, 1};
  });
  c.add("tensor_dim_zero", "tensor 'w.f32'", [](RawFile& f) { f.tensors[0].dims = {8, 0}; });
  c.add("tensor_dim_over_int64", "tensor 'w.f32'", [](RawFile& f) {
    f.tensors[0].dims = {8, uint64_t(1) << 63};
  });
  c.add("tensor_elements_overflow", "tensor 'w.f32'", [](RawFile& f) {
    f.tensors[0].n_dims = 3;
    f.tensors[0].dims = {uint64_t(1) << 32, uint64_t(1) << 31, 4};
  });
  c.add("tensor_bytes_overflow", "tensor 'w.f32'", [](RawFile& f) {
    f.tensors[0].dims = {uint64_t(1) << 31, uint64_t(1) << 31};
  });
  c.add("tensor_dims_short", "tensor 'w.only'", [](RawFile& f) {
    f.tensors = {{"w.only", 3, {8}, kTypeF32, 0}};
    f.data_bytes = 0;
  });
  c.add("tensor_dtype_q4_1", "tensor 'w.f16'", [](RawFile& f) { f.tensors[2].type = 3; });
  c.add("tensor_dtype_unknown", "tensor 'w.f16'", [](RawFile& f) { f.tensors[2].type = 1000; });
  c.add("tensor_block_misaligned", "tensor 'w.q8_0'", [](RawFile& f) {
    f.tensors[1].dims = {33, 2};
  });
  c.add("tensor_offset_unaligned", "tensor 'w.f16'", [](RawFile& f) { f.tensors[2].offset = 164; });
  c.add("tensor_offset_past_end", "tensor 'w.q4_0'",
        [](RawFile& f) { f.tensors[3].offset = 4096; });
  c.add("tensor_data_past_end", "tensor 'w.q4_0'", [](RawFile& f) { f.data_bytes = 209; });
  c.add("tensor_offset_wraps", "tensor 'w.q4_0'",
        [](RawFile& f) { f.tensors[3].offset = ~uint64_t(0) - 31; });
  c.add("tensor_overlap", "tensor 'w.q8_0'", [](RawFile& f) { f.tensors[1].offset = 32; });
  c.add("tensor_same_offset", "w.f32", [](RawFile& f) { f.tensors[2].offset = 0; });
  c.add("tensor_offset_misaligned_for_64", "tensor 'w.f16'", [](RawFile& f) {
    f.kvs.insert(f.kvs.begin(), {"general.alignment", kU32, le<uint32_t>(64)});
    f.alignment = 64;
  });
  c.add("data_section_missing", "data section", [](RawFile& f) {
    f.data_bytes = 0;
    f.alignment = 1;  // no padding after the infos either: the file ends there
  });
  c.add_bytes("truncated_in_tensor_info", "tensor 'w.q4_0'", [](auto& b) {
    RawFile f = base();
    f.data_bytes = 0;
    f.alignment = 1;
    b = f.serialize();
    b.resize(b.size() - 6);  // inside the last offset field
  });
  // Files cut or patched at a computed position.
  {
    RawFile f = base();
    f.kvs.resize(2);
    f.tensors.clear();
    f.data_bytes = 0;
    f.alignment = 1;
    f.n_kv = 3;
    std::vector<uint8_t> b = Bytes().raw(f.serialize()).put(huge).raw({'x', 'y', 'z'}).take();
    c.files.push_back({"key_length_huge.gguf", std::move(b), "metadata entry 2"});
  }
  c.add_bytes("key_too_long", "metadata entry 0", [](auto& b) {
    uint64_t len = 70000;  // the first key's length field follows the 24-byte header
    std::memcpy(b.data() + 24, &len, 8);
  });
  c.add_bytes("tensor_name_too_long", "tensor info 0", [](auto& b) {
    uint64_t len = 70000;
    std::memcpy(b.data() + first_tensor_info_offset(), &len, 8);
  });
  {
    RawFile f = base();
    f.data_bytes = 0;
    f.alignment = 1;
    f.tensors.pop_back();
    f.n_tensors = 4;
    std::vector<uint8_t> b =
        Bytes().raw(f.serialize()).str("w.cut").put<uint32_t>(2).put<uint32_t>(8).take();
    c.files.push_back({"truncated_in_dims.gguf", std::move(b), "tensor 'w.cut'"});
  }
  return c.files;
}

std::vector<CorpusFile> fuzz_seed_corpus() {
  std::vector<CorpusFile> seeds;
  seeds.push_back({"valid_base.gguf", base().serialize(), ""});
  RawFile v2 = base();
  v2.version = 2;
  seeds.push_back({"valid_v2.gguf", v2.serialize(), ""});
  RawFile a64 = base();
  a64.kvs.insert(a64.kvs.begin(), {"general.alignment", kU32, le<uint32_t>(64)});
  a64.alignment = 64;
  a64.tensors[1].offset = 64;
  a64.tensors[2].offset = 192;
  a64.tensors[3].offset = 256;
  a64.data_bytes = 274;
  seeds.push_back({"valid_align64.gguf", a64.serialize(), ""});
  RawFile empty = base();
  empty.tensors.clear();
  empty.data_bytes = 0;
  seeds.push_back({"valid_no_tensors.gguf", empty.serialize(), ""});
  // A small llama model so the fuzzer reaches LlamaConfig's checks too.
  SyntheticSpec spec;
  spec.name = "fuzz-seed";
  spec.n_vocab = 260;
  spec.n_embd = 32;
  spec.n_layer = 1;
  spec.n_ff = 64;
  spec.n_head = 2;
  spec.n_head_kv = 1;
  spec.context_length = 64;
  spec.dtype = DType::Q4_0;
  spec.seed = 7;
  seeds.push_back({"llama_q4_0.gguf", make_synthetic_writer(spec).to_bytes(), ""});
  return seeds;
}

}  // namespace tandem::testing
