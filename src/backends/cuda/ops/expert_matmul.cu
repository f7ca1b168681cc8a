// ExpertMatMul with quantized weights (MoE layers): one warp per output row of each (token,
// choice) for decode, gate + up + SwiGLU as one launch, and the (token, choice) pairs grouped by
// expert for prefill. The int8 row loops and b's quantization are the matrix-vector kernels'
// (matvec.cuh). Every path takes the product's map (ExpertMap): a choice it has no matrix for
// reads no weights and gets a column of zeros.
#include <span>

#include "common.cuh"
#include "matvec.cuh"
#include "ops.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 4;

// ExpertMatMul with quantized weights: one warp per output row of each (token, choice) z, the
// chosen expert's row times b's column for z (b quantized once, as for a matrix-vector
// product). The expert comes from data, so nothing is fetched before the wait. kMapped: whether
// the product has a map; the instances without keep its check out (Q4_K took 2 more registers).
template <DType kType, bool kMapped>
__global__ __launch_bounds__(kWarps * 32) void expert_matvec_kernel(
    const uint8_t* a, int64_t row_stride, int64_t expert_stride, int64_t n_expert, int M, int64_t K,
    const int8_t* bq, const float* bd, int64_t b_cols, const int32_t* ids, ExpertMap map, int k,
    float* out, int32_t* error_flag) {
  grid_dependency_wait();
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;
  const int64_t z = blockIdx.y, col = b_cols == 1 ? z / k : z;
  const int32_t expert = expert_of(ids[z], kMapped ? map : ExpertMap{}, n_expert);
  out += z * M;
  if (expert < 0) {
    if (lane == 0) {
      out[row] = 0.0f;
      if (expert == kBadExpert) atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
    }
    return;
  }
  const uint8_t* ar = a + expert * expert_stride + row * row_stride;
  bq += col * K;
  bd += col * (K / kQBlock);
  if constexpr (kType == DType::Q4_K || kType == DType::Q5_K || kType == DType::Q6_K) {
    k_matvec_row<kType, 1>(ar, M, row, int(K / kSuperBlock), bq, bd, out);
  } else {
    const int8_t* const bqs[1] = {bq};
    const float* const bds[1] = {bd};
    float acc[1];
    quant_row_dot<kType, 1>(ar, int(K / kQBlock), bqs, bds, acc);
    const float v = warp_sum(acc[0]);
    if (lane == 0) out[row] = v;
  }
}

// Gate and up ExpertMatMul of one b, one set of ids and one map, then the SwiGlu of their
// outputs (a MoE layer's decode): one launch whose warps take row m of both chosen experts'
// matrices and write both products and silu(gate) * up. kMapped as for expert_matvec_kernel.
template <DType kType, bool kMapped>
__global__ __launch_bounds__(kWarps * 32) void expert_gate_up_kernel(
    const uint8_t* gate_w, const uint8_t* up_w, int64_t row_stride, int64_t expert_stride,
    int64_t n_expert, int M, int64_t K, const int8_t* bq, const float* bd, int64_t b_cols,
    const int32_t* ids, ExpertMap map, int k, float* gate_out, float* up_out, float* glu,
    int32_t* error_flag) {
  grid_dependency_wait();
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;
  const int64_t z = blockIdx.y, col = b_cols == 1 ? z / k : z;
  const int32_t expert = expert_of(ids[z], kMapped ? map : ExpertMap{}, n_expert);
  gate_out += z * M;
  up_out += z * M;
  glu += z * M;
  if (expert < 0) {
    if (lane == 0) {
      gate_out[row] = up_out[row] = glu[row] = 0.0f;
      if (expert == kBadExpert) atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
    }
    return;
  }
  const int64_t offset = expert * expert_stride + row * row_stride;
  bq += col * K;
  bd += col * (K / kQBlock);
  if constexpr (kType == DType::Q4_K || kType == DType::Q5_K || kType == DType::Q6_K) {
    // Lane 0 writes each product; it computes the GLU from what it wrote.
    k_matvec_row<kType, 1>(gate_w + offset, M, row, int(K / kSuperBlock), bq, bd, gate_out);
    k_matvec_row<kType, 1>(up_w + offset, M, row, int(K / kSuperBlock), bq, bd, up_out);
    if (lane == 0) {
      const float g = gate_out[row], u = up_out[row];
      glu[row] = g / (1.0f + expf(-g)) * u;
    }
  } else {
    const int8_t* const bqs[1] = {bq};
    const float* const bds[1] = {bd};
    float g[1], u[1];
    quant_row_dot<kType, 1>(gate_w + offset, int(K / kQBlock), bqs, bds, g);
    quant_row_dot<kType, 1>(up_w + offset, int(K / kQBlock), bqs, bds, u);
    g[0] = warp_sum(g[0]);
    u[0] = warp_sum(u[0]);
    if (lane == 0) {
      gate_out[row] = g[0];
      up_out[row] = u[0];
      glu[row] = g[0] / (1.0f + expf(-g[0])) * u[0];
    }
  }
}

// The down ExpertMatMul of a MoE layer's decode and the MoeCombine of its output: one launch
// whose warps take row m of every chosen expert's matrix for one token t, write each choice's
// product (the ExpertMatMul's output) and their sum weighted by w (the combine's, in the same
// order as moe_combine_kernel). A choice the map skips is a product of zeros in both. kMapped as
// for expert_matvec_kernel.
template <DType kType, bool kMapped>
__global__ __launch_bounds__(kWarps * 32) void expert_down_combine_kernel(
    const uint8_t* a, int64_t row_stride, int64_t expert_stride, int64_t n_expert, int M, int64_t K,
    const int8_t* bq, const float* bd, int64_t b_cols, const int32_t* ids, ExpertMap map, int k,
    const float* w, float* experts_out, float* out, int32_t* error_flag) {
  grid_dependency_wait();
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;
  const int64_t t = blockIdx.y;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int64_t z = t * k + j, col = b_cols == 1 ? t : z;
    const int32_t expert = expert_of(ids[z], kMapped ? map : ExpertMap{}, n_expert);
    float* eo = experts_out + z * M;
    float v = 0.0f;
    if (expert < 0) {
      if (expert == kBadExpert && lane == 0) atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
    } else {
      const uint8_t* ar = a + expert * expert_stride + row * row_stride;
      const int8_t* bqc = bq + col * K;
      const float* bdc = bd + col * (K / kQBlock);
      if constexpr (kType == DType::Q4_K || kType == DType::Q5_K || kType == DType::Q6_K) {
        k_matvec_row<kType, 1>(ar, M, row, int(K / kSuperBlock), bqc, bdc, eo);
        __syncwarp();
        v = eo[row];  // lane 0 wrote it
      } else {
        const int8_t* const bqs[1] = {bqc};
        const float* const bds[1] = {bdc};
        float part[1];
        quant_row_dot<kType, 1>(ar, int(K / kQBlock), bqs, bds, part);
        v = warp_sum(part[0]);
      }
    }
    if (lane == 0) eo[row] = v;
    acc += w[z] * v;
  }
  if (lane == 0) out[t * M + row] = acc;
}

// ExpertMatMul over many tokens (prefill): the (token, choice) pairs grouped by expert on the
// device, then each expert's rows read once per tile of up to kExpertTile pairs instead of once
// per pair, and multiplied on the tensor cores. moe_group_kernel (one block) counts the pairs per
// expert, lays the groups out one after another (pairs[]), and lists the tiles (expert, first pair,
// pairs) for the product. The pairs that read no matrix (skipped by the map, or with an invalid
// id) come last, in no tile: expert_zero_kernel writes their zeros where the product has a map.
constexpr int kExpertTile = 32;
constexpr int kMaxGroupedExperts = 2048;  // counts, cursors and offsets in shared memory
struct ExpertGroups {
  int32_t* pairs;        // [pairs]: z = t * k + j, grouped by expert, then those that read none
  int32_t* tile_expert;  // [max_tiles]
  int32_t* tile_start;   // index into pairs
  int32_t* tile_count;
  int32_t* n_tiles;
  int32_t* unread;  // [2]: index into pairs and number of the pairs that read no matrix
};

__global__ void moe_group_kernel(const int32_t* ids, ExpertMap map, int64_t n_pairs, int n_expert,
                                 ExpertGroups g, int32_t* error_flag) {
  // Groups 0 .. n_expert - 1 are a's matrices, group n_expert the pairs that read none.
  __shared__ int32_t count[kMaxGroupedExperts + 1], offset[kMaxGroupedExperts + 1],
      cursor[kMaxGroupedExperts + 1];
  grid_dependency_wait();
  const int n_groups = n_expert + 1;
  auto group_of = [&](int32_t expert) { return expert < 0 ? n_expert : int(expert); };
  for (int e = threadIdx.x; e < n_groups; e += blockDim.x) count[e] = cursor[e] = 0;
  __syncthreads();
  for (int64_t z = threadIdx.x; z < n_pairs; z += blockDim.x) {
    const int32_t e = expert_of(ids[z], map, n_expert);
    if (e == kBadExpert) atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
    atomicAdd(&count[group_of(e)], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t at = 0, tiles = 0;
    for (int e = 0; e < n_expert; ++e) {
      offset[e] = at;
      for (int32_t s = 0; s < count[e]; s += kExpertTile, ++tiles) {
        g.tile_expert[tiles] = e;
        g.tile_start[tiles] = at + s;
        g.tile_count[tiles] = min(kExpertTile, count[e] - s);
      }
      at += count[e];
    }
    offset[n_expert] = at;
    *g.n_tiles = tiles;
    g.unread[0] = at;
    g.unread[1] = count[n_expert];
  }
  __syncthreads();
  for (int64_t z = threadIdx.x; z < n_pairs; z += blockDim.x) {
    const int group = group_of(expert_of(ids[z], map, n_expert));
    g.pairs[offset[group] + atomicAdd(&cursor[group], 1)] = int32_t(z);
  }
}

// Zeros in the output columns of the pairs that read no matrix: one thread per row, one block
// per kExpertTile of those pairs (the grid has room for every pair).
constexpr int kZeroThreads = 128;
__global__ __launch_bounds__(kZeroThreads) void expert_zero_kernel(int M, ExpertGroups g,
                                                                   float* out) {
  grid_dependency_wait();
  const int first = int(blockIdx.y) * kExpertTile, count = g.unread[1];
  const int row = int(blockIdx.x) * kZeroThreads + int(threadIdx.x);
  if (first >= count || row >= M) return;
  const int32_t* pairs = g.pairs + g.unread[0] + first;
  const int n = min(kExpertTile, count - first);
  for (int c = 0; c < n; ++c) out[int64_t(pairs[c]) * M + row] = 0.0f;
}

// D += A * B on the tensor cores, int8 in, int32 out: A 16 x 32 (row-major fragments a0..a3),
// B 32 x 8 (column-major b0, b1), D 16 x 8. Lane l holds, with g = l / 4 and t = l % 4: a0 / a1
// rows g / g + 8, elements 4t..4t+3; a2 / a3 the same rows, elements 16 + 4t..; b0 / b1 column g,
// elements 4t.. / 16 + 4t..; d0, d1 row g, columns 2t, 2t + 1; d2, d3 row g + 8.
__device__ __forceinline__ void mma_s8(int (&d)[4], const int (&a)[4], int b0, int b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A tile's pairs times kMmaWarps * kMmaWarpRows rows of its expert on the tensor cores: each
// warp 32 rows (two 16-row fragments) by the tile's 32 pairs (four 8-column fragments). Per
// 32-element block k of the row, one mma per fragment pair gives the int32 dot products of the
// weights' quants with b's int8 quants, scaled into the f32 sums by both blocks' scales (as
// ggml's q8_1 products: the scales change every 32 elements). A short tile repeats its first
// pair and does not write the copies; rows past M read row M - 1 and are not written. The
// pairs that read no matrix are not in the tiles (expert_zero_kernel writes their zeros).
constexpr int kMmaWarps = 4, kMmaWarpRows = 32, kMmaRows = kMmaWarps * kMmaWarpRows;
static_assert(kExpertTile == 32, "four 8-column fragments per warp");

// One 32-element block's products into this lane's sums: `arow[i][h]` is the weight block of
// the lane's row 16 i + 8 h + g (its 2-byte scale, then the quants: Q4_0's low nibbles are
// elements 0-15 and the high ones 16-31, so one 4-byte load gives a0 and a2), `bcol[j]` b's
// quants of column 8 j + g in this block, `db[j][e]` the block scales of columns 8 j + 2t + e.
template <DType kType>
__device__ __forceinline__ void mma_block(float (&acc)[2][4][4], const uint8_t* const (&arow)[2][2],
                                          const int8_t* const (&bcol)[4], const float (&db)[4][2],
                                          int tq) {
  int af[2][4];
  float da[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* bp = arow[i][h];
      da[i][h] = f16_bits_to_f32(*reinterpret_cast<const uint16_t*>(bp));
      if constexpr (kType == DType::Q4_0) {
        const int v = load_int_b2(bp + 2 + 4 * tq);
        af[i][h] = int(__vsub4(unsigned(v & 0x0F0F0F0F), 0x08080808u));
        af[i][2 + h] = int(__vsub4(unsigned((v >> 4) & 0x0F0F0F0F), 0x08080808u));
      } else {
        af[i][h] = load_int_b2(bp + 2 + 4 * tq);
        af[i][2 + h] = load_int_b2(bp + 18 + 4 * tq);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int b0 = *reinterpret_cast<const int*>(bcol[j] + 4 * tq);
    const int b1 = *reinterpret_cast<const int*>(bcol[j] + 16 + 4 * tq);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int d[4] = {0, 0, 0, 0};
      mma_s8(d, af[i], b0, b1);
      acc[i][j][0] += float(d[0]) * (da[i][0] * db[j][0]);
      acc[i][j][1] += float(d[1]) * (da[i][0] * db[j][1]);
      acc[i][j][2] += float(d[2]) * (da[i][1] * db[j][0]);
      acc[i][j][3] += float(d[3]) * (da[i][1] * db[j][1]);
    }
  }
}

// This lane's sums to out[pair * M + row] for the warp's rows from row0 and the tile's pairs.
__device__ __forceinline__ void mma_store(const float (&acc)[2][4][4], const int32_t* pairs,
                                          int count, int M, int row0, int gq, int tq, float* out) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 8 * j + 2 * tq + e;
      if (c >= count) continue;
      float* oc = out + int64_t(pairs[c]) * M;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = row0 + 16 * i + 8 * h + gq;
          if (r < M) oc[r] = acc[i][j][2 * h + e];
        }
      }
    }
  }
}

// Lanes read their fragments straight from the weight blocks and b's quantized columns in
// global memory (any K; the four warps share b through L1).
template <DType kType>
__global__ __launch_bounds__(kMmaWarps * 32) void expert_mma_kernel(
    const uint8_t* a, int64_t row_stride, int64_t expert_stride, int M, int64_t K, const int8_t* bq,
    const float* bd, int64_t b_cols, int k, ExpertGroups g, float* out) {
  constexpr int kBlockBytes = kType == DType::Q4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
  grid_dependency_wait();
  const int tile = blockIdx.y;
  if (tile >= *g.n_tiles) return;
  const int row0 = blockIdx.x * kMmaRows + (threadIdx.x / 32) * kMmaWarpRows;
  if (row0 >= M) return;
  const int lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
  const int expert = g.tile_expert[tile], start = g.tile_start[tile], count = g.tile_count[tile];
  const int n_blocks = int(K / kQBlock);
  auto column = [&](int c) {
    const int32_t z = g.pairs[start + (c < count ? c : 0)];
    return b_cols == 1 ? int64_t(z / k) : int64_t(z);
  };
  const uint8_t* arow[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = min(row0 + 16 * i + 8 * h + gq, M - 1);
      arow[i][h] = a + expert * expert_stride + int64_t(r) * row_stride;
    }
  }
  const int8_t* bcol[4];
  const float* dcol[4][2];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    bcol[j] = bq + column(8 * j + gq) * K;
    dcol[j][0] = bd + column(8 * j + 2 * tq) * n_blocks;
    dcol[j][1] = bd + column(8 * j + 2 * tq + 1) * n_blocks;
  }
  float acc[2][4][4] = {};
  for (int blk = 0; blk < n_blocks; ++blk) {
    const float db[4][2] = {{dcol[0][0][blk], dcol[0][1][blk]},
                            {dcol[1][0][blk], dcol[1][1][blk]},
                            {dcol[2][0][blk], dcol[2][1][blk]},
                            {dcol[3][0][blk], dcol[3][1][blk]}};
    mma_block<kType>(acc, arow, bcol, db, tq);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      arow[i][0] += kBlockBytes;
      arow[i][1] += kBlockBytes;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) bcol[j] += kQBlock;
  }
  mma_store(acc, g.pairs + start, count, M, row0, gq, tq, out);
}

// The same product with both operands staged in shared memory (the fragments read from global
// memory above touch eight rows or columns per load, and the L1 spent more time on those than
// the tensor cores on the products: Qwen3-30B-A3B-shaped pp512 32 ms in the expert products on
// an H100). Per chunk of kChunkBlocks 32-element blocks, the block copies its 128 weight rows
// and the tile's 32 quantized b columns with their scales by 16-byte cp.async, then each warp
// multiplies its 32 rows from there. Row strides of 144 (Q4_0) and 272 (Q8_0) bytes and b
// columns padded to 272 put a fragment load's 32 words in 32 distinct banks. Needs K a multiple
// of kChunkBlocks * 32 and 16-byte aligned rows (expert_mma_staged).
constexpr int kChunkBlocks = 8;
template <DType kType>
struct MmaStage {
  static constexpr int kBlockBytes = kType == DType::Q4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
  static constexpr int kRowBytes = kChunkBlocks * kBlockBytes;
  static constexpr int kColBytes = kChunkBlocks * kQBlock + 16;
  uint8_t a[kMmaRows][kRowBytes];
  int8_t b[kExpertTile][kColBytes];
  float bd[kExpertTile][kChunkBlocks];
  int64_t column[kExpertTile];
};

template <DType kType>
__global__ __launch_bounds__(kMmaWarps * 32) void expert_mma_staged_kernel(
    const uint8_t* a, int64_t row_stride, int64_t expert_stride, int M, int64_t K, const int8_t* bq,
    const float* bd, int64_t b_cols, int k, ExpertGroups g, float* out) {
  using Stage = MmaStage<kType>;
  __shared__ __align__(16) Stage sm;
  grid_dependency_wait();
  const int tile = blockIdx.y;
  if (tile >= *g.n_tiles) return;
  const int expert = g.tile_expert[tile], start = g.tile_start[tile], count = g.tile_count[tile];
  const int block_row0 = blockIdx.x * kMmaRows;
  const int warp_row0 = (threadIdx.x / 32) * kMmaWarpRows;
  const int lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
  const int n_blocks = int(K / kQBlock);
  if (threadIdx.x < kExpertTile) {
    const int32_t z = g.pairs[start + (int(threadIdx.x) < count ? threadIdx.x : 0)];
    sm.column[threadIdx.x] = b_cols == 1 ? z / k : z;
  }
  __syncthreads();
  const uint8_t* ae = a + expert * expert_stride;
  float acc[2][4][4] = {};
  for (int chunk = 0; chunk < n_blocks / kChunkBlocks; ++chunk) {
    constexpr int kRowCopies = Stage::kRowBytes / 16;
    for (int i = threadIdx.x; i < kMmaRows * kRowCopies; i += kMmaWarps * 32) {
      const int r = i / kRowCopies, c = i % kRowCopies;
      const int64_t row = min(block_row0 + r, M - 1);
      copy_async_16(uint32_t(__cvta_generic_to_shared(&sm.a[r][16 * c])),
                    ae + row * row_stride + int64_t(chunk) * Stage::kRowBytes + 16 * c);
    }
    constexpr int kColCopies = kChunkBlocks * kQBlock / 16;
    for (int i = threadIdx.x; i < kExpertTile * kColCopies; i += kMmaWarps * 32) {
      const int col = i / kColCopies, c = i % kColCopies;
      copy_async_16(uint32_t(__cvta_generic_to_shared(&sm.b[col][16 * c])),
                    bq + sm.column[col] * K + chunk * kChunkBlocks * kQBlock + 16 * c);
    }
    if (threadIdx.x < kExpertTile * kChunkBlocks / 4) {
      const int col = threadIdx.x / (kChunkBlocks / 4), c = threadIdx.x % (kChunkBlocks / 4);
      copy_async_16(uint32_t(__cvta_generic_to_shared(&sm.bd[col][4 * c])),
                    bd + sm.column[col] * n_blocks + chunk * kChunkBlocks + 4 * c);
    }
    copy_async_commit();
    copy_async_wait<0>();
    __syncthreads();
#pragma unroll 2
    for (int kb = 0; kb < kChunkBlocks; ++kb) {
      const uint8_t* arow[2][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          arow[i][h] = &sm.a[warp_row0 + 16 * i + 8 * h + gq][kb * Stage::kBlockBytes];
        }
      }
      const int8_t* bcol[4];
      float db[4][2];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        bcol[j] = &sm.b[8 * j + gq][kb * kQBlock];
        db[j][0] = sm.bd[8 * j + 2 * tq][kb];
        db[j][1] = sm.bd[8 * j + 2 * tq + 1][kb];
      }
      mma_block<kType>(acc, arow, bcol, db, tq);
    }
    __syncthreads();
  }
  mma_store(acc, g.pairs + start, count, M, block_row0 + warp_row0, gq, tq, out);
}

// The staged kernel's conditions: whole chunks, and 16-byte aligned weight rows and experts.
bool expert_mma_staged(const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  return a.ne[0] % (kChunkBlocks * kQBlock) == 0 && a.nb[1] % 16 == 0 && a.nb[2] % 16 == 0 &&
         reinterpret_cast<uintptr_t>(e.inputs[0].data) % 16 == 0;
}

// Tokens from which the grouped product reads fewer weight bytes than one product per pair.
constexpr int64_t kGroupedMinTokens = 8;
bool expert_grouped(const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &id = *e.inputs[2].desc;
  return (a.dtype == DType::Q4_0 || a.dtype == DType::Q8_0) && id.ne[1] >= kGroupedMinTokens &&
         a.ne[2] <= kMaxGroupedExperts;
}

// The grouped product's lists after b's quantization in the scratch: pairs, then the tiles.
int64_t expert_max_tiles(const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &id = *e.inputs[2].desc;
  return a.ne[2] + (id.ne[0] * id.ne[1] + kExpertTile - 1) / kExpertTile;
}

}  // namespace

size_t expert_matvec_scratch_bytes(const NodeExecution& e) {
  const TensorDesc& b = *e.inputs[1].desc;
  size_t bytes = align_up(size_t(b.elements()), kScratchAlignment) +
                 align_up(size_t(b.elements() / kQBlock) * 4, kScratchAlignment);
  if (expert_grouped(e)) {
    const TensorDesc& id = *e.inputs[2].desc;
    bytes += align_up(size_t(id.ne[0] * id.ne[1]) * 4, kScratchAlignment) +
             3 * align_up(size_t(expert_max_tiles(e)) * 4, kScratchAlignment) + kScratchAlignment;
  }
  return bytes;
}

namespace {

// ExpertMatMul nodes the matrix-vector kernels take: quantized weights with contiguous rows.
bool expert_matvec_fits(const NodeExecution& e) {
  if (e.node->op != OpKind::ExpertMatMul) return false;
  const TensorDesc &a = *e.inputs[0].desc, &b = *e.inputs[1].desc;
  const bool quantized = a.dtype == DType::Q4_0 || a.dtype == DType::Q8_0 || is_k_quant(a.dtype);
  return quantized && int8_activations(a.ne[1], 1) && b.is_contiguous() && a.ne[1] <= INT32_MAX &&
         a.nb[1] == int64_t(row_bytes(a.dtype, a.ne[0]));
}

}  // namespace

size_t run_fused_expert_gate_up(const OpContext& ctx, std::span<const NodeExecution> segment) {
  if (segment.size() < 3) return 0;
  const NodeExecution &gate = segment[0], &up = segment[1], &glu = segment[2];
  if (!expert_matvec_fits(gate) || !expert_matvec_fits(up) || expert_grouped(gate) ||
      glu.node->op != OpKind::SwiGlu) {
    return 0;
  }
  const TensorDesc &ga = *gate.inputs[0].desc, &ua = *up.inputs[0].desc;
  const TensorDesc& out = *gate.output.desc;
  const ExpertMap map = expert_map_of(gate), up_map = expert_map_of(up);
  if (ua.dtype != ga.dtype || ua.ne != ga.ne || ua.nb != ga.nb || up_map.map != map.map ||
      up_map.n_map != map.n_map || up.inputs[1].data != gate.inputs[1].data ||
      up.inputs[1].desc->ne != gate.inputs[1].desc->ne ||
      up.inputs[2].data != gate.inputs[2].data ||
      up.inputs[2].desc->ne != gate.inputs[2].desc->ne || glu.inputs[0].data != gate.output.data ||
      glu.inputs[1].data != up.output.data || glu.inputs[0].desc->ne != out.ne ||
      glu.inputs[1].desc->ne != out.ne || glu.output.desc->ne != out.ne ||
      glu.output.desc->dtype != DType::F32 || !glu.output.desc->is_contiguous()) {
    return 0;
  }
  const TensorDesc &b = *gate.inputs[1].desc, &id = *gate.inputs[2].desc;
  const QuantizedB qb = quantize_b(ctx, b, gate.inputs[1].data);
  const int M = int(ga.ne[1]);
  const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(id.ne[0] * id.ne[1]));
  auto go = [&](auto kernel) {
    ctx.check(launch_programmatic(
                  ctx.stream, grid, dim3(kWarps * 32), 0, kernel,
                  static_cast<const uint8_t*>(gate.inputs[0].data),
                  static_cast<const uint8_t*>(up.inputs[0].data), int64_t(ga.nb[1]),
                  int64_t(ga.nb[2]), ga.ne[2], M, ga.ne[0], static_cast<const int8_t*>(qb.bq),
                  static_cast<const float*>(qb.bd), b.ne[1],
                  static_cast<const int32_t*>(gate.inputs[2].data), map, int(id.ne[0]),
                  static_cast<float*>(gate.output.data), static_cast<float*>(up.output.data),
                  static_cast<float*>(glu.output.data), ctx.error_flag),
              "expert_matmul + swiglu", "kernel launch");
  };
  with_quantized_dtype(ga.dtype, [&](auto d) {
    go(map.map ? expert_gate_up_kernel<d(), true> : expert_gate_up_kernel<d(), false>);
  });
  return 3;
}

size_t run_fused_expert_down_combine(const OpContext& ctx, std::span<const NodeExecution> segment) {
  if (segment.size() < 2) return 0;
  const NodeExecution &down = segment[0], &combine = segment[1];
  if (!expert_matvec_fits(down) || expert_grouped(down) || combine.node->op != OpKind::MoeCombine) {
    return 0;
  }
  const TensorDesc &a = *down.inputs[0].desc, &b = *down.inputs[1].desc, &id = *down.inputs[2].desc;
  const TensorDesc &x = *down.output.desc, &w = *combine.inputs[1].desc,
                   &out = *combine.output.desc;
  if (combine.inputs[0].data != down.output.data || combine.inputs[0].desc->ne != x.ne ||
      !x.is_contiguous() || w.dtype != DType::F32 || !w.is_contiguous() || w.ne[0] != id.ne[0] ||
      w.ne[1] != id.ne[1] || out.dtype != DType::F32 || !out.is_contiguous() ||
      (b.ne[1] != 1 && b.ne[1] != id.ne[0])) {
    return 0;
  }
  const ExpertMap map = expert_map_of(down);
  const QuantizedB qb = quantize_b(ctx, b, down.inputs[1].data);
  const int M = int(a.ne[1]);
  const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(id.ne[1]));
  auto go = [&](auto kernel) {
    ctx.check(
        launch_programmatic(ctx.stream, grid, dim3(kWarps * 32), 0, kernel,
                            static_cast<const uint8_t*>(down.inputs[0].data), int64_t(a.nb[1]),
                            int64_t(a.nb[2]), a.ne[2], M, a.ne[0],
                            static_cast<const int8_t*>(qb.bq), static_cast<const float*>(qb.bd),
                            b.ne[1], static_cast<const int32_t*>(down.inputs[2].data), map,
                            int(id.ne[0]), static_cast<const float*>(combine.inputs[1].data),
                            static_cast<float*>(down.output.data),
                            static_cast<float*>(combine.output.data), ctx.error_flag),
        "expert_matmul + moe_combine", "kernel launch");
  };
  with_quantized_dtype(a.dtype, [&](auto d) {
    go(map.map ? expert_down_combine_kernel<d(), true> : expert_down_combine_kernel<d(), false>);
  });
  return 2;
}

bool launch_expert_matvec(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &b = *e.inputs[1].desc, &id = *e.inputs[2].desc;
  if (!expert_matvec_fits(e)) return false;
  const ExpertMap map = expert_map_of(e);
  const QuantizedB qb = quantize_b(ctx, b, e.inputs[1].data);
  const int M = int(a.ne[1]);
  if (expert_grouped(e)) {
    // The lists follow b's scales in the scratch.
    auto* at = reinterpret_cast<uint8_t*>(qb.bd) +
               align_up(size_t(b.elements() / kQBlock) * 4, kScratchAlignment);
    auto take = [&](size_t n) {
      auto* p = reinterpret_cast<int32_t*>(at);
      at += align_up(n * 4, kScratchAlignment);
      return p;
    };
    const int64_t n_pairs = id.ne[0] * id.ne[1], max_tiles = expert_max_tiles(e);
    ExpertGroups g{};
    g.pairs = take(size_t(n_pairs));
    g.tile_expert = take(size_t(max_tiles));
    g.tile_start = take(size_t(max_tiles));
    g.tile_count = take(size_t(max_tiles));
    g.n_tiles = take(3);  // and unread[2]
    g.unread = g.n_tiles + 1;
    ctx.check(launch_programmatic(ctx.stream, dim3(1), dim3(1024), 0, moe_group_kernel,
                                  static_cast<const int32_t*>(e.inputs[2].data), map, n_pairs,
                                  int(a.ne[2]), g, ctx.error_flag),
              "expert_matmul", "kernel launch");
    const dim3 grid(unsigned((M + kMmaRows - 1) / kMmaRows), unsigned(max_tiles));
    const bool q4 = a.dtype == DType::Q4_0;
    auto kernel =
        expert_mma_staged(e)
            ? (q4 ? expert_mma_staged_kernel<DType::Q4_0> : expert_mma_staged_kernel<DType::Q8_0>)
            : (q4 ? expert_mma_kernel<DType::Q4_0> : expert_mma_kernel<DType::Q8_0>);
    ctx.check(launch_programmatic(ctx.stream, grid, dim3(kMmaWarps * 32), 0, kernel,
                                  static_cast<const uint8_t*>(e.inputs[0].data), int64_t(a.nb[1]),
                                  int64_t(a.nb[2]), M, a.ne[0], static_cast<const int8_t*>(qb.bq),
                                  static_cast<const float*>(qb.bd), b.ne[1], int(id.ne[0]), g,
                                  static_cast<float*>(e.output.data)),
              "expert_matmul", "kernel launch");
    if (map.map) {
      // Without a map no choice is skipped (an invalid id's column is left as it is: the op
      // fails at synchronize).
      const dim3 zero_grid(unsigned((M + kZeroThreads - 1) / kZeroThreads),
                           unsigned((n_pairs + kExpertTile - 1) / kExpertTile));
      ctx.check(launch_programmatic(ctx.stream, zero_grid, dim3(kZeroThreads), 0,
                                    expert_zero_kernel, M, g, static_cast<float*>(e.output.data)),
                "expert_matmul", "kernel launch");
    }
    return true;
  }
  const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(id.ne[0] * id.ne[1]));
  auto go = [&](auto kernel) {
    ctx.check(
        launch_programmatic(ctx.stream, grid, dim3(kWarps * 32), 0, kernel,
                            static_cast<const uint8_t*>(e.inputs[0].data), int64_t(a.nb[1]),
                            int64_t(a.nb[2]), a.ne[2], M, a.ne[0],
                            static_cast<const int8_t*>(qb.bq), static_cast<const float*>(qb.bd),
                            b.ne[1], static_cast<const int32_t*>(e.inputs[2].data), map,
                            int(id.ne[0]), static_cast<float*>(e.output.data), ctx.error_flag),
        "expert_matmul", "kernel launch");
  };
  with_quantized_dtype(a.dtype, [&](auto d) {
    go(map.map ? expert_matvec_kernel<d(), true> : expert_matvec_kernel<d(), false>);
  });
  return true;
}

}  // namespace tandem::cuda
