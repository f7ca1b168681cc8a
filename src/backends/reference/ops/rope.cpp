// RoPE over x [head_dim, heads, tokens], angles in float64: llama's adjacent pairs (Rope) or
// NeoX's halves (RopeNeox).
#include <cmath>

#include "ops.h"

namespace tandem::reference {

namespace {

// Rotates the pairs (x[i], x[i + half]) for i < n_rot/2 with half = 1 (llama, i even) or
// n_rot/2 (NeoX).
void rope(const NodeExecution& e, bool neox) {
  const OpParams& p = e.node->params;
  const TensorDesc& a = *e.inputs[0].desc;
  const float* x = f32(e.inputs[0]);
  const int32_t* pos = i32(e.inputs[1]);
  float* o = f32(e.output);
  const int64_t d = a.ne[0];
  for (int64_t t = 0; t < a.ne[2]; ++t)
    for (int64_t h = 0; h < a.ne[1]; ++h) {
      const float* xr = x + (t * a.ne[1] + h) * d;
      float* orow = o + (t * a.ne[1] + h) * d;
      for (int64_t i = 0; i < d; ++i) orow[i] = xr[i];
      for (int64_t i = 0; i < p.n_rot; i += 2) {
        double theta = double(pos[t]) * std::pow(double(p.freq_base), -double(i) / p.n_rot);
        double c = std::cos(theta), s = std::sin(theta);
        const int64_t i0 = neox ? i / 2 : i, i1 = neox ? i / 2 + p.n_rot / 2 : i + 1;
        double x0 = xr[i0], x1 = xr[i1];
        orow[i0] = float(x0 * c - x1 * s);
        orow[i1] = float(x0 * s + x1 * c);
      }
    }
}

void run_rope(const NodeExecution& e) {
  rope(e, false);
}

void run_rope_neox(const NodeExecution& e) {
  rope(e, true);
}

}  // namespace

void add_rope_kernels(KernelTable<ReferenceKernel>& rows) {
  rows.add(OpKind::Rope, {DType::F32, DType::I32}, run_rope);
  rows.add(OpKind::RopeNeox, {DType::F32, DType::I32}, run_rope_neox);
}

}  // namespace tandem::reference
