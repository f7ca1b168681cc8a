// Add and Mul with broadcast, Scale, Silu, Gelu, SwiGlu: grid-stride loops over f32.
#include "common.cuh"
#include "ops.h"

namespace tandem::cuda {

namespace {

struct Shape4 {
  int64_t ne[4];
};

enum class BinaryKind { Add, Mul };

template <BinaryKind kKind>
__device__ __forceinline__ float apply(float a, float b) {
  if constexpr (kKind == BinaryKind::Add) return a + b;
  return a * b;
}

// b has a's shape (the common case) or broadcasts; the general path divides per element.
template <BinaryKind kKind>
__global__ void binary_kernel(const float* a, const float* b, float* out, int64_t n, Shape4 sa,
                              Shape4 sb, int mode) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t ib;
    if (mode == 0) {
      ib = i;
    } else if (mode == 1) {
      ib = i % sb.ne[0];  // b is one row broadcast over a's rows
    } else {
      const Index4 x = unflatten(i, sa.ne);
      ib = (((x.i3 % sb.ne[3]) * sb.ne[2] + x.i2 % sb.ne[2]) * sb.ne[1] + x.i1 % sb.ne[1]) *
               sb.ne[0] +
           x.i0 % sb.ne[0];
    }
    out[i] = apply<kKind>(a[i], b[ib]);
  }
}

enum class UnaryKind { Scale, Silu, Gelu };

template <UnaryKind kKind>
__global__ void unary_kernel(const float* x, float* out, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    if constexpr (kKind == UnaryKind::Scale) {
      out[i] = v * scale;
    } else if constexpr (kKind == UnaryKind::Silu) {
      out[i] = v / (1.0f + expf(-v));
    } else {
      // ggml's tanh approximation.
      constexpr float kSqrt2OverPi = 0.79788456080286535588f;
      constexpr float kCoef = 0.044715f;
      out[i] = 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * v * (1.0f + kCoef * v * v)));
    }
  }
}

// A programmatic dependent that lets its dependents launch at once (the down projection's
// matrix-vector kernel fetches its weights meanwhile).
__global__ void swiglu_kernel(const float* gate, const float* up, float* out, int64_t n) {
  grid_launch_dependents();
  grid_dependency_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

constexpr int kThreads = 256;

void run_binary(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const int64_t n = a.elements();
  Shape4 sa{{a.ne[0], a.ne[1], a.ne[2], a.ne[3]}}, sb{{b.ne[0], b.ne[1], b.ne[2], b.ne[3]}};
  const int mode = a.ne == b.ne ? 0 : (b.elements() == b.ne[0] && b.ne[0] == a.ne[0]) ? 1 : 2;
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  const auto* y = static_cast<const float*>(e.inputs[1].data);
  auto* o = static_cast<float*>(e.output.data);
  const bool add = e.node->op == OpKind::Add;
  if (add) {
    binary_kernel<BinaryKind::Add>
        <<<grid_1d(n, kThreads), kThreads, 0, ctx.stream>>>(x, y, o, n, sa, sb, mode);
  } else {
    binary_kernel<BinaryKind::Mul>
        <<<grid_1d(n, kThreads), kThreads, 0, ctx.stream>>>(x, y, o, n, sa, sb, mode);
  }
  ctx.check_launch(add ? "add" : "mul");
}

void run_unary(const OpContext& ctx, const NodeExecution& e) {
  const int64_t n = e.output.desc->elements();
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  auto* o = static_cast<float*>(e.output.data);
  const unsigned grid = grid_1d(n, kThreads);
  switch (e.node->op) {
    case OpKind::Scale:
      unary_kernel<UnaryKind::Scale>
          <<<grid, kThreads, 0, ctx.stream>>>(x, o, n, e.node->params.scale);
      ctx.check_launch("scale");
      return;
    case OpKind::Silu:
      unary_kernel<UnaryKind::Silu><<<grid, kThreads, 0, ctx.stream>>>(x, o, n, 1.0f);
      ctx.check_launch("silu");
      return;
    default:
      unary_kernel<UnaryKind::Gelu><<<grid, kThreads, 0, ctx.stream>>>(x, o, n, 1.0f);
      ctx.check_launch("gelu");
      return;
  }
}

void run_swiglu(const OpContext& ctx, const NodeExecution& e) {
  const int64_t n = e.output.desc->elements();
  ctx.check(launch_programmatic(ctx.stream, dim3(grid_1d(n, kThreads)), dim3(kThreads), 0,
                                swiglu_kernel, static_cast<const float*>(e.inputs[0].data),
                                static_cast<const float*>(e.inputs[1].data),
                                static_cast<float*>(e.output.data), n),
            "swiglu", "kernel launch");
}

}  // namespace

void add_elementwise_kernels(KernelTable<Kernel>& rows) {
  for (OpKind op : {OpKind::Add, OpKind::Mul}) add_row(rows, op, {DType::F32}, {run_binary});
  for (OpKind op : {OpKind::Scale, OpKind::Silu, OpKind::Gelu}) {
    add_row(rows, op, {DType::F32}, {run_unary});
  }
  add_row(rows, OpKind::SwiGlu, {DType::F32}, {run_swiglu});
}

}  // namespace tandem::cuda
