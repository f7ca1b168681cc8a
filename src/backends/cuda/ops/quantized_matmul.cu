// QuantizedMatMul with Q4_0/Q8_0 weights in GGUF layout. Up to kMatvecMaxColumns columns of b:
// a matrix-vector kernel that reads the blocks once (16-byte loads staged through shared
// memory, exact integer-to-float tricks instead of conversions). More columns: the weights are
// dequantized to f16 and multiplied on tensor cores by cuBLAS with f32 accumulation.
#include "common.cuh"
#include "ops.h"
#include "tandem/error.h"

namespace tandem::cuda {

void gemm_batched(const OpContext& ctx, const char* op, const TensorDesc& a, const void* a_data,
                  DType a_type, const TensorDesc& b, const void* b_data, DType b_type, float* out);

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 2;

// 2^23 + u as a float, for a byte u in lane k of w: one byte permute, no conversion.
__device__ __forceinline__ float byte_as_float(uint32_t w, int k) {
  return __int_as_float(int(__byte_perm(w, 0x4B000000u, 0x7440u + unsigned(k))));
}

template <DType kType>
struct PairTraits;
template <>
struct PairTraits<DType::Q4_0> {
  static constexpr int kWords = 9;  // two 18-byte blocks
};
template <>
struct PairTraits<DType::Q8_0> {
  static constexpr int kWords = 17;  // two 34-byte blocks
};

// Dots of one 32-element block (its quants in 32-bit words) with kCols columns of b.
template <DType kType, int kCols>
__device__ __forceinline__ void block_dot(const uint32_t (&qs)[kType == DType::Q4_0 ? 4 : 8],
                                          const float* b, int64_t K, float (&sum)[kCols]) {
  if constexpr (kType == DType::Q4_0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = qs[i] & 0x0F0F0F0Fu, hi = (qs[i] >> 4) & 0x0F0F0F0Fu;
      float vl[4], vh[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        vl[k] = byte_as_float(lo, k) - 8388616.0f;  // exact q - 8
        vh[k] = byte_as_float(hi, k) - 8388616.0f;
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float4 bl = *reinterpret_cast<const float4*>(b + c * K + 4 * i);
        const float4 bh = *reinterpret_cast<const float4*>(b + c * K + 16 + 4 * i);
        sum[c] += vl[0] * bl.x + vl[1] * bl.y + vl[2] * bl.z + vl[3] * bl.w + vh[0] * bh.x +
                  vh[1] * bh.y + vh[2] * bh.z + vh[3] * bh.w;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t u = qs[i] ^ 0x80808080u;  // q + 128 per byte
      float v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = byte_as_float(u, k) - 8388736.0f;  // exact q
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float4 bv = *reinterpret_cast<const float4*>(b + c * K + 4 * i);
        sum[c] += v[0] * bv.x + v[1] * bv.y + v[2] * bv.z + v[3] * bv.w;
      }
    }
  }
}

// Each warp owns kRowsPerWarp rows; per step the warp stages 32 block pairs of each row in
// shared memory with coalesced 16-byte loads, then each lane reduces one pair.
template <DType kType, int kCols>
__global__ __launch_bounds__(kWarps * 32) void matvec_kernel(const uint8_t* a, int64_t row_stride,
                                                             int64_t a_stride2, int64_t a_stride3,
                                                             int64_t a_div2, int64_t a_div3, int M,
                                                             int n_pairs, const float* b, int64_t K,
                                                             int64_t b_ne2, int64_t n_cols,
                                                             float* out) {
  constexpr int kWords = PairTraits<kType>::kWords;
  constexpr int kChunkWords = 32 * kWords;
  __shared__ __align__(16) uint32_t smem[kWarps][kRowsPerWarp][kChunkWords];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int row0 = (blockIdx.x * kWarps + warp) * kRowsPerWarp;
  if (row0 >= M) return;
  const int64_t z = blockIdx.y, i2 = z % b_ne2, i3 = z / b_ne2;
  a += (i2 / a_div2) * a_stride2 + (i3 / a_div3) * a_stride3;
  b += z * K * n_cols;
  out += z * int64_t(M) * n_cols;

  float acc[kRowsPerWarp][kCols];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.0f;

  for (int p0 = 0; p0 < n_pairs; p0 += 32) {
    const int pairs = min(32, n_pairs - p0), words = pairs * kWords;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      if (row0 + r >= M) break;
      const auto* src =
          reinterpret_cast<const uint32_t*>(a + int64_t(row0 + r) * row_stride) + p0 * kWords;
      uint32_t* dst = smem[warp][r];
      for (int w = lane; w < words / 4; w += 32) {
        reinterpret_cast<uint4*>(dst)[w] = __ldg(reinterpret_cast<const uint4*>(src) + w);
      }
      for (int w = words / 4 * 4 + lane; w < words; w += 32) dst[w] = __ldg(src + w);
    }
    __syncwarp();
    if (lane < pairs) {
      const float* bp = b + int64_t(p0 + lane) * 64;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const uint32_t* w = smem[warp][r] + lane * kWords;
        constexpr int kQWords = kType == DType::Q4_0 ? 4 : 8;
        uint32_t q0[kQWords], q1[kQWords];
#pragma unroll
        for (int i = 0; i < kQWords; ++i) {
          q0[i] = __byte_perm(w[i], w[i + 1], 0x5432);  // block 0's quants start at byte 2
          q1[i] = w[kQWords + 1 + i];                   // block 1's quants are word aligned
        }
        const float d0 = f16_bits_to_f32(uint16_t(w[0] & 0xffffu));
        const float d1 = f16_bits_to_f32(uint16_t(w[kQWords] >> 16));
        float s0[kCols], s1[kCols];
#pragma unroll
        for (int c = 0; c < kCols; ++c) s0[c] = s1[c] = 0.0f;
        block_dot<kType, kCols>(q0, bp, K, s0);
        block_dot<kType, kCols>(q1, bp + 32, K, s1);
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[r][c] += d0 * s0[c] + d1 * s1[c];
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float v = warp_sum(acc[r][c]);
      if (lane == 0 && row0 + r < M) out[int64_t(c) * M + row0 + r] = v;
    }
}

// Any layout (odd block counts, unaligned rows): one warp per row, one lane per block.
template <int kCols>
__global__ void matvec_generic_kernel(const uint8_t* a, DType dtype, int64_t row_stride,
                                      int64_t a_stride2, int64_t a_stride3, int64_t a_div2,
                                      int64_t a_div3, int M, int64_t K, const float* b,
                                      int64_t b_ne2, int64_t n_cols, float* out) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= M) return;
  const int64_t z = blockIdx.y, i2 = z % b_ne2, i3 = z / b_ne2;
  const uint8_t* ar = a + (i2 / a_div2) * a_stride2 + (i3 / a_div3) * a_stride3 + row * row_stride;
  b += z * K * n_cols;
  out += z * int64_t(M) * n_cols;
  float acc[kCols] = {};
  for (int64_t blk = lane; blk < K / kQBlock; blk += 32) {
    for (int j = 0; j < kQBlock; ++j) {
      const int64_t i = blk * kQBlock + j;
      const float v = load_f32(dtype, ar, i);
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] += v * b[c * K + i];
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const float v = warp_sum(acc[c]);
    if (lane == 0) out[int64_t(c) * M + row] = v;
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <int kCols>
void launch_matvec(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const int64_t K = a.ne[0], M = a.ne[1];
  const int64_t batches = b.ne[2] * b.ne[3];
  const int64_t div2 = b.ne[2] / a.ne[2], div3 = b.ne[3] / a.ne[3];
  const auto* ap = static_cast<const uint8_t*>(e.inputs[0].data);
  const auto* bp = static_cast<const float*>(e.inputs[1].data);
  auto* op = static_cast<float*>(e.output.data);
  const bool fast = K % 64 == 0 && a.nb[1] % 16 == 0 && a.nb[2] % 16 == 0 && a.nb[3] % 16 == 0 &&
                    aligned16(ap) && aligned16(bp);
  if (fast) {
    const dim3 grid(unsigned((M + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp)),
                    unsigned(batches));
    auto go = [&](auto kernel) {
      kernel<<<grid, kWarps * 32, 0, ctx.stream>>>(ap, a.nb[1], a.nb[2], a.nb[3], div2, div3,
                                                   int(M), int(K / 64), bp, K, b.ne[2], kCols, op);
    };
    if (a.dtype == DType::Q4_0) {
      go(matvec_kernel<DType::Q4_0, kCols>);
    } else {
      go(matvec_kernel<DType::Q8_0, kCols>);
    }
  } else {
    constexpr int kGenericWarps = 4;
    const dim3 grid(unsigned((M + kGenericWarps - 1) / kGenericWarps), unsigned(batches));
    matvec_generic_kernel<kCols><<<grid, kGenericWarps * 32, 0, ctx.stream>>>(
        ap, a.dtype, a.nb[1], a.nb[2], a.nb[3], div2, div3, int(M), K, bp, b.ne[2], kCols, op);
  }
  ctx.check_launch("quantized_matmul");
}

size_t align_up(size_t v) {
  return (v + 255) / 256 * 256;
}

}  // namespace

size_t quantized_matmul_scratch_bytes(const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  if (b.ne[1] <= kMatvecMaxColumns) return 0;
  return align_up(size_t(a.elements()) * 2) + align_up(size_t(b.elements()) * 2);
}

void run_quantized_matmul(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  if (a.ne[1] > INT32_MAX || a.ne[0] / 64 > INT32_MAX) {
    throw_error(ErrorCode::Unsupported, ctx.state->id + " quantized_matmul",
                "weights " + shape_string(a) + " exceed the kernel's int32 row range");
  }
  switch (b.ne[1]) {
    case 1:
      return launch_matvec<1>(ctx, e);
    case 2:
      return launch_matvec<2>(ctx, e);
    case 3:
      return launch_matvec<3>(ctx, e);
    case 4:
      return launch_matvec<4>(ctx, e);
    case 5:
      return launch_matvec<5>(ctx, e);
    case 6:
      return launch_matvec<6>(ctx, e);
    case 7:
      return launch_matvec<7>(ctx, e);
    case 8:
      return launch_matvec<8>(ctx, e);
    default:
      break;
  }
  // Large batches: weights to f16 once, b to f16, tensor-core GEMM with f32 accumulation.
  auto* a_half = static_cast<uint8_t*>(ctx.scratch);
  auto* b_half = a_half + align_up(size_t(a.elements()) * 2);
  convert_to_half(ctx, a.dtype, e.inputs[0].data, a_half, a.elements(), false, "quantized_matmul");
  convert_to_half(ctx, DType::F32, e.inputs[1].data, b_half, b.elements(), false,
                  "quantized_matmul");
  gemm_batched(ctx, "quantized_matmul", a, a_half, DType::F16, b, b_half, DType::F16,
               static_cast<float*>(e.output.data));
}

}  // namespace tandem::cuda
