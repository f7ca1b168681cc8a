// GGUF (versions 2 and 3): a memory-mapped, zero-copy, hostile-input-safe reader and a writer.
// Every malformed file gives Error{Format} naming the key or tensor and the offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/dtype.h"
#include "tandem/tensor.h"

namespace tandem::gguf {

// Format constants and the reader's limits against hostile files.
inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr uint32_t kWriteVersion = 3;
inline constexpr size_t kDefaultAlignment = 32;
inline constexpr size_t kMaxAlignment = size_t(1) << 20;
inline constexpr size_t kMaxNameBytes = 65535;  // keys and tensor names
inline constexpr size_t kMaxStringBytes = size_t(1) << 20;
inline constexpr uint64_t kMaxArrayElements = uint64_t(1) << 24;
inline constexpr uint64_t kMaxMetadataBytes = uint64_t(1) << 28;  // decoded, all keys together
inline constexpr uint64_t kMaxTensors = uint64_t(1) << 20;
inline constexpr uint64_t kMaxKeys = uint64_t(1) << 20;

enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view value_type_name(ValueType type);

// GGUF's tensor type ids (ggml_type) for the dtypes Tandem knows, named once: the reader maps
// ids to dtypes and the writer dtypes to ids through kTensorTypes. Unknown ids are a Format error.
enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  I8 = 24,
  I32 = 26,
  BF16 = 30
};
struct TensorTypeId {
  DType dtype;
  TensorType id;
};
inline constexpr TensorTypeId kTensorTypes[] = {
    {DType::F32, TensorType::F32},   {DType::F16, TensorType::F16},
    {DType::Q4_0, TensorType::Q4_0}, {DType::Q8_0, TensorType::Q8_0},
    {DType::I8, TensorType::I8},     {DType::I32, TensorType::I32},
    {DType::BF16, TensorType::BF16}, {DType::Q4_K, TensorType::Q4_K},
    {DType::Q5_K, TensorType::Q5_K}, {DType::Q6_K, TensorType::Q6_K}};
std::optional<DType> dtype_from_gguf(uint32_t ggml_type);
uint32_t dtype_to_gguf(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  int n_dims = 1;
  Dims ne{1, 1, 1, 1};
  uint64_t offset = 0;            // relative to the start of the data section
  size_t bytes = 0;               // exact size of the tensor's data
  const uint8_t* data = nullptr;  // points into the mapping (zero-copy)
};

// One metadata value: a scalar, a string, or an array of one element type.
struct Value {
  ValueType type = ValueType::U8;
  ValueType array_type = ValueType::U8;  // for Array
  // Scalars are widened: integers and bools in i/u, floats in f.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  std::string str;
  std::vector<std::string> strings;  // Array of String
  std::vector<double> numbers;       // Array of numbers or bools, widened

  // The writer reads unsigned integers from `u`, signed ones from `i`, bools from `u`.
  static Value make_u32(uint32_t v);
  static Value make_i32(int32_t v);
  static Value make_u64(uint64_t v);
  static Value make_i64(int64_t v);
  static Value make_f32(float v);
  static Value make_f64(double v);
  static Value make_bool(bool v);
  static Value make_string(std::string v);
  static Value make_string_array(std::vector<std::string> v);
  static Value make_number_array(ValueType element_type, std::vector<double> v);

  friend bool operator==(const Value&, const Value&) = default;
};

class File {
 public:
  // Maps the file read-only; throws Io if it cannot be opened, Format if it is malformed.
  static File open(const std::string& path);
  // Parses bytes the caller keeps alive (for tests and fuzzing).
  static File parse(std::span<const uint8_t> bytes, std::string name = "<memory>");

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  uint32_t version() const;
  size_t alignment() const;
  const std::string& path() const;

  // Metadata, in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const;
  bool has(std::string_view key) const;
  const Value* find(std::string_view key) const;
  // Typed accessors check the stored type and throw Format naming the key otherwise.
  std::string get_string(std::string_view key) const;
  uint64_t get_uint(std::string_view key) const;  // any unsigned or non-negative signed integer
  int64_t get_int(std::string_view key) const;    // any integer type
  double get_float(std::string_view key) const;   // f32 or f64
  bool get_bool(std::string_view key) const;
  const std::vector<std::string>& get_string_array(std::string_view key) const;
  const std::vector<double>& get_number_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const;
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent
  // File offset where the tensor data section starts (a multiple of alignment()).
  uint64_t data_offset() const;
  // Byte offset in the file of a key's entry (for error messages); 0 if absent.
  uint64_t key_offset(std::string_view key) const;

 private:
  struct Impl;
  explicit File(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Builds a GGUF v3 file: metadata in insertion order, tensors aligned to `alignment`, each
// padded with zeros to the next multiple. A non-default alignment is recorded as the first key,
// general.alignment (u32). Bad names, shapes, sizes or out-of-range values: InvalidArgument.
class Writer {
 public:
  explicit Writer(size_t alignment = 32);
  // Setting an existing key replaces its value in place (the first insertion fixes the order).
  void set(std::string key, Value value);
  void set_string(std::string key, std::string value);
  void set_u32(std::string key, uint32_t value);
  void set_i32(std::string key, int32_t value);
  void set_f32(std::string key, float value);
  void set_bool(std::string key, bool value);
  void set_string_array(std::string key, std::vector<std::string> values);
  void set_f32_array(std::string key, std::vector<float> values);
  void set_i32_array(std::string key, std::vector<int32_t> values);
  // The tensor's bytes are copied when added, or produced later by `fill` (so an 8B model is
  // generated straight into the output without holding it in memory).
  void add_tensor(std::string name, DType dtype, std::span<const int64_t> ne,
                  std::span<const uint8_t> bytes);
  void add_tensor_lazy(std::string name, DType dtype, std::span<const int64_t> ne,
                       std::function<void(uint8_t* dst, size_t bytes)> fill);
  // Writes through a mapped, pre-reserved file; on any failure no file is left behind.
  void write(const std::string& path) const;  // throws Io
  // Same, reporting bytes written so far after the header and after every tensor.
  using Progress = std::function<void(size_t done_bytes, size_t total_bytes)>;
  void write(const std::string& path, const Progress& progress) const;
  std::vector<uint8_t> to_bytes() const;

 private:
  struct Pending;
  size_t alignment_;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<std::shared_ptr<Pending>> tensors_;
};

}  // namespace tandem::gguf
