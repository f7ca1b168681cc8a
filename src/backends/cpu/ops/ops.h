// Op drivers of the CPU backend: each splits its op over the pool and calls the per-ISA
// kernels row by row. One op family per file, with its kernel rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "../kernels.h"
#include "../thread_pool.h"
#include "tandem/backend.h"
#include "tandem/kernel_table.h"

namespace tandem::cpu {

// How F32 MatMul picks OpenBLAS (see ops/matmul.cpp and bench/NOTES.md).
enum class BlasPolicy : uint8_t { Auto, Always, Never };

struct OpContext {
  ThreadPool& pool;
  const Kernels& k;
  BlasPolicy blas = BlasPolicy::Auto;
  bool amx = false;  // AMX tiles for quantized matrix-matrix products
};

// A CPU kernel, and the backend's rows: each op family's file (ops/<family>.cpp) adds the rows
// of its kernels, and ops/registry.cpp lists the families. Add rows (an op registered outside
// the library) before creating backends: each backend copies the rows it starts with.
using Kernel = void (*)(const OpContext& ctx, const NodeExecution& e);
KernelTable<Kernel>& kernel_table();

// One contiguous row of n elements of dtype to float32 and back (quantized: n % 32 == 0).
void row_to_f32(const Kernels& k, DType dtype, const void* src, float* dst, int64_t n);
void row_from_f32(const Kernels& k, DType dtype, const float* src, void* dst, int64_t n);

// One matrix product a [K, M] x b [K, N] -> out [M, N] (b and out contiguous), split over the
// pool: float weights (F32, F16, BF16; ops/matmul.cpp) or GGUF blocks with rows wrb bytes apart
// (ops/quantized_matmul.cpp). MatMul and ExpertMatMul share them.
void float_matmul_2d(const OpContext& ctx, DType dtype, const uint8_t* a, const float* b,
                     float* out, int64_t M, int64_t N, int64_t K);
void quantized_matmul_2d(const OpContext& ctx, DType dtype, const uint8_t* w, size_t wrb,
                         const float* b, float* out, int64_t M, int64_t N, int64_t K);

// The same product of quantized weights with f32 activations, row by row on the calling thread
// (products too small for 8-bit activations, see int8_activations).
void exact_matmul_2d(const Kernels& k, DType dtype, const uint8_t* w, size_t wrb, const float* b,
                     float* out, int64_t M, int64_t N, int64_t K);

// Consecutive QuantizedMatMuls of one activation input (Q, K and V; gate and up): the number
// at the start of execs that quantized_matmul_group runs as one (1: run the first alone). Each
// is a Q4_0 / Q8_0 product for the integer tiles, and no output shares memory with another or
// with the input.
size_t quantized_matmul_group_size(const OpContext& ctx, std::span<const NodeExecution> execs);
// Quantizes the shared input once and splits the rows of all the products over the pool in one
// job; every output has the bits the products give one by one.
void quantized_matmul_group(const OpContext& ctx, std::span<const NodeExecution> group);

// Decode's expert products of one token (ExpertMatMul of Q4_0 / Q8_0 experts): the gate and up
// products of one column and one set of ids, with the SwiGLU of the two where it follows (3
// nodes, or 2), or the down product with the MoeCombine of its outputs (2 nodes). The number of
// nodes at the start of execs that expert_group runs as one (1: run the first alone).
size_t expert_group_size(const OpContext& ctx, std::span<const NodeExecution> execs);
// One pass over the pool for the whole group, the token's column(s) quantized once; every
// output (the products' too) has the bits the nodes give one by one.
void expert_group(const OpContext& ctx, std::span<const NodeExecution> group);

// Whether two tensors' bytes share memory.
bool overlaps(const TensorRef& x, const TensorRef& y);

// b's N columns of K values quantized to 8 bits over the pool (on the caller alone when they
// are one task), into the calling thread's scratch (valid until its next call on this thread).
QuantizedActivations quantize_columns(const OpContext& ctx, const float* b, int64_t K, int64_t N);
// AMX tiles (OpContext::amx) pay off for quantized products from one full 16-column tile.
inline constexpr int64_t kAmxMinCols = 16;

// The integer tile kernel of Q4_0 or (any other dtype) Q8_0 weights; K-quant products take
// their own activation layout (k_quant_matmul_2d).
using QuantizedTile = decltype(Kernels::q4_0_tile);
QuantizedTile quantized_tile(const Kernels& k, DType dtype);

// How a product split by rows hands rows to threads: one fixed range per thread (OpenBLAS calls,
// which pack the activations once per call), or tasks of rows_per_task claimed as threads go.
enum class RowTasks : uint8_t { Fixed, Claimed };

// Splits an M x N output (M weight rows, N activation columns) over the pool: by rows when there
// are enough (see RowTasks), else by columns. fn(m0, m1, n0, n1).
void split_output(ThreadPool& pool, int64_t M, int64_t N,
                  const std::function<void(int64_t, int64_t, int64_t, int64_t)>& fn,
                  RowTasks tasks = RowTasks::Fixed);

// The cache blocking of the matrix products: weight rows kept hot in L2 while activation
// columns sweep by, and activation columns reused across row chunks.
inline constexpr int64_t kRowChunk = 64;
inline constexpr int64_t kColChunk = 64;

// Rows per claimed task of a product split by rows: about four tasks per thread, so that a
// thread that starts late or reads slower takes fewer, a multiple of kTileRows, at least
// kMinTaskRows (below that the claims cost more than they balance) and at most kMaxTaskRows.
// A task's first tile is the one its kernels could not prefetch (the tile before it prefetched
// the next task's rows, another thread's): with at most 64 rows a task, 4,096-wide Q4_0 / Q4_K
// rows read 73-75% of copy with 2 threads, with 256 78-83%; with 16 threads (H100 host) the
// matrix-vector products read -5 to +22% (most more), the 1B's CPU decode held (bench/NOTES.md).
inline constexpr int64_t kMinTaskRows = 16;
inline constexpr int64_t kMaxTaskRows = 256;
int64_t rows_per_task(int64_t M, int threads);

// Calls tile(m, rows, n, cols) for every kernel tile (kTileRows x kTileCols at most) of the
// output block [m0, m1) x [n0, n1), column chunk by row chunk.
template <typename Tile>
void for_each_tile(int64_t m0, int64_t m1, int64_t n0, int64_t n1, Tile&& tile) {
  for (int64_t nc = n0; nc < n1; nc += kColChunk) {
    const int64_t nce = std::min(n1, nc + kColChunk);
    for (int64_t mc = m0; mc < m1; mc += kRowChunk) {
      const int64_t mce = std::min(m1, mc + kRowChunk);
      for (int64_t n = nc; n < nce; n += kTileCols) {
        const int cols = int(std::min<int64_t>(kTileCols, nce - n));
        for (int64_t m = mc; m < mce; m += kTileRows) {
          tile(m, int(std::min<int64_t>(kTileRows, mce - m)), n, cols);
        }
      }
    }
  }
}

// Throws InvalidArgument unless every position lies in [0, limit).
void check_positions(const char* where, const int32_t* pos, int64_t n, int64_t limit);

// Elements per task below which splitting over threads costs more than it saves.
inline constexpr int64_t kElementwiseGrain = 16384;

}  // namespace tandem::cpu
