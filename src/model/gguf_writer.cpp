// GGUF v3 writer. The header is serialized in memory; tensor data goes straight into a mapped,
// pre-sized output file, so a lazily generated tensor is never staged in a second buffer.
#include <cmath>
#include <cstring>
#include <limits>

#include "mapped_file.h"
#include "tandem/bytes.h"
#include "tandem/error.h"
#include "tandem/model/gguf.h"

namespace tandem::gguf {

Value Value::make_u32(uint32_t v) {
  Value x;
  x.type = ValueType::U32;
  x.u = v;
  x.i = v;
  return x;
}
Value Value::make_i32(int32_t v) {
  Value x;
  x.type = ValueType::I32;
  x.i = v;
  x.u = uint64_t(int64_t(v));
  return x;
}
Value Value::make_u64(uint64_t v) {
  Value x;
  x.type = ValueType::U64;
  x.u = v;
  x.i = int64_t(v);
  return x;
}
Value Value::make_i64(int64_t v) {
  Value x;
  x.type = ValueType::I64;
  x.i = v;
  x.u = uint64_t(v);
  return x;
}
Value Value::make_f32(float v) {
  Value x;
  x.type = ValueType::F32;
  x.f = v;
  return x;
}
Value Value::make_f64(double v) {
  Value x;
  x.type = ValueType::F64;
  x.f = v;
  return x;
}
Value Value::make_bool(bool v) {
  Value x;
  x.type = ValueType::Bool;
  x.u = v ? 1 : 0;
  x.i = x.u;
  return x;
}
Value Value::make_string(std::string v) {
  Value x;
  x.type = ValueType::String;
  x.str = std::move(v);
  return x;
}
Value Value::make_string_array(std::vector<std::string> v) {
  Value x;
  x.type = ValueType::Array;
  x.array_type = ValueType::String;
  x.strings = std::move(v);
  return x;
}
Value Value::make_number_array(ValueType element_type, std::vector<double> v) {
  Value x;
  x.type = ValueType::Array;
  x.array_type = element_type;
  x.numbers = std::move(v);
  return x;
}

struct Writer::Pending {
  std::string name;
  DType dtype = DType::F32;
  int n_dims = 1;
  Dims ne{1, 1, 1, 1};
  size_t bytes = 0;
  std::vector<uint8_t> data;
  std::function<void(uint8_t*, size_t)> fill;
};

namespace {

const std::string kWhere = "gguf writer";

class Sink {
 public:
  template <class T>
  void put(T v) {
    size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

void check_name(const std::string& name, std::string_view what) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    throw_error(ErrorCode::InvalidArgument, kWhere,
                std::string(what) + " name length " + std::to_string(name.size()) +
                    " is not in [1, " + std::to_string(kMaxNameBytes) + "]");
  }
}

// Integer range and integrality of a number stored in a typed slot.
// (max + 1 is exact for the small types and rounds to 2^63 / 2^64 for the 64-bit ones, so the
// cast below is always defined.)
template <class T>
T checked_number(double x, const std::string& key) {
  if (!(x >= double(std::numeric_limits<T>::lowest()) &&
        x < double(std::numeric_limits<T>::max()) + 1.0) ||
      double(T(x)) != x) {
    throw_error(ErrorCode::InvalidArgument, kWhere,
                "key '" + key + "': value " + std::to_string(x) + " does not fit its type");
  }
  return T(x);
}

template <class T>
T checked_int(uint64_t u, int64_t i, bool is_signed, const std::string& key) {
  if (is_signed) {
    if (i < int64_t(std::numeric_limits<T>::lowest()) ||
        (i > 0 && uint64_t(i) > uint64_t(std::numeric_limits<T>::max()))) {
      throw_error(ErrorCode::InvalidArgument, kWhere,
                  "key '" + key + "': value " + std::to_string(i) + " does not fit its type");
    }
    return T(i);
  }
  if (u > uint64_t(std::numeric_limits<T>::max())) {
    throw_error(ErrorCode::InvalidArgument, kWhere,
                "key '" + key + "': value " + std::to_string(u) + " does not fit its type");
  }
  return T(u);
}

void put_scalar(Sink& s, ValueType t, uint64_t u, int64_t i, double f, const std::string& key) {
  switch (t) {
    case ValueType::U8:
      s.put(checked_int<uint8_t>(u, i, false, key));
      break;
    case ValueType::I8:
      s.put(checked_int<int8_t>(u, i, true, key));
      break;
    case ValueType::U16:
      s.put(checked_int<uint16_t>(u, i, false, key));
      break;
    case ValueType::I16:
      s.put(checked_int<int16_t>(u, i, true, key));
      break;
    case ValueType::U32:
      s.put(checked_int<uint32_t>(u, i, false, key));
      break;
    case ValueType::I32:
      s.put(checked_int<int32_t>(u, i, true, key));
      break;
    case ValueType::U64:
      s.put(u);
      break;
    case ValueType::I64:
      s.put(i);
      break;
    case ValueType::F32:
      s.put(float(f));
      break;
    case ValueType::F64:
      s.put(f);
      break;
    case ValueType::Bool:
      s.put(uint8_t(u != 0 ? 1 : 0));
      break;
    case ValueType::String:
    case ValueType::Array:
      throw_error(ErrorCode::InvalidArgument, kWhere, "key '" + key + "': not a scalar type");
  }
}

void put_array_number(Sink& s, ValueType t, double x, const std::string& key) {
  switch (t) {
    case ValueType::U8:
      s.put(checked_number<uint8_t>(x, key));
      break;
    case ValueType::I8:
      s.put(checked_number<int8_t>(x, key));
      break;
    case ValueType::U16:
      s.put(checked_number<uint16_t>(x, key));
      break;
    case ValueType::I16:
      s.put(checked_number<int16_t>(x, key));
      break;
    case ValueType::U32:
      s.put(checked_number<uint32_t>(x, key));
      break;
    case ValueType::I32:
      s.put(checked_number<int32_t>(x, key));
      break;
    case ValueType::U64:
      s.put(checked_number<uint64_t>(x, key));
      break;
    case ValueType::I64:
      s.put(checked_number<int64_t>(x, key));
      break;
    case ValueType::F32:
      s.put(float(x));
      break;
    case ValueType::F64:
      s.put(x);
      break;
    case ValueType::Bool:
      s.put(uint8_t(x != 0.0 ? 1 : 0));
      break;
    case ValueType::String:
    case ValueType::Array:
      throw_error(ErrorCode::InvalidArgument, kWhere, "key '" + key + "': bad array element type");
  }
}

void put_value(Sink& s, const std::string& key, const Value& v) {
  s.put(uint32_t(v.type));
  if (v.type == ValueType::String) {
    if (v.str.size() > kMaxStringBytes) {
      throw_error(ErrorCode::InvalidArgument, kWhere, "key '" + key + "': string too long");
    }
    s.put_string(v.str);
  } else if (v.type == ValueType::Array) {
    s.put(uint32_t(v.array_type));
    if (v.array_type == ValueType::String) {
      s.put<uint64_t>(v.strings.size());
      for (const auto& str : v.strings) {
        if (str.size() > kMaxStringBytes) {
          throw_error(ErrorCode::InvalidArgument, kWhere, "key '" + key + "': string too long");
        }
        s.put_string(str);
      }
    } else {
      s.put<uint64_t>(v.numbers.size());
      for (double x : v.numbers) put_array_number(s, v.array_type, x, key);
    }
  } else {
    put_scalar(s, v.type, v.u, v.i, v.f, key);
  }
}

}  // namespace

Writer::Writer(size_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kMaxAlignment) {
    throw_error(ErrorCode::InvalidArgument, kWhere,
                "alignment " + std::to_string(alignment) + " is not a power of two in [1, " +
                    std::to_string(kMaxAlignment) + "]");
  }
  if (alignment != kDefaultAlignment)
    set("general.alignment", Value::make_u32(uint32_t(alignment)));
}

void Writer::set(std::string key, Value value) {
  check_name(key, "key");
  if (value.type > ValueType::F64 ||
      (value.type == ValueType::Array &&
       (value.array_type == ValueType::Array || value.array_type > ValueType::F64))) {
    throw_error(ErrorCode::InvalidArgument, kWhere, "key '" + key + "': invalid value type");
  }
  if (key == "general.alignment" &&
      (value.type != ValueType::U32 || value.u != uint64_t(alignment_))) {
    throw_error(ErrorCode::InvalidArgument, kWhere,
                "general.alignment must be the writer's alignment as u32 (" +
                    std::to_string(alignment_) + ")");
  }
  for (auto& [k, v] : metadata_) {
    if (k == key) {  // replaced in place: the first insertion fixes the order
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

void Writer::set_string(std::string key, std::string value) {
  set(std::move(key), Value::make_string(std::move(value)));
}
void Writer::set_u32(std::string key, uint32_t value) {
  set(std::move(key), Value::make_u32(value));
}
void Writer::set_i32(std::string key, int32_t value) {
  set(std::move(key), Value::make_i32(value));
}
void Writer::set_f32(std::string key, float value) {
  set(std::move(key), Value::make_f32(value));
}
void Writer::set_bool(std::string key, bool value) {
  set(std::move(key), Value::make_bool(value));
}
void Writer::set_string_array(std::string key, std::vector<std::string> values) {
  set(std::move(key), Value::make_string_array(std::move(values)));
}
void Writer::set_f32_array(std::string key, std::vector<float> values) {
  set(std::move(key), Value::make_number_array(ValueType::F32, {values.begin(), values.end()}));
}
void Writer::set_i32_array(std::string key, std::vector<int32_t> values) {
  set(std::move(key), Value::make_number_array(ValueType::I32, {values.begin(), values.end()}));
}

void Writer::add_tensor(std::string name, DType dtype, std::span<const int64_t> ne,
                        std::span<const uint8_t> bytes) {
  add_tensor_lazy(std::move(name), dtype, ne, nullptr);
  auto& p = *tensors_.back();
  if (bytes.size() != p.bytes) {
    std::string n = p.name;
    size_t want = p.bytes;
    tensors_.pop_back();
    throw_error(ErrorCode::InvalidArgument, kWhere,
                "tensor '" + n + "': " + std::to_string(bytes.size()) +
                    " bytes given, shape needs " + std::to_string(want));
  }
  p.data.assign(bytes.begin(), bytes.end());
}

void Writer::add_tensor_lazy(std::string name, DType dtype, std::span<const int64_t> ne,
                             std::function<void(uint8_t* dst, size_t bytes)> fill) {
  check_name(name, "tensor");
  std::string subject = "tensor '" + name + "'";
  for (const auto& t : tensors_) {
    if (t->name == name)
      throw_error(ErrorCode::InvalidArgument, kWhere, subject + ": duplicate name");
  }
  if (ne.empty() || ne.size() > size_t(kMaxDims)) {
    throw_error(ErrorCode::InvalidArgument, kWhere,
                subject + ": needs 1 to 4 dims (got " + std::to_string(ne.size()) + ")");
  }
  auto p = std::make_shared<Pending>();
  p->name = std::move(name);
  p->dtype = dtype;
  p->n_dims = int(ne.size());
  for (size_t d = 0; d < ne.size(); ++d) p->ne[d] = ne[d];
  try {
    TensorDesc desc = make_tensor_desc(p->name, dtype, p->ne, p->n_dims);
    p->bytes = desc.bytes();
  } catch (const Error& e) {
    throw_error(ErrorCode::InvalidArgument, kWhere, subject + ": " + e.message());
  }
  dtype_to_gguf(dtype);  // every Tandem dtype has an id; checked so a new one cannot slip by
  p->fill = std::move(fill);
  tensors_.push_back(std::move(p));
}

namespace {

struct Layout {
  std::vector<uint8_t> header;  // everything before the data section, padded
  std::vector<size_t> offsets;  // per tensor, relative to the data section
  size_t total = 0;
};

// Serializes the header and places each tensor at the next multiple of the alignment.
// (Templates, so these helpers need not name the writer's private Pending type.)
template <class Tensors>
Layout make_layout(size_t alignment, const std::vector<std::pair<std::string, Value>>& metadata,
                   const Tensors& tensors) {
  Layout layout;
  size_t data_size = 0;
  for (const auto& t : tensors) {
    layout.offsets.push_back(data_size);
    data_size = align_up(data_size + t->bytes, alignment);
  }
  Sink s;
  s.put(kMagic);
  s.put(kWriteVersion);
  s.put<uint64_t>(tensors.size());
  s.put<uint64_t>(metadata.size());
  for (const auto& [key, value] : metadata) {
    s.put_string(key);
    put_value(s, key, value);
  }
  for (size_t k = 0; k < tensors.size(); ++k) {
    const auto& t = *tensors[k];
    s.put_string(t.name);
    s.put(uint32_t(t.n_dims));
    for (int d = 0; d < t.n_dims; ++d) s.put(uint64_t(t.ne[d]));
    s.put(dtype_to_gguf(t.dtype));
    s.put(uint64_t(layout.offsets[k]));
  }
  layout.header = std::move(s.bytes());
  // Without tensors there is no data section to align (llama.cpp's vocab files end here too).
  if (!tensors.empty()) layout.header.resize(align_up(layout.header.size(), alignment), 0);
  layout.total = layout.header.size() + data_size;
  return layout;
}

// `written(offset, bytes)` is told about each finished tensor (the file drops its pages).
template <class Tensors>
void fill_data(uint8_t* out, const Layout& layout, const Tensors& tensors,
               const Writer::Progress& progress,
               const std::function<void(size_t, size_t)>& written = {}) {
  std::memcpy(out, layout.header.data(), layout.header.size());
  size_t done = layout.header.size();
  if (progress) progress(done, layout.total);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const auto& t = *tensors[k];
    uint8_t* dst = out + layout.header.size() + layout.offsets[k];
    if (t.fill) {
      t.fill(dst, t.bytes);
    } else {
      std::memcpy(dst, t.data.data(), t.bytes);
    }
    done += t.bytes;
    if (written) written(size_t(dst - out), t.bytes);
    if (progress) progress(done, layout.total);
  }
}

}  // namespace

void Writer::write(const std::string& path) const {
  write(path, Progress{});
}

void Writer::write(const std::string& path, const Progress& progress) const {
  Layout layout = make_layout(alignment_, metadata_, tensors_);
  model::MappedOutputFile out(path, layout.total);
  fill_data(out.data(), layout, tensors_, progress,
            [&out](size_t offset, size_t bytes) { out.release(offset, bytes); });
  out.commit();
}

std::vector<uint8_t> Writer::to_bytes() const {
  Layout layout = make_layout(alignment_, metadata_, tensors_);
  std::vector<uint8_t> out(layout.total, 0);
  fill_data(out.data(), layout, tensors_, Progress{});
  return out;
}

}  // namespace tandem::gguf
