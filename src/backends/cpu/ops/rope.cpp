// RoPE over x [head_dim, heads, tokens]: one token's cos/sin table per task, then every head;
// llama's adjacent pairs (Rope) or NeoX's halves (RopeNeox).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops.h"

namespace tandem::cpu {

namespace {

// NeoX's pairs (x[i], x[i + n_rot/2]); cs holds cos, sin per pair as for rope_row.
void rope_neox_row(const float* x, const float* cs, int64_t n_rot, float* out, int64_t n) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[i], x1 = x[i + half];
    out[i] = x0 * c - x1 * s;
    out[i + half] = x0 * s + x1 * c;
  }
  std::copy(x + n_rot, x + n, out + n_rot);
}

void rope(const OpContext& ctx, const NodeExecution& e, bool neox) {
  const TensorDesc& a = *e.inputs[0].desc;
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  const auto* pos = static_cast<const int32_t*>(e.inputs[1].data);
  auto* out = static_cast<float*>(e.output.data);
  const OpParams& p = e.node->params;
  const int64_t d = a.ne[0], heads = a.ne[1], n_rot = p.n_rot;
  // Same double-precision frequencies as the reference, so only float rounding differs.
  std::vector<double> inv_freq(static_cast<size_t>(n_rot / 2));
  for (int64_t i = 0; i < n_rot; i += 2) {
    inv_freq[size_t(i / 2)] = std::pow(double(p.freq_base), -double(i) / double(n_rot));
  }
  const int64_t tokens = a.ne[2] * a.ne[3];
  ctx.pool.parallel_for(tokens, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> cs(static_cast<size_t>(n_rot));
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t i = 0; i < n_rot; i += 2) {
        const double theta = double(pos[t % a.ne[2]]) * inv_freq[size_t(i / 2)];
        cs[size_t(i)] = float(std::cos(theta));
        cs[size_t(i + 1)] = float(std::sin(theta));
      }
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t off = (t * heads + h) * d;
        (neox ? rope_neox_row : ctx.k.rope_row)(x + off, cs.data(), n_rot, out + off, d);
      }
    }
  });
}

void run_rope(const OpContext& ctx, const NodeExecution& e) {
  rope(ctx, e, false);
}

void run_rope_neox(const OpContext& ctx, const NodeExecution& e) {
  rope(ctx, e, true);
}

}  // namespace

void add_rope_kernels(KernelTable<Kernel>& rows) {
  rows.add(OpKind::Rope, {DType::F32, DType::I32}, run_rope);
  rows.add(OpKind::RopeNeox, {DType::F32, DType::I32}, run_rope_neox);
}

}  // namespace tandem::cpu
