// ExpertMatMul with quantized weights (MoE layers): one warp per output row of each (token,
// choice) for decode, gate + up + SwiGLU as one launch, and the (token, choice) pairs grouped by
// expert for prefill. The int8 row loops and b's quantization are the matrix-vector kernels'
// (matvec.cuh).
#include <span>

#include "common.cuh"
#include "matvec.cuh"
#include "ops.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 4;

// ExpertMatMul with quantized weights: one warp per output row of each (token, choice) z, the
// chosen expert's row times b's column for z (b quantized once, as for a matrix-vector
// product). The expert comes from data, so nothing is fetched before the wait.
template <DType kType>
__global__ __launch_bounds__(kWarps * 32) void expert_matvec_kernel(
    const uint8_t* a, int64_t row_stride, int64_t expert_stride, int64_t n_expert, int M, int64_t K,
    const int8_t* bq, const float* bd, int64_t b_cols, const int32_t* ids, int k, float* out,
    int32_t* error_flag) {
  grid_dependency_wait();
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;
  const int64_t z = blockIdx.y, col = b_cols == 1 ? z / k : z;
  const int32_t expert = ids[z];
  out += z * M;
  if (expert < 0 || expert >= n_expert) {
    if (lane == 0) {
      out[row] = 0.0f;
      atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
    }
    return;
  }
  const uint8_t* ar = a + expert * expert_stride + row * row_stride;
  bq += col * K;
  bd += col * (K / kQBlock);
  if constexpr (kType == DType::Q4_K || kType == DType::Q5_K || kType == DType::Q6_K) {
    k_matvec_row<kType, 1>(ar, M, row, int(K / kSuperBlock), bq, bd, out);
  } else {
    const int8_t* const bqs[1] = {bq};
    const float* const bds[1] = {bd};
    float acc[1];
    quant_row_dot<kType, 1>(ar, int(K / kQBlock), bqs, bds, acc);
    const float v = warp_sum(acc[0]);
    if (lane == 0) out[row] = v;
  }
}

// Gate and up ExpertMatMul of one b and one set of ids, then the SwiGlu of their outputs (a MoE
// layer's decode): one launch whose warps take row m of both chosen experts' matrices and write
// both products and silu(gate) * up.
template <DType kType>
__global__ __launch_bounds__(kWarps * 32) void expert_gate_up_kernel(
    const uint8_t* gate_w, const uint8_t* up_w, int64_t row_stride, int64_t expert_stride,
    int64_t n_expert, int M, int64_t K, const int8_t* bq, const float* bd, int64_t b_cols,
    const int32_t* ids, int k, float* gate_out, float* up_out, float* glu, int32_t* error_flag) {
  grid_dependency_wait();
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;
  const int64_t z = blockIdx.y, col = b_cols == 1 ? z / k : z;
  const int32_t expert = ids[z];
  gate_out += z * M;
  up_out += z * M;
  glu += z * M;
  if (expert < 0 || expert >= n_expert) {
    if (lane == 0) {
      gate_out[row] = up_out[row] = glu[row] = 0.0f;
      atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
    }
    return;
  }
  const int64_t offset = expert * expert_stride + row * row_stride;
  bq += col * K;
  bd += col * (K / kQBlock);
  if constexpr (kType == DType::Q4_K || kType == DType::Q5_K || kType == DType::Q6_K) {
    // Lane 0 writes each product; it computes the GLU from what it wrote.
    k_matvec_row<kType, 1>(gate_w + offset, M, row, int(K / kSuperBlock), bq, bd, gate_out);
    k_matvec_row<kType, 1>(up_w + offset, M, row, int(K / kSuperBlock), bq, bd, up_out);
    if (lane == 0) {
      const float g = gate_out[row], u = up_out[row];
      glu[row] = g / (1.0f + expf(-g)) * u;
    }
  } else {
    const int8_t* const bqs[1] = {bq};
    const float* const bds[1] = {bd};
    float g[1], u[1];
    quant_row_dot<kType, 1>(gate_w + offset, int(K / kQBlock), bqs, bds, g);
    quant_row_dot<kType, 1>(up_w + offset, int(K / kQBlock), bqs, bds, u);
    g[0] = warp_sum(g[0]);
    u[0] = warp_sum(u[0]);
    if (lane == 0) {
      gate_out[row] = g[0];
      up_out[row] = u[0];
      glu[row] = g[0] / (1.0f + expf(-g[0])) * u[0];
    }
  }
}

// ExpertMatMul over many tokens (prefill): the (token, choice) pairs grouped by expert on the
// device, then each expert's rows read once per tile of up to kExpertTile pairs instead of once
// per pair. moe_group_kernel (one block) counts the pairs per expert, lays the groups out one
// after another (pairs[]), and lists the tiles (expert, first pair, pairs) for the product.
constexpr int kExpertTile = 8;
constexpr int kMaxGroupedExperts = 2048;  // counts, cursors and offsets in shared memory
struct ExpertGroups {
  int32_t* pairs;        // [pairs]: z = t * k + j, grouped by expert
  int32_t* tile_expert;  // [max_tiles]
  int32_t* tile_start;   // index into pairs
  int32_t* tile_count;
  int32_t* n_tiles;
};

__global__ void moe_group_kernel(const int32_t* ids, int64_t n_pairs, int n_expert, ExpertGroups g,
                                 int32_t* error_flag) {
  __shared__ int32_t count[kMaxGroupedExperts], offset[kMaxGroupedExperts],
      cursor[kMaxGroupedExperts];
  grid_dependency_wait();
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = cursor[e] = 0;
  __syncthreads();
  for (int64_t z = threadIdx.x; z < n_pairs; z += blockDim.x) {
    const int32_t e = ids[z];
    if (e < 0 || e >= n_expert) {
      atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
      continue;
    }
    atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t at = 0, tiles = 0;
    for (int e = 0; e < n_expert; ++e) {
      offset[e] = at;
      for (int32_t s = 0; s < count[e]; s += kExpertTile, ++tiles) {
        g.tile_expert[tiles] = e;
        g.tile_start[tiles] = at + s;
        g.tile_count[tiles] = min(kExpertTile, count[e] - s);
      }
      at += count[e];
    }
    *g.n_tiles = tiles;
  }
  __syncthreads();
  for (int64_t z = threadIdx.x; z < n_pairs; z += blockDim.x) {
    const int32_t e = ids[z];
    if (e < 0 || e >= n_expert) continue;
    g.pairs[offset[e] + atomicAdd(&cursor[e], 1)] = int32_t(z);
  }
}

// One warp per row of a tile's expert, the tile's pairs as the columns (a short tile repeats
// its first pair and does not write the copies). A pair with an invalid expert id was left out
// by the grouping: its output stays unwritten, and the flag is raised.
template <DType kType>
__global__ __launch_bounds__(kWarps * 32) void expert_grouped_kernel(
    const uint8_t* a, int64_t row_stride, int64_t expert_stride, int M, int64_t K, const int8_t* bq,
    const float* bd, int64_t b_cols, int k, ExpertGroups g, float* out) {
  grid_dependency_wait();
  const int tile = blockIdx.y;
  if (tile >= *g.n_tiles) return;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  if (row >= M) return;
  const int expert = g.tile_expert[tile], start = g.tile_start[tile], count = g.tile_count[tile];
  const int n_blocks = int(K / kQBlock);
  int32_t z[kExpertTile];
  const int8_t* bqs[kExpertTile];
  const float* bds[kExpertTile];
#pragma unroll
  for (int c = 0; c < kExpertTile; ++c) {
    z[c] = g.pairs[start + (c < count ? c : 0)];
    const int64_t col = b_cols == 1 ? z[c] / k : z[c];
    bqs[c] = bq + col * K;
    bds[c] = bd + col * int64_t(n_blocks);
  }
  float acc[kExpertTile];
  quant_row_dot<kType, kExpertTile>(a + expert * expert_stride + row * row_stride, n_blocks, bqs,
                                    bds, acc);
#pragma unroll
  for (int c = 0; c < kExpertTile; ++c) {
    const float v = warp_sum(acc[c]);
    if (threadIdx.x % 32 == 0 && c < count) out[int64_t(z[c]) * M + row] = v;
  }
}

// Tokens from which the grouped product reads fewer weight bytes than one product per pair.
constexpr int64_t kGroupedMinTokens = 8;
bool expert_grouped(const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &id = *e.inputs[2].desc;
  return (a.dtype == DType::Q4_0 || a.dtype == DType::Q8_0) && id.ne[1] >= kGroupedMinTokens &&
         a.ne[2] <= kMaxGroupedExperts;
}

// The grouped product's lists after b's quantization in the scratch: pairs, then the tiles.
int64_t expert_max_tiles(const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &id = *e.inputs[2].desc;
  return a.ne[2] + (id.ne[0] * id.ne[1] + kExpertTile - 1) / kExpertTile;
}

}  // namespace

size_t expert_matvec_scratch_bytes(const NodeExecution& e) {
  const TensorDesc& b = *e.inputs[1].desc;
  size_t bytes = align_up(size_t(b.elements()), kScratchAlignment) +
                 align_up(size_t(b.elements() / kQBlock) * 4, kScratchAlignment);
  if (expert_grouped(e)) {
    const TensorDesc& id = *e.inputs[2].desc;
    bytes += align_up(size_t(id.ne[0] * id.ne[1]) * 4, kScratchAlignment) +
             3 * align_up(size_t(expert_max_tiles(e)) * 4, kScratchAlignment) + kScratchAlignment;
  }
  return bytes;
}

namespace {

// ExpertMatMul nodes the matrix-vector kernels take: quantized weights with contiguous rows.
bool expert_matvec_fits(const NodeExecution& e) {
  if (e.node->op != OpKind::ExpertMatMul) return false;
  const TensorDesc &a = *e.inputs[0].desc, &b = *e.inputs[1].desc;
  const bool quantized = a.dtype == DType::Q4_0 || a.dtype == DType::Q8_0 || is_k_quant(a.dtype);
  return quantized && int8_activations(a.ne[1], 1) && b.is_contiguous() && a.ne[1] <= INT32_MAX &&
         a.nb[1] == int64_t(row_bytes(a.dtype, a.ne[0]));
}

}  // namespace

size_t run_fused_expert_gate_up(const OpContext& ctx, std::span<const NodeExecution> segment) {
  if (segment.size() < 3) return 0;
  const NodeExecution &gate = segment[0], &up = segment[1], &glu = segment[2];
  if (!expert_matvec_fits(gate) || !expert_matvec_fits(up) || expert_grouped(gate) ||
      glu.node->op != OpKind::SwiGlu) {
    return 0;
  }
  const TensorDesc &ga = *gate.inputs[0].desc, &ua = *up.inputs[0].desc;
  const TensorDesc& out = *gate.output.desc;
  if (ua.dtype != ga.dtype || ua.ne != ga.ne || ua.nb != ga.nb ||
      up.inputs[1].data != gate.inputs[1].data ||
      up.inputs[1].desc->ne != gate.inputs[1].desc->ne ||
      up.inputs[2].data != gate.inputs[2].data ||
      up.inputs[2].desc->ne != gate.inputs[2].desc->ne || glu.inputs[0].data != gate.output.data ||
      glu.inputs[1].data != up.output.data || glu.inputs[0].desc->ne != out.ne ||
      glu.inputs[1].desc->ne != out.ne || glu.output.desc->ne != out.ne ||
      glu.output.desc->dtype != DType::F32 || !glu.output.desc->is_contiguous()) {
    return 0;
  }
  const TensorDesc &b = *gate.inputs[1].desc, &id = *gate.inputs[2].desc;
  const QuantizedB qb = quantize_b(ctx, b, gate.inputs[1].data);
  const int M = int(ga.ne[1]);
  const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(id.ne[0] * id.ne[1]));
  auto go = [&](auto kernel) {
    ctx.check(launch_programmatic(
                  ctx.stream, grid, dim3(kWarps * 32), 0, kernel,
                  static_cast<const uint8_t*>(gate.inputs[0].data),
                  static_cast<const uint8_t*>(up.inputs[0].data), int64_t(ga.nb[1]),
                  int64_t(ga.nb[2]), ga.ne[2], M, ga.ne[0], static_cast<const int8_t*>(qb.bq),
                  static_cast<const float*>(qb.bd), b.ne[1],
                  static_cast<const int32_t*>(gate.inputs[2].data), int(id.ne[0]),
                  static_cast<float*>(gate.output.data), static_cast<float*>(up.output.data),
                  static_cast<float*>(glu.output.data), ctx.error_flag),
              "expert_matmul + swiglu", "kernel launch");
  };
  with_quantized_dtype(ga.dtype, [&](auto d) { go(expert_gate_up_kernel<d()>); });
  return 3;
}

bool launch_expert_matvec(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &b = *e.inputs[1].desc, &id = *e.inputs[2].desc;
  if (!expert_matvec_fits(e)) return false;
  const QuantizedB qb = quantize_b(ctx, b, e.inputs[1].data);
  const int M = int(a.ne[1]);
  if (expert_grouped(e)) {
    // The lists follow b's scales in the scratch.
    auto* at = reinterpret_cast<uint8_t*>(qb.bd) +
               align_up(size_t(b.elements() / kQBlock) * 4, kScratchAlignment);
    auto take = [&](size_t n) {
      auto* p = reinterpret_cast<int32_t*>(at);
      at += align_up(n * 4, kScratchAlignment);
      return p;
    };
    const int64_t n_pairs = id.ne[0] * id.ne[1], max_tiles = expert_max_tiles(e);
    ExpertGroups g{};
    g.pairs = take(size_t(n_pairs));
    g.tile_expert = take(size_t(max_tiles));
    g.tile_start = take(size_t(max_tiles));
    g.tile_count = take(size_t(max_tiles));
    g.n_tiles = take(1);
    ctx.check(launch_programmatic(ctx.stream, dim3(1), dim3(1024), 0, moe_group_kernel,
                                  static_cast<const int32_t*>(e.inputs[2].data), n_pairs,
                                  int(a.ne[2]), g, ctx.error_flag),
              "expert_matmul", "kernel launch");
    const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(max_tiles));
    auto kernel = a.dtype == DType::Q4_0 ? expert_grouped_kernel<DType::Q4_0>
                                         : expert_grouped_kernel<DType::Q8_0>;
    ctx.check(launch_programmatic(ctx.stream, grid, dim3(kWarps * 32), 0, kernel,
                                  static_cast<const uint8_t*>(e.inputs[0].data), int64_t(a.nb[1]),
                                  int64_t(a.nb[2]), M, a.ne[0], static_cast<const int8_t*>(qb.bq),
                                  static_cast<const float*>(qb.bd), b.ne[1], int(id.ne[0]), g,
                                  static_cast<float*>(e.output.data)),
              "expert_matmul", "kernel launch");
    return true;
  }
  const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(id.ne[0] * id.ne[1]));
  auto go = [&](auto kernel) {
    ctx.check(
        launch_programmatic(ctx.stream, grid, dim3(kWarps * 32), 0, kernel,
                            static_cast<const uint8_t*>(e.inputs[0].data), int64_t(a.nb[1]),
                            int64_t(a.nb[2]), a.ne[2], M, a.ne[0],
                            static_cast<const int8_t*>(qb.bq), static_cast<const float*>(qb.bd),
                            b.ne[1], static_cast<const int32_t*>(e.inputs[2].data), int(id.ne[0]),
                            static_cast<float*>(e.output.data), ctx.error_flag),
        "expert_matmul", "kernel launch");
  };
  with_quantized_dtype(a.dtype, [&](auto d) { go(expert_matvec_kernel<d()>); });
  return true;
}

}  // namespace tandem::cuda
