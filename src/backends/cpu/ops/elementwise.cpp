// Add and Mul (with ggml broadcasting of b over a), Scale, Silu, Gelu, SwiGlu.
#include <algorithm>

#include "ops.h"

namespace tandem::cpu {

namespace {

void run_binary(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  const auto* y = static_cast<const float*>(e.inputs[1].data);
  auto* out = static_cast<float*>(e.output.data);
  auto fn = e.node->op == OpKind::Add ? ctx.k.add : ctx.k.mul;
  if (a.same_shape(b)) {
    ctx.pool.parallel_for(a.elements(), kElementwiseGrain,
                          [&](int64_t i0, int64_t i1) { fn(x + i0, y + i0, out + i0, i1 - i0); });
    return;
  }
  const int64_t n0 = a.ne[0], b0 = b.ne[0];
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / n0);
  ctx.pool.parallel_for(a.rows(), grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
      const int64_t rb = ((i3 % b.ne[3]) * b.ne[2] + i2 % b.ne[2]) * b.ne[1] + i1 % b.ne[1];
      const float* brow = y + rb * b0;
      for (int64_t i = 0; i < n0; i += b0) fn(x + r * n0 + i, brow, out + r * n0 + i, b0);
    }
  });
}

void run_unary(const OpContext& ctx, const NodeExecution& e) {
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  auto* out = static_cast<float*>(e.output.data);
  const int64_t n = e.output.desc->elements();
  const OpKind op = e.node->op;
  const float s = e.node->params.scale;
  const auto* up = op == OpKind::SwiGlu ? static_cast<const float*>(e.inputs[1].data) : nullptr;
  ctx.pool.parallel_for(n, kElementwiseGrain, [&](int64_t i0, int64_t i1) {
    switch (op) {
      case OpKind::Scale:
        return ctx.k.scale(x + i0, s, out + i0, i1 - i0);
      case OpKind::Silu:
        return ctx.k.silu(x + i0, out + i0, i1 - i0);
      case OpKind::Gelu:
        return ctx.k.gelu(x + i0, out + i0, i1 - i0);
      default:  // SwiGlu
        return ctx.k.swiglu(x + i0, up + i0, out + i0, i1 - i0);
    }
  });
}

}  // namespace

void add_elementwise_kernels(KernelTable<Kernel>& rows) {
  for (OpKind op : {OpKind::Add, OpKind::Mul}) rows.add(op, {DType::F32}, run_binary);
  for (OpKind op : {OpKind::Scale, OpKind::Silu, OpKind::Gelu, OpKind::SwiGlu}) {
    rows.add(op, {DType::F32}, run_unary);
  }
}

}  // namespace tandem::cpu
