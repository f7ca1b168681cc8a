// Softmax over ne[0] of (a * scale + mask), the mask optional and broadcast over dims 2 and 3.
#include "families.h"

namespace tandem::ops {

namespace {

TensorDesc infer_softmax(OpInference& c) {
  const TensorDesc& a = c.in(0);
  c.expect_dtype(0, {DType::F32}, "input");
  if (c.inputs.size() == 2) {
    const TensorDesc& m = c.in(1);
    c.expect_dtype(1, {DType::F32}, "mask");
    if (m.ne[0] != a.ne[0] || m.ne[1] < a.ne[1] || m.ne[2] != 1 || m.ne[3] != 1) {
      c.fail("mask " + shape_string(m) + " must be [" + std::to_string(a.ne[0]) +
             ", >= " + std::to_string(a.ne[1]) + "]");
    }
  }
  return contiguous_like(DType::F32, a);
}

void work_softmax(const Graph& g, const Node& n, OpWork& w) {
  // scale, max, subtract, exp, sum, divide (+ mask add)
  w.flops = (6.0 + (n.inputs.size() > 1 ? 1.0 : 0.0)) * double(g.tensor(n.id).elements());
}

constexpr OpDescriptor kOps[] = {
    {.op = OpKind::Softmax,
     .name = "softmax",
     .doc = "softmax over ne[0] of (a * scale + mask)",
     .min_inputs = 1,
     .max_inputs = 2,
     .attributes = kAttrScale,
     .infer = infer_softmax,
     .work = work_softmax},
};

}  // namespace

std::span<const OpDescriptor> softmax_ops() {
  return kOps;
}

}  // namespace tandem::ops
