// Tensor descriptions: dtype, up to 4 dims in ggml order (ne[0] is contiguous), byte strides,
// role and view source. Descriptions carry no data; backends see data through TensorRef.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "tandem/dtype.h"

namespace tandem {

inline constexpr int kMaxDims = 4;
using Dims = std::array<int64_t, kMaxDims>;
using TensorId = int32_t;
inline constexpr TensorId kNoTensor = -1;

enum class TensorRole : uint8_t { Input, Weight, Activation, KvCache, Output };
std::string_view role_name(TensorRole role);

struct TensorDesc {
  TensorId id = kNoTensor;
  std::string name;
  DType dtype = DType::F32;
  int n_dims = 1;       // dims in use; ne[i] == 1 for i >= n_dims
  Dims ne{1, 1, 1, 1};  // elements per dim, ne[0] innermost
  Dims nb{0, 0, 0, 0};  // byte strides; nb[0] is one element (or one block) in bytes
  TensorRole role = TensorRole::Activation;
  TensorId view_of = kNoTensor;  // the tensor that owns the storage, when this is a view
  int64_t view_offset = 0;       // bytes into the owner's storage

  int64_t elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
  // Bytes from the first to one past the last element (the storage a tensor needs).
  size_t bytes() const;
  bool is_contiguous() const;
  bool is_view() const { return view_of != kNoTensor; }
  bool same_shape(const TensorDesc& other) const { return ne == other.ne; }
};

// Byte strides of a contiguous tensor; throws InvalidArgument if ne[0] is not a multiple of
// the dtype's block or a size overflows.
Dims contiguous_strides(DType dtype, const Dims& ne);

// A contiguous description; dims beyond the list are 1. Throws on a non-positive dim.
TensorDesc make_tensor_desc(std::string name, DType dtype, std::initializer_list<int64_t> ne,
                            TensorRole role = TensorRole::Activation);
TensorDesc make_tensor_desc(std::string name, DType dtype, const Dims& ne, int n_dims,
                            TensorRole role = TensorRole::Activation);

// "[4096, 32]" (the dims in use) and "f32[4096, 32]".
std::string shape_string(const TensorDesc& desc);
std::string desc_string(const TensorDesc& desc);

// A tensor as a backend sees it: its description and a pointer in that backend's memory
// (already offset for views).
struct TensorRef {
  const TensorDesc* desc = nullptr;
  void* data = nullptr;
};

}  // namespace tandem
