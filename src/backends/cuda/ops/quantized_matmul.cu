// QuantizedMatMul with Q4_0/Q8_0/K-quant weights in GGUF layout, by size: fewer than 16 outputs
// multiply f32 b; up to kMatvecMaxColumns columns of b are quantized to int8 blocks and a
// matrix-vector kernel reads the weight blocks once, multiplying with __dp4a (the staged kernel of
// staged_matvec.cu where the layout allows, else the generic ones here); more columns: the weights
// are dequantized to f16 and multiplied on tensor cores by cuBLAS with f32 accumulation.
#include <algorithm>
#include <span>

#include "common.cuh"
#include "matvec.cuh"
#include "ops.h"
#include "tandem/error.h"

namespace tandem::cuda {

void gemm_batched(const OpContext& ctx, const char* op, const TensorDesc& a, const void* a_data,
                  DType a_type, const TensorDesc& b, const void* b_data, DType b_type, float* out);

namespace {

constexpr int kWarps = 4;

// b as int8 blocks of 32 with one f32 scale each (like ggml's q8_1), so the weights' quants
// meet it in __dp4a: a quarter of f32 b's bytes and one instruction per four products.
// A programmatic dependent that releases its dependent (the matrix-vector kernel) at once.
__global__ void quantize_b_kernel(const float* b, int8_t* bq, float* bd, int64_t n_blocks) {
  grid_launch_dependents();
  grid_dependency_wait();
  const int64_t blk = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (blk >= n_blocks) return;
  const float x = b[blk * kQBlock + lane];
  const float amax = warp_max(fabsf(x));
  const float d = amax / 127.0f;
  bq[blk * kQBlock + lane] = int8_t(d > 0.0f ? rintf(x / d) : 0.0f);
  if (lane == 0) bd[blk] = d;
}

// One warp per row.
template <DType kType, int kCols>
__global__ __launch_bounds__(kWarps * 32) void matvec_kernel(const uint8_t* a, int64_t row_stride,
                                                             int64_t a_stride2, int64_t a_stride3,
                                                             int64_t a_div2, int64_t a_div3, int M,
                                                             int n_blocks, const int8_t* bq,
                                                             const float* bd, int64_t b_ne2,
                                                             float* out) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  if (row >= M) return;
  const int64_t z = blockIdx.y, i2 = z % b_ne2, i3 = z / b_ne2;
  const int64_t K = int64_t(n_blocks) * kQBlock;
  const uint8_t* ar = a + (i2 / a_div2) * a_stride2 + (i3 / a_div3) * a_stride3 + row * row_stride;
  const int8_t* bqs[kCols];
  const float* bds[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    bqs[c] = bq + (z * kCols + c) * K;
    bds[c] = bd + (z * kCols + c) * int64_t(n_blocks);
  }
  float acc[kCols];
  quant_row_dot<kType, kCols>(ar, n_blocks, bqs, bds, acc);
  out += z * int64_t(M) * kCols;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const float v = warp_sum(acc[c]);
    if (lane == 0) out[int64_t(c) * M + row] = v;
  }
}

template <DType kType, int kCols>
__global__ __launch_bounds__(kWarps * 32) void k_matvec_kernel(const uint8_t* a, int64_t row_stride,
                                                               int64_t a_stride2, int64_t a_stride3,
                                                               int64_t a_div2, int64_t a_div3,
                                                               int M, int n_supers,
                                                               const int8_t* bq, const float* bd,
                                                               int64_t b_ne2, float* out) {
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  if (row >= M) return;
  const int64_t z = blockIdx.y, i2 = z % b_ne2, i3 = z / b_ne2;
  const int64_t K = int64_t(n_supers) * kSuperBlock;
  const uint8_t* ar = a + (i2 / a_div2) * a_stride2 + (i3 / a_div3) * a_stride3 + row * row_stride;
  k_matvec_row<kType, kCols>(ar, M, row, n_supers, bq + z * kCols * K,
                             bd + z * kCols * (K / kQBlock), out + z * int64_t(M) * kCols);
}

// Up to kMaxParts K-quant matrices of one dtype multiplying the same quantized b in one launch:
// rows [row_start[p], row_start[p + 1]) of the grid are part p's.
struct KParts {
  const uint8_t* a[kMaxParts];
  int64_t row_stride[kMaxParts];
  float* out[kMaxParts];
  int row_start[kMaxParts + 1];
};

template <DType kType, int kCols>
__global__ __launch_bounds__(kWarps *
                             32) void k_matvec_parts_kernel(const __grid_constant__ KParts parts,
                                                            int n_parts, int n_supers,
                                                            const int8_t* bq, const float* bd) {
  const int r = blockIdx.x * kWarps + threadIdx.x / 32;
  if (r >= parts.row_start[n_parts]) return;
  int p = 0;
#pragma unroll
  for (int k = 1; k < kMaxParts; ++k) p += k < n_parts && r >= parts.row_start[k];
  const int row = r - parts.row_start[p];
  k_matvec_row<kType, kCols>(parts.a[p] + row * parts.row_stride[p],
                             parts.row_start[p + 1] - parts.row_start[p], row, n_supers, bq, bd,
                             parts.out[p]);
}

// Products of fewer than kMinOutputsForInt8Activations outputs (M x N) multiply f32 b: one warp
// per output.
template <DType kType>
__global__ __launch_bounds__(kWarps * 32) void exact_matvec_kernel(
    const uint8_t* a, int64_t row_stride, int64_t a_stride2, int64_t a_stride3, int64_t a_div2,
    int64_t a_div3, int M, int N, int64_t K, const float* b, int64_t b_ne2, float* out) {
  const int lane = threadIdx.x % 32;
  const int o = blockIdx.x * kWarps + threadIdx.x / 32;  // row + M * column
  if (o >= M * N) return;
  const int row = o % M, col = o / M;
  const int64_t z = blockIdx.y, i2 = z % b_ne2, i3 = z / b_ne2;
  const uint8_t* ar = a + (i2 / a_div2) * a_stride2 + (i3 / a_div3) * a_stride3 + row * row_stride;
  const float* bc = b + (z * N + col) * K;
  float acc = 0.0f;
  for (int64_t k = lane; k < K; k += 32) acc += load_f32(kType, ar, k) * bc[k];
  acc = warp_sum(acc);
  if (lane == 0) out[z * M * N + o] = acc;
}

// A product of fewer than kMinOutputsForInt8Activations outputs per matrix, any number of columns.
void launch_exact(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const int64_t M = a.ne[1], N = b.ne[1];
  const dim3 grid(unsigned((M * N + kWarps - 1) / kWarps), unsigned(b.ne[2] * b.ne[3]));
  with_quantized_dtype(a.dtype, [&](auto d) {
    exact_matvec_kernel<d()><<<grid, kWarps * 32, 0, ctx.stream>>>(
        static_cast<const uint8_t*>(e.inputs[0].data), a.nb[1], a.nb[2], a.nb[3], b.ne[2] / a.ne[2],
        b.ne[3] / a.ne[3], int(M), int(N), a.ne[0], static_cast<const float*>(e.inputs[1].data),
        b.ne[2], static_cast<float*>(e.output.data));
  });
  ctx.check_launch("quantized_matmul");
}

}  // namespace

QuantizedB quantize_b(const OpContext& ctx, const TensorDesc& b, const void* b_data) {
  const int64_t b_blocks = b.elements() / kQBlock;
  auto* bq = static_cast<int8_t*>(ctx.scratch);
  auto* bd = reinterpret_cast<float*>(bq + align_up(size_t(b.elements()), kScratchAlignment));
  ctx.check(
      launch_programmatic(ctx.stream, dim3(grid_1d(b_blocks * 32, 256, INT32_MAX)), dim3(256), 0,
                          quantize_b_kernel, static_cast<const float*>(b_data), bq, bd, b_blocks),
      "quantized_matmul", "kernel launch");
  return {bq, bd};
}

namespace {

// The generic kernel, after a separate kernel quantizes b.
template <int kCols>
void launch_generic_matvec(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const int64_t K = a.ne[0], M = a.ne[1];
  const int64_t batches = b.ne[2] * b.ne[3];
  const int64_t div2 = b.ne[2] / a.ne[2], div3 = b.ne[3] / a.ne[3];
  const auto* ap = static_cast<const uint8_t*>(e.inputs[0].data);
  auto* op = static_cast<float*>(e.output.data);
  const QuantizedB qb = quantize_b(ctx, b, e.inputs[1].data);
  int8_t* const bq = qb.bq;
  float* const bd = qb.bd;
  const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(batches));
  auto go = [&](auto kernel) {
    kernel<<<grid, kWarps * 32, 0, ctx.stream>>>(ap, a.nb[1], a.nb[2], a.nb[3], div2, div3, int(M),
                                                 int(K / kQBlock), bq, bd, b.ne[2], op);
  };
  auto go_k = [&](auto kernel) {
    ctx.check(launch_programmatic(ctx.stream, grid, dim3(kWarps * 32), 0, kernel, ap, a.nb[1],
                                  a.nb[2], a.nb[3], div2, div3, int(M), int(K / kSuperBlock),
                                  static_cast<const int8_t*>(bq), static_cast<const float*>(bd),
                                  b.ne[2], op),
              "quantized_matmul", "kernel launch");
  };
  switch (a.dtype) {
    case DType::Q4_0:
      go(matvec_kernel<DType::Q4_0, kCols>);
      break;
    case DType::Q4_K:
      go_k(k_matvec_kernel<DType::Q4_K, kCols>);
      break;
    case DType::Q5_K:
      go_k(k_matvec_kernel<DType::Q5_K, kCols>);
      break;
    case DType::Q6_K:
      go_k(k_matvec_kernel<DType::Q6_K, kCols>);
      break;
    default:
      go(matvec_kernel<DType::Q8_0, kCols>);
      break;
  }
  ctx.check_launch("quantized_matmul");
}

// K-quant products that multiply the same b (Q, K and V; gate and up): b quantized once, then
// one launch per run of equal dtype (a Q4_K_M layer mixes Q4_K and Q6_K).
template <int kCols>
void launch_k_matvec_parts(const OpContext& ctx, std::span<const NodeExecution> execs) {
  const int n_supers = int(execs[0].inputs[0].desc->ne[0] / kSuperBlock);
  const QuantizedB qb = quantize_b(ctx, *execs[0].inputs[1].desc, execs[0].inputs[1].data);
  int8_t* const bq = qb.bq;
  float* const bd = qb.bd;
  for (size_t i = 0; i < execs.size();) {
    const DType dtype = execs[i].inputs[0].desc->dtype;
    KParts parts{};
    int n = 0;
    for (; i < execs.size() && n < kMaxParts && execs[i].inputs[0].desc->dtype == dtype; ++i, ++n) {
      const TensorDesc& a = *execs[i].inputs[0].desc;
      parts.a[n] = static_cast<const uint8_t*>(execs[i].inputs[0].data);
      parts.row_stride[n] = a.nb[1];
      parts.out[n] = static_cast<float*>(execs[i].output.data);
      parts.row_start[n + 1] = parts.row_start[n] + int(a.ne[1]);
    }
    const unsigned blocks = unsigned((parts.row_start[n] + kWarps - 1) / kWarps);
    auto go = [&](auto kernel) {
      ctx.check(launch_programmatic(ctx.stream, dim3(blocks), dim3(kWarps * 32), 0, kernel, parts,
                                    n, n_supers, static_cast<const int8_t*>(bq),
                                    static_cast<const float*>(bd)),
                "quantized_matmul", "kernel launch");
    };
    switch (dtype) {
      case DType::Q4_K:
        go(k_matvec_parts_kernel<DType::Q4_K, kCols>);
        break;
      case DType::Q5_K:
        go(k_matvec_parts_kernel<DType::Q5_K, kCols>);
        break;
      default:
        go(k_matvec_parts_kernel<DType::Q6_K, kCols>);
        break;
    }
    ctx.check_launch("quantized_matmul");
  }
}

// 9 to kSplitMaxColumns columns of a 2-D b (a batched decode step of several sequences) run
// as matrix-vector products of up to kMatvecMaxColumns columns each: the weights are read once
// per slice instead of converted to f16 for the GEMM (1B, 16 rows: the conversion of every
// weight matrix cost more than the product).
constexpr int64_t kSplitMaxColumns = 32;
bool split_columns(const NodeExecution& e) {
  const TensorDesc& b = *e.inputs[1].desc;
  return b.ne[1] > kMatvecMaxColumns && b.ne[1] <= kSplitMaxColumns && b.ne[2] * b.ne[3] == 1 &&
         b.is_contiguous() && e.output.desc->is_contiguous();
}

void run_matvec(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  if (!launch_staged_matvec(ctx, std::span(&e, 1))) {
    with_columns(b.ne[1], [&](auto cols) { launch_generic_matvec<cols()>(ctx, e); });
  }
}

void run_split_columns(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& b = *e.inputs[1].desc;
  const TensorDesc& out = *e.output.desc;
  for (int64_t c0 = 0; c0 < b.ne[1]; c0 += kMatvecMaxColumns) {
    const int64_t n = std::min<int64_t>(kMatvecMaxColumns, b.ne[1] - c0);
    TensorDesc bs = b, os = out;
    bs.ne[1] = n;
    os.ne[1] = n;
    NodeExecution slice = e;
    slice.inputs[1] = {&bs, static_cast<uint8_t*>(e.inputs[1].data) + c0 * b.nb[1]};
    slice.output = {&os, static_cast<uint8_t*>(e.output.data) + c0 * out.nb[1]};
    run_matvec(ctx, slice);
  }
}

size_t quantized_matmul_scratch_bytes(const NodeExecution& e, int /*sm_count*/) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  if (b.ne[1] <= kMatvecMaxColumns || split_columns(e)) {
    return align_up(size_t(b.elements()), kScratchAlignment) +
           align_up(size_t(b.elements() / kQBlock) * 4, kScratchAlignment);
  }
  return align_up(size_t(a.elements()) * 2, kScratchAlignment) +
         align_up(size_t(b.elements()) * 2, kScratchAlignment);
}

void run_quantized_matmul(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  if (a.ne[1] > INT32_MAX || a.ne[0] / 64 > INT32_MAX) {
    throw_error(ErrorCode::Unsupported, ctx.state->id + " quantized_matmul",
                "weights " + shape_string(a) + " exceed the kernel's int32 row range");
  }
  if (!int8_activations(a.ne[1], b.ne[1])) {
    launch_exact(ctx, e);
    return;
  }
  if (b.ne[1] <= kMatvecMaxColumns) {
    run_matvec(ctx, e);
    return;
  }
  if (split_columns(e)) {
    run_split_columns(ctx, e);
    return;
  }
  // Large batches: weights to f16 once, b to f16, tensor-core GEMM with f32 accumulation.
  auto* a_half = static_cast<uint8_t*>(ctx.scratch);
  auto* b_half = a_half + align_up(size_t(a.elements()) * 2, kScratchAlignment);
  convert_to_half(ctx, a.dtype, e.inputs[0].data, a_half, a.elements(), false, "quantized_matmul");
  convert_to_half(ctx, DType::F32, e.inputs[1].data, b_half, b.elements(), false,
                  "quantized_matmul");
  gemm_batched(ctx, "quantized_matmul", a, a_half, DType::F16, b, b_half, DType::F16,
               static_cast<float*>(e.output.data));
}

}  // namespace

void add_quantized_matmul_kernels(KernelTable<Kernel>& rows) {
  const Kernel quantized{run_quantized_matmul, quantized_matmul_scratch_bytes};
  add_row(rows, OpKind::QuantizedMatMul, {DType::Q8_0, DType::F32}, quantized, "tensor_cores");
  add_row(rows, OpKind::QuantizedMatMul, {DType::Q4_0, DType::F32}, quantized, "tensor_cores");
  for (DType d : kKQuantDTypes) {
    add_row(rows, OpKind::QuantizedMatMul, {d, DType::F32}, quantized, "tensor_cores");
  }
}

size_t run_fused_matvecs(const OpContext& ctx, std::span<const NodeExecution> segment) {
  // Matrices of one dtype multiplying the same b: one launch of the staged kernel.
  auto is_matvec = [](const NodeExecution& e) {
    return e.node->op == OpKind::QuantizedMatMul && e.inputs[1].desc->ne[1] >= 1 &&
           e.inputs[1].desc->ne[1] <= kMatvecMaxColumns &&
           int8_activations(e.inputs[0].desc->ne[1], e.inputs[1].desc->ne[1]);
  };
  if (const size_t n = count_same_b(segment, kMaxParts, is_matvec); n >= 2) {
    // Gate and up of one column and their SwiGlu: the GLU in the same launch.
    if (const size_t ran =
            launch_staged_products(ctx, segment, n, nullptr, swiglu_of(segment, n))) {
      return ran;
    }
  }
  // K-quant matrices (2-D) of mixed dtypes (a Q4_K_M layer's Q4_K and Q6_K) multiplying the same
  // b, where the staged kernel does not take them: one quantization of b, fewer launches.
  auto is_k_matvec = [](const NodeExecution& e) {
    const TensorDesc& a = *e.inputs[0].desc;
    const TensorDesc& b = *e.inputs[1].desc;
    return e.node->op == OpKind::QuantizedMatMul && is_k_quant(a.dtype) && b.ne[1] >= 1 &&
           b.ne[1] <= kMatvecMaxColumns && int8_activations(a.ne[1], b.ne[1]) &&
           a.ne[2] * a.ne[3] == 1 && b.ne[2] * b.ne[3] == 1 && a.ne[1] <= INT32_MAX / 4;
  };
  const size_t n = count_same_b(segment, kMaxParts, is_k_matvec, /*same_dtype=*/false);
  if (n < 2) return 0;
  with_columns(segment[0].inputs[1].desc->ne[1],
               [&](auto cols) { launch_k_matvec_parts<cols()>(ctx, segment.first(n)); });
  return n;
}

size_t run_fused_norm_matvecs(const OpContext& ctx, std::span<const NodeExecution> segment) {
  // [Add,] RmsNorm, then products of its output (one column): the staged kernel makes b itself.
  NormedB in{};
  const size_t lead = match_normed_b(segment, in);
  if (lead == 0) return 0;
  const NodeExecution& norm = segment[lead - 1];
  auto is_matvec = [&](const NodeExecution& e) {
    return e.node->op == OpKind::QuantizedMatMul && e.inputs[1].data == norm.output.data &&
           e.inputs[1].desc->ne[1] == 1 && int8_activations(e.inputs[0].desc->ne[1], 1);
  };
  const std::span<const NodeExecution> products = segment.subspan(lead);
  const size_t n = count_same_b(products, kMaxParts, is_matvec);
  if (n == 0) return 0;
  const size_t ran = launch_staged_products(ctx, products, n, &in, swiglu_of(products, n));
  return ran > 0 ? lead + ran : 0;
}

}  // namespace tandem::cuda
