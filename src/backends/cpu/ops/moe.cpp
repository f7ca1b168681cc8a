// Mixture-of-experts routing and combining, one token per task: MoeRoute (top_k of the gate
// logits, best first, ties to the lower id, as the reference), MoeWeights (the chosen experts'
// softmax probabilities) and MoeCombine (the expert outputs summed by weight).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops.h"
#include "tandem/error.h"

namespace tandem::cpu {

namespace {

// Tokens per task: routing a token costs about n_expert * top_k comparisons.
int64_t token_grain(int64_t work_per_token) {
  return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, work_per_token));
}

void run_moe_route(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& l = *e.inputs[0].desc;
  const auto* logits = static_cast<const float*>(e.inputs[0].data);
  auto* ids = static_cast<int32_t*>(e.output.data);
  const int64_t n = l.ne[0], k = e.node->params.top_k;
  ctx.pool.parallel_for(l.ne[1], token_grain(n * k), [&](int64_t t0, int64_t t1) {
    std::vector<char> taken(static_cast<size_t>(n));
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = logits + t * n;
      std::fill(taken.begin(), taken.end(), 0);
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t i = 0; i < n; ++i) {
          if (!taken[size_t(i)] && (best < 0 || row[i] > row[best])) best = i;
        }
        taken[size_t(best)] = 1;
        ids[t * k + j] = int32_t(best);
      }
    }
  });
}

void run_moe_weights(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc &l = *e.inputs[0].desc, &id = *e.inputs[1].desc;
  const auto* logits = static_cast<const float*>(e.inputs[0].data);
  const auto* ids = static_cast<const int32_t*>(e.inputs[1].data);
  auto* out = static_cast<float*>(e.output.data);
  const int64_t n = l.ne[0], k = id.ne[0];
  for (int64_t p = 0; p < k * l.ne[1]; ++p) {
    if (ids[p] < 0 || ids[p] >= n) {
      throw_error(
          ErrorCode::InvalidArgument, "cpu moe_weights",
          "expert id " + std::to_string(ids[p]) + " is not in [0, " + std::to_string(n) + ")");
    }
  }
  const bool normalize = e.node->params.normalize;
  ctx.pool.parallel_for(l.ne[1], token_grain(n), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = logits + t * n;
      const float mx = *std::max_element(row, row + n);
      float sum = 0.0f;
      if (normalize) {
        for (int64_t j = 0; j < k; ++j) sum += std::exp(row[ids[t * k + j]] - mx);
      } else {
        for (int64_t i = 0; i < n; ++i) sum += std::exp(row[i] - mx);
      }
      for (int64_t j = 0; j < k; ++j) out[t * k + j] = std::exp(row[ids[t * k + j]] - mx) / sum;
    }
  });
}

void run_moe_combine(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& x = *e.inputs[0].desc;
  const auto* experts = static_cast<const float*>(e.inputs[0].data);
  const auto* w = static_cast<const float*>(e.inputs[1].data);
  auto* out = static_cast<float*>(e.output.data);
  const int64_t n = x.ne[0], k = x.ne[1];
  ctx.pool.parallel_for(x.ne[2], token_grain(n * k), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* o = out + t * n;
      ctx.k.scale(experts + t * k * n, w[t * k], o, n);
      for (int64_t j = 1; j < k; ++j) ctx.k.axpy_f32(w[t * k + j], experts + (t * k + j) * n, o, n);
    }
  });
}

}  // namespace

void add_moe_kernels(KernelTable<Kernel>& rows) {
  rows.add(OpKind::MoeRoute, {DType::F32, DType::I32}, run_moe_route);
  rows.add(OpKind::MoeWeights, {DType::F32, DType::I32}, run_moe_weights);
  rows.add(OpKind::MoeCombine, {DType::F32}, run_moe_combine);
}

}  // namespace tandem::cpu
