// GetRows (embedding lookup): table rows of any float or quantized dtype to f32.
#include <string>

#include "ops.h"
#include "tandem/error.h"

namespace tandem::reference {

namespace {

void run_get_rows(const NodeExecution& e) {
  const TensorDesc& table = *e.inputs[0].desc;
  const int32_t* ids = i32(e.inputs[1]);
  const int64_t n = e.inputs[1].desc->ne[0];
  const auto* base = static_cast<const uint8_t*>(e.inputs[0].data);
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = ids[i];
    if (r < 0 || r >= table.ne[1]) {
      throw_error(
          ErrorCode::InvalidArgument, "reference get_rows",
          "row id " + std::to_string(r) + " outside [0, " + std::to_string(table.ne[1]) + ")");
    }
    to_f32(table.dtype, base + r * table.nb[1], f32(e.output) + i * table.ne[0], table.ne[0]);
  }
}

}  // namespace

void add_get_rows_kernels(KernelTable<ReferenceKernel>& rows) {
  for (DType d : convertible_dtypes()) {
    rows.add(OpKind::GetRows, {d, DType::I32, DType::F32}, run_get_rows);
  }
  for (DType d : kKQuantDTypes)
    rows.add(OpKind::GetRows, {d, DType::I32, DType::F32}, run_get_rows);
}

}  // namespace tandem::reference
