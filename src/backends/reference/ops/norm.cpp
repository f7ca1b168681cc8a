// RmsNorm and LayerNorm over ne[0] in float64, with optional weight and bias.
#include <cmath>

#include "ops.h"

namespace tandem::reference {

namespace {

void run_norm(const NodeExecution& e, bool rms) {
  const float eps = e.node->params.eps;
  const TensorDesc& a = *e.inputs[0].desc;
  const float* x = f32(e.inputs[0]);
  const float* w = e.inputs.size() > 1 ? f32(e.inputs[1]) : nullptr;
  const float* b = e.inputs.size() > 2 ? f32(e.inputs[2]) : nullptr;
  float* o = f32(e.output);
  const int64_t n = a.ne[0];
  for (int64_t r = 0; r < a.rows(); ++r) {
    const float* xr = x + r * n;
    double mean = 0.0;
    if (!rms) {
      for (int64_t i = 0; i < n; ++i) mean += xr[i];
      mean /= double(n);
    }
    double var = 0.0;
    for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= double(n);
    const double inv = 1.0 / std::sqrt(var + double(eps));
    for (int64_t i = 0; i < n; ++i) {
      double y = (xr[i] - mean) * inv;
      if (w) y *= w[i];
      if (b) y += b[i];
      o[r * n + i] = float(y);
    }
  }
}

void run_rms_norm(const NodeExecution& e) {
  run_norm(e, true);
}

void run_layer_norm(const NodeExecution& e) {
  run_norm(e, false);
}

}  // namespace

void add_norm_kernels(KernelTable<ReferenceKernel>& rows) {
  rows.add(OpKind::RmsNorm, {DType::F32}, run_rms_norm);
  rows.add(OpKind::LayerNorm, {DType::F32}, run_layer_norm);
}

}  // namespace tandem::reference
