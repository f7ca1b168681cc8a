// KvWrite: src [head_dim, kv_heads, tokens] into the cache at each token's position; the
// output aliases the cache.
#include <string>

#include "ops.h"
#include "tandem/error.h"

namespace tandem::reference {

namespace {

void run_kv_write(const NodeExecution& e) {
  const TensorDesc& cache = *e.output.desc;
  const TensorDesc& src = *e.inputs[1].desc;
  const float* s = f32(e.inputs[1]);
  const int32_t* pos = i32(e.inputs[2]);
  auto* base = static_cast<uint8_t*>(e.output.data);
  const int64_t row = src.ne[0] * src.ne[1];  // one token's [head_dim, kv_heads]
  for (int64_t t = 0; t < src.ne[2]; ++t) {
    if (pos[t] < 0 || pos[t] >= cache.ne[2]) {
      throw_error(ErrorCode::InvalidArgument, "reference kv_write",
                  "position " + std::to_string(pos[t]) + " outside the cache [0, " +
                      std::to_string(cache.ne[2]) + ")");
    }
    from_f32(cache.dtype, s + t * row, base + pos[t] * cache.nb[2], row);
  }
}

}  // namespace

void add_kv_write_kernels(KernelTable<ReferenceKernel>& rows) {
  rows.add(OpKind::KvWrite, {DType::F32, DType::I32}, run_kv_write);
  rows.add(OpKind::KvWrite, {DType::F16, DType::F32, DType::I32}, run_kv_write);
}

}  // namespace tandem::reference
