// MatMul and QuantizedMatMul: a [K, M] (any float or quantized dtype, broadcast over b's
// batch dims) times f32 b [K, N] -> [M, N], one row of a at a time, accumulated in float64.
#include <vector>

#include "ops.h"

namespace tandem::reference {

namespace {

void run_matmul(const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const int64_t K = a.ne[0], M = a.ne[1], N = b.ne[1];
  const auto* abase = static_cast<const uint8_t*>(e.inputs[0].data);
  const float* bdata = f32(e.inputs[1]);
  float* out = f32(e.output);
  std::vector<float> arow(static_cast<size_t>(K));
  for (int64_t i3 = 0; i3 < b.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < b.ne[2]; ++i2) {
      const int64_t a2 = i2 / (b.ne[2] / a.ne[2]), a3 = i3 / (b.ne[3] / a.ne[3]);
      const float* bmat = bdata + (i3 * b.ne[2] + i2) * K * N;
      float* omat = out + (i3 * b.ne[2] + i2) * M * N;
      for (int64_t m = 0; m < M; ++m) {
        to_f32(a.dtype, abase + m * a.nb[1] + a2 * a.nb[2] + a3 * a.nb[3], arow.data(), K);
        for (int64_t n = 0; n < N; ++n) {
          double acc = 0.0;
          const float* bcol = bmat + n * K;
          for (int64_t k = 0; k < K; ++k) acc += double(arow[size_t(k)]) * double(bcol[k]);
          omat[n * M + m] = float(acc);
        }
      }
    }
}

}  // namespace

void add_matmul_kernels(KernelTable<ReferenceKernel>& rows) {
  for (DType d : float_dtypes()) rows.add(OpKind::MatMul, {d, DType::F32}, run_matmul);
  rows.add(OpKind::QuantizedMatMul, {DType::Q8_0, DType::F32}, run_matmul);
  rows.add(OpKind::QuantizedMatMul, {DType::Q4_0, DType::F32}, run_matmul);
  for (DType d : kKQuantDTypes) rows.add(OpKind::QuantizedMatMul, {d, DType::F32}, run_matmul);
}

}  // namespace tandem::reference
