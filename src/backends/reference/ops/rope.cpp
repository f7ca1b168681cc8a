// RoPE (llama: adjacent pairs) over x [head_dim, heads, tokens], angles in float64.
#include <cmath>

#include "ops.h"

namespace tandem::reference {

namespace {

void run_rope(const NodeExecution& e) {
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
        double x0 = xr[i], x1 = xr[i + 1];
        orow[i] = float(x0 * c - x1 * s);
        orow[i + 1] = float(x0 * s + x1 * c);
      }
    }
}

}  // namespace

void add_rope_kernels(KernelTable<ReferenceKernel>& rows) {
  rows.add(OpKind::Rope, {DType::F32, DType::I32}, run_rope);
}

}  // namespace tandem::reference
