// Matrix products: a [K, M] x b [K, N] -> f32 [M, N], batched over dims 2 and 3 (a's batch
// dims divide b's). MatMul takes float weights, QuantizedMatMul GGUF blocks.
#include <algorithm>

#include "families.h"

namespace tandem::ops {

namespace {

TensorDesc infer_matmul(OpInference& c) {
  const TensorDesc &a = c.in(0), &b = c.in(1);
  if (c.op == OpKind::MatMul) {
    c.expect_dtype(0, {DType::F32, DType::F16, DType::BF16}, "a");
  } else {
    c.expect_dtype(0, {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}, "a");
  }
  c.expect_dtype(1, {DType::F32}, "b");
  if (a.ne[0] != b.ne[0]) {
    c.fail("inner dims differ: '" + a.name + "' " + shape_string(a) + " vs '" + b.name + "' " +
           shape_string(b));
  }
  if (b.ne[2] % a.ne[2] != 0 || b.ne[3] % a.ne[3] != 0) {
    c.fail("batch dims of '" + a.name + "' " + shape_string(a) + " do not divide '" + b.name +
           "' " + shape_string(b));
  }
  return contiguous(DType::F32, {a.ne[1], b.ne[1], b.ne[2], b.ne[3]}, std::max(2, b.n_dims));
}

void work_matmul(const Graph& g, const Node& n, OpWork& w) {
  const TensorDesc &a = g.tensor(n.inputs[0]), &b = g.tensor(n.inputs[1]);
  w.flops =
      2.0 * double(a.ne[0]) * double(a.ne[1]) * double(b.ne[1]) * double(b.ne[2]) * double(b.ne[3]);
  w.dtype_class = dtype_class(a.dtype);
}

constexpr OpDescriptor kOps[] = {
    {.op = OpKind::MatMul,
     .name = "matmul",
     .doc = "a [K, M] (f32/f16/bf16) x b [K, N] (f32) -> f32 [M, N]",
     .min_inputs = 2,
     .max_inputs = 2,
     .infer = infer_matmul,
     .work = work_matmul},
    {.op = OpKind::QuantizedMatMul,
     .name = "quantized_matmul",
     .doc = "a [K, M] (q8_0/q4_0/q4_k/q5_k/q6_k) x b [K, N] (f32) -> f32 [M, N]",
     .min_inputs = 2,
     .max_inputs = 2,
     .infer = infer_matmul,
     .work = work_matmul},
};

}  // namespace

std::span<const OpDescriptor> matmul_ops() {
  return kOps;
}

}  // namespace tandem::ops
