// The built-in op families: each file of this folder describes its ops, and table.cpp
// collects them into the table indexed by OpKind.
#pragma once

#include <span>

#include "tandem/op.h"

namespace tandem::ops {

std::span<const OpDescriptor> leaf_ops();
std::span<const OpDescriptor> layout_ops();  // View, Reshape, Permute, Transpose
std::span<const OpDescriptor> copy_ops();    // Copy, GetRows, Dequantize
std::span<const OpDescriptor> matmul_ops();
std::span<const OpDescriptor> elementwise_ops();
std::span<const OpDescriptor> softmax_ops();
std::span<const OpDescriptor> norm_ops();
std::span<const OpDescriptor> rope_ops();
std::span<const OpDescriptor> attention_ops();  // Attention, KvWrite
std::span<const OpDescriptor> moe_ops();        // MoeRoute, MoeWeights, ExpertMatMul, MoeCombine

// A contiguous output of `dtype` shaped like `like`.
inline TensorDesc contiguous(DType dtype, const Dims& ne, int n_dims) {
  return make_tensor_desc("", dtype, ne, n_dims);
}
inline TensorDesc contiguous_like(DType dtype, const TensorDesc& like) {
  return contiguous(dtype, like.ne, like.n_dims);
}

}  // namespace tandem::ops
