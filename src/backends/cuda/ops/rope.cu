// RoPE on adjacent pairs: one thread per element, angles in double (exact positions matter
// more than the few extra cycles of a memory-bound op).
#include "common.cuh"
#include "ops.h"

namespace tandem::cuda {

namespace {

__global__ void rope_kernel(const float* x, const int32_t* pos, float* out, int64_t d,
                            int64_t heads, int64_t n, int n_rot, double log_base) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % d;
    const int64_t t = idx / (d * heads);
    if (i >= n_rot) {
      out[idx] = x[idx];
      continue;
    }
    const int64_t even = i & ~int64_t(1);
    const double theta = double(pos[t]) * exp(-double(even) / n_rot * log_base);
    double s, c;
    sincos(theta, &s, &c);
    const double x0 = x[idx - (i - even)], x1 = x[idx - (i - even) + 1];
    out[idx] = float(i == even ? x0 * c - x1 * s : x0 * s + x1 * c);
  }
}

void run_rope(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& x = *e.inputs[0].desc;
  const int64_t n = x.elements();
  constexpr int kThreads = 256;
  rope_kernel<<<grid_1d(n, kThreads), kThreads, 0, ctx.stream>>>(
      static_cast<const float*>(e.inputs[0].data), static_cast<const int32_t*>(e.inputs[1].data),
      static_cast<float*>(e.output.data), x.ne[0], x.ne[1], n, e.node->params.n_rot,
      log(double(e.node->params.freq_base)));
  ctx.check_launch("rope");
}

}  // namespace

void add_rope_kernels(KernelTable<Kernel>& rows) {
  add_row(rows, OpKind::Rope, {DType::F32, DType::I32}, {run_rope});
}

}  // namespace tandem::cuda
