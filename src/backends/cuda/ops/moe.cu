// Mixture of experts (llama.cpp's build_moe_ffn): MoeRoute, MoeWeights, ExpertMatMul and
// MoeCombine, each as the reference defines it. One warp per token for routing and weights; the
// expert product is one warp per output row of each (token, choice), reading only the chosen
// experts' rows: quantized weights through the matrix-vector kernels' int8 dot products
// (launch_expert_matvec), float weights element by element. With a map (expert -> matrix of a,
// or none), a choice the map has no matrix for gives zeros. Expert ids outside [0, n_expert) (or
// the map) raise the device-side flag and their rows are left as zeros (the next synchronize
// throws InvalidArgument).
#include <algorithm>

#include "common.cuh"
#include "ops.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 4;

// (value, id) of the better of two candidates: the larger value, the lower id on a tie.
__device__ __forceinline__ void better(float& v, int& id, float ov, int oid) {
  if (ov > v || (ov == v && oid < id)) {
    v = ov;
    id = oid;
  }
}

// Token t's top_k experts by gate logit (row), best first; ties go to the lower id. One warp;
// the ids chosen so far are skipped.
__device__ __forceinline__ void route_token(const float* row, int64_t n, int k, int32_t* out) {
  const int lane = threadIdx.x % 32;
  for (int j = 0; j < k; ++j) {
    float v = -INFINITY;
    int id = INT_MAX;
    for (int64_t i = lane; i < n; i += 32) {
      bool taken = false;
      for (int p = 0; p < j; ++p) taken |= out[p] == int32_t(i);
      if (!taken) better(v, id, row[i], int(i));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      better(v, id, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, id, o));
    }
    if (lane == 0) out[j] = id;
    __syncwarp();
  }
}

// softmax(row)[ids] over every expert, or (normalize) over the chosen ones. One warp.
__device__ __forceinline__ void weigh_token(const float* row, const int32_t* ids, float* out,
                                            int64_t n, int k, bool normalize, int32_t* error_flag) {
  const int lane = threadIdx.x % 32;
  float mx = -INFINITY;
  for (int64_t i = lane; i < n; i += 32) mx = fmaxf(mx, row[i]);
  mx = warp_max(mx);
  float all = 0.0f;
  for (int64_t i = lane; i < n; i += 32) all += expf(row[i] - mx);
  all = warp_sum(all);
  float chosen = 0.0f;
  bool bad = false;
  for (int j = lane; j < k; j += 32) {
    const int32_t id = ids[j];
    if (id < 0 || id >= n) {
      bad = true;
      continue;
    }
    chosen += expf(row[id] - mx);
  }
  chosen = warp_sum(chosen);
  if (__any_sync(0xffffffffu, bad)) {
    if (lane == 0) atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
    return;
  }
  const float sum = normalize ? chosen : all;
  for (int j = lane; j < k; j += 32) out[j] = expf(row[ids[j]] - mx) / sum;
}

__global__ void moe_route_kernel(const float* logits, int32_t* ids, int64_t n, int k,
                                 int64_t tokens) {
  grid_launch_dependents();
  grid_dependency_wait();
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (t < tokens) route_token(logits + t * n, n, k, ids + t * k);
}

__global__ void moe_weights_kernel(const float* logits, const int32_t* ids, float* out, int64_t n,
                                   int k, int64_t tokens, bool normalize, int32_t* error_flag) {
  grid_launch_dependents();
  grid_dependency_wait();
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (t < tokens)
    weigh_token(logits + t * n, ids + t * k, out + t * k, n, k, normalize, error_flag);
}

// MoeRoute and the MoeWeights of its ids in one launch: the warp reads back the ids it wrote.
__global__ void moe_route_weights_kernel(const float* logits, int32_t* ids, float* weights,
                                         int64_t n, int k, int64_t tokens, bool normalize,
                                         int32_t* error_flag) {
  grid_launch_dependents();
  grid_dependency_wait();
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (t >= tokens) return;
  route_token(logits + t * n, n, k, ids + t * k);
  weigh_token(logits + t * n, ids + t * k, weights + t * k, n, k, normalize, error_flag);
}

// out[:, j, t] = a[:, :, ids[j, t]] x b[:, j or 0, t] (a[:, :, map[ids[j, t]]] with a map, zeros
// where it has none): one warp per output row, blockIdx.y the (token, choice).
template <DType kType>
__global__ __launch_bounds__(kWarps * 32) void expert_matmul_kernel(
    const uint8_t* a, int64_t row_stride, int64_t expert_stride, int64_t n_expert, int M, int64_t K,
    const float* b, int64_t b_cols, const int32_t* ids, ExpertMap map, int k, float* out,
    int32_t* error_flag) {
  grid_launch_dependents();
  grid_dependency_wait();
  const int m = int(blockIdx.x) * kWarps + int(threadIdx.x / 32);
  const int lane = threadIdx.x % 32;
  if (m >= M) return;
  const int64_t jt = blockIdx.y, t = jt / k, j = jt % k;
  const int32_t expert = expert_of(ids[jt], map, n_expert);
  float* o = out + jt * M + m;
  if (expert < 0) {
    if (lane == 0) {
      *o = 0.0f;
      if (expert == kBadExpert) atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
    }
    return;
  }
  const uint8_t* row = a + expert * expert_stride + m * row_stride;
  const float* col = b + (t * b_cols + (b_cols == 1 ? 0 : j)) * K;
  float acc = 0.0f;
  for (int64_t i = lane; i < K; i += 32) acc += load_f32(kType, row, i) * col[i];
  acc = warp_sum(acc);
  if (lane == 0) *o = acc;
}

// out[i, t] = sum_j w[j, t] * experts[i, j, t].
__global__ void moe_combine_kernel(const float* experts, const float* w, float* out, int64_t n,
                                   int k, int64_t total) {
  grid_launch_dependents();
  grid_dependency_wait();
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < total;
       g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = g / n, i = g % n;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += w[t * k + j] * experts[(t * k + j) * n + i];
    out[g] = acc;
  }
}

void run_moe_route(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& l = *e.inputs[0].desc;
  const int64_t tokens = l.ne[1];
  ctx.check(launch_programmatic(
                ctx.stream, dim3(unsigned((tokens + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0,
                moe_route_kernel, static_cast<const float*>(e.inputs[0].data),
                static_cast<int32_t*>(e.output.data), l.ne[0], int(e.node->params.top_k), tokens),
            "moe_route", "kernel launch");
}

void run_moe_weights(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& l = *e.inputs[0].desc;
  const int64_t tokens = l.ne[1];
  ctx.check(
      launch_programmatic(
          ctx.stream, dim3(unsigned((tokens + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0,
          moe_weights_kernel, static_cast<const float*>(e.inputs[0].data),
          static_cast<const int32_t*>(e.inputs[1].data), static_cast<float*>(e.output.data),
          l.ne[0], int(e.inputs[1].desc->ne[0]), tokens, e.node->params.normalize, ctx.error_flag),
      "moe_weights", "kernel launch");
}

size_t expert_matmul_scratch_bytes(const NodeExecution& e, int /*sm_count*/) {
  return expert_matvec_scratch_bytes(e);
}

void run_expert_matmul(const OpContext& ctx, const NodeExecution& e) {
  if (launch_expert_matvec(ctx, e)) return;
  const TensorDesc &a = *e.inputs[0].desc, &b = *e.inputs[1].desc, &id = *e.inputs[2].desc;
  const int64_t M = a.ne[1], pairs = id.ne[0] * id.ne[1];
  const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(pairs));
  auto go = [&](auto kernel) {
    ctx.check(launch_programmatic(
                  ctx.stream, grid, dim3(kWarps * 32), 0, kernel,
                  static_cast<const uint8_t*>(e.inputs[0].data), int64_t(a.nb[1]), int64_t(a.nb[2]),
                  a.ne[2], int(M), a.ne[0], static_cast<const float*>(e.inputs[1].data), b.ne[1],
                  static_cast<const int32_t*>(e.inputs[2].data), expert_map_of(e), int(id.ne[0]),
                  static_cast<float*>(e.output.data), ctx.error_flag),
              "expert_matmul", "kernel launch");
  };
  switch (a.dtype) {
    case DType::F32:
      return go(expert_matmul_kernel<DType::F32>);
    case DType::F16:
      return go(expert_matmul_kernel<DType::F16>);
    case DType::BF16:
      return go(expert_matmul_kernel<DType::BF16>);
    case DType::Q8_0:
      return go(expert_matmul_kernel<DType::Q8_0>);
    case DType::Q4_0:
      return go(expert_matmul_kernel<DType::Q4_0>);
    case DType::Q4_K:
      return go(expert_matmul_kernel<DType::Q4_K>);
    case DType::Q5_K:
      return go(expert_matmul_kernel<DType::Q5_K>);
    default:
      return go(expert_matmul_kernel<DType::Q6_K>);
  }
}

void run_moe_combine(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& x = *e.inputs[0].desc;
  const int64_t n = x.ne[0], total = n * x.ne[2];
  constexpr int kThreads = 256;
  ctx.check(launch_programmatic(ctx.stream, dim3(grid_1d(total, kThreads)), dim3(kThreads), 0,
                                moe_combine_kernel, static_cast<const float*>(e.inputs[0].data),
                                static_cast<const float*>(e.inputs[1].data),
                                static_cast<float*>(e.output.data), n, int(x.ne[1]), total),
            "moe_combine", "kernel launch");
}

}  // namespace

size_t run_fused_moe_route_weights(const OpContext& ctx, std::span<const NodeExecution> segment) {
  if (segment.size() < 2 || segment[0].node->op != OpKind::MoeRoute ||
      segment[1].node->op != OpKind::MoeWeights) {
    return 0;
  }
  const NodeExecution &route = segment[0], &weigh = segment[1];
  const TensorDesc& l = *route.inputs[0].desc;
  if (weigh.inputs[0].data != route.inputs[0].data || weigh.inputs[0].desc->ne != l.ne ||
      weigh.inputs[1].data != route.output.data ||
      weigh.inputs[1].desc->ne != route.output.desc->ne || !l.is_contiguous()) {
    return 0;
  }
  const int64_t tokens = l.ne[1];
  ctx.check(
      launch_programmatic(
          ctx.stream, dim3(unsigned((tokens + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0,
          moe_route_weights_kernel, static_cast<const float*>(route.inputs[0].data),
          static_cast<int32_t*>(route.output.data), static_cast<float*>(weigh.output.data), l.ne[0],
          int(route.node->params.top_k), tokens, weigh.node->params.normalize, ctx.error_flag),
      "moe_route + moe_weights", "kernel launch");
  return 2;
}

void add_moe_kernels(KernelTable<Kernel>& rows) {
  add_row(rows, OpKind::MoeRoute, {DType::F32, DType::I32}, {run_moe_route});
  add_row(rows, OpKind::MoeWeights, {DType::F32, DType::I32}, {run_moe_weights});
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K}) {
    add_row(rows, OpKind::ExpertMatMul, {d, DType::F32, DType::I32},
            {run_expert_matmul, expert_matmul_scratch_bytes});
  }
  add_row(rows, OpKind::MoeCombine, {DType::F32}, {run_moe_combine});
}

}  // namespace tandem::cuda
