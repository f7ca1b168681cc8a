// KvWrite: src [head_dim, kv_heads, tokens] into the cache at each token's position; the
// output aliases the cache, so the write goes through the output pointer.
#include <algorithm>
#include <string>

#include "ops.h"
#include "tandem/error.h"

namespace tandem::cpu {

void check_positions(const char* where, const int32_t* pos, int64_t n, int64_t limit) {
  for (int64_t t = 0; t < n; ++t) {
    if (pos[t] < 0 || pos[t] >= limit) {
      throw_error(ErrorCode::InvalidArgument, where,
                  "position " + std::to_string(pos[t]) + " outside the cache [0, " +
                      std::to_string(limit) + ")");
    }
  }
}

namespace {

void run_kv_write(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& cache = *e.output.desc;
  const TensorDesc& src = *e.inputs[1].desc;
  const auto* s = static_cast<const float*>(e.inputs[1].data);
  const auto* pos = static_cast<const int32_t*>(e.inputs[2].data);
  auto* base = static_cast<uint8_t*>(e.output.data);
  check_positions("cpu kv_write", pos, src.ne[2], cache.ne[2]);
  const int64_t row = src.ne[0] * src.ne[1];  // one token's [head_dim, kv_heads]
  // Repeated positions must keep the reference's order (last write wins): run those serially.
  bool increasing = true;
  for (int64_t t = 1; t < src.ne[2]; ++t) increasing = increasing && pos[t] > pos[t - 1];
  const int64_t grain = increasing ? std::max<int64_t>(1, kElementwiseGrain / row) : src.ne[2];
  ctx.pool.parallel_for(src.ne[2], grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      row_from_f32(ctx.k, cache.dtype, s + t * row, base + pos[t] * cache.nb[2], row);
    }
  });
}

}  // namespace

void add_kv_write_kernels(KernelTable<Kernel>& rows) {
  rows.add(OpKind::KvWrite, {DType::F32, DType::I32}, run_kv_write);
  rows.add(OpKind::KvWrite, {DType::F16, DType::F32, DType::I32}, run_kv_write);
}

}  // namespace tandem::cpu
