// RoPE: Rope rotates adjacent pairs (llama), RopeNeox the pairs (x[i], x[i + n_rot/2]) (GPT-NeoX,
// Qwen). One thread per element, angles in double (rope_pair). Also the fused launch of a layer's
// RoPE of Q and K with the KV-cache writes that follow it (run_fused_rope_kv_write).
#include <array>

#include "common.cuh"
#include "matvec.cuh"
#include "ops.h"

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

// One tensor of a fused RoPE / KV-write launch, [d, heads, T] contiguous f32: rotated or copied
// as is, written to `out` (a Rope node's output) and/or to `cache` at its token's position (a
// KvWrite node's cache: position p's row at p * token_stride).
struct RopeKvPart {
  const float* src = nullptr;
  float* out = nullptr;
  uint8_t* cache = nullptr;
  int64_t d = 0, heads = 0, n = 0;
  int64_t token_stride = 0, capacity = 0;
  DType cache_dtype = DType::F32;
  bool rotate = false;
};
constexpr int kMaxRopeKvParts = 4;
struct RopeKvParts {
  std::array<RopeKvPart, kMaxRopeKvParts> part;
  int count = 0;
  bool neox = false;  // every rotated part: RopeNeox
};

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

bool contiguous_f32(const TensorRef& t) {
  return t.desc->dtype == DType::F32 && t.desc->is_contiguous();
}

}  // namespace

size_t run_fused_rope_kv_write(const OpContext& ctx, std::span<const NodeExecution> segment) {
  // Up to two Rope nodes (Q, K), then up to two KvWrite nodes (K, V), all at the same positions;
  // a KvWrite of a Rope's output writes the rotated values it computes itself.
  if (segment.empty()) return 0;
  RopeKvParts parts;
  const TensorRef* positions = nullptr;
  auto same_positions = [&](const TensorRef& p) {
    if (p.desc->dtype != DType::I32 || !p.desc->is_contiguous()) return false;
    if (!positions) positions = &p;
    return p.data == positions->data && p.desc->ne == positions->desc->ne;
  };
  size_t n = 0;
  int n_rot = 0;
  float freq_base = 0.0f;
  const OpKind rope_op = segment[0].node->op;
  parts.neox = rope_op == OpKind::RopeNeox;
  while (n < segment.size() && n < 2 && segment[n].node->op == rope_op &&
         (rope_op == OpKind::Rope || rope_op == OpKind::RopeNeox)) {
    const NodeExecution& e = segment[n];
    const TensorDesc& x = *e.inputs[0].desc;
    if (!contiguous_f32(e.inputs[0]) || !contiguous_f32(e.output) || !same_positions(e.inputs[1]) ||
        positions->desc->ne[0] != x.ne[2] || x.ne[3] != 1 ||
        (n > 0 && (e.node->params.n_rot != n_rot || e.node->params.freq_base != freq_base))) {
      break;
    }
    n_rot = e.node->params.n_rot;
    freq_base = e.node->params.freq_base;
    RopeKvPart& p = parts.part[size_t(parts.count++)];
    p.src = static_cast<const float*>(e.inputs[0].data);
    p.out = static_cast<float*>(e.output.data);
    p.d = x.ne[0];
    p.heads = x.ne[1];
    p.n = x.elements();
    p.rotate = true;
    ++n;
  }
  const size_t ropes = n;
  while (n < segment.size() && n < ropes + 2 && segment[n].node->op == OpKind::KvWrite) {
    const NodeExecution& e = segment[n];
    const TensorDesc& cache = *e.output.desc;
    const TensorDesc& src = *e.inputs[1].desc;
    if (!contiguous_f32(e.inputs[1]) || !same_positions(e.inputs[2]) ||
        positions->desc->ne[0] != src.ne[2] || src.ne[3] != 1 ||
        (cache.dtype != DType::F32 && cache.dtype != DType::F16) || cache.ne[0] != src.ne[0] ||
        cache.ne[1] != src.ne[1] || cache.nb[1] != cache.nb[0] * cache.ne[0]) {
      break;
    }
    // The K write reads what a Rope of this launch writes: that part writes the cache too.
    RopeKvPart* p = nullptr;
    for (size_t r = 0; r < ropes; ++r) {
      if (parts.part[r].out == e.inputs[1].data && parts.part[r].n == src.elements() &&
          !parts.part[r].cache) {
        p = &parts.part[r];
      }
    }
    if (!p) {
      p = &parts.part[size_t(parts.count++)];
      p->src = static_cast<const float*>(e.inputs[1].data);
      p->d = src.ne[0];
      p->heads = src.ne[1];
      p->n = src.elements();
    }
    p->cache = static_cast<uint8_t*>(e.output.data);
    p->token_stride = cache.nb[2];
    p->capacity = cache.ne[2];
    p->cache_dtype = cache.dtype;
    ++n;
  }
  if (n < 2) return 0;
  int64_t total = 0;
  for (int j = 0; j < parts.count; ++j) total += parts.part[size_t(j)].n;
  constexpr int kThreads = 256;
  ctx.check(
      launch_programmatic(ctx.stream, dim3(grid_1d(total, kThreads)), dim3(kThreads), 0,
                          rope_kv_write_kernel, parts, static_cast<const int32_t*>(positions->data),
                          n_rot, log(double(freq_base)), total, ctx.error_flag),
      "rope + kv_write", "kernel launch");
  return n;
}

size_t rope_tail_of(std::span<const NodeExecution> segment, size_t n, RopeTail* tail) {
  // Products Q, K, V of one column, then Rope(Q), Rope(K), KvWrite(K rotated), KvWrite(V): the
  // llama graph's order (run_fused_rope_kv_write takes the same four nodes alone).
  if (n != 3 || segment.size() < n + 4 || segment[0].inputs[1].desc->ne[1] != 1) return 0;
  const NodeExecution* rope[2] = {&segment[n], &segment[n + 1]};
  const NodeExecution* write[2] = {&segment[n + 2], &segment[n + 3]};
  const TensorRef* positions = nullptr;
  auto same_positions = [&](const TensorRef& p) {
    if (p.desc->dtype != DType::I32 || !p.desc->is_contiguous() || p.desc->elements() != 1) {
      return false;
    }
    if (!positions) positions = &p;
    return p.data == positions->data;
  };
  const int64_t d = rope[0]->inputs[0].desc->ne[0];
  const int n_rot = rope[0]->node->params.n_rot;
  const float freq_base = rope[0]->node->params.freq_base;
  if (d % 2 != 0 || n_rot % 2 != 0 || n_rot <= 0 || n_rot > d) return 0;
  RopeTail t;
  for (int r = 0; r < 2; ++r) {
    const NodeExecution& e = *rope[r];
    const TensorDesc& x = *e.inputs[0].desc;
    if (e.node->op != OpKind::Rope || e.inputs[0].data != segment[size_t(r)].output.data ||
        x.elements() != segment[size_t(r)].output.desc->elements() ||
        !contiguous_f32(e.inputs[0]) || !contiguous_f32(e.output) || x.ne[0] != d || x.ne[2] != 1 ||
        x.ne[3] != 1 || !same_positions(e.inputs[1]) || e.node->params.n_rot != n_rot ||
        e.node->params.freq_base != freq_base) {
      return 0;
    }
    t.out[r] = static_cast<float*>(e.output.data);
  }
  // The K write reads the K Rope's output, the V write V's product.
  const void* sources[2] = {rope[1]->output.data, segment[2].output.data};
  for (int w = 0; w < 2; ++w) {
    const NodeExecution& e = *write[w];
    if (e.node->op != OpKind::KvWrite) return 0;
    const TensorDesc& cache = *e.output.desc;
    const TensorDesc& src = *e.inputs[1].desc;
    if (e.inputs[1].data != sources[w] || !contiguous_f32(e.inputs[1]) ||
        !same_positions(e.inputs[2]) || src.ne[0] != d ||
        src.elements() != cache.ne[0] * cache.ne[1] ||
        (cache.dtype != DType::F32 && cache.dtype != DType::F16) || cache.ne[0] != src.ne[0] ||
        cache.ne[1] != src.ne[1] || cache.nb[1] != cache.nb[0] * cache.ne[0] ||
        (w == 1 && cache.dtype != t.cache_dtype)) {
      return 0;
    }
    t.cache[w + 1] = static_cast<uint8_t*>(e.output.data);
    t.token_stride[w + 1] = cache.nb[2];
    t.capacity[w + 1] = cache.ne[2];
    t.cache_dtype = cache.dtype;
  }
  t.pos = static_cast<const int32_t*>(positions->data);
  t.log_base = log(double(freq_base));
  t.n_rot = n_rot;
  t.head_dim = int(d);
  *tail = t;
  return 4;
}

void add_rope_kernels(KernelTable<Kernel>& rows) {
  add_row(rows, OpKind::Rope, {DType::F32, DType::I32}, {run_rope});
  add_row(rows, OpKind::RopeNeox, {DType::F32, DType::I32}, {run_rope});
}

}  // namespace tandem::cuda
