// Softmax over ne[0] of (x * scale + mask), one block per row, f32 accumulation.
#include "common.cuh"
#include "ops.h"

namespace tandem::cuda {

namespace {

__global__ void softmax_kernel(const float* x, const float* mask, float* out, int64_t n,
                               int64_t ne1, float scale) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * n;
  const float* mr = mask ? mask + (row % ne1) * n : nullptr;
  float* orow = out + row * n;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    mx = fmaxf(mx, xr[i] * scale + (mr ? mr[i] : 0.0f));
  }
  mx = block_reduce<true>(mx, shared);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = mx == -INFINITY ? 0.0f : expf(xr[i] * scale + (mr ? mr[i] : 0.0f) - mx);
    orow[i] = v;
    sum += v;
  }
  sum = block_reduce<false>(sum, shared);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] *= inv;
}

void run_softmax(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const int64_t n = a.ne[0];
  const int threads = n >= 1024 ? 1024 : n >= 256 ? 256 : 128;
  const auto* mask = e.inputs.size() > 1 ? static_cast<const float*>(e.inputs[1].data) : nullptr;
  softmax_kernel<<<unsigned(a.rows()), threads, 0, ctx.stream>>>(
      static_cast<const float*>(e.inputs[0].data), mask, static_cast<float*>(e.output.data), n,
      a.ne[1], e.node->params.scale);
  ctx.check_launch("softmax");
}

}  // namespace

void add_softmax_kernels(KernelTable<Kernel>& rows) {
  add_row(rows, OpKind::Softmax, {DType::F32}, {run_softmax});
}

}  // namespace tandem::cuda
