// QuantizedMatMul: Q4_0 / Q8_0 / K-quant weights a [K, M] in GGUF layout times f32 activations
// b [K, N].
// The activations are quantized to 8-bit blocks once per call; integer dot kernels then read
// every weight byte once per column tile. Matrix-vector (N small) and matrix-matrix products
// share the loop: row chunks stay in L2 while tiles of columns sweep over them.
#include <algorithm>
#include <span>
#include <vector>

#include "../amx.h"
#include "ops.h"

namespace tandem::cpu {

namespace {

// The AMX path for one batch slice: activation column tiles packed once, then every thread
// unpacks its 16-row weight panels and multiplies each against all column tiles.
void amx_matmul_2d(ThreadPool& pool, bool q4, const uint8_t* w, size_t wrb,
                   const QuantizedActivations& act, float* out, int64_t M, int64_t N) {
  constexpr int64_t T = amx::kTile;
  const int64_t K = act.k, nb = K / kQuantBlock;
  const int64_t col_tiles = (N + T - 1) / T, panels = (M + T - 1) / T;
  // Packed activations survive across calls (the caller's, also inside worker tasks): a
  // prefill's products allocated and zeroed 1-4 MiB each, on one thread, before any work.
  thread_local std::vector<int8_t> tls_bp;
  thread_local std::vector<float> tls_dap;
  std::vector<int8_t>& bp = tls_bp;
  std::vector<float>& dap = tls_dap;
  bp.resize(static_cast<size_t>(col_tiles * nb * 512));
  dap.resize(static_cast<size_t>(col_tiles * nb * T));
  pool.parallel_for(col_tiles, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t ct = c0; ct < c1; ++ct) {
      const int cols = int(std::min<int64_t>(T, N - ct * T));
      amx::pack_activations(act.qs + ct * T * K, act.d + ct * T * nb, cols, K,
                            bp.data() + ct * nb * 512, dap.data() + ct * nb * T);
    }
  });
  pool.parallel_for(panels, 1, [&](int64_t p0, int64_t p1) {
    // Per running thread (this lambda runs on the workers): unpacked weight panels.
    thread_local std::vector<int8_t> wp;
    thread_local std::vector<float> wd, tile;
    wp.resize(static_cast<size_t>(nb * T * 32));
    wd.resize(static_cast<size_t>(nb * T));
    tile.resize(static_cast<size_t>(T * T));
    amx::configure_tiles();
    for (int64_t p = p0; p < p1; ++p) {
      const int rows = int(std::min<int64_t>(T, M - p * T));
      amx::pack_weights(q4, w + size_t(p * T) * wrb, wrb, rows, nb, wp.data(), wd.data());
      for (int64_t ct = 0; ct < col_tiles; ++ct) {
        amx::tile_product(wp.data(), wd.data(), bp.data() + ct * nb * 512, dap.data() + ct * nb * T,
                          nb, tile.data());
        const int cols = int(std::min<int64_t>(T, N - ct * T));
        for (int n = 0; n < cols; ++n)
          for (int m = 0; m < rows; ++m) {
            out[(ct * T + n) * M + p * T + m] = tile[size_t(m * T + n)];
          }
      }
    }
    amx::release_tiles();
  });
}

// Per calling thread: quantized activations survive across calls, so decode does not allocate.
struct ActivationScratch {
  std::vector<int8_t> qs;
  std::vector<float> d;
  std::vector<int32_t> bias;
};

}  // namespace

QuantizedActivations quantize_columns(const OpContext& ctx, const float* b, int64_t K, int64_t N) {
  thread_local ActivationScratch tls_scratch;
  ActivationScratch& scratch = tls_scratch;  // the caller's, also inside worker tasks
  const int64_t nb = K / kQuantBlock;
  scratch.qs.resize(size_t(N * K));
  scratch.d.resize(size_t(N * nb));
  scratch.bias.resize(size_t(N * nb * kBiasLanes));
  ctx.pool.parallel_for(N, std::max<int64_t>(1, kElementwiseGrain / K),
                        [&](int64_t c0, int64_t c1) {
                          for (int64_t c = c0; c < c1; ++c) {
                            ctx.k.quantize_activations(b + c * K, K, scratch.qs.data() + c * K,
                                                       scratch.d.data() + c * nb,
                                                       scratch.bias.data() + c * nb * kBiasLanes);
                          }
                        });
  return {scratch.qs.data(), scratch.d.data(), scratch.bias.data(), K};
}

namespace {

// out (M x N) = w (M rows of wrb bytes) times the quantized activations, tile by tile over the
// pool, rows claimed by the threads as they go.
template <typename Tile, typename Activations>
void tiled_products(const OpContext& ctx, Tile tile, const uint8_t* w, size_t wrb,
                    const Activations& act, float* out, int64_t M, int64_t N) {
  split_output(
      ctx.pool, M, N,
      [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
        for_each_tile(m0, m1, n0, n1, [&](int64_t m, int rows, int64_t n, int cols) {
          tile(w + size_t(m) * wrb, wrb, rows, act, n, cols, out + n * M + m, M);
        });
      },
      RowTasks::Claimed);
}

struct KActivationScratch {
  std::vector<int8_t> qs;
  std::vector<float> d;
  std::vector<int16_t> sums;
};

// K-quant weights: activations with one scale per 256 (ggml's Q8_K), then the same tiling.
void k_quant_matmul_2d(const OpContext& ctx, DType dtype, const uint8_t* w, size_t wrb,
                       const float* b, float* out, int64_t M, int64_t N, int64_t K) {
  const Kernels& k = ctx.k;
  const auto tile = dtype == DType::Q4_K   ? k.q4_k_tile
                    : dtype == DType::Q5_K ? k.q5_k_tile
                                           : k.q6_k_tile;
  const int64_t n_scales = K / kKActivationBlock, n_sums = K / kKActivationSumGroup;
  thread_local KActivationScratch tls_scratch;
  KActivationScratch& scratch = tls_scratch;  // the caller's, also inside worker tasks
  scratch.qs.resize(size_t(N * K));
  scratch.d.resize(size_t(N * n_scales));
  scratch.sums.resize(size_t(N * n_sums));
  const KQuantizedActivations act{scratch.qs.data(), scratch.d.data(), scratch.sums.data(), K};
  ctx.pool.parallel_for(N, std::max<int64_t>(1, kElementwiseGrain / K),
                        [&](int64_t c0, int64_t c1) {
                          for (int64_t c = c0; c < c1; ++c) {
                            k.quantize_activations_k(b + c * K, K, scratch.qs.data() + c * K,
                                                     scratch.d.data() + c * n_scales,
                                                     scratch.sums.data() + c * n_sums);
                          }
                        });
  tiled_products(ctx, tile, w, wrb, act, out, M, N);
}

}  // namespace

void exact_matmul_2d(const Kernels& k, DType dtype, const uint8_t* w, size_t wrb, const float* b,
                     float* out, int64_t M, int64_t N, int64_t K) {
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    row_to_f32(k, dtype, w + size_t(m) * wrb, row.data(), K);
    for (int64_t n = 0; n < N; ++n) out[n * M + m] = k.dot_f32(row.data(), b + n * K, K);
  }
}

QuantizedTile quantized_tile(const Kernels& k, DType dtype) {
  return dtype == DType::Q4_0 ? k.q4_0_tile : k.q8_0_tile;
}

void quantized_matmul_2d(const OpContext& ctx, DType dtype, const uint8_t* w, size_t wrb,
                         const float* b, float* out, int64_t M, int64_t N, int64_t K) {
  const Kernels& k = ctx.k;
  if (!int8_activations(M, N)) {
    exact_matmul_2d(k, dtype, w, wrb, b, out, M, N, K);
    return;
  }
  if (is_k_quant(dtype)) {
    k_quant_matmul_2d(ctx, dtype, w, wrb, b, out, M, N, K);
    return;
  }
  const auto tile = quantized_tile(k, dtype);
  const QuantizedActivations act = quantize_columns(ctx, b, K, N);
  if (ctx.amx && N >= kAmxMinCols && M >= amx::kTile) {
    amx_matmul_2d(ctx.pool, dtype == DType::Q4_0, w, wrb, act, out, M, N);
    return;
  }
  tiled_products(ctx, tile, w, wrb, act, out, M, N);
}

bool overlaps(const TensorRef& x, const TensorRef& y) {
  const auto* a = static_cast<const uint8_t*>(x.data);
  const auto* b = static_cast<const uint8_t*>(y.data);
  return a < b + y.desc->bytes() && b < a + x.desc->bytes();
}

namespace {

// A member of a group: Q4_0 / Q8_0 weights of one matrix, f32 activations of one batch slice,
// a product for the integer tiles (not AMX, not the exact small-product path).
bool groupable(const OpContext& ctx, const NodeExecution& e) {
  if (e.node->op != OpKind::QuantizedMatMul || e.inputs.size() != 2) return false;
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const int64_t M = a.ne[1], N = b.ne[1];
  return (a.dtype == DType::Q4_0 || a.dtype == DType::Q8_0) && b.dtype == DType::F32 &&
         a.ne[2] * a.ne[3] == 1 && b.ne[2] * b.ne[3] == 1 && int8_activations(M, N) &&
         !(ctx.amx && N >= kAmxMinCols && M >= amx::kTile);
}

}  // namespace

size_t quantized_matmul_group_size(const OpContext& ctx, std::span<const NodeExecution> execs) {
  if (execs.empty() || !groupable(ctx, execs[0])) return 1;
  const TensorRef& b = execs[0].inputs[1];
  // Run one by one, a product writing over b would change what the next ones read.
  if (overlaps(execs[0].output, b)) return 1;
  size_t n = 1;
  for (; n < execs.size(); ++n) {
    const NodeExecution& e = execs[n];
    if (!groupable(ctx, e) || e.inputs[1].data != b.data ||
        e.inputs[1].desc->ne[0] != b.desc->ne[0] || e.inputs[1].desc->ne[1] != b.desc->ne[1]) {
      break;
    }
    // Every output is written while the others are: none may share memory with another or b.
    bool disjoint = !overlaps(e.output, b);
    for (size_t j = 0; j < n && disjoint; ++j) disjoint = !overlaps(e.output, execs[j].output);
    if (!disjoint) break;
  }
  return n;
}

void quantized_matmul_group(const OpContext& ctx, std::span<const NodeExecution> group) {
  const Kernels& k = ctx.k;
  const TensorDesc& bd = *group[0].inputs[1].desc;
  const auto* b = static_cast<const float*>(group[0].inputs[1].data);
  const int64_t K = bd.ne[0], N = bd.ne[1];
  // Row offsets of each matrix in the concatenation.
  std::vector<int64_t> first(group.size() + 1, 0);
  for (size_t i = 0; i < group.size(); ++i)
    first[i + 1] = first[i] + group[i].inputs[0].desc->ne[1];
  const QuantizedActivations act = quantize_columns(ctx, b, K, N);
  ctx.pool.parallel_chunks(
      first.back(), rows_per_task(first.back(), ctx.pool.size()), [&](int64_t r0, int64_t r1) {
        for (size_t i = 0; i < group.size(); ++i) {
          const int64_t m0 = std::max(r0, first[i]) - first[i],
                        m1 = std::min(r1, first[i + 1]) - first[i];
          if (m0 >= m1) continue;
          const NodeExecution& e = group[i];
          const auto* w = static_cast<const uint8_t*>(e.inputs[0].data);
          const size_t wrb = size_t(e.inputs[0].desc->nb[1]);
          const int64_t M = e.inputs[0].desc->ne[1];
          auto* out = static_cast<float*>(e.output.data);
          const auto tile = quantized_tile(k, e.inputs[0].desc->dtype);
          for_each_tile(m0, m1, 0, N, [&](int64_t m, int rows, int64_t n, int cols) {
            tile(w + size_t(m) * wrb, wrb, rows, act, n, cols, out + n * M + m, M);
          });
        }
      });
}

namespace {

void run_quantized_matmul(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const int64_t K = a.ne[0], M = a.ne[1], N = b.ne[1];
  const auto* abase = static_cast<const uint8_t*>(e.inputs[0].data);
  const auto* bdata = static_cast<const float*>(e.inputs[1].data);
  auto* out = static_cast<float*>(e.output.data);
  for (int64_t i3 = 0; i3 < b.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < b.ne[2]; ++i2) {
      const int64_t a2 = i2 / (b.ne[2] / a.ne[2]), a3 = i3 / (b.ne[3] / a.ne[3]);
      const int64_t batch = i3 * b.ne[2] + i2;
      quantized_matmul_2d(ctx, a.dtype, abase + a2 * a.nb[2] + a3 * a.nb[3], size_t(a.nb[1]),
                          bdata + batch * K * N, out + batch * M * N, M, N, K);
    }
}

}  // namespace

void add_quantized_matmul_kernels(KernelTable<Kernel>& rows) {
  rows.add(OpKind::QuantizedMatMul, {DType::Q8_0, DType::F32}, run_quantized_matmul);
  rows.add(OpKind::QuantizedMatMul, {DType::Q4_0, DType::F32}, run_quantized_matmul);
  for (DType d : kKQuantDTypes)
    rows.add(OpKind::QuantizedMatMul, {d, DType::F32}, run_quantized_matmul);
}

}  // namespace tandem::cpu
