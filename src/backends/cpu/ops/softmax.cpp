// Softmax over ne[0] of (a * scale + mask), one row per task; mask row = row index % ne[1].
#include <algorithm>

#include "ops.h"

namespace tandem::cpu {

namespace {

void run_softmax(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  const auto* mask = e.inputs.size() > 1 ? static_cast<const float*>(e.inputs[1].data) : nullptr;
  auto* out = static_cast<float*>(e.output.data);
  const int64_t n = a.ne[0];
  const float scale = e.node->params.scale;
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / n);
  ctx.pool.parallel_for(a.rows(), grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* m = mask ? mask + (r % a.ne[1]) * n : nullptr;
      ctx.k.softmax_row(x + r * n, m, scale, out + r * n, n);
    }
  });
}

}  // namespace

void add_softmax_kernels(KernelTable<Kernel>& rows) {
  rows.add(OpKind::Softmax, {DType::F32}, run_softmax);
}

}  // namespace tandem::cpu
