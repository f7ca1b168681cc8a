// Causal grouped-query attention over the KV cache: for each token and query head, scores
// against every cached position up to its own, softmax and weighted sum, in float64.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops.h"
#include "tandem/error.h"

namespace tandem::reference {

namespace {

void run_attention(const NodeExecution& e) {
  const float scale = e.node->params.scale;
  const TensorDesc& q = *e.inputs[0].desc;
  const TensorDesc& k = *e.inputs[1].desc;
  const std::vector<float> kf = load_f32(e.inputs[1]);
  const std::vector<float> vf = load_f32(e.inputs[2]);
  const float* qd = f32(e.inputs[0]);
  const int32_t* pos = i32(e.inputs[3]);
  float* o = f32(e.output);
  const int64_t D = q.ne[0], Hq = q.ne[1], T = q.ne[2], Hkv = k.ne[1], C = k.ne[2];
  const int64_t group = Hq / Hkv;
  std::vector<double> score(static_cast<size_t>(C)), acc(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    if (pos[t] < 0 || pos[t] >= C) {
      throw_error(ErrorCode::InvalidArgument, "reference attention",
                  "position " + std::to_string(pos[t]) + " outside the cache [0, " +
                      std::to_string(C) + ")");
    }
    const int64_t n_kv = int64_t(pos[t]) + 1;
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / group;
      const float* qr = qd + (t * Hq + h) * D;
      double mx = -INFINITY;
      for (int64_t j = 0; j < n_kv; ++j) {
        const float* kr = kf.data() + (j * Hkv + hk) * D;
        double s = 0.0;
        for (int64_t i = 0; i < D; ++i) s += double(qr[i]) * double(kr[i]);
        score[size_t(j)] = s * scale;
        mx = std::max(mx, score[size_t(j)]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n_kv; ++j) {
        double w = std::exp(score[size_t(j)] - mx);
        sum += w;
        const float* vr = vf.data() + (j * Hkv + hk) * D;
        for (int64_t i = 0; i < D; ++i) acc[size_t(i)] += w * vr[i];
      }
      float* orow = o + (t * Hq + h) * D;
      for (int64_t i = 0; i < D; ++i) orow[i] = float(acc[size_t(i)] / sum);
    }
  }
}

}  // namespace

void add_attention_kernels(KernelTable<ReferenceKernel>& rows) {
  rows.add(OpKind::Attention, {DType::F32, DType::I32}, run_attention);
  rows.add(OpKind::Attention, {DType::F32, DType::F16, DType::I32}, run_attention);
}

}  // namespace tandem::reference
