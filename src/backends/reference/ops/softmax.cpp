// Softmax over ne[0] of (a * scale + mask) in float64; mask row = row index % ne[1].
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops.h"

namespace tandem::reference {

namespace {

void run_softmax(const NodeExecution& e) {
  const float scale = e.node->params.scale;
  const TensorDesc& a = *e.inputs[0].desc;
  const float* x = f32(e.inputs[0]);
  const float* mask = e.inputs.size() > 1 ? f32(e.inputs[1]) : nullptr;
  float* o = f32(e.output);
  const int64_t n = a.ne[0];
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t r = 0; r < a.rows(); ++r) {
    const int64_t i1 = r % a.ne[1];
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      v[size_t(i)] = double(x[r * n + i]) * scale + (mask ? double(mask[i1 * n + i]) : 0.0);
      mx = std::max(mx, v[size_t(i)]);
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      v[size_t(i)] = mx == -INFINITY ? 0.0 : std::exp(v[size_t(i)] - mx);
      sum += v[size_t(i)];
    }
    for (int64_t i = 0; i < n; ++i) o[r * n + i] = sum > 0 ? float(v[size_t(i)] / sum) : 0.0f;
  }
}

}  // namespace

void add_softmax_kernels(KernelTable<ReferenceKernel>& rows) {
  rows.add(OpKind::Softmax, {DType::F32}, run_softmax);
}

}  // namespace tandem::reference
