// Element-wise f32 ops: Add and Mul (b broadcast over a), Scale, Silu, Gelu and SwiGlu.
#include "families.h"

namespace tandem::ops {

namespace {

TensorDesc infer_binary(OpInference& c) {
  const TensorDesc &a = c.in(0), &b = c.in(1);
  c.expect_dtype(0, {DType::F32}, "a");
  c.expect_dtype(1, {DType::F32}, "b");
  for (int i = 0; i < kMaxDims; ++i) {
    if (a.ne[size_t(i)] % b.ne[size_t(i)] != 0) {
      c.fail("'" + b.name + "' " + shape_string(b) + " does not broadcast to '" + a.name + "' " +
             shape_string(a));
    }
  }
  return contiguous_like(DType::F32, a);
}

TensorDesc infer_unary(OpInference& c) {
  c.expect_dtype(0, {DType::F32}, "input");
  return contiguous_like(DType::F32, c.in(0));
}

TensorDesc infer_swiglu(OpInference& c) {
  c.expect_dtype(0, {DType::F32}, "gate");
  c.expect_dtype(1, {DType::F32}, "up");
  c.expect_same_shape(0, 1);
  return contiguous_like(DType::F32, c.in(0));
}

// `kFlops` per output element.
template <int kFlops>
void work_per_element(const Graph& g, const Node& n, OpWork& w) {
  w.flops = double(kFlops) * double(g.tensor(n.id).elements());
}

constexpr OpDescriptor kOps[] = {
    {.op = OpKind::Add,
     .name = "add",
     .doc = "a + b, b broadcast over a (a.ne[i] % b.ne[i] == 0)",
     .min_inputs = 2,
     .max_inputs = 2,
     .infer = infer_binary,
     .work = work_per_element<1>},
    {.op = OpKind::Mul,
     .name = "mul",
     .doc = "a * b, b broadcast over a",
     .min_inputs = 2,
     .max_inputs = 2,
     .infer = infer_binary,
     .work = work_per_element<1>},
    {.op = OpKind::Scale,
     .name = "scale",
     .doc = "a * params.scale",
     .min_inputs = 1,
     .max_inputs = 1,
     .attributes = kAttrScale,
     .infer = infer_unary,
     .work = work_per_element<1>},
    // negate, exp, add, divide
    {.op = OpKind::Silu,
     .name = "silu",
     .doc = "x / (1 + exp(-x))",
     .min_inputs = 1,
     .max_inputs = 1,
     .infer = infer_unary,
     .work = work_per_element<4>},
    // the tanh approximation
    {.op = OpKind::Gelu,
     .name = "gelu",
     .doc = "gelu, tanh approximation (as ggml)",
     .min_inputs = 1,
     .max_inputs = 1,
     .infer = infer_unary,
     .work = work_per_element<8>},
    // silu then multiply
    {.op = OpKind::SwiGlu,
     .name = "swiglu",
     .doc = "silu(gate) * up",
     .min_inputs = 2,
     .max_inputs = 2,
     .infer = infer_swiglu,
     .work = work_per_element<5>},
};

}  // namespace

std::span<const OpDescriptor> elementwise_ops() {
  return kOps;
}

}  // namespace tandem::ops
