// RmsNorm and LayerNorm: one block per row, f32 accumulation, optional weight and bias.
#include "common.cuh"
#include "ops.h"

namespace tandem::cuda {

namespace {

template <bool kRms>
__global__ void norm_kernel(const float* x, const float* w, const float* b, float* out, int64_t n,
                            float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * n;
  float* orow = out + row * n;
  float mean = 0.0f;
  if constexpr (!kRms) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    mean = block_reduce<false>(s, shared) / float(n);
  }
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float d = xr[i] - mean;
    ss += d * d;
  }
  const float inv = rsqrtf(block_reduce<false>(ss, shared) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float y = (xr[i] - mean) * inv;
    if (w) y *= w[i];
    if (b) y += b[i];
    orow[i] = y;
  }
}

void run_norm(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& x = *e.inputs[0].desc;
  const int64_t n = x.ne[0];
  const int threads = n >= 1024 ? 1024 : n >= 256 ? 256 : 128;
  const auto* w = e.inputs.size() > 1 ? static_cast<const float*>(e.inputs[1].data) : nullptr;
  const auto* b = e.inputs.size() > 2 ? static_cast<const float*>(e.inputs[2].data) : nullptr;
  const auto* xd = static_cast<const float*>(e.inputs[0].data);
  auto* o = static_cast<float*>(e.output.data);
  const auto rows = unsigned(x.rows());
  const float eps = e.node->params.eps;
  if (e.node->op == OpKind::RmsNorm) {
    norm_kernel<true><<<rows, threads, 0, ctx.stream>>>(xd, w, nullptr, o, n, eps);
    ctx.check_launch("rms_norm");
  } else {
    norm_kernel<false><<<rows, threads, 0, ctx.stream>>>(xd, w, b, o, n, eps);
    ctx.check_launch("layer_norm");
  }
}

}  // namespace

void add_norm_kernels(KernelTable<Kernel>& rows) {
  for (OpKind op : {OpKind::RmsNorm, OpKind::LayerNorm})
    add_row(rows, op, {DType::F32}, {run_norm});
}

}  // namespace tandem::cuda
