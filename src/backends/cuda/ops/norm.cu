// RmsNorm and LayerNorm: one block per row, f32 accumulation, optional weight and bias. Also the
// fused launch of a residual Add with the RmsNorm that reads its sum (run_fused_add_rms_norm).
// Launched as programmatic dependents that let their own dependents launch at once: the next
// matrix-vector kernel starts fetching its weights while the norm runs.
#include "common.cuh"
#include "ops.h"

namespace tandem::cuda {

namespace {

template <bool kRms>
__global__ void norm_kernel(const float* x, const float* w, const float* b, float* out, int64_t n,
                            float eps) {
  __shared__ float shared[32];
  grid_launch_dependents();
  grid_dependency_wait();
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

int norm_threads(int64_t n) {
  return n >= 1024 ? 1024 : n >= 256 ? 256 : 128;
}

// sum = a + b and out = rms_norm(sum) * w, row by row; the same arithmetic as binary_kernel's
// Add followed by norm_kernel<true>, so the results are those of the two launches.
__global__ void add_rms_norm_kernel(const float* a, const float* b, float* sum, const float* w,
                                    float* out, int64_t n, float eps) {
  __shared__ float shared[32];
  grid_launch_dependents();
  grid_dependency_wait();
  const int64_t offset = int64_t(blockIdx.x) * n;
  a += offset;
  b += offset;
  sum += offset;
  out += offset;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float s = a[i] + b[i];
    sum[i] = s;
    ss += s * s;
  }
  const float inv = rsqrtf(block_reduce<false>(ss, shared) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float y = sum[i] * inv;
    if (w) y *= w[i];
    out[i] = y;
  }
}

void run_norm(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& x = *e.inputs[0].desc;
  const int64_t n = x.ne[0];
  const int threads = norm_threads(n);
  const auto* w = e.inputs.size() > 1 ? static_cast<const float*>(e.inputs[1].data) : nullptr;
  const auto* b = e.inputs.size() > 2 ? static_cast<const float*>(e.inputs[2].data) : nullptr;
  const auto* xd = static_cast<const float*>(e.inputs[0].data);
  auto* o = static_cast<float*>(e.output.data);
  const auto rows = unsigned(x.rows());
  const float eps = e.node->params.eps;
  if (e.node->op == OpKind::RmsNorm) {
    ctx.check(launch_programmatic(ctx.stream, dim3(rows), dim3(unsigned(threads)), 0,
                                  norm_kernel<true>, xd, w, nullptr, o, n, eps),
              "rms_norm", "kernel launch");
  } else {
    ctx.check(launch_programmatic(ctx.stream, dim3(rows), dim3(unsigned(threads)), 0,
                                  norm_kernel<false>, xd, w, b, o, n, eps),
              "layer_norm", "kernel launch");
  }
}

}  // namespace

size_t run_fused_add_rms_norm(const OpContext& ctx, std::span<const NodeExecution> segment) {
  if (segment.size() < 2 || segment[0].node->op != OpKind::Add ||
      segment[1].node->op != OpKind::RmsNorm) {
    return 0;
  }
  const NodeExecution& add = segment[0];
  const NodeExecution& norm = segment[1];
  const TensorDesc& sum = *add.output.desc;
  // Same shapes on both sides of the Add (no broadcast), the norm reading exactly its sum.
  if (!contiguous_f32(add.inputs[0]) || !contiguous_f32(add.inputs[1]) ||
      !contiguous_f32(add.output) || add.inputs[0].desc->ne != sum.ne ||
      add.inputs[1].desc->ne != sum.ne || norm.inputs[0].data != add.output.data ||
      norm.inputs[0].desc->ne != sum.ne || !contiguous_f32(norm.output) ||
      norm.output.desc->ne != sum.ne) {
    return 0;
  }
  const float* w = nullptr;
  if (norm.inputs.size() > 1) {
    const TensorRef& weight = norm.inputs[1];
    if (!contiguous_f32(weight) || weight.desc->elements() != sum.ne[0]) return 0;
    w = static_cast<const float*>(weight.data);
  }
  const int64_t n = sum.ne[0];
  ctx.check(launch_programmatic(
                ctx.stream, dim3(unsigned(sum.rows())), dim3(unsigned(norm_threads(n))), 0,
                add_rms_norm_kernel, static_cast<const float*>(add.inputs[0].data),
                static_cast<const float*>(add.inputs[1].data), static_cast<float*>(add.output.data),
                w, static_cast<float*>(norm.output.data), n, norm.node->params.eps),
            "add + rms_norm", "kernel launch");
  return 2;
}

void add_norm_kernels(KernelTable<Kernel>& rows) {
  for (OpKind op : {OpKind::RmsNorm, OpKind::LayerNorm})
    add_row(rows, op, {DType::F32}, {run_norm});
}

}  // namespace tandem::cuda
