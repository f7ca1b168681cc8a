// MatMul through cuBLAS on tensor cores: f16/bf16 weights meet b converted to the same type
// (f32 accumulation); f32 weights use TF32 tensor cores. Matrix-vector products of f16/bf16
// weights (decode: 1 to kMatvecMaxColumns columns) take a streaming kernel of their own.
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

// One warp per weight row: each lane takes 8 consecutive weights (one 16-byte load) of every
// 256, kHalfSteps such loads in flight before any is used, against f32 b (no conversion launch;
// f32 products, more exact than the tensor-core path). A programmatic dependent: the first loads
// of weights (which no kernel writes) go out before the wait for the kernel that wrote b. Its
// dependents are released as it exits (the output projection runs many waves of blocks).
constexpr int kHalfWarps = 4;
constexpr int kHalfSteps = 8;
constexpr int64_t kHalfChunk = 256;  // elements of a row one warp load covers

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

template <DType kType, int kCols>
__global__ __launch_bounds__(kHalfWarps * 32) void half_matvec_kernel(const uint8_t* a,
                                                                     int64_t row_stride, int M,
                                                                     int64_t K, const float* b,
                                                                     float* out) {
  const int row = blockIdx.x * kHalfWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;
  const auto* ar = reinterpret_cast<const uint4*>(a + row * row_stride);
  const int64_t chunks = K / kHalfChunk;
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
  for (int64_t c0 = 0; c0 < chunks; c0 += kHalfSteps) {
    uint4 w[kHalfSteps];
#pragma unroll
    for (int t = 0; t < kHalfSteps; ++t) {
      if (c0 + t < chunks) w[t] = __ldcs(ar + (c0 + t) * 32 + lane);
    }
    if (c0 == 0) grid_dependency_wait();  // b is written by the preceding kernel
#pragma unroll
    for (int t = 0; t < kHalfSteps; ++t) {
      if (c0 + t >= chunks) break;
      float x[8];
      half8_to_f32<kType>(w[t], x);
      const int64_t k = (c0 + t) * kHalfChunk + 8 * lane;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float4 b0 = *reinterpret_cast<const float4*>(b + c * K + k);
        const float4 b1 = *reinterpret_cast<const float4*>(b + c * K + k + 4);
        acc[c] += x[0] * b0.x + x[1] * b0.y + x[2] * b0.z + x[3] * b0.w + x[4] * b1.x +
                  x[5] * b1.y + x[6] * b1.z + x[7] * b1.w;
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const float v = warp_sum(acc[c]);
    if (lane == 0) out[int64_t(c) * M + row] = v;
  }
}

// The streaming kernel covers one 2-D weight matrix of contiguous, 16-byte aligned rows, K a
// multiple of 256, and 1 to kMatvecMaxColumns contiguous, aligned columns of b.
bool half_matvec_fits(const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const TensorDesc& o = *e.output.desc;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return (a.dtype == DType::F16 || a.dtype == DType::BF16) && b.dtype == DType::F32 &&
         b.ne[1] >= 1 && b.ne[1] <= kMatvecMaxColumns && a.ne[2] * a.ne[3] == 1 &&
         b.ne[2] * b.ne[3] == 1 && a.ne[0] % kHalfChunk == 0 && a.nb[0] == 2 &&
         a.nb[1] % 16 == 0 && a.ne[1] <= INT_MAX && b.is_contiguous() && o.is_contiguous() &&
         aligned(e.inputs[0].data) && aligned(e.inputs[1].data);
}

void launch_half_matvec(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const int M = int(a.ne[1]);
  const dim3 grid(unsigned((M + kHalfWarps - 1) / kHalfWarps));
  const auto* ap = static_cast<const uint8_t*>(e.inputs[0].data);
  const auto* bp = static_cast<const float*>(e.inputs[1].data);
  auto* op = static_cast<float*>(e.output.data);
  with_columns(b.ne[1], [&](auto cols) {
    auto kernel = a.dtype == DType::F16 ? half_matvec_kernel<DType::F16, cols()>
                                        : half_matvec_kernel<DType::BF16, cols()>;
    ctx.check(launch_programmatic(ctx.stream, grid, dim3(kHalfWarps * 32), 0, kernel, ap,
                                  int64_t(a.nb[1]), M, int64_t(a.ne[0]), bp, op),
              "matmul", "kernel launch");
  });
}

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
  if (a.dtype == DType::F32) {
    gemm_batched(ctx, "matmul", a, e.inputs[0].data, DType::F32, b, e.inputs[1].data, DType::F32,
                 out);
    return;
  }
  if (half_matvec_fits(e)) {
    launch_half_matvec(ctx, e);
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
