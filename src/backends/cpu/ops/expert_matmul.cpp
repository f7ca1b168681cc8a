// ExpertMatMul (ggml's MUL_MAT_ID): out[:, j, t] = expert ids[j, t]'s matrix x b[:, j or 0, t].
// The (token, choice) pairs are grouped by expert, each expert's activation columns gathered
// into one block, and the dense matrix product runs once per chosen expert: every expert's
// weights are read once per call, and experts nobody chose are not read at all.
#include <algorithm>
#include <vector>

#include "ops.h"
#include "tandem/error.h"

namespace tandem::cpu {

namespace {

void run_expert_matmul(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &b = *e.inputs[1].desc, &id = *e.inputs[2].desc;
  const auto* abase = static_cast<const uint8_t*>(e.inputs[0].data);
  const auto* bdata = static_cast<const float*>(e.inputs[1].data);
  const auto* ids = static_cast<const int32_t*>(e.inputs[2].data);
  auto* out = static_cast<float*>(e.output.data);
  const int64_t K = a.ne[0], M = a.ne[1], n_expert = a.ne[2], k = id.ne[0], T = id.ne[1];
  const int64_t pairs = k * T;

  // Pairs sorted by expert (counting sort, stable: token order within an expert).
  std::vector<int64_t> first(static_cast<size_t>(n_expert + 1), 0);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t x = ids[p];
    if (x < 0 || x >= n_expert) {
      throw_error(
          ErrorCode::InvalidArgument, "cpu expert_matmul",
          "expert id " + std::to_string(x) + " is not in [0, " + std::to_string(n_expert) + ")");
    }
    ++first[size_t(x) + 1];
  }
  for (int64_t x = 0; x < n_expert; ++x) first[size_t(x + 1)] += first[size_t(x)];
  std::vector<int64_t> order(static_cast<size_t>(pairs)), next(first.begin(), first.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) order[size_t(next[size_t(ids[p])]++)] = p;

  const bool quantized = dtype_traits(a.dtype).is_quantized;
  int64_t widest = 0;
  for (int64_t x = 0; x < n_expert; ++x) {
    widest = std::max(widest, first[size_t(x + 1)] - first[size_t(x)]);
  }
  std::vector<float> columns(static_cast<size_t>(widest * K)), products(size_t(widest * M));
  for (int64_t x = 0; x < n_expert; ++x) {
    const int64_t p0 = first[size_t(x)], n = first[size_t(x + 1)] - p0;
    if (n == 0) continue;
    // The pair p = t * k + j reads b column j (or 0 when b has one column per token) of token t.
    const float* src = nullptr;
    if (b.ne[1] == k && n == 1) {
      src = bdata + order[size_t(p0)] * K;  // one column, already contiguous
    } else {
      for (int64_t c = 0; c < n; ++c) {
        const int64_t p = order[size_t(p0 + c)], t = p / k, j = p % k;
        const float* col = bdata + (t * b.ne[1] + (b.ne[1] == 1 ? 0 : j)) * K;
        std::copy(col, col + K, columns.begin() + c * K);
      }
      src = columns.data();
    }
    const uint8_t* w = abase + x * a.nb[2];
    if (quantized) {
      quantized_matmul_2d(ctx, a.dtype, w, size_t(a.nb[1]), src, products.data(), M, n, K);
    } else {
      float_matmul_2d(ctx, a.dtype, w, src, products.data(), M, n, K);
    }
    for (int64_t c = 0; c < n; ++c) {
      const float* from = products.data() + c * M;
      std::copy(from, from + M, out + order[size_t(p0 + c)] * M);
    }
  }
}

}  // namespace

void add_expert_matmul_kernels(KernelTable<Kernel>& rows) {
  for (DType d : float_dtypes()) {
    rows.add(OpKind::ExpertMatMul, {d, DType::F32, DType::I32}, run_expert_matmul);
  }
  rows.add(OpKind::ExpertMatMul, {DType::Q8_0, DType::F32, DType::I32}, run_expert_matmul);
  rows.add(OpKind::ExpertMatMul, {DType::Q4_0, DType::F32, DType::I32}, run_expert_matmul);
  for (DType d : kKQuantDTypes) {
    rows.add(OpKind::ExpertMatMul, {d, DType::F32, DType::I32}, run_expert_matmul);
  }
}

}  // namespace tandem::cpu
