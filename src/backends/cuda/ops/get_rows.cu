// GetRows (embedding lookup) of any table dtype into f32; bad ids raise the device error flag.
#include "common.cuh"
#include "ops.h"

namespace tandem::cuda {

namespace {

__global__ void get_rows_kernel(const uint8_t* table, DType dtype, int64_t row_bytes,
                                int64_t n_rows, int64_t width, const int32_t* ids, float* out,
                                int32_t* error_flag) {
  const int64_t r = blockIdx.x;
  const int64_t id = ids[r];
  float* orow = out + r * width;
  if (id < 0 || id >= n_rows) {
    if (threadIdx.x == 0) atomicCAS(error_flag, kDeviceOk, kRowIdOutOfRange);
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) orow[i] = 0.0f;
    return;
  }
  const uint8_t* row = table + id * row_bytes;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) orow[i] = load_f32(dtype, row, i);
}

void run_get_rows(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& table = *e.inputs[0].desc;
  const int64_t n = e.inputs[1].desc->ne[0];
  get_rows_kernel<<<unsigned(n), 256, 0, ctx.stream>>>(
      static_cast<const uint8_t*>(e.inputs[0].data), table.dtype, table.nb[1], table.ne[1],
      table.ne[0], static_cast<const int32_t*>(e.inputs[1].data),
      static_cast<float*>(e.output.data), ctx.error_flag);
  ctx.check_launch("get_rows");
}

}  // namespace

void add_get_rows_kernels(KernelTable<Kernel>& rows) {
  for (DType d : convertible_dtypes()) {
    add_row(rows, OpKind::GetRows, {d, DType::I32, DType::F32}, {run_get_rows});
  }
  for (DType d : kKQuantDTypes)
    add_row(rows, OpKind::GetRows, {d, DType::I32, DType::F32}, {run_get_rows});
}

}  // namespace tandem::cuda
