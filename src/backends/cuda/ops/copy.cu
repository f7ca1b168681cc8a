// Copy/Cast (strided plain types, integer bit copies, quantize and dequantize in GGUF layout),
// Dequantize, and the f16/bf16 conversions the matmul paths feed to cuBLAS.
#include "common.cuh"
#include "ops.h"
#include "tandem/error.h"

namespace tandem::cuda {

namespace {

struct Layout {
  int64_t ne[4];
  int64_t nb[4];
};

// Plain float types, any strides in, contiguous out.
__global__ void cast_kernel(const uint8_t* src, DType src_dtype, Layout in, void* dst,
                            DType dst_dtype, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t* p = src + byte_offset(unflatten(i, in.ne), in.nb);
    store_f32(dst_dtype, dst, i, load_f32(src_dtype, p, 0));
  }
}

// Integer copies keep their bits: element-size byte moves with any strides in.
__global__ void bits_kernel(const uint8_t* src, Layout in, uint8_t* dst, int64_t n,
                            int element_bytes) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t* p = src + byte_offset(unflatten(i, in.ne), in.nb);
    for (int b = 0; b < element_bytes; ++b) dst[i * element_bytes + b] = p[b];
  }
}

// Bit-compatible with ggml's quantize_row_q8_0_ref / q4_0_ref (no fused multiply-adds).
__device__ void quantize_block(const float* x, DType dtype, uint8_t* out) {
  if (dtype == DType::Q8_0) {
    float amax = 0.0f;
    for (int j = 0; j < kQBlock; ++j) amax = fmaxf(amax, fabsf(x[j]));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    auto* b = reinterpret_cast<DeviceBlockQ8*>(out);
    b->d = f32_to_f16_bits(d);
    for (int j = 0; j < kQBlock; ++j) b->qs[j] = int8_t(roundf(__fmul_rn(x[j], id)));
    return;
  }
  float amax = 0.0f, mx = 0.0f;
  for (int j = 0; j < kQBlock; ++j) {
    if (amax < fabsf(x[j])) {
      amax = fabsf(x[j]);
      mx = x[j];
    }
  }
  const float d = __fdiv_rn(mx, -8.0f);
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  auto* b = reinterpret_cast<DeviceBlockQ4*>(out);
  b->d = f32_to_f16_bits(d);
  for (int j = 0; j < kQBlock / 2; ++j) {
    const float x0 = __fmul_rn(x[j], id), x1 = __fmul_rn(x[j + kQBlock / 2], id);
    const int q0 = min(15, int(int8_t(__fadd_rn(x0, 8.5f))));
    const int q1 = min(15, int(int8_t(__fadd_rn(x1, 8.5f))));
    b->qs[j] = uint8_t(q0 | (q1 << 4));
  }
}

// One thread per 32-element block of contiguous tensors, when either side is quantized.
__global__ void block_copy_kernel(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                                  int64_t n_blocks, int64_t dst_block_bytes) {
  for (int64_t blk = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; blk < n_blocks;
       blk += int64_t(gridDim.x) * blockDim.x) {
    float x[kQBlock];
    for (int j = 0; j < kQBlock; ++j) x[j] = load_f32(src_dtype, src, blk * kQBlock + j);
    if (dst_dtype == DType::Q8_0 || dst_dtype == DType::Q4_0) {
      quantize_block(x, dst_dtype, static_cast<uint8_t*>(dst) + blk * dst_block_bytes);
    } else {
      for (int j = 0; j < kQBlock; ++j) store_f32(dst_dtype, dst, blk * kQBlock + j, x[j]);
    }
  }
}

// Contiguous n elements of any float or quantized dtype to f16 or bf16 (cuBLAS operands).
template <bool kBf16>
__global__ void to_half_kernel(const void* src, DType dtype, uint16_t* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = load_f32(dtype, src, i);
    dst[i] = kBf16 ? f32_to_bf16_bits(v) : f32_to_f16_bits(v);
  }
}

// Q4_0 to f16, one thread per block: 18 bytes in, 64 bytes out, no per-element division.
__global__ void q4_0_to_f16_kernel(const DeviceBlockQ4* src, __half* dst, int64_t n_blocks) {
  for (int64_t blk = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; blk < n_blocks;
       blk += int64_t(gridDim.x) * blockDim.x) {
    const DeviceBlockQ4 b = src[blk];
    const __half d = __ushort_as_half(b.d);
    __half2 out[kQBlock / 2];
#pragma unroll
    for (int j = 0; j < kQBlock / 2; j += 2) {
      out[j / 2] = __hmul2(__halves2half2(__int2half_rn((b.qs[j] & 0xf) - 8),
                                          __int2half_rn((b.qs[j + 1] & 0xf) - 8)),
                           __half2half2(d));
      out[kQBlock / 4 + j / 2] = __hmul2(
          __halves2half2(__int2half_rn((b.qs[j] >> 4) - 8), __int2half_rn((b.qs[j + 1] >> 4) - 8)),
          __half2half2(d));
    }
    auto* o = reinterpret_cast<uint4*>(dst + blk * kQBlock);
    const auto* v = reinterpret_cast<const uint4*>(out);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = v[k];
  }
}

// Q8_0 to f16; q * d rounds once to f16, as a dequantized f16 weight would.
__global__ void q8_0_to_f16_kernel(const DeviceBlockQ8* src, __half* dst, int64_t n_blocks) {
  for (int64_t blk = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; blk < n_blocks;
       blk += int64_t(gridDim.x) * blockDim.x) {
    const DeviceBlockQ8& b = src[blk];
    const float d = f16_bits_to_f32(b.d);
    __half2 out[kQBlock / 2];
#pragma unroll
    for (int j = 0; j < kQBlock; j += 2) {
      out[j / 2] = __floats2half2_rn(float(b.qs[j]) * d, float(b.qs[j + 1]) * d);
    }
    auto* o = reinterpret_cast<uint4*>(dst + blk * kQBlock);
    const auto* v = reinterpret_cast<const uint4*>(out);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = v[k];
  }
}

// K-quant super-blocks to f16 (the dense prefill's weight conversion), one warp per super-block:
// lane l writes elements 8l..8l+7 as one 16-byte store, with load_k_quant's arithmetic per
// element (so the output is bit for bit the generic kernel's). The generic kernel decoded every
// element on its own, with a 64-bit division and the scale unpacking each time.
template <DType kType>
__global__ void k_quant_to_f16_kernel(const uint8_t* src, __half* dst, int64_t n_supers) {
  constexpr int64_t kBytes = kType == DType::Q4_K   ? sizeof(BlockQ4_K)
                             : kType == DType::Q5_K ? sizeof(BlockQ5_K)
                                                    : sizeof(BlockQ6_K);
  const int lane = threadIdx.x % 32, e0 = 8 * lane;
  for (int64_t sb = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; sb < n_supers;
       sb += int64_t(gridDim.x) * blockDim.x / 32) {
    const uint8_t* blk = src + sb * kBytes;
    float v[8];
    if constexpr (kType == DType::Q6_K) {
      const auto& b = *reinterpret_cast<const BlockQ6_K*>(blk);
      const int h = e0 / 128, k = (e0 % 128) / 32, l = e0 % 32;
      const float d = f16_bits_to_f32(b.d) * float(b.scales[8 * h + 2 * k + l / 16]);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int low = (b.ql[64 * h + 32 * (k & 1) + l + i] >> (4 * (k >> 1))) & 0x0F;
        const int high = (b.qh[32 * h + l + i] >> (2 * k)) & 3;
        v[i] = d * float((low | (high << 4)) - 32);
      }
    } else {
      const auto& b4 = *reinterpret_cast<const BlockQ4_K*>(blk);  // d, dmin, scales lead both
      const int j = e0 / 32, l = e0 % 32;
      uint8_t sc, m;
      k_scale_min(j, b4.scales, sc, m);
      const float d = f16_bits_to_f32(b4.d), dmin = f16_bits_to_f32(b4.dmin);
      const uint8_t* qs =
          kType == DType::Q4_K ? b4.qs : reinterpret_cast<const BlockQ5_K*>(blk)->qs;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        int q = (qs[32 * (j / 2) + l + i] >> (4 * (j % 2))) & 0x0F;
        if constexpr (kType == DType::Q5_K) {
          q |= ((reinterpret_cast<const BlockQ5_K*>(blk)->qh[l + i] >> j) & 1) << 4;
        }
        v[i] = d * float(sc) * float(q) - dmin * float(m);
      }
    }
    uint16_t out[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = f32_to_f16_bits(v[i]);
    *reinterpret_cast<uint4*>(dst + sb * kSuperBlock + e0) = *reinterpret_cast<const uint4*>(out);
  }
}

constexpr int kThreads = 256;

Layout layout_of(const TensorDesc& d) {
  return Layout{{d.ne[0], d.ne[1], d.ne[2], d.ne[3]}, {d.nb[0], d.nb[1], d.nb[2], d.nb[3]}};
}

}  // namespace

void convert_to_half(const OpContext& ctx, DType src_dtype, const void* src, void* dst, int64_t n,
                     bool bf16, const char* op) {
  if (!bf16 && src_dtype == DType::Q4_0) {
    q4_0_to_f16_kernel<<<grid_1d(n / kQBlock, kThreads), kThreads, 0, ctx.stream>>>(
        static_cast<const DeviceBlockQ4*>(src), static_cast<__half*>(dst), n / kQBlock);
  } else if (!bf16 && src_dtype == DType::Q8_0) {
    q8_0_to_f16_kernel<<<grid_1d(n / kQBlock, kThreads), kThreads, 0, ctx.stream>>>(
        static_cast<const DeviceBlockQ8*>(src), static_cast<__half*>(dst), n / kQBlock);
  } else if (!bf16 && is_k_quant(src_dtype) && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    const int64_t n_supers = n / kSuperBlock;
    auto go = [&](auto kernel) {
      kernel<<<grid_1d(n_supers * 32, kThreads), kThreads, 0, ctx.stream>>>(
          static_cast<const uint8_t*>(src), static_cast<__half*>(dst), n_supers);
    };
    if (src_dtype == DType::Q4_K) {
      go(k_quant_to_f16_kernel<DType::Q4_K>);
    } else if (src_dtype == DType::Q5_K) {
      go(k_quant_to_f16_kernel<DType::Q5_K>);
    } else {
      go(k_quant_to_f16_kernel<DType::Q6_K>);
    }
  } else if (bf16) {
    to_half_kernel<true><<<grid_1d(n, kThreads), kThreads, 0, ctx.stream>>>(
        src, src_dtype, static_cast<uint16_t*>(dst), n);
  } else {
    to_half_kernel<false><<<grid_1d(n, kThreads), kThreads, 0, ctx.stream>>>(
        src, src_dtype, static_cast<uint16_t*>(dst), n);
  }
  ctx.check_launch(op);
}

namespace {

void run_copy(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& in = *e.inputs[0].desc;
  const TensorDesc& out = *e.output.desc;
  const char* op = e.node->op == OpKind::Dequantize ? "dequantize" : "copy";
  const int64_t n = in.elements();
  const auto* src = static_cast<const uint8_t*>(e.inputs[0].data);
  const bool quantized =
      dtype_traits(in.dtype).is_quantized || dtype_traits(out.dtype).is_quantized;
  if (in.dtype == DType::I32 || in.dtype == DType::I8) {
    bits_kernel<<<grid_1d(n, kThreads), kThreads, 0, ctx.stream>>>(
        src, layout_of(in), static_cast<uint8_t*>(e.output.data), n,
        int(dtype_traits(in.dtype).block_bytes));
  } else if (quantized) {
    if (!in.is_contiguous()) {
      throw_error(ErrorCode::InvalidArgument, ctx.state->id + " " + op,
                  "a quantized copy needs a contiguous input (" + desc_string(in) + ")");
    }
    block_copy_kernel<<<grid_1d(n / kQBlock, kThreads), kThreads, 0, ctx.stream>>>(
        src, in.dtype, e.output.data, out.dtype, n / kQBlock, dtype_traits(out.dtype).block_bytes);
  } else {
    cast_kernel<<<grid_1d(n, kThreads), kThreads, 0, ctx.stream>>>(src, in.dtype, layout_of(in),
                                                                   e.output.data, out.dtype, n);
  }
  ctx.check_launch(op);
}

}  // namespace

void add_copy_kernels(KernelTable<Kernel>& rows) {
  add_row(rows, OpKind::Copy, convertible_dtypes(), {run_copy});
  add_row(rows, OpKind::Copy, {DType::I32}, {run_copy});
  add_row(rows, OpKind::Copy, {DType::I8}, {run_copy});
  for (DType d : {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16}) {
    add_row(rows, OpKind::Dequantize, {d, DType::F32}, {run_copy});
  }
  // K-quants through the per-element loads: 32 of a super-block's elements per thread.
  for (DType d : kKQuantDTypes) add_row(rows, OpKind::Dequantize, {d, DType::F32}, {run_copy});
}

}  // namespace tandem::cuda
