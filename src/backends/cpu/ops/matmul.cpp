// MatMul with f32, f16 or bf16 weights a [K, M] and f32 activations b [K, N] -> [M, N].
// Large f32 products go to OpenBLAS sgemm (single-threaded, one slice of rows per pool
// thread) when the policy allows; everything else runs the dot-form f32 tiles, f16/bf16
// weights converted to f32 a chunk of rows at a time (or dotted directly for matvec).
#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "ops.h"

namespace tandem::cpu {

namespace {

constexpr int64_t kBlasMinCols = 16;  // below this a product is memory-bound: own kernels

bool use_blas(BlasPolicy policy, int64_t M, int64_t N, int64_t K) {
  if (policy == BlasPolicy::Never) return false;
  if (policy == BlasPolicy::Always) return true;
  return N >= kBlasMinCols && M >= kRowChunk && K >= 64;
}

// Our pool splits the work; OpenBLAS's own threads would fight it for the cores.
void make_openblas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Tiles of one f32 matrix pair over rows [m0, m1) and columns [n0, n1).
void f32_tiles(const Kernels& k, const float* a, const float* b, float* out, int64_t M, int64_t K,
               int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  for_each_tile(m0, m1, n0, n1, [&](int64_t m, int rows, int64_t n, int cols) {
    k.f32_tile(a + (m - m0) * K, K, rows, b + n * K, K, cols, K, out + n * M + m, M);
  });
}

}  // namespace

void float_matmul_2d(const OpContext& ctx, DType dtype, const uint8_t* a, const float* b,
                     float* out, int64_t M, int64_t N, int64_t K) {
  const Kernels& k = ctx.k;
  if (dtype == DType::F32 && use_blas(ctx.blas, M, N, K)) {
    make_openblas_single_threaded();
    const auto* af = reinterpret_cast<const float*>(a);
    split_output(ctx.pool, M, N, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n1 - n0), int(m1 - m0), int(K), 1.0f,
                  b + n0 * K, int(K), af + m0 * K, int(K), 0.0f, out + n0 * M + m0, int(M));
    });
    return;
  }
  if (dtype == DType::F32) {
    const auto* af = reinterpret_cast<const float*>(a);
    split_output(ctx.pool, M, N, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      f32_tiles(k, af + m0 * K, b, out, M, K, m0, m1, n0, n1);
    });
    return;
  }
  const auto* ah = reinterpret_cast<const uint16_t*>(a);
  auto dot = dtype == DType::F16 ? k.dot_f16 : k.dot_bf16;
  auto convert = dtype == DType::F16 ? k.f16_to_f32 : k.bf16_to_f32;
  split_output(ctx.pool, M, N, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    if (n1 - n0 <= 2) {  // matrix-vector: read the 16-bit weights once, directly
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t n = n0; n < n1; ++n) out[n * M + m] = dot(ah + m * K, b + n * K, K);
      return;
    }
    std::vector<float> rows(static_cast<size_t>(kRowChunk * K));
    for (int64_t mc = m0; mc < m1; mc += kRowChunk) {
      const int64_t mce = std::min(m1, mc + kRowChunk);
      convert(ah + mc * K, rows.data(), (mce - mc) * K);
      f32_tiles(k, rows.data(), b, out, M, K, mc, mce, n0, n1);
    }
  });
}

int64_t rows_per_task(int64_t M, int threads) {
  const int64_t per = (M + 4 * threads - 1) / (4 * threads);  // about 4 tasks per thread
  return std::clamp((per + kTileRows - 1) / kTileRows * kTileRows, kMinTaskRows, kMaxTaskRows);
}

void split_output(ThreadPool& pool, int64_t M, int64_t N,
                  const std::function<void(int64_t, int64_t, int64_t, int64_t)>& fn,
                  RowTasks tasks) {
  if (M >= N || M >= int64_t(pool.size()) * kTileRows * 4) {
    if (tasks == RowTasks::Claimed) {
      pool.parallel_chunks(M, rows_per_task(M, pool.size()),
                           [&](int64_t m0, int64_t m1) { fn(m0, m1, 0, N); });
    } else {
      pool.parallel_for(M, kTileRows, [&](int64_t m0, int64_t m1) { fn(m0, m1, 0, N); });
    }
  } else {
    pool.parallel_for(N, kTileCols, [&](int64_t n0, int64_t n1) { fn(0, M, n0, n1); });
  }
}

namespace {

void run_matmul(const OpContext& ctx, const NodeExecution& e) {
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
      float_matmul_2d(ctx, a.dtype, abase + a2 * a.nb[2] + a3 * a.nb[3], bdata + batch * K * N,
                      out + batch * M * N, M, N, K);
    }
}

}  // namespace

void add_matmul_kernels(KernelTable<Kernel>& rows) {
  for (DType d : float_dtypes()) rows.add(OpKind::MatMul, {d, DType::F32}, run_matmul);
}

}  // namespace tandem::cpu
