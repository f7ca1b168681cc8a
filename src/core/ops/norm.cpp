// Row norms over ne[0]: RmsNorm x / sqrt(mean(x^2) + eps) [* w] and LayerNorm
// (x - mean) / sqrt(var + eps) [* w] [+ b].
#include "families.h"

namespace tandem::ops {

namespace {

TensorDesc infer_norm(OpInference& c) {
  const TensorDesc& x = c.in(0);
  c.expect_dtype(0, {DType::F32}, "x");
  for (size_t i = 1; i < c.inputs.size(); ++i) {
    c.expect_dtype(i, {DType::F32}, "weight");
    if (c.in(i).elements() != x.ne[0]) {
      c.fail("weight '" + c.in(i).name + "' " + shape_string(c.in(i)) + " must have " +
             std::to_string(x.ne[0]) + " elements");
    }
  }
  if (!(c.params.eps >= 0.0f)) c.fail("eps must be >= 0");
  return contiguous_like(DType::F32, x);
}

void work_rms_norm(const Graph& g, const Node& n, OpWork& w) {
  // square, add, scale [* w]
  w.flops = (3.0 + (n.inputs.size() > 1 ? 1.0 : 0.0)) * double(g.tensor(n.id).elements());
}

void work_layer_norm(const Graph& g, const Node& n, OpWork& w) {
  // mean add, subtract, square, add, scale [* w] [+ b]
  w.flops = (5.0 + double(n.inputs.size() - 1)) * double(g.tensor(n.id).elements());
}

constexpr OpDescriptor kOps[] = {
    {.op = OpKind::RmsNorm,
     .name = "rms_norm",
     .doc = "x / sqrt(mean(x^2) + eps) [* w]",
     .min_inputs = 1,
     .max_inputs = 2,
     .attributes = kAttrEps,
     .infer = infer_norm,
     .work = work_rms_norm},
    {.op = OpKind::LayerNorm,
     .name = "layer_norm",
     .doc = "(x - mean) / sqrt(var + eps) [* w] [+ b]",
     .min_inputs = 1,
     .max_inputs = 3,
     .attributes = kAttrEps,
     .infer = infer_norm,
     .work = work_layer_norm},
};

}  // namespace

std::span<const OpDescriptor> norm_ops() {
  return kOps;
}

}  // namespace tandem::ops
