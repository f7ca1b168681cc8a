// Metadata ops: a new shape or new strides over their input's storage; no backend runs them.
#include <algorithm>
#include <array>

#include "families.h"

namespace tandem::ops {

namespace {

TensorDesc infer_view(OpInference& c) {
  const TensorDesc& a = c.in(0);
  if (!c.view_ne || !c.view_nb || c.view_dims < 1 || c.view_dims > kMaxDims) {
    c.fail("needs dims and strides");
  }
  const int n = c.view_dims;
  TensorDesc out = make_tensor_desc("", a.dtype, *c.view_ne, n);
  for (int i = 0; i < n; ++i) out.nb[size_t(i)] = (*c.view_nb)[size_t(i)];
  for (int i = n; i < kMaxDims; ++i)
    out.nb[size_t(i)] = out.nb[size_t(n - 1)] * out.ne[size_t(n - 1)];
  const int64_t element = dtype_traits(a.dtype).block_bytes;
  if (out.nb[0] != element) {
    c.fail("the first stride must be one element (" + std::to_string(element) + " bytes)");
  }
  for (int i = 1; i < kMaxDims; ++i) {
    if (out.nb[size_t(i)] <= 0) c.fail("strides must be positive");
  }
  if (c.view_offset < 0 || size_t(c.view_offset) + out.bytes() > a.bytes()) {
    c.fail("view of " + std::to_string(out.bytes()) + " bytes at offset " +
           std::to_string(c.view_offset) + " exceeds '" + a.name + "' (" +
           std::to_string(a.bytes()) + " bytes)");
  }
  out.view_of = c.storage_of(0);
  out.view_offset = a.view_offset + c.view_offset;
  return out;
}

TensorDesc infer_reshape(OpInference& c) {
  const TensorDesc& a = c.in(0);
  if (!c.view_ne || c.view_dims < 1) c.fail("needs dims");
  if (!a.is_contiguous()) c.fail("input '" + a.name + "' is not contiguous");
  TensorDesc out = make_tensor_desc("", a.dtype, *c.view_ne, c.view_dims);
  if (out.elements() != a.elements()) {
    c.fail("cannot reshape " + shape_string(a) + " to " + shape_string(out) +
           " (element counts differ)");
  }
  out.view_of = c.storage_of(0);
  out.view_offset = a.view_offset;
  return out;
}

TensorDesc infer_permute(OpInference& c) {
  const TensorDesc& a = c.in(0);
  if (dtype_traits(a.dtype).is_quantized) c.fail("cannot permute a quantized tensor");
  if (c.op == OpKind::Transpose) c.params.axes = {1, 0, 2, 3};
  const auto& axes = c.params.axes;
  std::array<bool, kMaxDims> seen{};
  for (int32_t ax : axes) {
    if (ax < 0 || ax >= kMaxDims || seen[size_t(ax)]) c.fail("axes must be a permutation of 0..3");
    seen[size_t(ax)] = true;
  }
  TensorDesc out = a;
  out.name.clear();
  for (int i = 0; i < kMaxDims; ++i) {
    out.ne[size_t(axes[size_t(i)])] = a.ne[size_t(i)];
    out.nb[size_t(axes[size_t(i)])] = a.nb[size_t(i)];
  }
  out.n_dims =
      std::max(a.n_dims, int(*std::max_element(axes.begin(), axes.begin() + a.n_dims)) + 1);
  out.role = TensorRole::Activation;
  out.view_of = c.storage_of(0);
  return out;
}

constexpr OpDescriptor kOps[] = {
    {.op = OpKind::View,
     .name = "view",
     .doc = "a window of its input's storage: dims, byte strides and a byte offset",
     .op_class = OpClass::Metadata,
     .min_inputs = 1,
     .max_inputs = 1,
     .infer = infer_view},
    {.op = OpKind::Reshape,
     .name = "reshape",
     .doc = "the same contiguous elements under new dims",
     .op_class = OpClass::Metadata,
     .min_inputs = 1,
     .max_inputs = 1,
     .infer = infer_reshape},
    {.op = OpKind::Permute,
     .name = "permute",
     .doc = "dim i of the input becomes dim axes[i]",
     .op_class = OpClass::Metadata,
     .min_inputs = 1,
     .max_inputs = 1,
     .attributes = kAttrAxes,
     .infer = infer_permute},
    {.op = OpKind::Transpose,
     .name = "transpose",
     .doc = "swaps dims 0 and 1",
     .op_class = OpClass::Metadata,
     .min_inputs = 1,
     .max_inputs = 1,
     .infer = infer_permute},
};

}  // namespace

std::span<const OpDescriptor> layout_ops() {
  return kOps;
}

}  // namespace tandem::ops
