// RoPE: Rope rotates adjacent pairs (llama), RopeNeox the pairs (x[i], x[i + n_rot/2]) (GPT-NeoX,
// Qwen). One thread per element, angles in double (rope_pair). Also the fused launch of a layer's
// RoPE of Q and K with the KV-cache writes that follow it (run_fused_rope_kv_write), or of the
// five nodes with the Attention after them (the attention kernel's, attention.cu).
#include "common.cuh"
#include "ops.h"
#include "rope_kv.h"

namespace tandem::cuda {

namespace {

// Element idx of RoPE(x) for x contiguous [d, heads, T], i = idx % d, at position pos: pair j
// (angle pos * base^(-2j / n_rot)) is (2j, 2j + 1), or with neox (j, j + n_rot / 2).
__device__ __forceinline__ float rope_element(const float* x, int64_t idx, int64_t i, int32_t pos,
                                              int n_rot, double log_base, bool neox = false) {
  if (i >= n_rot) return x[idx];
  const int64_t half = n_rot / 2;
  const int64_t j = neox ? (i < half ? i : i - half) : i / 2;
  const bool first = neox ? i < half : (i & 1) == 0;
  const int64_t i0 = idx - i + (neox ? j : 2 * j), i1 = i0 + (neox ? half : 1);
  float y0, y1;
  rope_pair(x[i0], x[i1], j, pos, n_rot, log_base, y0, y1);
  return first ? y0 : y1;
}

__global__ void rope_kernel(const float* x, const int32_t* pos, float* out, int64_t d,
                            int64_t heads, int64_t n, int n_rot, double log_base, bool neox) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    out[idx] = rope_element(x, idx, idx % d, pos[idx / (d * heads)], n_rot, log_base, neox);
  }
}

void run_rope(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& x = *e.inputs[0].desc;
  const int64_t n = x.elements();
  constexpr int kThreads = 256;
  rope_kernel<<<grid_1d(n, kThreads), kThreads, 0, ctx.stream>>>(
      static_cast<const float*>(e.inputs[0].data), static_cast<const int32_t*>(e.inputs[1].data),
      static_cast<float*>(e.output.data), x.ne[0], x.ne[1], n, e.node->params.n_rot,
      log(double(e.node->params.freq_base)), e.node->op == OpKind::RopeNeox);
  ctx.check_launch("rope");
}

__global__ void rope_kv_write_kernel(RopeKvParts parts, const int32_t* pos, int n_rot,
                                     double log_base, int64_t total, int32_t* error_flag) {
  grid_launch_dependents();
  grid_dependency_wait();
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < total;
       g += int64_t(gridDim.x) * blockDim.x) {
    int64_t idx = g;
    int j = 0;
    while (j + 1 < parts.count && idx >= parts.part[j].n) idx -= parts.part[j++].n;
    const RopeKvPart& p = parts.part[j];
    const int64_t row = p.d * p.heads;
    const int64_t t = idx / row;
    const int32_t position = pos[t];
    const float v = p.rotate
                        ? rope_element(p.src, idx, idx % p.d, position, n_rot, log_base, parts.neox)
                        : p.src[idx];
    if (p.out) p.out[idx] = v;
    if (p.cache) {
      if (position < 0 || position >= p.capacity) {
        atomicCAS(error_flag, kDeviceOk, kPositionOutOfRange);
        continue;
      }
      store_f32(p.cache_dtype, p.cache + position * p.token_stride, idx - t * row, v);
    }
  }
}

}  // namespace

size_t run_fused_rope_kv_write(const OpContext& ctx, std::span<const NodeExecution> segment) {
  RopeKvMatch m;
  const size_t n = match_rope_kv_write(segment, &m);
  if (n < 2) return 0;
  if (n == 4 && attention_follows(segment, m) && run_rope_kv_attention(ctx, segment[4], m)) {
    return 5;
  }
  int64_t total = 0;
  for (int j = 0; j < m.parts.count; ++j) total += m.parts.part[size_t(j)].n;
  constexpr int kThreads = 256;
  ctx.check(launch_programmatic(ctx.stream, dim3(grid_1d(total, kThreads)), dim3(kThreads), 0,
                                rope_kv_write_kernel, m.parts,
                                static_cast<const int32_t*>(m.positions->data), m.n_rot,
                                log(double(m.freq_base)), total, ctx.error_flag),
            "rope + kv_write", "kernel launch");
  return n;
}

void add_rope_kernels(KernelTable<Kernel>& rows) {
  add_row(rows, OpKind::Rope, {DType::F32, DType::I32}, {run_rope});
  add_row(rows, OpKind::RopeNeox, {DType::F32, DType::I32}, {run_rope});
}

}  // namespace tandem::cuda
