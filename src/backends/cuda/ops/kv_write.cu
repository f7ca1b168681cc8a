// KvWrite: cache[:, :, pos[t]] = src[:, :, t] into an f32 or f16 cache.
#include "common.cuh"
#include "ops.h"

namespace tandem::cuda {

namespace {

__global__ void kv_write_kernel(const float* src, const int32_t* pos, uint8_t* cache, DType dtype,
                                int64_t token_stride, int64_t capacity, int64_t row,
                                int32_t* error_flag) {
  const int64_t t = blockIdx.x;
  const int64_t p = pos[t];
  if (p < 0 || p >= capacity) {
    if (threadIdx.x == 0) atomicCAS(error_flag, kDeviceOk, kPositionOutOfRange);
    return;
  }
  uint8_t* dst = cache + p * token_stride;
  const float* s = src + t * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) store_f32(dtype, dst, i, s[i]);
}

void run_kv_write(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& cache = *e.output.desc;
  const TensorDesc& src = *e.inputs[1].desc;
  const int64_t row = src.ne[0] * src.ne[1];
  kv_write_kernel<<<unsigned(src.ne[2]), 256, 0, ctx.stream>>>(
      static_cast<const float*>(e.inputs[1].data), static_cast<const int32_t*>(e.inputs[2].data),
      static_cast<uint8_t*>(e.output.data), cache.dtype, cache.nb[2], cache.ne[2], row,
      ctx.error_flag);
  ctx.check_launch("kv_write");
}

}  // namespace

void add_kv_write_kernels(KernelTable<Kernel>& rows) {
  add_row(rows, OpKind::KvWrite, {DType::F32, DType::I32}, {run_kv_write});
  add_row(rows, OpKind::KvWrite, {DType::F16, DType::F32, DType::I32}, {run_kv_write});
}

}  // namespace tandem::cuda
