// MatMul through cuBLAS on tensor cores: f16/bf16 weights meet b converted to the same type
// (f32 accumulation); f32 weights use TF32 tensor cores.
#include <climits>

#include "common.cuh"
#include "ops.h"
#include "tandem/error.h"

namespace tandem::cuda {

namespace {

cudaDataType_t cuda_type(DType d) {
  return d == DType::F16 ? CUDA_R_16F : d == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

size_t matmul_scratch_bytes(const NodeExecution& e, int /*sm_count*/) {
  const TensorDesc& a = *e.inputs[0].desc;
  if (a.dtype == DType::F32) return 0;
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
