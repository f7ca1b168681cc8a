// Device helpers shared by the CUDA kernels: element loads of every dtype, block formats and
// warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <utility>

#include "tandem/dtype.h"

namespace tandem::cuda {

inline constexpr int kQBlock = 32;
struct alignas(2) DeviceBlockQ8 {
  uint16_t d;
  int8_t qs[kQBlock];
};
struct alignas(2) DeviceBlockQ4 {
  uint16_t d;
  uint8_t qs[kQBlock / 2];
};
static_assert(sizeof(DeviceBlockQ8) == sizeof(BlockQ8_0));
static_assert(sizeof(DeviceBlockQ4) == sizeof(BlockQ4_0));

__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(uint32_t(h) << 16);
}
__device__ __forceinline__ uint16_t f32_to_f16_bits(float v) {
  return __half_as_ushort(__float2half_rn(v));
}
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// Element i of a contiguous row of K-quant super-blocks, as dequantize_row_q*_K computes it.
__device__ __forceinline__ float load_k_quant(DType dtype, const void* row, int64_t i) {
  const int e = int(i % kSuperBlock);
  const auto* base = static_cast<const uint8_t*>(row);
  if (dtype == DType::Q6_K) {
    const auto& b = reinterpret_cast<const BlockQ6_K*>(base)[i / kSuperBlock];
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const int low = (b.ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0x0F;
    const int high = (b.qh[32 * h + l] >> (2 * k)) & 3;
    return f16_bits_to_f32(b.d) * float(b.scales[8 * h + 2 * k + l / 16]) *
           float((low | (high << 4)) - 32);
  }
  const int j = e / 32, l = e % 32;
  const uint8_t* blk =
      base + (i / kSuperBlock) * (dtype == DType::Q4_K ? sizeof(BlockQ4_K) : sizeof(BlockQ5_K));
  const auto& b4 = *reinterpret_cast<const BlockQ4_K*>(blk);  // d, dmin, scales lead both
  uint8_t sc, m;
  k_scale_min(j, b4.scales, sc, m);
  int q;
  if (dtype == DType::Q4_K) {
    q = (b4.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
  } else {
    const auto& b5 = *reinterpret_cast<const BlockQ5_K*>(blk);
    q = ((b5.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F) | (((b5.qh[l] >> j) & 1) << 4);
  }
  return f16_bits_to_f32(b4.d) * float(sc) * float(q) - f16_bits_to_f32(b4.dmin) * float(m);
}

// Element i of a contiguous row of `dtype` (quantized: i indexes elements, not blocks).
__device__ __forceinline__ float load_f32(DType dtype, const void* row, int64_t i) {
  switch (dtype) {
    case DType::F32:
      return static_cast<const float*>(row)[i];
    case DType::F16:
      return f16_bits_to_f32(static_cast<const uint16_t*>(row)[i]);
    case DType::BF16:
      return bf16_bits_to_f32(static_cast<const uint16_t*>(row)[i]);
    case DType::I32:
      return float(static_cast<const int32_t*>(row)[i]);
    case DType::I8:
      return float(static_cast<const int8_t*>(row)[i]);
    case DType::Q8_0: {
      const auto& b = static_cast<const DeviceBlockQ8*>(row)[i / kQBlock];
      return float(b.qs[i % kQBlock]) * f16_bits_to_f32(b.d);
    }
    case DType::Q4_0: {
      const auto& b = static_cast<const DeviceBlockQ4*>(row)[i / kQBlock];
      const int j = int(i % kQBlock);
      const int q = j < kQBlock / 2 ? (b.qs[j] & 0x0f) : (b.qs[j - kQBlock / 2] >> 4);
      return float(q - 8) * f16_bits_to_f32(b.d);
    }
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return load_k_quant(dtype, row, i);
  }
  return 0.0f;
}

// RoPE of one pair (x0, x1), pair j of its head (angle pos * base^(-2j / n_rot)), in double:
// exact positions matter more than the few extra cycles of a memory-bound op. The Rope kernels
// and the staged products' RoPE tail (staged_matvec.cuh) share it, so both write the same bits.
// rope_angle and rope_rotate are its two halves, for a kernel that turns several pairs by one
// angle (the attention kernel's heads of a group).
__device__ __forceinline__ void rope_angle(int64_t j, int32_t pos, int n_rot, double log_base,
                                           double& c, double& s) {
  sincos(double(pos) * exp(-double(2 * j) / n_rot * log_base), &s, &c);
}
__device__ __forceinline__ void rope_rotate(double x0, double x1, double c, double s, float& y0,
                                            float& y1) {
  y0 = float(x0 * c - x1 * s);
  y1 = float(x0 * s + x1 * c);
}
__device__ __forceinline__ void rope_pair(double x0, double x1, int64_t j, int32_t pos, int n_rot,
                                          double log_base, float& y0, float& y1) {
  double c, s;
  rope_angle(j, pos, n_rot, log_base, c, s);
  rope_rotate(x0, x1, c, s, y0, y1);
}

// Stores v as element i of a contiguous plain (non-quantized) float row.
__device__ __forceinline__ void store_f32(DType dtype, void* row, int64_t i, float v) {
  switch (dtype) {
    case DType::F16:
      static_cast<uint16_t*>(row)[i] = f32_to_f16_bits(v);
      return;
    case DType::BF16:
      static_cast<uint16_t*>(row)[i] = f32_to_bf16_bits(v);
      return;
    default:
      static_cast<float*>(row)[i] = v;
      return;
  }
}

// The 4-d index of flat element i of a tensor with extents ne (ggml order: ne[0] fastest).
struct Index4 {
  int64_t i0, i1, i2, i3;
};
__device__ __forceinline__ Index4 unflatten(int64_t i, const int64_t (&ne)[4]) {
  Index4 x;
  x.i0 = i % ne[0];
  i /= ne[0];
  x.i1 = i % ne[1];
  i /= ne[1];
  x.i2 = i % ne[2];
  x.i3 = i / ne[2];
  return x;
}
// Byte offset of that element under byte strides nb.
__device__ __forceinline__ int64_t byte_offset(const Index4& x, const int64_t (&nb)[4]) {
  return x.i0 * nb[0] + x.i1 * nb[1] + x.i2 * nb[2] + x.i3 * nb[3];
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over a block of up to 1024 threads; every thread gets the result.
// `shared` holds 32 floats; callers separate two reductions with __syncthreads().
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int n_warps = (blockDim.x + 31) / 32;
  v = lane < n_warps ? shared[lane] : (kMax ? -INFINITY : 0.0f);
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();
  return v;
}

// Programmatic dependent launch (sm_90; launched with programmaticStreamSerializationAllowed):
// wait until the preceding kernel has finished and its writes are visible; let the next kernel
// start launching. Before the wait a kernel may only fetch (prefetch_l2) what that kernel writes.
// (No-ops before sm_90, where no launch is programmatic.)
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Pulls the 128-byte line at p into the L2; returns nothing, so it may run ahead of a writer.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
// cp.async (sm_80+): 16 bytes global -> shared, bypassing L1, in the group the next commit closes;
// with `valid` false the 16 bytes are zero-filled and nothing is read.
__device__ __forceinline__ void copy_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void copy_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending committed groups of this thread's copies are still in flight.
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The bulk copy engine (sm_90): one thread copies a contiguous range global -> shared, and the
// copy completes on an mbarrier in shared memory that counts its bytes. Its requests do not take
// the SM's load slots, so ordinary loads issued after it are not queued behind it as behind
// cp.async copies. Older targets compile the cp.async path instead (kHasBulkCopy).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kHasBulkCopy = false;
#else
constexpr bool kHasBulkCopy = true;
#endif
// An mbarrier at shared address `bar` expecting `count` arrivals per phase; fenced so that the
// copy engine sees it initialized.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival on `bar` that also makes its phase wait for `bytes` more bytes of bulk copies.
__device__ __forceinline__ void mbarrier_arrive_expect(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from src to shared dst, counted on
// `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}
// Waits until the phase of `bar` with parity `parity` has completed (its copies have landed).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra LAB_WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// Launches `kernel` as a programmatic dependent of the stream's previous kernel: it may start
// while that one drains, and must call grid_dependency_wait() before reading what it writes.
template <typename... Params, typename... Args>
cudaError_t launch_programmatic(cudaStream_t stream, dim3 grid, dim3 block, size_t smem,
                                void (*kernel)(Params...), Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

inline unsigned grid_1d(int64_t n, int threads, int64_t cap = 65535LL * 16) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  return unsigned(blocks < cap ? blocks : cap);
}

}  // namespace tandem::cuda
