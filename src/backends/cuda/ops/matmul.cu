// MatMul through cuBLAS on tensor cores: f16/bf16 weights meet b converted to the same type
// (f32 accumulation); f32 weights use TF32 tensor cores. Matrix-vector products of f32, f16 and
// bf16 weights (decode: 1 to kMatvecMaxColumns columns) take a streaming kernel of their own
// ("half" below for all three: it was written for the 16-bit types; f32 rows take two loads).
#include <algorithm>
#include <atomic>
#include <climits>

#include "common.cuh"
#include "matvec.cuh"
#include "ops.h"
#include "tandem/error.h"

namespace tandem::cuda {

namespace {

cudaDataType_t cuda_type(DType d) {
  return d == DType::F16 ? CUDA_R_16F : d == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// Each lane takes 8 consecutive weights (one 16-byte load) of every 256 of a row, against f32 b
// (no conversion launch; f32 products, more exact than the tensor-core path). Products of the
// same b that follow each other run as one launch (Q, K and V); gate and up followed by the
// SwiGLU of their outputs run as one launch whose warps take row r of both matrices and write
// the two products and silu(gate) * up (the SwiGlu node's output). half_matvec_kernel below says
// how the rows are shared out.
constexpr int kHalfSteps = 8;
constexpr int64_t kHalfChunk = 256;  // elements of a row one warp load covers
constexpr int kMaxHalfParts = 3;

template <DType kType>
__device__ __forceinline__ void half8_to_f32(const uint4& w, float (&x)[8]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kType == DType::F16) {
      x[2 * i] = f16_bits_to_f32(uint16_t(words[i] & 0xFFFFu));
      x[2 * i + 1] = f16_bits_to_f32(uint16_t(words[i] >> 16));
    } else {
      x[2 * i] = __uint_as_float(words[i] << 16);
      x[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
    }
  }
}

// 16-byte loads a lane takes of each chunk of a row (8 weights), and chunks in flight.
template <DType kType>
constexpr int kVecs = kType == DType::F32 ? 2 : 1;
template <DType kType>
constexpr int kSteps = kHalfSteps / kVecs<kType>;

template <DType kType>
__device__ __forceinline__ void weights8_to_f32(const uint4 (&w)[kVecs<kType>], float (&x)[8]) {
  if constexpr (kType == DType::F32) {
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      x[4 * v] = __uint_as_float(w[v].x);
      x[4 * v + 1] = __uint_as_float(w[v].y);
      x[4 * v + 2] = __uint_as_float(w[v].z);
      x[4 * v + 3] = __uint_as_float(w[v].w);
    }
  } else {
    half8_to_f32<kType>(w[0], x);
  }
}

// Up to kMaxHalfParts matrices multiplying the same b: rows [row_start[p], row_start[p + 1]) of
// the grid are part p's; out[p] is [M_p, kCols].
struct HalfParts {
  const uint8_t* a[kMaxHalfParts];
  int64_t row_stride[kMaxHalfParts];
  float* out[kMaxHalfParts];
  int row_start[kMaxHalfParts + 1];
};

// Persistent CTAs of kHalfWarps warps, as many as the SMs hold at once (2 or 3 a SM, by their
// registers): CTA g takes the row groups g, g + gridDim.x, ... of kHalfWarps / kSplit rows.
// kSplit warps share a row (long rows: K of 8,192 is four passes of kHalfSteps loads for one
// warp), each K / kSplit of it, and add their sums through shared memory in a fixed order. A
// warp walks its rows in passes of kS chunks and issues the next pass's loads before it
// multiplies the current one. This replaced a grid of 4-warp blocks whose warps each took one
// row and exited: 1B F16 products of one token, in a graph of 8 (H100, bench/NOTES.md), o 5.5 ->
// 4.8 us, gate 16.4 -> 13.2, down 15.7 -> 13.1 (86% of copy); tg128 +3%. A lane adds its chunks
// in the same order as before: the same sums, bit for bit. kPair 2 takes row r of parts 0 and 1
// (gate and up) and writes their GLU, with half the chunks a pass (two rows' loads in flight).
// A programmatic dependent: the first loads of weights (which no kernel writes) go out before
// the wait for the kernel that wrote b, and it releases its dependents after that wait.
// With kNorm (one column) b is not read but made, as the staged kernel makes it: every CTA sums
// the residual Add's two inputs into shared memory, reduces their squares and scales them by the
// RmsNorm's factor and weight there, and CTA 0 writes the sum and the normed vector (the two
// nodes' outputs; b is the normed vector's address). The weights' first loads are in flight
// meanwhile; the Add and norm launch leaves the chain between two products.
constexpr int kHalfWarps = 8;
constexpr int64_t kMaxNormK = 8192;  // most elements a kNorm CTA holds (32 KB of shared memory)
template <DType kType, int kCols, int kPair, int kSplit, bool kNorm = false>
__global__ __launch_bounds__(kHalfWarps *
                             32) void half_matvec_kernel(const __grid_constant__ HalfParts parts,
                                                         int n_parts, int64_t K, const float* b,
                                                         float* glu,
                                                         const __grid_constant__ NormedB norm) {
  static_assert(kHalfWarps % kSplit == 0 && (kPair == 1 || kSplit == 1), "whole rows a CTA");
  static_assert(!kNorm || kCols == 1, "the norm makes one column");
  constexpr int kV = kVecs<kType>;
  constexpr int kS = kSteps<kType> / kPair;  // a pair's two rows keep the bytes in flight
  constexpr int kRowsPerCta = kHalfWarps / kSplit;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, slice = warp % kSplit;
  const int total = kPair == 2 ? parts.row_start[1] : parts.row_start[n_parts];
  const int groups = (total + kRowsPerCta - 1) / kRowsPerCta;
  const int64_t part_k = K / kSplit;
  const int64_t chunks = part_k / kHalfChunk;
  const int passes = int((chunks + kS - 1) / kS);
  const int elem = kType == DType::F32 ? 4 : 2;
  auto part_of = [&](int r) {
    int p = 0;
#pragma unroll
    for (int k = 1; k < kMaxHalfParts; ++k) p += k < n_parts && r >= parts.row_start[k];
    return p;
  };
  auto row_of = [&](int g) { return g * kRowsPerCta + warp / kSplit; };
  auto load = [&](uint4(&dst)[kPair][kS][kV], int r, int ps) {
#pragma unroll
    for (int q = 0; q < kPair; ++q) {
      const int p = kPair == 2 ? q : part_of(r);
      const int row = kPair == 2 ? r : r - parts.row_start[p];
      const auto* base =
          reinterpret_cast<const uint4*>(parts.a[p] + row * parts.row_stride[p] +
                                         (slice * part_k + int64_t(ps) * kS * kHalfChunk) * elem);
#pragma unroll
      for (int t = 0; t < kS; ++t)
#pragma unroll
        for (int v = 0; v < kV; ++v) {
          if (int64_t(ps) * kS + t < chunks) dst[q][t][v] = __ldcs(base + (t * 32 + lane) * kV + v);
        }
    }
  };
  int g = blockIdx.x, ps = 0;
  uint4 w[kPair][kS][kV];
  if (g < groups && row_of(g) < total) load(w, row_of(g), 0);
  grid_dependency_wait();  // b is written by the preceding kernel
  grid_launch_dependents();
  const float* bv = b;  // b, or with kNorm the normed vector in shared memory
  if constexpr (kNorm) {
    extern __shared__ float4 s_x[];  // K / 4
    __shared__ float s_red[kHalfWarps];
    const int n4 = int(K / 4);
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 x = __ldcg(reinterpret_cast<const float4*>(norm.a) + i);
      if (norm.r) {
        const float4 r = __ldcg(reinterpret_cast<const float4*>(norm.r) + i);
        x = make_float4(x.x + r.x, x.y + r.y, x.z + r.z, x.w + r.w);
      }
      s_x[i] = x;
      ss += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
    }
    // x = a + r and y = x * inv * w, the Add's and the RmsNorm's arithmetic (binary_kernel,
    // norm_kernel). Each thread rescales the elements it summed, so only the reduction meets.
    const float inv = rsqrtf(block_reduce<false>(ss, s_red) / float(K) + norm.eps);
    const bool writer = blockIdx.x == 0;
    auto* const normed = reinterpret_cast<float4*>(const_cast<float*>(b));  // read by no CTA
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
      const float4 x = s_x[i];
      if (writer && norm.r) reinterpret_cast<float4*>(norm.sum)[i] = x;
      float4 y = make_float4(x.x * inv, x.y * inv, x.z * inv, x.w * inv);
      if (norm.w) {
        const float4 w = __ldg(reinterpret_cast<const float4*>(norm.w) + i);
        y = make_float4(y.x * w.x, y.y * w.y, y.z * w.z, y.w * w.w);
      }
      if (writer) normed[i] = y;
      s_x[i] = y;
    }
    __syncthreads();
    bv = reinterpret_cast<const float*>(s_x);
  }
  float acc[kPair][kCols];
#pragma unroll
  for (int q = 0; q < kPair; ++q)
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[q][c] = 0.0f;
  __shared__ float partial[kSplit > 1 ? kHalfWarps : 1][kCols];
  while (g < groups) {  // the same trips for every warp of the CTA (its barriers)
    const int r = row_of(g);
    const bool live = r < total;
    int ng = g, nps = ps + 1;
    if (nps == passes) ng += gridDim.x, nps = 0;
    uint4 wn[kPair][kS][kV];
    if (ng < groups && row_of(ng) < total) load(wn, row_of(ng), nps);
    if (live) {
#pragma unroll
      for (int t = 0; t < kS; ++t) {
        if (int64_t(ps) * kS + t >= chunks) break;
        const int64_t k = slice * part_k + (int64_t(ps) * kS + t) * kHalfChunk + 8 * lane;
#pragma unroll
        for (int q = 0; q < kPair; ++q) {
          float x[8];
          weights8_to_f32<kType>(w[q][t], x);
#pragma unroll
          for (int c = 0; c < kCols; ++c) {
            const float4 b0 = *reinterpret_cast<const float4*>(bv + c * K + k);
            const float4 b1 = *reinterpret_cast<const float4*>(bv + c * K + k + 4);
            acc[q][c] += x[0] * b0.x + x[1] * b0.y + x[2] * b0.z + x[3] * b0.w + x[4] * b1.x +
                         x[5] * b1.y + x[6] * b1.z + x[7] * b1.w;
          }
        }
      }
    }
    if (nps == 0) {  // row r done
#pragma unroll
      for (int q = 0; q < kPair; ++q)
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[q][c] = warp_sum(acc[q][c]);
      if constexpr (kSplit > 1) {
        if (live && lane == 0) {
#pragma unroll
          for (int c = 0; c < kCols; ++c) partial[warp][c] = acc[0][c];
        }
        __syncthreads();
        if (slice == 0) {
#pragma unroll
          for (int c = 0; c < kCols; ++c) {
            for (int s = 1; s < kSplit; ++s) acc[0][c] += partial[warp + s][c];
          }
        }
        __syncthreads();  // partial is written again for the next row
      }
      if (live && slice == 0 && lane == 0) {
        const int p = kPair == 2 ? 0 : part_of(r);
        const int row = r - parts.row_start[p];
        const int M = parts.row_start[p + 1] - parts.row_start[p];
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int64_t i = int64_t(c) * M + row;
          parts.out[p][i] = acc[0][c];
          if constexpr (kPair == 2) {
            const float gv = acc[0][c], u = acc[1][c];
            parts.out[1][i] = u;
            glu[i] = gv / (1.0f + expf(-gv)) * u;
          }
        }
      }
#pragma unroll
      for (int q = 0; q < kPair; ++q)
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[q][c] = 0.0f;
    }
#pragma unroll
    for (int q = 0; q < kPair; ++q)
#pragma unroll
      for (int t = 0; t < kS; ++t)
#pragma unroll
        for (int v = 0; v < kV; ++v) w[q][t][v] = wn[q][t][v];
    g = ng, ps = nps;
  }
}

// CTAs of half_matvec_kernel<kType, kCols, kPair, kSplit, kNorm> one SM holds at once (its
// registers decide: 2 or 3 of 8 warps; with kNorm at most kMaxNormK elements of shared memory),
// asked once per device, not at every launch (as decode_smem_bytes).
template <DType kType, int kCols, int kPair, int kSplit, bool kNorm>
int resident_ctas(const OpContext& ctx) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> state[kMaxDevices];  // 0 unknown, else the answer
  const int device = ctx.state->device;
  if (device < 0 || device >= kMaxDevices) return 1;
  int n = state[device].load(std::memory_order_acquire);
  if (n == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &n, half_matvec_kernel<kType, kCols, kPair, kSplit, kNorm>, kHalfWarps * 32,
            kNorm ? size_t(kMaxNormK) * 4 : 0) != cudaSuccess) {
      (void)cudaGetLastError();  // a failed query is an answer (one CTA a SM), not an error
      n = 1;
    }
    n = std::max(n, 1);
    state[device].store(n, std::memory_order_release);
  }
  return n;
}

// The streaming kernel covers one 2-D weight matrix of contiguous, 16-byte aligned rows, K a
// multiple of 256, and 1 to kMatvecMaxColumns contiguous, aligned columns of b.
bool half_matvec_fits(const NodeExecution& e) {
  if (e.node->op != OpKind::MatMul) return false;
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const TensorDesc& o = *e.output.desc;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool f32 = a.dtype == DType::F32;
  return (f32 || a.dtype == DType::F16 || a.dtype == DType::BF16) && b.dtype == DType::F32 &&
         b.ne[1] >= 1 && b.ne[1] <= kMatvecMaxColumns && a.ne[2] * a.ne[3] == 1 &&
         b.ne[2] * b.ne[3] == 1 && a.ne[0] % kHalfChunk == 0 && a.nb[0] == (f32 ? 4 : 2) &&
         a.nb[1] % 16 == 0 && a.ne[1] <= INT_MAX / 4 && b.is_contiguous() && o.is_contiguous() &&
         aligned(e.inputs[0].data) && aligned(e.inputs[1].data);
}

HalfParts half_parts(std::span<const NodeExecution> execs) {
  HalfParts parts{};
  for (size_t i = 0; i < execs.size(); ++i) {
    const TensorDesc& a = *execs[i].inputs[0].desc;
    parts.a[i] = static_cast<const uint8_t*>(execs[i].inputs[0].data);
    parts.row_stride[i] = a.nb[1];
    parts.out[i] = static_cast<float*>(execs[i].output.data);
    parts.row_start[i + 1] = parts.row_start[i] + int(a.ne[1]);
  }
  return parts;
}

// execs: 1 to kMaxHalfParts products of the same b (half_matvec_fits, equal dtype and K); with
// glu, gate and up of equal M and the SwiGlu output they feed; with norm (one column, K at most
// kMaxNormK), b is made from the Add and RmsNorm it names and written to b's address.
void launch_half_matvec(const OpContext& ctx, std::span<const NodeExecution> execs,
                        float* glu = nullptr, const NormedB* norm = nullptr) {
  const TensorDesc& a = *execs[0].inputs[0].desc;
  const TensorDesc& b = *execs[0].inputs[1].desc;
  const HalfParts parts = half_parts(execs);
  const int n = int(execs.size());
  const int rows = glu ? parts.row_start[1] : parts.row_start[n];
  // Warps per row: up to four, each with at least one pass of kHalfSteps chunks (K of 4096: two,
  // 8192 or more: four) and an equal share; gate and up keep one warp per row pair.
  const int64_t chunks = a.ne[0] / kHalfChunk;
  auto splits = [&](int s) { return chunks % s == 0 && chunks >= s * kHalfSteps; };
  const int split = glu ? 1 : splits(4) ? 4 : splits(2) ? 2 : 1;
  const int64_t groups = (rows + kHalfWarps / split - 1) / (kHalfWarps / split);
  const auto* bp = static_cast<const float*>(execs[0].inputs[1].data);
  auto launch = [&](auto type, auto cols) {
    constexpr DType kType = decltype(type)::value;
    auto matvec = [&](auto pair, auto split_warps) {
      constexpr int kPair = decltype(pair)::value, kSplit = decltype(split_warps)::value;
      auto go = [&](auto with_norm) {
        constexpr bool kNorm = decltype(with_norm)::value;
        const int per_sm = resident_ctas<kType, cols(), kPair, kSplit, kNorm>(ctx);
        const dim3 grid(unsigned(std::min<int64_t>(groups, int64_t(ctx.sm_count) * per_sm)));
        return launch_programmatic(ctx.stream, grid, dim3(kHalfWarps * 32),
                                   kNorm ? size_t(a.ne[0]) * 4 : 0,
                                   half_matvec_kernel<kType, cols(), kPair, kSplit, kNorm>, parts,
                                   n, int64_t(a.ne[0]), bp, glu, norm ? *norm : NormedB{});
      };
      if constexpr (cols() == 1) {
        if (norm) return go(std::true_type{});
      } else if (norm) {
        return cudaErrorInvalidValue;  // the norm makes one column (the matcher's condition)
      }
      return go(std::false_type{});
    };
    using One = std::integral_constant<int, 1>;
    using Two = std::integral_constant<int, 2>;
    const cudaError_t err = glu          ? matvec(Two{}, One{})
                            : split == 4 ? matvec(One{}, std::integral_constant<int, 4>{})
                            : split == 2 ? matvec(One{}, Two{})
                                         : matvec(One{}, One{});
    ctx.check(err, "matmul", "kernel launch");
  };
  with_columns(b.ne[1], [&](auto cols) {
    switch (a.dtype) {
      case DType::F32:
        return launch(std::integral_constant<DType, DType::F32>{}, cols);
      case DType::F16:
        return launch(std::integral_constant<DType, DType::F16>{}, cols);
      default:
        return launch(std::integral_constant<DType, DType::BF16>{}, cols);
    }
  });
}

}  // namespace

size_t run_fused_half_matvecs(const OpContext& ctx, std::span<const NodeExecution> segment) {
  const size_t n = count_same_b(segment, kMaxHalfParts, half_matvec_fits);
  if (n < 2) return 0;
  if (float* glu = swiglu_of(segment, n)) {
    launch_half_matvec(ctx, segment.first(2), glu);
    return 3;
  }
  launch_half_matvec(ctx, segment.first(n));
  return n;
}

size_t run_fused_norm_half_matvecs(const OpContext& ctx, std::span<const NodeExecution> segment) {
  // [Add,] RmsNorm, then f32/f16/bf16 products of its output (one column): the streaming kernel
  // makes b itself (as run_fused_norm_matvecs for quantized weights).
  NormedB in{};
  const size_t lead = match_normed_b(segment, in);
  if (lead == 0) return 0;
  const NodeExecution& norm = segment[lead - 1];
  if (norm.inputs[0].desc->ne[0] > kMaxNormK) return 0;
  auto is_matvec = [&](const NodeExecution& e) {
    return half_matvec_fits(e) && e.inputs[1].data == norm.output.data &&
           e.inputs[1].desc->ne[1] == 1;
  };
  const std::span<const NodeExecution> products = segment.subspan(lead);
  const size_t n = count_same_b(products, kMaxHalfParts, is_matvec);
  if (n == 0) return 0;
  if (float* glu = swiglu_of(products, n)) {
    launch_half_matvec(ctx, products.first(2), glu, &in);
    return lead + 3;
  }
  launch_half_matvec(ctx, products.first(n), nullptr, &in);
  return lead + n;
}

namespace {

size_t matmul_scratch_bytes(const NodeExecution& e, int /*sm_count*/) {
  const TensorDesc& a = *e.inputs[0].desc;
  if (a.dtype == DType::F32 || half_matvec_fits(e)) return 0;
  return align_up(size_t(e.inputs[1].desc->elements()) * 2, kScratchAlignment);
}

}  // namespace

// out[n][m] = sum_k a[m][k] b[n][k]: column-major C (M x N) = A^T (A is K x M) times B (K x N).
void gemm_batched(const OpContext& ctx, const char* op, const TensorDesc& a, const void* a_data,
                  DType a_type, const TensorDesc& b, const void* b_data, DType b_type, float* out) {
  const int64_t K = a.ne[0], M = a.ne[1], N = b.ne[1];
  if (K > INT_MAX || M > INT_MAX || N > INT_MAX) {
    throw_error(ErrorCode::Unsupported, ctx.state->id + " " + op,
                "dims exceed cuBLAS int range (" + shape_string(a) + " x " + shape_string(b) + ")");
  }
  const float alpha = 1.0f, beta = 0.0f;
  const cublasComputeType_t compute =
      a_type == DType::F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const size_t a_elem = a_type == DType::F32 ? 4 : 2, b_elem = b_type == DType::F32 ? 4 : 2;
  ctx.check_blas(cublasSetStream(ctx.cublas, ctx.stream), op, "cublasSetStream");
  const int64_t batches = b.ne[2] * b.ne[3];
  const int64_t a_batches = a.ne[2] * a.ne[3];
  const int64_t a_mat = K * M, b_mat = K * N, c_mat = M * N;
  if (a_batches == 1 || (a.ne[2] == b.ne[2] && a.ne[3] == b.ne[3])) {
    ctx.check_blas(cublasGemmStridedBatchedEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(M), int(N),
                                              int(K), &alpha, a_data, cuda_type(a_type), int(K),
                                              a_batches == 1 ? 0 : a_mat, b_data, cuda_type(b_type),
                                              int(K), b_mat, &beta, out, CUDA_R_32F, int(M), c_mat,
                                              int(batches), compute, CUBLAS_GEMM_DEFAULT),
                   op, "cublasGemmStridedBatchedEx");
    return;
  }
  // Broadcast of a over b's batch dims that no single stride expresses: one call per batch.
  for (int64_t i3 = 0; i3 < b.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < b.ne[2]; ++i2) {
      const int64_t a2 = i2 / (b.ne[2] / a.ne[2]), a3 = i3 / (b.ne[3] / a.ne[3]);
      const int64_t z = i3 * b.ne[2] + i2;
      const auto* ap = static_cast<const uint8_t*>(a_data) + (a3 * a.ne[2] + a2) * a_mat * a_elem;
      const auto* bp = static_cast<const uint8_t*>(b_data) + z * b_mat * b_elem;
      ctx.check_blas(
          cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(M), int(N), int(K), &alpha, ap,
                       cuda_type(a_type), int(K), bp, cuda_type(b_type), int(K), &beta,
                       out + z * c_mat, CUDA_R_32F, int(M), compute, CUBLAS_GEMM_DEFAULT),
          op, "cublasGemmEx");
    }
}

namespace {

void run_matmul(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  auto* out = static_cast<float*>(e.output.data);
  if (half_matvec_fits(e)) {
    launch_half_matvec(ctx, std::span<const NodeExecution>(&e, 1));
    return;
  }
  if (a.dtype == DType::F32) {
    gemm_batched(ctx, "matmul", a, e.inputs[0].data, DType::F32, b, e.inputs[1].data, DType::F32,
                 out);
    return;
  }
  // b meets the weights in their own 16-bit type so the tensor cores take both.
  const bool bf16 = a.dtype == DType::BF16;
  convert_to_half(ctx, DType::F32, e.inputs[1].data, ctx.scratch, b.elements(), bf16, "matmul");
  gemm_batched(ctx, "matmul", a, e.inputs[0].data, a.dtype, b, ctx.scratch, a.dtype, out);
}

}  // namespace

void add_matmul_kernels(KernelTable<Kernel>& rows) {
  const Kernel matmul{run_matmul, matmul_scratch_bytes};
  add_row(rows, OpKind::MatMul, {DType::F32}, matmul, "tensor_cores");
  add_row(rows, OpKind::MatMul, {DType::F16, DType::F32}, matmul, "tensor_cores");
  add_row(rows, OpKind::MatMul, {DType::BF16, DType::F32}, matmul, "bf16");
}

}  // namespace tandem::cuda
