// Add and Mul (with ggml broadcasting of b over a), Scale, Silu, Gelu, SwiGlu.
#include <cmath>

#include "ops.h"

namespace tandem::reference {

namespace {

template <typename F>
void run_binary(const NodeExecution& e, F f) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const float* x = f32(e.inputs[0]);
  const float* y = f32(e.inputs[1]);
  float* o = f32(e.output);
  for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < a.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < a.ne[0]; ++i0) {
          int64_t ia = ((i3 * a.ne[2] + i2) * a.ne[1] + i1) * a.ne[0] + i0;
          int64_t ib =
              (((i3 % b.ne[3]) * b.ne[2] + i2 % b.ne[2]) * b.ne[1] + i1 % b.ne[1]) * b.ne[0] +
              i0 % b.ne[0];
          o[ia] = f(x[ia], y[ib]);
        }
}

template <typename F>
void run_unary(const NodeExecution& e, F f) {
  const float* x = f32(e.inputs[0]);
  float* o = f32(e.output);
  for (int64_t i = 0; i < e.output.desc->elements(); ++i) o[i] = f(x[i]);
}

float silu(float x) {
  return float(double(x) / (1.0 + std::exp(-double(x))));
}

float gelu(float x) {
  // ggml's tanh approximation.
  constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;
  constexpr double kCoef = 0.044715;
  double v = x;
  return float(0.5 * v * (1.0 + std::tanh(kSqrt2OverPi * v * (1.0 + kCoef * v * v))));
}

void run_add(const NodeExecution& e) {
  run_binary(e, [](float a, float b) { return a + b; });
}

void run_mul(const NodeExecution& e) {
  run_binary(e, [](float a, float b) { return a * b; });
}

void run_scale(const NodeExecution& e) {
  run_unary(e, [s = e.node->params.scale](float x) { return x * s; });
}

void run_silu(const NodeExecution& e) {
  run_unary(e, silu);
}

void run_gelu(const NodeExecution& e) {
  run_unary(e, gelu);
}

void run_swiglu(const NodeExecution& e) {
  const float* g = f32(e.inputs[0]);
  const float* u = f32(e.inputs[1]);
  float* o = f32(e.output);
  for (int64_t i = 0; i < e.output.desc->elements(); ++i) o[i] = silu(g[i]) * u[i];
}

}  // namespace

void add_elementwise_kernels(KernelTable<ReferenceKernel>& rows) {
  rows.add(OpKind::Add, {DType::F32}, run_add);
  rows.add(OpKind::Mul, {DType::F32}, run_mul);
  rows.add(OpKind::Scale, {DType::F32}, run_scale);
  rows.add(OpKind::Silu, {DType::F32}, run_silu);
  rows.add(OpKind::Gelu, {DType::F32}, run_gelu);
  rows.add(OpKind::SwiGlu, {DType::F32}, run_swiglu);
}

}  // namespace tandem::reference
