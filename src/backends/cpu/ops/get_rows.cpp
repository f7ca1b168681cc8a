// GetRows (embedding lookup): table rows of any float or quantized dtype to f32.
#include <algorithm>
#include <string>

#include "ops.h"
#include "tandem/error.h"

namespace tandem::cpu {

namespace {

void run_get_rows(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& table = *e.inputs[0].desc;
  const auto* ids = static_cast<const int32_t*>(e.inputs[1].data);
  const int64_t n = e.inputs[1].desc->ne[0];
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= table.ne[1]) {
      throw_error(
          ErrorCode::InvalidArgument, "cpu get_rows",
          "row id " + std::to_string(ids[i]) + " outside [0, " + std::to_string(table.ne[1]) + ")");
    }
  }
  const auto* base = static_cast<const uint8_t*>(e.inputs[0].data);
  auto* out = static_cast<float*>(e.output.data);
  const int64_t d = table.ne[0];
  ctx.pool.parallel_for(
      n, std::max<int64_t>(1, kElementwiseGrain / d), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          row_to_f32(ctx.k, table.dtype, base + ids[i] * table.nb[1], out + i * d, d);
        }
      });
}

}  // namespace

void add_get_rows_kernels(KernelTable<Kernel>& rows) {
  for (DType d : convertible_dtypes()) {
    rows.add(OpKind::GetRows, {d, DType::I32, DType::F32}, run_get_rows);
  }
  for (DType d : kKQuantDTypes)
    rows.add(OpKind::GetRows, {d, DType::I32, DType::F32}, run_get_rows);
}

}  // namespace tandem::cpu
