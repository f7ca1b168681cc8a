// Causal grouped-query attention over the KV cache in one pass (online softmax): each task
// owns one (token, head) pair and walks cache positions [0, pos[t]] in blocks of kKeyBlock,
// rescaling its running sum when the running maximum grows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops.h"

namespace tandem::cpu {

namespace {
constexpr int64_t kKeyBlock = 64;
}

void run_attention(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& q = *e.inputs[0].desc;
  const TensorDesc& k = *e.inputs[1].desc;
  const auto* qd = static_cast<const float*>(e.inputs[0].data);
  const void* kd = e.inputs[1].data;
  const void* vd = e.inputs[2].data;
  const auto* pos = static_cast<const int32_t*>(e.inputs[3].data);
  auto* out = static_cast<float*>(e.output.data);
  const int64_t D = q.ne[0], Hq = q.ne[1], T = q.ne[2], Hkv = k.ne[1], C = k.ne[2];
  const int64_t group = Hq / Hkv;
  const float scale = e.node->params.scale;
  const bool half = k.dtype == DType::F16;
  check_positions("cpu attention", pos, T, C);
  const Kernels& kn = ctx.k;
  ctx.pool.parallel_for(T * Hq, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> acc(static_cast<size_t>(D)), score(static_cast<size_t>(kKeyBlock));
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item / Hq, h = item % Hq, hk = h / group;
      const float* qr = qd + (t * Hq + h) * D;
      const int64_t n_kv = int64_t(pos[t]) + 1;
      std::fill(acc.begin(), acc.end(), 0.0f);
      float running_max = -INFINITY, running_sum = 0.0f;
      for (int64_t j0 = 0; j0 < n_kv; j0 += kKeyBlock) {
        const int64_t nj = std::min(kKeyBlock, n_kv - j0);
        float block_max = -INFINITY;
        for (int64_t j = 0; j < nj; ++j) {
          const int64_t off = ((j0 + j) * Hkv + hk) * D;
          const float s = half ? kn.dot_f16(static_cast<const uint16_t*>(kd) + off, qr, D)
                               : kn.dot_f32(static_cast<const float*>(kd) + off, qr, D);
          score[size_t(j)] = s * scale;
          block_max = std::max(block_max, score[size_t(j)]);
        }
        const float new_max = std::max(running_max, block_max);
        if (new_max > running_max && running_sum > 0.0f) {
          const float correction = std::exp(running_max - new_max);
          running_sum *= correction;
          kn.scale(acc.data(), correction, acc.data(), D);
        }
        running_max = new_max;
        for (int64_t j = 0; j < nj; ++j) score[size_t(j)] -= running_max;
        kn.exp_inplace(score.data(), nj);
        for (int64_t j = 0; j < nj; ++j) {
          const int64_t off = ((j0 + j) * Hkv + hk) * D;
          const float p = score[size_t(j)];
          running_sum += p;
          if (half) {
            kn.axpy_f16(p, static_cast<const uint16_t*>(vd) + off, acc.data(), D);
          } else {
            kn.axpy_f32(p, static_cast<const float*>(vd) + off, acc.data(), D);
          }
        }
      }
      kn.scale(acc.data(), 1.0f / running_sum, out + (t * Hq + h) * D, D);
    }
  });
}

}  // namespace tandem::cpu
