// RmsNorm and LayerNorm over ne[0], one row per task.
#include <algorithm>

#include "ops.h"

namespace tandem::cpu {

namespace {

void run_norm(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  auto input = [&](size_t i) {
    return e.inputs.size() > i ? static_cast<const float*>(e.inputs[i].data) : nullptr;
  };
  const float* w = input(1);
  const float* b = input(2);
  auto* out = static_cast<float*>(e.output.data);
  const int64_t n = a.ne[0];
  const float eps = e.node->params.eps;
  const bool rms = e.node->op == OpKind::RmsNorm;
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / n);
  ctx.pool.parallel_for(a.rows(), grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (rms) {
        ctx.k.rms_norm_row(x + r * n, w, eps, out + r * n, n);
      } else {
        ctx.k.layer_norm_row(x + r * n, w, b, eps, out + r * n, n);
      }
    }
  });
}

}  // namespace

void add_norm_kernels(KernelTable<Kernel>& rows) {
  for (OpKind op : {OpKind::RmsNorm, OpKind::LayerNorm}) rows.add(op, {DType::F32}, run_norm);
}

}  // namespace tandem::cpu
