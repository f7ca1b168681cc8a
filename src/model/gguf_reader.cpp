// GGUF reader: every read checks the bytes left, every count and size is capped or checked for
// overflow before anything is allocated, and every failure names the key or tensor and offset.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>

#include "mapped_file.h"
#include "tandem/bytes.h"
#include "tandem/error.h"
#include "tandem/model/gguf.h"

namespace tandem::gguf {

std::string_view value_type_name(ValueType type) {
  switch (type) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::Bool:
      return "bool";
    case ValueType::String:
      return "string";
    case ValueType::Array:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "unknown";
}

std::optional<DType> dtype_from_gguf(uint32_t ggml_type) {
  for (const TensorTypeId& t : kTensorTypes) {
    if (uint32_t(t.id) == ggml_type) return t.dtype;
  }
  return std::nullopt;
}

uint32_t dtype_to_gguf(DType dtype) {
  for (const TensorTypeId& t : kTensorTypes) {
    if (t.dtype == dtype) return uint32_t(t.id);
  }
  throw_error(ErrorCode::InvalidArgument, "gguf", "dtype has no GGUF id");
}

namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using NameIndex = std::unordered_map<std::string, size_t, StringHash, std::equal_to<>>;

bool is_numeric_type(ValueType t) {
  return t != ValueType::String && t != ValueType::Array;
}

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::Bool:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    case ValueType::String:
    case ValueType::Array:
      return 0;
  }
  return 0;
}

// A bounds-checked little-endian reader over the file's bytes. `subject` names what is being
// read ("header", "key 'x'", "tensor 'y'") so every error carries it with the offset.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& where) : bytes_(bytes), where_(where) {}

  size_t pos() const { return pos_; }
  size_t size() const { return bytes_.size(); }
  size_t remaining() const { return bytes_.size() - pos_; }

  [[noreturn]] void fail(std::string_view subject, uint64_t offset, const std::string& what) const {
    throw_error(ErrorCode::Format, where_,
                std::string(subject) + " at offset " + std::to_string(offset) + ": " + what);
  }

  void need(size_t n, std::string_view subject, std::string_view what) const {
    if (n > remaining()) {
      fail(subject, pos_,
           "truncated " + std::string(what) + " (needs " + std::to_string(n) + " bytes, " +
               std::to_string(remaining()) + " left)");
    }
  }

  template <class T>
  T read(std::string_view subject, std::string_view what) {
    need(sizeof(T), subject, what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view subject, std::string_view what, size_t cap) {
    size_t at = pos_;
    uint64_t len = read<uint64_t>(subject, what);
    if (len > cap) {
      fail(subject, at,
           std::string(what) + " length " + std::to_string(len) + " exceeds the limit of " +
               std::to_string(cap) + " bytes");
    }
    need(size_t(len), subject, what);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), size_t(len));
    pos_ += size_t(len);
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& where_;
  size_t pos_ = 0;
};

}  // namespace

struct File::Impl {
  std::optional<model::MappedFile> mapping;
  std::string path;
  std::string where;
  uint32_t version = 0;
  size_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;
  std::vector<std::pair<std::string, Value>> metadata;
  std::vector<uint64_t> key_offsets;
  NameIndex key_index;
  std::vector<TensorInfo> tensors;
  NameIndex tensor_index;

  void parse(std::span<const uint8_t> bytes);
  Value read_value(Cursor& c, ValueType type, const std::string& subject, uint64_t& budget);
  const Value& require(std::string_view key) const;
  [[noreturn]] void wrong_type(std::string_view key, const Value& v, std::string_view want) const;
};

namespace {

void charge(Cursor& c, const std::string& subject, uint64_t& budget, uint64_t bytes) {
  if (bytes > budget) {
    c.fail(subject, c.pos(),
           "metadata exceeds the limit of " + std::to_string(kMaxMetadataBytes) + " bytes");
  }
  budget -= bytes;
}

ValueType read_value_type(Cursor& c, const std::string& subject, std::string_view what) {
  size_t at = c.pos();
  uint32_t raw = c.read<uint32_t>(subject, what);
  if (raw > uint32_t(ValueType::F64))
    c.fail(subject, at, "unknown value type " + std::to_string(raw));
  return ValueType(raw);
}

// Reads one scalar of `type` into a widened Value.
void read_scalar(Cursor& c, ValueType type, const std::string& subject, Value& v) {
  size_t at = c.pos();
  auto set_unsigned = [&v](uint64_t x) {
    v.u = x;
    v.i = int64_t(x);
  };
  auto set_signed = [&v](int64_t x) {
    v.i = x;
    v.u = uint64_t(x);
  };
  switch (type) {
    case ValueType::U8:
      set_unsigned(c.read<uint8_t>(subject, "u8"));
      break;
    case ValueType::I8:
      set_signed(c.read<int8_t>(subject, "i8"));
      break;
    case ValueType::U16:
      set_unsigned(c.read<uint16_t>(subject, "u16"));
      break;
    case ValueType::I16:
      set_signed(c.read<int16_t>(subject, "i16"));
      break;
    case ValueType::U32:
      set_unsigned(c.read<uint32_t>(subject, "u32"));
      break;
    case ValueType::I32:
      set_signed(c.read<int32_t>(subject, "i32"));
      break;
    case ValueType::U64:
      set_unsigned(c.read<uint64_t>(subject, "u64"));
      break;
    case ValueType::I64:
      set_signed(c.read<int64_t>(subject, "i64"));
      break;
    case ValueType::F32:
      v.f = c.read<float>(subject, "f32");
      break;
    case ValueType::F64:
      v.f = c.read<double>(subject, "f64");
      break;
    case ValueType::Bool: {
      uint8_t b = c.read<uint8_t>(subject, "bool");
      if (b > 1) c.fail(subject, at, "bool value " + std::to_string(b) + " is not 0 or 1");
      set_unsigned(b);
      break;
    }
    case ValueType::String:
    case ValueType::Array:
      c.fail(subject, at, "internal: not a scalar type");
  }
}

double widened(const Value& v, ValueType type) {
  switch (type) {
    case ValueType::F32:
    case ValueType::F64:
      return v.f;
    case ValueType::I8:
    case ValueType::I16:
    case ValueType::I32:
    case ValueType::I64:
      return double(v.i);
    default:
      return double(v.u);
  }
}

}  // namespace

Value File::Impl::read_value(Cursor& c, ValueType type, const std::string& subject,
                             uint64_t& budget) {
  Value v;
  v.type = type;
  if (type == ValueType::String) {
    v.str = c.read_string(subject, "string value", kMaxStringBytes);
    charge(c, subject, budget, v.str.size() + sizeof(Value));
    return v;
  }
  if (type != ValueType::Array) {
    read_scalar(c, type, subject, v);
    charge(c, subject, budget, sizeof(Value));
    return v;
  }
  charge(c, subject, budget, sizeof(Value));
  v.array_type = read_value_type(c, subject, "array element type");
  size_t count_at = c.pos();
  uint64_t count = c.read<uint64_t>(subject, "array count");
  if (v.array_type == ValueType::Array)
    c.fail(subject, count_at - 4, "nested arrays are not supported");
  if (count > kMaxArrayElements) {
    c.fail(subject, count_at,
           "array count " + std::to_string(count) + " exceeds the limit of " +
               std::to_string(kMaxArrayElements));
  }
  // Every element takes at least this many bytes in the file: checked before reserving.
  size_t min_element = v.array_type == ValueType::String ? 8 : scalar_size(v.array_type);
  if (count * min_element > c.remaining()) {
    c.fail(subject, count_at,
           "array of " + std::to_string(count) + " " + std::string(value_type_name(v.array_type)) +
               " needs at least " + std::to_string(count * min_element) + " bytes, " +
               std::to_string(c.remaining()) + " left");
  }
  if (v.array_type == ValueType::String) {
    charge(c, subject, budget, count * sizeof(std::string));
    v.strings.reserve(size_t(count));
    for (uint64_t k = 0; k < count; ++k) {
      v.strings.push_back(c.read_string(subject, "string element", kMaxStringBytes));
      charge(c, subject, budget, v.strings.back().size());
    }
  } else {
    charge(c, subject, budget, count * sizeof(double));
    v.numbers.reserve(size_t(count));
    Value scalar;
    for (uint64_t k = 0; k < count; ++k) {
      read_scalar(c, v.array_type, subject, scalar);
      v.numbers.push_back(widened(scalar, v.array_type));
    }
  }
  return v;
}

void File::Impl::parse(std::span<const uint8_t> bytes) {
  Cursor c(bytes, where);
  const std::string header = "header";
  uint32_t magic = c.read<uint32_t>(header, "magic");
  if (magic != kMagic) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08x", magic);
    c.fail(header, 0, std::string("bad magic ") + hex + " (expected \"GGUF\")");
  }
  version = c.read<uint32_t>(header, "version");
  if (version == 1) c.fail(header, 4, "version 1 is not supported (only 2 and 3)");
  if (version == 0x02000000u || version == 0x03000000u)
    c.fail(header, 4, "big-endian GGUF is not supported");
  if (version != 2 && version != 3)
    c.fail(header, 4, "unsupported version " + std::to_string(version) + " (only 2 and 3)");
  uint64_t n_tensors = c.read<uint64_t>(header, "tensor count");
  uint64_t n_keys = c.read<uint64_t>(header, "metadata count");
  // A key entry takes at least 8 (length) + 1 (name) + 4 (type) + 1 (value) bytes; a tensor
  // info 8 + 1 + 4 + 8 + 4 + 8. Checking both against the file bounds every reserve below.
  if (n_keys > kMaxKeys || n_keys * 14 > c.remaining()) {
    c.fail(header, 16,
           "metadata count " + std::to_string(n_keys) + " is impossible for a file of " +
               std::to_string(c.size()) + " bytes");
  }
  if (n_tensors > kMaxTensors || n_tensors * 33 > c.remaining()) {
    c.fail(header, 8,
           "tensor count " + std::to_string(n_tensors) + " is impossible for a file of " +
               std::to_string(c.size()) + " bytes");
  }

  uint64_t budget = kMaxMetadataBytes;
  metadata.reserve(size_t(n_keys));
  key_offsets.reserve(size_t(n_keys));
  for (uint64_t k = 0; k < n_keys; ++k) {
    size_t at = c.pos();
    std::string entry = "metadata entry " + std::to_string(k);
    std::string key = c.read_string(entry, "key", kMaxNameBytes);
    if (key.empty()) c.fail(entry, at, "empty key");
    std::string subject = "key '" + key + "'";
    if (key_index.count(key) != 0) c.fail(subject, at, "duplicate key");
    ValueType type = read_value_type(c, subject, "value type");
    Value value = read_value(c, type, subject, budget);
    if (key == "general.alignment") {
      if (type != ValueType::U32) {
        c.fail(subject, at, "must be u32, not " + std::string(value_type_name(type)));
      }
      if (value.u == 0 || (value.u & (value.u - 1)) != 0 || value.u > kMaxAlignment) {
        c.fail(subject, at,
               "alignment " + std::to_string(value.u) + " is not a power of two in [1, " +
                   std::to_string(kMaxAlignment) + "]");
      }
      alignment = size_t(value.u);
    }
    key_index.emplace(key, metadata.size());
    key_offsets.push_back(at);
    metadata.emplace_back(std::move(key), std::move(value));
  }

  std::vector<uint64_t> info_offsets;
  tensors.reserve(size_t(n_tensors));
  info_offsets.reserve(size_t(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    size_t at = c.pos();
    std::string entry = "tensor info " + std::to_string(k);
    TensorInfo t;
    t.name = c.read_string(entry, "tensor name", kMaxNameBytes);
    if (t.name.empty()) c.fail(entry, at, "empty tensor name");
    std::string subject = "tensor '" + t.name + "'";
    if (tensor_index.count(t.name) != 0) c.fail(subject, at, "duplicate tensor name");
    size_t dims_at = c.pos();
    uint32_t n_dims = c.read<uint32_t>(subject, "dim count");
    if (n_dims < 1 || n_dims > uint32_t(kMaxDims)) {
      c.fail(subject, dims_at, "dim count " + std::to_string(n_dims) + " is not in [1, 4]");
    }
    t.n_dims = int(n_dims);
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      size_t dim_at = c.pos();
      uint64_t n = c.read<uint64_t>(subject, "dim");
      if (n == 0 || n > uint64_t(std::numeric_limits<int64_t>::max())) {
        c.fail(subject, dim_at, "dim " + std::to_string(d) + " is " + std::to_string(n));
      }
      t.ne[d] = int64_t(n);
      if (__builtin_mul_overflow(elements, t.ne[d], &elements)) {
        c.fail(subject, dim_at, "element count overflows 64 bits");
      }
    }
    size_t type_at = c.pos();
    uint32_t ggml_type = c.read<uint32_t>(subject, "dtype");
    auto dtype = dtype_from_gguf(ggml_type);
    if (!dtype)
      c.fail(subject, type_at, "unknown or unsupported dtype id " + std::to_string(ggml_type));
    t.dtype = *dtype;
    const auto& traits = dtype_traits(t.dtype);
    if (t.ne[0] % traits.block_elements != 0) {
      c.fail(subject, dims_at,
             "dim 0 (" + std::to_string(t.ne[0]) + ") is not a multiple of the " +
                 std::string(traits.name) + " block (" + std::to_string(traits.block_elements) +
                 ")");
    }
    int64_t byte_size = 0;
    if (__builtin_mul_overflow(elements / traits.block_elements, traits.block_bytes, &byte_size)) {
      c.fail(subject, dims_at, "byte size overflows 64 bits");
    }
    t.bytes = size_t(byte_size);
    size_t offset_at = c.pos();
    t.offset = c.read<uint64_t>(subject, "data offset");
    if (t.offset % alignment != 0) {
      c.fail(subject, offset_at,
             "data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                 std::to_string(alignment));
    }
    tensor_index.emplace(t.name, tensors.size());
    tensors.push_back(std::move(t));
    info_offsets.push_back(at);
  }

  // The data section starts at the next multiple of the alignment after the tensor infos.
  uint64_t end_of_infos = c.pos();
  data_offset = align_up(end_of_infos, alignment);
  if (!tensors.empty() && data_offset > bytes.size()) {
    c.fail("data section", end_of_infos,
           "starts at " + std::to_string(data_offset) + ", beyond the end of the file (" +
               std::to_string(bytes.size()) + " bytes)");
  }
  uint64_t data_size = tensors.empty() ? 0 : bytes.size() - data_offset;
  for (size_t k = 0; k < tensors.size(); ++k) {
    auto& t = tensors[k];
    if (t.offset > data_size || t.bytes > data_size - t.offset) {
      c.fail("tensor '" + t.name + "'", info_offsets[k],
             "data [" + std::to_string(t.offset) + ", +" + std::to_string(t.bytes) +
                 ") lies outside the data section (" + std::to_string(data_size) + " bytes at " +
                 std::to_string(data_offset) + ")");
    }
    t.data = bytes.data() + data_offset + t.offset;
  }
  std::vector<size_t> order(tensors.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const auto& prev = tensors[order[k - 1]];
    const auto& cur = tensors[order[k]];
    if (prev.offset + prev.bytes > cur.offset) {
      c.fail("tensor '" + cur.name + "'", info_offsets[order[k]],
             "data at " + std::to_string(cur.offset) + " overlaps tensor '" + prev.name + "' [" +
                 std::to_string(prev.offset) + ", +" + std::to_string(prev.bytes) + ")");
    }
  }
}

const Value& File::Impl::require(std::string_view key) const {
  auto it = key_index.find(key);
  if (it == key_index.end()) {
    throw_error(ErrorCode::Format, where, "missing key '" + std::string(key) + "'");
  }
  return metadata[it->second].second;
}

void File::Impl::wrong_type(std::string_view key, const Value& v, std::string_view want) const {
  std::string have(value_type_name(v.type));
  if (v.type == ValueType::Array) have = "array of " + std::string(value_type_name(v.array_type));
  auto it = key_index.find(key);
  throw_error(ErrorCode::Format, where,
              "key '" + std::string(key) + "' at offset " +
                  std::to_string(key_offsets[it->second]) + ": is " + have + ", expected " +
                  std::string(want));
}

File::File(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

File File::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->where = "gguf " + path;
  impl->mapping.emplace(path);
  impl->parse(impl->mapping->bytes());
  return File(std::move(impl));
}

File File::parse(std::span<const uint8_t> bytes, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  impl->where = "gguf " + impl->path;
  impl->parse(bytes);
  return File(std::move(impl));
}

uint32_t File::version() const {
  return impl_->version;
}
size_t File::alignment() const {
  return impl_->alignment;
}
const std::string& File::path() const {
  return impl_->path;
}
uint64_t File::data_offset() const {
  return impl_->data_offset;
}

const std::vector<std::pair<std::string, Value>>& File::metadata() const {
  return impl_->metadata;
}

bool File::has(std::string_view key) const {
  return impl_->key_index.count(key) != 0;
}

const Value* File::find(std::string_view key) const {
  auto it = impl_->key_index.find(key);
  return it == impl_->key_index.end() ? nullptr : &impl_->metadata[it->second].second;
}

uint64_t File::key_offset(std::string_view key) const {
  auto it = impl_->key_index.find(key);
  return it == impl_->key_index.end() ? 0 : impl_->key_offsets[it->second];
}

std::string File::get_string(std::string_view key) const {
  const Value& v = impl_->require(key);
  if (v.type != ValueType::String) impl_->wrong_type(key, v, "string");
  return v.str;
}

uint64_t File::get_uint(std::string_view key) const {
  const Value& v = impl_->require(key);
  switch (v.type) {
    case ValueType::U8:
    case ValueType::U16:
    case ValueType::U32:
    case ValueType::U64:
      return v.u;
    case ValueType::I8:
    case ValueType::I16:
    case ValueType::I32:
    case ValueType::I64:
      if (v.i >= 0) return uint64_t(v.i);
      impl_->wrong_type(key, v, "a non-negative integer (value " + std::to_string(v.i) + ")");
    default:
      impl_->wrong_type(key, v, "an unsigned integer");
  }
}

int64_t File::get_int(std::string_view key) const {
  const Value& v = impl_->require(key);
  switch (v.type) {
    case ValueType::I8:
    case ValueType::I16:
    case ValueType::I32:
    case ValueType::I64:
      return v.i;
    case ValueType::U8:
    case ValueType::U16:
    case ValueType::U32:
    case ValueType::U64:
      if (v.u <= uint64_t(std::numeric_limits<int64_t>::max())) return int64_t(v.u);
      impl_->wrong_type(key, v, "an integer that fits i64 (value " + std::to_string(v.u) + ")");
    default:
      impl_->wrong_type(key, v, "an integer");
  }
}

double File::get_float(std::string_view key) const {
  const Value& v = impl_->require(key);
  if (v.type != ValueType::F32 && v.type != ValueType::F64) impl_->wrong_type(key, v, "f32 or f64");
  return v.f;
}

bool File::get_bool(std::string_view key) const {
  const Value& v = impl_->require(key);
  if (v.type != ValueType::Bool) impl_->wrong_type(key, v, "bool");
  return v.u != 0;
}

const std::vector<std::string>& File::get_string_array(std::string_view key) const {
  const Value& v = impl_->require(key);
  if (v.type != ValueType::Array || v.array_type != ValueType::String) {
    impl_->wrong_type(key, v, "array of string");
  }
  return v.strings;
}

const std::vector<double>& File::get_number_array(std::string_view key) const {
  const Value& v = impl_->require(key);
  if (v.type != ValueType::Array || !is_numeric_type(v.array_type)) {
    impl_->wrong_type(key, v, "array of numbers");
  }
  return v.numbers;
}

const std::vector<TensorInfo>& File::tensors() const {
  return impl_->tensors;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

}  // namespace tandem::gguf
