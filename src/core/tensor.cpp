#include "tandem/tensor.h"

#include <limits>
#include <string>

#include "tandem/error.h"

namespace tandem {

std::string_view role_name(TensorRole role) {
  switch (role) {
    case TensorRole::Input:
      return "input";
    case TensorRole::Weight:
      return "weight";
    case TensorRole::Activation:
      return "activation";
    case TensorRole::KvCache:
      return "kv-cache";
    case TensorRole::Output:
      return "output";
  }
  return "unknown";
}

size_t TensorDesc::bytes() const {
  const auto& t = dtype_traits(dtype);
  // Last element's offset plus one element (one block along ne[0]).
  int64_t last = (ne[0] / t.block_elements - 1) * nb[0];
  for (int i = 1; i < kMaxDims; ++i) last += (ne[i] - 1) * nb[i];
  return size_t(last + t.block_bytes);
}

bool TensorDesc::is_contiguous() const {
  const auto& t = dtype_traits(dtype);
  if (nb[0] != t.block_bytes) return false;
  int64_t expected = (ne[0] / t.block_elements) * t.block_bytes;
  for (int i = 1; i < kMaxDims; ++i) {
    if (ne[i] != 1 && nb[i] != expected) return false;
    expected *= ne[i];
  }
  return true;
}

Dims contiguous_strides(DType dtype, const Dims& ne) {
  const auto& t = dtype_traits(dtype);
  for (int i = 0; i < kMaxDims; ++i) {
    if (ne[i] <= 0) {
      throw_error(ErrorCode::InvalidArgument, "tensor",
                  "dim " + std::to_string(i) + " is " + std::to_string(ne[i]) + " (must be >= 1)");
    }
  }
  Dims nb{};
  nb[0] = t.block_bytes;
  nb[1] = int64_t(row_bytes(dtype, ne[0]));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max() / 2;
  for (int i = 2; i < kMaxDims; ++i) {
    if (nb[i - 1] > kMax / ne[i - 1]) {
      throw_error(ErrorCode::InvalidArgument, "tensor", "size overflows 64 bits");
    }
    nb[i] = nb[i - 1] * ne[i - 1];
  }
  if (nb[3] > kMax / ne[3])
    throw_error(ErrorCode::InvalidArgument, "tensor", "size overflows 64 bits");
  return nb;
}

TensorDesc make_tensor_desc(std::string name, DType dtype, const Dims& ne, int n_dims,
                            TensorRole role) {
  if (n_dims < 1 || n_dims > kMaxDims) {
    throw_error(ErrorCode::InvalidArgument, "tensor " + name,
                "needs 1 to 4 dims (got " + std::to_string(n_dims) + ")");
  }
  TensorDesc d;
  d.name = std::move(name);
  d.dtype = dtype;
  d.n_dims = n_dims;
  d.ne = ne;
  for (int i = n_dims; i < kMaxDims; ++i) d.ne[i] = 1;
  try {
    d.nb = contiguous_strides(dtype, d.ne);
  } catch (const Error& e) {
    throw_error(e.code(), "tensor " + d.name, e.message());
  }
  d.role = role;
  return d;
}

TensorDesc make_tensor_desc(std::string name, DType dtype, std::initializer_list<int64_t> ne,
                            TensorRole role) {
  if (ne.size() < 1 || ne.size() > size_t(kMaxDims)) {
    throw_error(ErrorCode::InvalidArgument, "tensor " + name,
                "needs 1 to 4 dims (got " + std::to_string(ne.size()) + ")");
  }
  Dims dims{1, 1, 1, 1};
  int i = 0;
  for (int64_t v : ne) dims[size_t(i++)] = v;
  return make_tensor_desc(std::move(name), dtype, dims, int(ne.size()), role);
}

std::string shape_string(const TensorDesc& desc) {
  std::string s = "[";
  for (int i = 0; i < desc.n_dims; ++i) {
    if (i) s += ", ";
    s += std::to_string(desc.ne[size_t(i)]);
  }
  return s + "]";
}

std::string desc_string(const TensorDesc& desc) {
  return std::string(dtype_name(desc.dtype)) + shape_string(desc);
}

}  // namespace tandem
