// The staged matrix-vector kernel of QuantizedMatMul (contiguous Q4_0, Q8_0 or K-quant weight
// rows, K a multiple of 256, up to kMatvecMaxColumns columns of b).
//
// One persistent CTA per SM streams its share of the weight rows through a ring of shared-memory
// tiles with 16-byte cp.async copies (or, kBulkTiles, one bulk copy per warp and tile) and
// quantizes b into shared memory itself. A tile is cut
// into groups of 8 blocks (256 elements: 144 or 272 bytes); each thread takes half a group (4
// blocks, read with 8-byte shared loads) and lanes 2i and 2i + 1 share one. A tile holds as many
// rows as give each thread of the CTA one half group, so a thread meets the same part of b in
// every tile: with one column (decode) it reads that part (4 blocks: 128 quants and 4 scale
// pairs, 40 registers) from shared memory once, not per tile (kRegB), which halves the shared
// memory traffic of Q4_0's loop (its b bytes outnumber its weight bytes two to one).
//
// No barrier per tile: each warp copies the part of every tile its own lanes multiply (16 groups
// from warp * 16 on) and waits for its own copies (cp.async.wait_group or its mbarrier, then a
// warp barrier), so the warps drift apart and one's shared loads, dp4a and shuffles overlap
// another's instead of all taking turns at each step (Q4_0 14336x4096: 15.4 -> 14.3 us, H100).
// A warp sums its lanes row by row with shuffles into a tile's partial buffer; the CTA meets
// only when the partial buffers of up to kMaxRedTiles tiles (as many as shared memory holds) are
// full, and then adds them into row sums: for 14336x4096 once, at the end; with 8 columns every
// tile.
//
// The kernel is launched as a programmatic dependent of the previous kernel: it fetches weights
// (which no kernel writes) and pulls b's lines into the L2 (fetching is not reading: the L2 is
// where every write lands) before it waits for that kernel (griddepcontrol.wait) and reads b.
// With two columns its registers, and for most shapes its shared memory, fit two CTAs on an SM:
// the next matrix-vector kernel's CTA becomes resident and starts its fetches while this one
// drains (kPairStages). Otherwise one CTA per SM runs a deeper ring: with one column (decode) of
// up to four tiles as large as shared memory holds (kWideStages), for Q4_K and more columns of
// five up to 32 KB (kSoloStages).
//
// With kNorm (one column) b is not read but made: every CTA loads the residual Add's two inputs,
// sums them, reduces their squares over the CTA and scales them by the RmsNorm's factor and
// weight before quantizing, and CTA 0 writes the sum and the normed vector (the two nodes'
// outputs). That takes the Add and norm kernel off the path between two products (1B Q4_0 tg128
// 1,154-1,195 -> 1,233-1,270 t/s, 8B unchanged; H100, bench/NOTES.md).
//
// The kernel and its launch are templates here; staged_matvec.cu instantiates them for Q4_0 and
// Q8_0, staged_matvec_k.cu for the K-quants (two units that compile side by side).
#pragma once

#include <algorithm>
#include <span>

#include "common.cuh"
#include "matvec.cuh"
#include "staged_kquant.cuh"

namespace tandem::cuda::staged {

constexpr int kStagedThreads = 512;  // most threads of a CTA
constexpr int kPairStages = 3;       // tiles in the ring of a CTA that shares its SM: two in flight
constexpr int kSoloStages = 5;       // ... of a CTA alone on its SM: four in flight
constexpr int kWideStages = 4;       // ... alone on its SM with the largest tiles (kWideTiles)
constexpr int kGroupBlocks = 8;
constexpr int kHalfBlocks = kGroupBlocks / 2;
constexpr int kGroupElems = kGroupBlocks * kQBlock;  // 256
constexpr int kMaxTileGroups = kStagedThreads / 2;   // most groups in a tile of several rows
constexpr int kStageTargetBytes = 32 * 1024;         // largest tile
constexpr int kWideTargetBytes = 64 * 1024;          // ... of a ring of kWideStages
// b in shared memory, per group of 256: the int8 quants of each half at kBHalfBytes * h and
// {d, 8 d sum(q)} per block of each half at kBScaleHalf * h. The pads put the two halves that
// neighbouring lanes read in different banks.
constexpr int kBHalfBytes = kGroupElems / 2 + 16;
constexpr int kBGroupBytes = 2 * kBHalfBytes;
constexpr int kBScaleHalf = kHalfBlocks * 8 + 8;  // bytes
constexpr int kBScaleBytes = 2 * kBScaleHalf;
// CTAs per SM the registers allow: the two-column kernels fit two in 64 registers a thread,
// except the K-quants' (Q4_K's spilled 16 bytes, Q5_K's 120, Q6_K's 192; Q4_K two to an SM, with
// or without b in registers, measured no faster than one: bench/NOTES.md). The one-column kernels
// run alone: Q4_0's two to an SM cost the 8B's decode 15% (tg128 384 against 447-455 t/s alone;
// 4096x14336 14.5 us against 12.8 alone; H100, bench/NOTES.md).
template <DType kType, int kCols>
constexpr int kStagedMinBlocks = kCols == 2 && !is_k_quant(kType) ? 2 : 1;
// A CTA alone on its SM (the deeper ring) may use all of the SM's registers: at 64 the one-column
// Q4_0 kernel spilled once its prologue grew; with them the one-column Q4_0 and Q8_0 kernels alone
// on their SM ran 0.2-0.8 us faster (aaa9c84, H100, 2026-11-21; bench/NOTES.md).
template <DType kType, int kCols, int kStages>
constexpr int kStagedLaunchBlocks = kStages != kPairStages ? 1 : kStagedMinBlocks<kType, kCols>;
// The one-column kernels run a ring of four tiles as large as shared memory holds (up to 16 rows
// of 4096 or 4 of 14336: 448-512 threads) instead of five of up to 32 KB (as few as 224 threads):
// more threads share the decoding and each pays the per-tile work for more bytes. % of copy,
// 4096x14336 / 14336x4096 (H100, bench/NOTES.md): Q6_K 79.3 / 68.8 -> 88.2 / 73.0, Q5_K 86.8 /
// 77.2 -> 89.1 / 82.0, Q4_0 79.8 / 76.5 -> 86.6 / 74.3, Q8_0 92.0 / 84.6 -> 94.3 / 85.6; end to
// end, tg128 1B Q4_0 +3%, 8B Q8_0 +1.5%. Q4_K 78.5 / 76.6 -> 85.9 / 74.5 keeps the five.
template <DType kType, int kCols>
constexpr bool kWideTiles = kCols == 1 && kType != DType::Q4_K;
// The ring of a CTA alone on its SM, and its largest tile.
template <DType kType, int kCols>
constexpr int kAloneStages = kWideTiles<kType, kCols> ? kWideStages : kSoloStages;
template <DType kType, int kCols>
constexpr int kAloneTargetBytes = kWideTiles<kType, kCols> ? kWideTargetBytes : kStageTargetBytes;
// Tiles copied by the bulk copy engine (kBulk; cp.async otherwise): each warp's share of a tile is
// one copy that completes on an mbarrier, and b's loads, which queue behind cp.async copies in
// flight, do not wait behind them. Where it paid, on an H200 (bench/NOTES.md, 2026-11-28): the
// one-column Q8_0 products, and the one-column Q5_K and Q6_K products whose b is long (rows of at
// least kBulkMinK: every CTA quantizes all of b before its first tile); % of copy, 4096x14336 /
// 14336x4096: Q8_0 84.4-84.9 / 76.1-76.6 -> 87.7-87.8 / 77.4-77.5, Q6_K (wide rows) 58.8-59.0 ->
// 60.6, Q5_K 61.6-61.9 -> 63.6. Q6_K and Q5_K with rows of 4,096 read 0.5-4.5% slower with them,
// Q4_K 2% slower, Q4_0 no faster (and the 1B Q4_0's decode 1% slower).
template <DType kType, int kCols>
constexpr bool kBulkTiles = kCols == 1 &&
                            (kType == DType::Q8_0 || kType == DType::Q5_K || kType == DType::Q6_K);
constexpr int64_t kBulkMinK = 8192;
// Tiles fetched before the wait for the preceding kernel (kEarly); the rest follow b's first
// loads. b's loads queue behind the copies in flight: the one-column Q4_0 kernel (rows of 14336)
// measured fastest sending two first (1, 3 or all four, or a sixth stage, were slower); Q8_0
// measured fastest with all but one; the one-column K-quant kernels fastest with two (Q4_K
// 14336x4096: 69.5% of copy with four, 76.9% with two, 69.6% with one; H100). With bulk copies
// one first measured fastest (Q8_0 4096x14336 17.4 us with two or three, 16.9 with one; H200).
template <DType kType, int kCols, int kStages, bool kBulk = false>
constexpr int kPreIssue = kBulk                                ? 1
                          : kType == DType::Q8_0 || kCols != 1 ? kStages - 1
                                                               : 2;
// Tiles of each part a CTA streams up to which gate and up write their GLU (launch_staged).
constexpr int kLongTiles = 4;

// A group of 256 elements: 8 blocks of Q4_0 / Q8_0 (a thread reads its half as 8-byte words), or
// one K-quant super-block (read by k_half below).
template <DType kType>
struct GroupFormat {
  static constexpr bool kSuper = is_k_quant(kType);
  static constexpr int kBlockBytes = kType == DType::Q4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
  static constexpr int kBytes = kType == DType::Q4_K   ? sizeof(BlockQ4_K)
                                : kType == DType::Q5_K ? sizeof(BlockQ5_K)
                                : kType == DType::Q6_K ? sizeof(BlockQ6_K)
                                                       : kGroupBlocks * kBlockBytes;  // 144 or 272
  static constexpr int kHalfBytes = kHalfBlocks * kBlockBytes;  // 72 or 136: 8-byte words
  static constexpr int kHalfWords = kHalfBytes / 4;
  static_assert(kHalfWords * 4 == kHalfBytes, "a half group is whole words");
  // b's scale pairs carry d * sum(q) for the weights' offsets: Q4_0's -8, the K-quant mins;
  // Q6_K's carry the integer sums of each 16-element half instead (its -32 offset, under two
  // scales), packed into the bits of the second float (k_block_accumulate).
  static constexpr bool kSumB =
      kType == DType::Q4_0 || kType == DType::Q4_K || kType == DType::Q5_K;
};

struct StagedLayout {
  int gpr;                                      // groups per row (K / 256)
  int rows;                                     // rows per tile
  int threads;                                  // threads per CTA: two per group of a full tile
  int stage_bytes;                              // rows * row bytes
  int red_tiles;                                // tiles whose row partials one set of buffers holds
  size_t b_scale, stages, reduce, bars, total;  // shared-memory offsets (b quants at 0), size
};

// Where a tile's row sums go, left by thread 0 for the flush that writes them.
struct TileOut {
  float* out;
  int part_rows, rows;
};
constexpr int kMaxRedTiles = 16;

// The tiles as large as `budget` bytes of shared memory allow (at most kStageTargetBytes), then
// partial buffers for as many tiles as the rest holds (at least one; at most kMaxRedTiles or the
// tiles of a CTA of cta_rows rows in `parts` matrices); total > budget when not even one row per
// tile fits.
template <DType kType>
StagedLayout staged_layout(int64_t K, int cols, size_t budget, int ring, int64_t cta_rows,
                           int parts, int target = kStageTargetBytes, bool bulk = false) {
  StagedLayout l{};
  // With bulk copies, an mbarrier per warp and slot of the ring at the end.
  const size_t bar_bytes = bulk ? size_t(ring) * (kStagedThreads / 32) * 8 : 0;
  budget = budget > bar_bytes ? budget - bar_bytes : 0;
  l.gpr = int(K / kGroupElems);
  const int row_bytes = l.gpr * GroupFormat<kType>::kBytes;
  l.b_scale = size_t(cols) * size_t(l.gpr) * kBGroupBytes;
  l.stages = l.b_scale + size_t(cols) * size_t(l.gpr) * kBScaleBytes;
  // Two sets of one tile's partials (one float per column and group slot) and their TileOuts.
  const size_t red_min = 2 * (size_t(cols) * kMaxTileGroups * sizeof(float) + sizeof(TileOut));
  const size_t room = budget > l.stages + red_min ? (budget - l.stages - red_min) / ring : 0;
  const int stage_cap = int(std::min<size_t>(target, room));
  l.rows = std::max(1, std::min(kMaxTileGroups / l.gpr, stage_cap / row_bytes));
  l.threads = std::min(kStagedThreads, (2 * l.rows * l.gpr + 31) / 32 * 32);
  l.stage_bytes = l.rows * row_bytes;
  l.reduce = l.stages + size_t(ring) * size_t(l.stage_bytes);
  // Shared memory per tile of partials: its slot in both sets.
  const size_t per_tile = 2 * (size_t(cols) * (l.threads / 2) * sizeof(float) + sizeof(TileOut));
  const int64_t cta_tiles = (cta_rows + l.rows - 1) / l.rows + parts - 1;  // parts split tiles
  l.red_tiles = int(std::clamp<size_t>(budget > l.reduce ? (budget - l.reduce) / per_tile : 0, 1,
                                       size_t(std::min<int64_t>(kMaxRedTiles, cta_tiles))));
  l.bars = (l.reduce + size_t(l.red_tiles) * per_tile + 7) / 8 * 8;
  l.total = l.bars + bar_bytes;
  return l;
}

// Block kBlk of a half group held in registers as 32-bit words: its f16 scale and its quant
// words (4 for Q4_0, 8 for Q8_0). Blocks alternate between word-aligned and half-word offsets
// (18 and 34 bytes are 2 mod 4); the shift is resolved at compile time.
template <DType kType, int kBlk>
__device__ __forceinline__ float block_words(const uint32_t (&w)[GroupFormat<kType>::kHalfWords],
                                             uint32_t (&q)[kType == DType::Q4_0 ? 4 : 8]) {
  constexpr int kOff = kBlk * GroupFormat<kType>::kBlockBytes;
  constexpr int kN = kType == DType::Q4_0 ? 4 : 8;
  static_assert(kOff / 4 + kN < GroupFormat<kType>::kHalfWords, "block runs past the half group");
  uint16_t d;
  if constexpr (kOff % 4 == 0) {
    d = uint16_t(w[kOff / 4] & 0xFFFFu);
#pragma unroll
    for (int i = 0; i < kN; ++i) q[i] = __funnelshift_r(w[kOff / 4 + i], w[kOff / 4 + i + 1], 16);
  } else {
    d = uint16_t(w[kOff / 4] >> 16);
#pragma unroll
    for (int i = 0; i < kN; ++i) q[i] = w[kOff / 4 + 1 + i];
  }
  return f16_bits_to_f32(d);
}

// The integer dot product of a weight block's quants q with b's quants of that block: lo holds
// b's elements 0-15, hi 16-31. Q4_0's -8 offset is left to the caller (s.y below).
template <DType kType>
__device__ __forceinline__ int block_dot(const uint32_t (&q)[kType == DType::Q4_0 ? 4 : 8],
                                         const int4& lo, const int4& hi) {
  int dot;
  if constexpr (kType == DType::Q4_0) {
    // Byte i holds element i (low nibble) and i + 16 (high nibble).
    dot = __dp4a(int(q[0] & 0x0F0F0F0Fu), lo.x, 0);
    dot = __dp4a(int(q[1] & 0x0F0F0F0Fu), lo.y, dot);
    dot = __dp4a(int(q[2] & 0x0F0F0F0Fu), lo.z, dot);
    dot = __dp4a(int(q[3] & 0x0F0F0F0Fu), lo.w, dot);
    dot = __dp4a(int((q[0] >> 4) & 0x0F0F0F0Fu), hi.x, dot);
    dot = __dp4a(int((q[1] >> 4) & 0x0F0F0F0Fu), hi.y, dot);
    dot = __dp4a(int((q[2] >> 4) & 0x0F0F0F0Fu), hi.z, dot);
    dot = __dp4a(int((q[3] >> 4) & 0x0F0F0F0Fu), hi.w, dot);
  } else {
    dot = dot_words(q + 4, hi, dot_words(q, lo, 0));
  }
  return dot;
}

// acc += a weight block (scale dw, quants q) times b's block: quants lo/hi, scales s = {d,
// 8 d sum(q)} (the second term is Q4_0's -8 offset).
template <DType kType>
__device__ __forceinline__ void block_accumulate(float dw,
                                                 const uint32_t (&q)[kType == DType::Q4_0 ? 4 : 8],
                                                 const int4& lo, const int4& hi, float2 s,
                                                 float& acc) {
  const int dot = block_dot<kType>(q, lo, hi);
  if constexpr (kType == DType::Q4_0) {
    acc += dw * (s.x * float(dot) - s.y);
  } else {
    acc += dw * s.x * float(dot);
  }
}

// Adds block kBlk of a half group times the quantized b, for every column. bq and bs point at
// the half group's first block of b (column 0).
template <DType kType, int kBlk, int kCols>
__device__ __forceinline__ void half_group_block(
    const uint32_t (&w)[GroupFormat<kType>::kHalfWords], const int8_t* bq, const float2* bs,
    int col_quant_bytes, int col_scales, float (&acc)[kCols]) {
  uint32_t q[kType == DType::Q4_0 ? 4 : 8];
  const float dw = block_words<kType, kBlk>(w, q);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int4 lo = *reinterpret_cast<const int4*>(bq + c * col_quant_bytes + kBlk * kQBlock);
    const int4 hi = *reinterpret_cast<const int4*>(bq + c * col_quant_bytes + kBlk * kQBlock + 16);
    block_accumulate<kType>(dw, q, lo, hi, bs[c * col_scales + kBlk], acc[c]);
  }
}

// The same for one column whose half group of b is held in registers.
template <DType kType, int kBlk>
__device__ __forceinline__ void half_group_block_held(
    const uint32_t (&w)[GroupFormat<kType>::kHalfWords], const int4 (&lo)[kHalfBlocks],
    const int4 (&hi)[kHalfBlocks], const float2 (&s)[kHalfBlocks], float& acc) {
  uint32_t q[kType == DType::Q4_0 ? 4 : 8];
  const float dw = block_words<kType, kBlk>(w, q);
  block_accumulate<kType>(dw, q, lo[kBlk], hi[kBlk], s[kBlk], acc);
}

// Up to kMaxParts weight matrices multiplying the same b in one launch: rows [row_start[p],
// row_start[p + 1]) of all rows are matrix p's.
struct MatvecParts {
  const uint8_t* a[kMaxParts];
  float* out[kMaxParts];
  int row_start[kMaxParts + 1];
  int count;
};

// v[i] with constant indices only (a run-time index would copy the kernel parameter to local
// memory).
template <typename T, int kN>
__device__ __forceinline__ T pick(const T (&v)[kN], int i) {
  T r = v[0];
#pragma unroll
  for (int k = 1; k < kN; ++k) r = i == k ? v[k] : r;
  return r;
}

// The part (matrix) that row r of all parts' rows belongs to.
__device__ __forceinline__ int part_of(const MatvecParts& parts, int r) {
  int p = 0;
#pragma unroll
  for (int k = 1; k < kMaxParts; ++k) p += k < parts.count && r >= parts.row_start[k];
  return p;
}

// Row split: CTA c of G takes rows_q + (c < rows_r) rows (rows_q = M / G, rows_r = M % G; with
// kRope the same in row pairs). kNorm (one column): b is the RmsNorm of the residual stream, made
// here from the Add's inputs (NormedB) instead of read from the norm's output. kGlu (one column):
// gate and up, and their GLU into glu. kRope (one column): Q, K and V, then RoPE and the cache
// writes of the CTA's rows (RopeTail). Template parameters: as a run-time argument the GLU's
// tests and tail were in every kernel, which then used more registers (Q4_K 112 -> 117, Q6_K 115
// -> 123) and read slower (Q4_K 14336x4096 76.7-77.6 -> 72.9-73.3% of copy: the commit of the
// GLU, bisected on an H100).
template <DType kType, int kCols, int kStages, bool kRegB, int kEarly, bool kNorm = false,
          bool kGlu = false, bool kRope = false, bool kBulk = false>
__global__ __launch_bounds__(
    kStagedThreads,
    kStagedLaunchBlocks<kType, kCols, kStages>) void staged_matvec_kernel(MatvecParts parts,
                                                                          int64_t a_stride2,
                                                                          int64_t a_stride3,
                                                                          int a_div2, int a_div3,
                                                                          int b_ne2, int rows_q,
                                                                          int rows_r, int gpr,
                                                                          int tile_rows,
                                                                          int stage_bytes,
                                                                          int red_tiles,
                                                                          uint32_t off_scale,
                                                                          uint32_t off_stages,
                                                                          uint32_t off_reduce,
                                                                          uint32_t off_bars,
                                                                          const float* b,
                                                                          NormedB norm, float* glu,
                                                                          RopeTail rope) {
  using F = GroupFormat<kType>;
  constexpr bool kQ4 = kType == DType::Q4_0;
  extern __shared__ __align__(16) uint8_t smem[];
  int8_t* s_bq = reinterpret_cast<int8_t*>(smem);
  float2* s_bs = reinterpret_cast<float2*>(smem + off_scale);
  // Two sets of red_tiles tiles' row partials, each with its tiles' TileOuts.
  TileOut* s_out = reinterpret_cast<TileOut*>(smem + off_reduce);
  float* s_red = reinterpret_cast<float*>(s_out + 2 * red_tiles);
  const uint32_t s_stage = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + off_stages;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // kBulk: each warp's share of a tile is one bulk copy (lane 0's) that completes on the warp's
  // mbarrier for that slot of the ring.
  constexpr bool kUseBulk = kBulk && kHasBulkCopy;
  const uint32_t s_bars =
      static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + off_bars + warp * kStages * 8;
  if constexpr (kUseBulk) {
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) mbarrier_init(s_bars + 8 * s, 1);
    }
    __syncwarp();
  }
  const int threads = blockDim.x, warps = threads / 32, tile_groups = threads / 2;
  const int z = int(blockIdx.y), i2 = z % b_ne2, i3 = z / b_ne2;
  const int64_t K = int64_t(gpr) * kGroupElems;
  const int row_bytes = gpr * F::kBytes;
  const int64_t a_batch = (i2 / a_div2) * a_stride2 + (i3 / a_div3) * a_stride3;
  b += z * kCols * K;

  // Pull b (or what it is made of) into the L2 before the weight copies queue up; each CTA
  // takes a share of its lines.
  {
    auto pull = [&](const float* v) {
      const auto* bl = reinterpret_cast<const uint8_t*>(v);
      const int lines = int((kCols * K * int64_t(sizeof(float)) + 127) / 128);
      for (int i = int(blockIdx.x) * threads + tid; i < lines; i += int(gridDim.x) * threads) {
        prefetch_l2(bl + int64_t(i) * 128);
      }
    };
    if constexpr (kNorm) {
      pull(norm.a);
      if (norm.r) pull(norm.r);
      if (norm.w) pull(norm.w);
    } else {
      pull(b);
    }
  }

  // This CTA's rows, in tiles of up to tile_rows that never straddle two parts. With glu (gate
  // and up, M rows each) the split is of M: the CTA takes rows [row_begin, row_end) of gate,
  // then the same rows of up, and ends with their GLU.
  // kRope: the split is of row pairs (a rotated pair is one CTA's).
  constexpr int kUnit = kRope ? 2 : 1;
  const int cta = int(blockIdx.x);
  const int row_begin = kUnit * (cta * rows_q + min(cta, rows_r));
  const int row_end = row_begin + kUnit * (rows_q + (cta < rows_r));
  const int half_rows = kGlu ? parts.row_start[1] : 0;  // gate's M
  // Where the tiles of a part stand: the next tile's first row, the end of the rows of this
  // part that are this CTA's, the part's first row, and the end of the CTA's current range.
  struct Cursor {
    int row, seg_end, part, part_begin, end;
  };
  auto next_rows = [&](Cursor& c) {  // rows of the tile at c, entering the next part if due
    if (kGlu && c.row == c.end && c.end == row_end) {  // gate's rows done: up's same rows
      c.row = c.seg_end = half_rows + row_begin;
      c.end = half_rows + row_end;
    }
    if (c.row == c.seg_end && c.row < c.end) {
      c.part = part_of(parts, c.row);
      c.part_begin = pick(parts.row_start, c.part);
      c.seg_end = min(c.end, pick(parts.row_start, c.part + 1));
    }
    return min(tile_rows, c.seg_end - c.row);
  };

  Cursor fetch{row_begin, row_begin, 0, 0, row_end};
  const uint8_t* fetch_src = nullptr;
  uint32_t fetch_dst = s_stage;
  int fetch_slot = 0;  // the ring slot fetch_dst is
  auto issue = [&] {   // the next tile, into the next slot of the ring
    const bool entered = fetch.row == fetch.seg_end;
    const int nr = next_rows(fetch);
    if (nr > 0) {
      if (entered) {
        fetch_src =
            pick(parts.a, fetch.part) + a_batch + int64_t(fetch.row - fetch.part_begin) * row_bytes;
      }
      // This warp's share: the groups its lanes multiply (16 from warp * 16 on, every
      // tile_groups), so no other warp reads what it copies and a warp barrier suffices. Every
      // range is whole 16-byte pieces: 16 groups are, and a short range ends the tile.
      const int groups = nr * gpr;
      if constexpr (kUseBulk) {
        if (lane == 0) {
          uint32_t total = 0;
          for (int g0 = warp * 16; g0 < groups; g0 += tile_groups) {
            total += uint32_t(min(16, groups - g0) * F::kBytes);
          }
          mbarrier_arrive_expect(s_bars + 8 * fetch_slot, total);
          for (int g0 = warp * 16; g0 < groups; g0 += tile_groups) {
            const int bytes = min(16, groups - g0) * F::kBytes, base = g0 * F::kBytes;
            bulk_copy(fetch_dst + base, fetch_src + base, uint32_t(bytes), s_bars + 8 * fetch_slot);
          }
        }
      } else {
        for (int g0 = warp * 16; g0 < groups; g0 += tile_groups) {
          const int bytes = min(16, groups - g0) * F::kBytes, base = g0 * F::kBytes;
#pragma unroll 4
          for (int off = base + lane * 16; off < base + bytes; off += 32 * 16) {
            copy_async_16(fetch_dst + off, fetch_src + off);
          }
        }
      }
      fetch_src += nr * row_bytes;
      fetch.row += nr;
    } else if constexpr (kUseBulk) {
      if (lane == 0) mbarrier_arrive_expect(s_bars + 8 * fetch_slot, 0);  // an empty phase
    }
    fetch_dst =
        fetch_dst == s_stage + (kStages - 1) * stage_bytes ? s_stage : fetch_dst + stage_bytes;
    fetch_slot = fetch_slot == kStages - 1 ? 0 : fetch_slot + 1;
    if constexpr (!kUseBulk) copy_async_commit();  // possibly empty: keeps the group count uniform
  };
#pragma unroll
  for (int s = 0; s < kEarly; ++s) issue();
  grid_launch_dependents();
  grid_dependency_wait();  // b is written by the preceding kernel

  // Quantize b while the first tiles arrive: a block of 32 per pair of lanes, 16 values each.
  // Two items' loads go out before either is used (one L2 round trip for b up to 2 * threads
  // blocks: K = 14336 with 448 threads). It is not all hidden: b's loads queue behind the early
  // tiles' cp.async copies, and on an H200 this prologue cost 2.5-3.1 us of a product with rows
  // of 14,336 (1.1-1.3 us with rows of 4,096; bench/NOTES.md, 2026-11-28); bulk tile copies
  // (kBulkTiles) gave 0.5-0.6 us of it back.
  const int blocks_per_col = gpr * kGroupBlocks;
  const int items = 2 * kCols * blocks_per_col;
  auto quantize = [&](int t, const float4(&x)[4]) {
    const int blk = t / 2, part = t % 2;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      amax = fmaxf(amax,
                   fmaxf(fmaxf(fabsf(x[i].x), fabsf(x[i].y)), fmaxf(fabsf(x[i].z), fabsf(x[i].w))));
    }
    // Both lanes of a pair are active together: items and threads are even.
    amax = fmaxf(amax, __shfl_xor_sync(__activemask(), amax, 1));
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    uint32_t q[4];
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = (uint32_t(int(rintf(x[i].x * inv))) & 0xFFu) |
             ((uint32_t(int(rintf(x[i].y * inv))) & 0xFFu) << 8) |
             ((uint32_t(int(rintf(x[i].z * inv))) & 0xFFu) << 16) |
             (uint32_t(int(rintf(x[i].w * inv))) << 24);
      sum = __dp4a(int(q[i]), 0x01010101, sum);
    }
    const int half_sum = sum;  // elements 16 * part to 16 * part + 15
    const int other_sum = __shfl_xor_sync(__activemask(), sum, 1);
    sum += other_sum;
    const int c = blk / blocks_per_col, bi = blk % blocks_per_col;
    const int g = bi / kGroupBlocks, j = bi % kGroupBlocks;
    const int h = j / kHalfBlocks, jj = j % kHalfBlocks;
    *reinterpret_cast<uint4*>(s_bq + (c * gpr + g) * kBGroupBytes + h * kBHalfBytes + jj * kQBlock +
                              16 * part) = make_uint4(q[0], q[1], q[2], q[3]);
    if (part == 0) {
      s_bs[((c * gpr + g) * kBScaleBytes + h * kBScaleHalf) / 8 + jj] = make_float2(
          d, kType == DType::Q6_K
                 ? __int_as_float(int((uint32_t(half_sum) & 0xFFFFu) | (uint32_t(other_sum) << 16)))
             : !F::kSumB ? 0.0f
             : kQ4       ? 8.0f * d * float(sum)
                         : d * float(sum));
    }
  };
  auto load_items = [&](int t0, float4(&x)[2][4]) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int t = t0 + u * threads;
      const float4* src =
          reinterpret_cast<const float4*>(b + int64_t(t / 2) * kQBlock) + 4 * (t % 2);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[u][i] = t < items ? __ldcg(src + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  };
  int t_next = tid;
  auto quantize_items = [&](int t0, const float4(&x)[2][4]) {
    if (t0 < items) quantize(t0, x[0]);
    if (t0 + threads < items) quantize(t0 + threads, x[1]);
  };
  if constexpr (kNorm) {
    // Every item in registers at once (items <= 2 * threads, checked at launch): the sum of
    // squares needs all of them before the first is quantized. x = a + r and y = x * inv * w,
    // the Add's and the RmsNorm's arithmetic (binary_kernel, norm_kernel); CTA 0 writes both.
    float4 x[2][4];
    auto at = [](int t) { return int64_t(t / 2) * kQBlock + 16 * (t % 2); };  // item t's first
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int t = tid + u * threads;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[u][i] = t < items ? __ldcg(reinterpret_cast<const float4*>(norm.a + at(t)) + i) : zero;
        if (norm.r && t < items) {
          const float4 r = __ldcg(reinterpret_cast<const float4*>(norm.r + at(t)) + i);
          x[u][i] = make_float4(x[u][i].x + r.x, x[u][i].y + r.y, x[u][i].z + r.z, x[u][i].w + r.w);
        }
      }
    }
#pragma unroll
    for (int s = kEarly; s < kStages - 1; ++s) issue();
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        ss += x[u][i].x * x[u][i].x;
        ss += x[u][i].y * x[u][i].y;
        ss += x[u][i].z * x[u][i].z;
        ss += x[u][i].w * x[u][i].w;
      }
    }
    // s_red is free until the first tile's partials, after the barrier below.
    const float inv = rsqrtf(block_reduce<false>(ss, s_red) / float(K) + norm.eps);
    const bool writer = blockIdx.x == 0;
    float* const normed = const_cast<float*>(b);  // the norm's output, read by no CTA here
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int t = tid + u * threads;
      if (t >= items) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (writer && norm.r) reinterpret_cast<float4*>(norm.sum + at(t))[i] = x[u][i];
        float4 y = make_float4(x[u][i].x * inv, x[u][i].y * inv, x[u][i].z * inv, x[u][i].w * inv);
        if (norm.w) {
          const float4 w = __ldg(reinterpret_cast<const float4*>(norm.w + at(t)) + i);
          y = make_float4(y.x * w.x, y.y * w.y, y.z * w.z, y.w * w.w);
        }
        if (writer) reinterpret_cast<float4*>(normed + at(t))[i] = y;
        x[u][i] = y;
      }
    }
    quantize_items(tid, x);
    t_next += 2 * threads;
  } else if constexpr (kEarly < kStages - 1) {
    // The ring's other first tiles go out right after this thread's first loads of b, so they
    // queue behind b, not b behind them (Q4_0 14336x4096: 15.50 -> 15.37 us, H100).
    float4 x[2][4];
    load_items(tid, x);
#pragma unroll
    for (int s = kEarly; s < kStages - 1; ++s) issue();
    quantize_items(tid, x);
    t_next += 2 * threads;
  }
  for (int t0 = t_next; t0 < items; t0 += 2 * threads) {
    float4 x[2][4];
    load_items(t0, x);
    quantize_items(t0, x);
  }

  // Lanes 2i and 2i + 1 take the two halves of group slot 16 * warp + i: the 8-byte shared loads
  // of 16 neighbouring lanes fall in distinct banks. In a tile of several rows slot s is group
  // s % gpr of row s / gpr, the same group of b in every tile (tile_groups >= rows * gpr); in a
  // tile of one row a thread walks the row's groups from its slot on.
  const int half = lane % 2;
  const int my_group = warp * 16 + lane / 2;
  const int my_column = my_group % gpr;
  const int col_quant_bytes = gpr * kBGroupBytes, col_scales = gpr * (kBScaleBytes / 8);
  // This thread's half of group g of b (column 0): its quants and its blocks' scale pairs.
  auto b_quants = [&](int g) { return s_bq + g * kBGroupBytes + half * kBHalfBytes; };
  auto b_scales = [&](int g) { return s_bs + (g * kBScaleBytes + half * kBScaleHalf) / 8; };
  // With one column and tiles of several rows a thread meets the same half group of b in every
  // tile: its quants and scales are read from shared memory once, into registers (kRegB).
  int4 b_lo[kRegB ? kHalfBlocks : 1], b_hi[kRegB ? kHalfBlocks : 1];
  float2 b_s[kRegB ? kHalfBlocks : 1];
  __syncthreads();  // b is quantized
  if constexpr (kRegB) {
    const int8_t* bq = b_quants(my_column);
    const float2* bs = b_scales(my_column);
#pragma unroll
    for (int j = 0; j < kHalfBlocks; ++j) {
      b_lo[j] = *reinterpret_cast<const int4*>(bq + j * kQBlock);
      b_hi[j] = *reinterpret_cast<const int4*>(bq + j * kQBlock + 16);
      b_s[j] = bs[j];
    }
  }
  // A warp sums its slots row by row (shuffles within the lanes of one row); the first lane of
  // each row in the warp leaves the sum in the slot's place, and a row adds the sums at its first
  // slot and at each warp start inside it, in a fixed order (deterministic).
  auto row_of = [&](int slot) { return tile_rows == 1 ? 0 : slot / gpr; };
  const int my_row = row_of(my_group);
  const int warp_last = warp * 16 + 15;
  const int row_last = tile_rows == 1 ? warp_last : min(warp_last, (my_row + 1) * gpr - 1);
  const int seg_last_lane = 2 * (row_last - warp * 16) + 1;
  const bool seg_head = half == 0 && (lane == 0 || row_of(my_group - 1) != my_row);
  const int red_stride = kCols * tile_groups;  // floats per tile's partials
  // Row sums of the filled tiles of the current set: a barrier (every warp is done with them),
  // then a thread per row and column adds its partials.
  int set = 0, filled = 0;
  auto flush = [&] {
    __syncthreads();
    const TileOut* to = s_out + set * red_tiles;
    const float* red = s_red + set * red_tiles * red_stride;
    const int per_tile = tile_rows * kCols;
    for (int i = tid; i < filled * per_tile; i += threads) {
      const int t = i / per_tile, c = i % per_tile / tile_rows, rr = i % tile_rows;
      const TileOut o = to[t];
      if (rr >= o.rows) continue;
      const float* r = red + t * red_stride + c * tile_groups;
      float v;
      if (tile_rows == 1) {
        v = r[0];
        for (int w = 1; w < warps; ++w) v += r[16 * w];
      } else {
        const int s0 = rr * gpr, s1 = s0 + gpr;
        v = r[s0];
        for (int s = (s0 / 16 + 1) * 16; s < s1; s += 16) v += r[s];
      }
      o.out[int64_t(c) * o.part_rows + rr] = v;
    }
    set ^= 1;
    filled = 0;
  };

  Cursor cur{row_begin, row_begin, 0, 0, row_end};
  int slot = 0;  // byte offset of this tile's slot in the ring
  int ring_slot = 0;
  uint32_t parity = 0;  // of the slot's phase this tile fills (kBulk)
  for (;;) {
    const int nr = next_rows(cur);
    if (nr <= 0) break;
    if constexpr (kUseBulk) {
      mbarrier_wait(s_bars + 8 * ring_slot, parity);
    } else {
      copy_async_wait<kStages - 2>();
    }
    // This warp's share of the tile is visible to its lanes, and they are done with the
    // previous tile, so its slot may be refilled.
    __syncwarp();
    issue();

    float acc[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
    for (int gi = my_group; gi < nr * gpr; gi += tile_groups) {
      const uint8_t* group = smem + off_stages + slot + gi * F::kBytes;
      const int jg = my_column + (gi - my_group);  // b's group when not held (kRegB)
      const int8_t* bq = b_quants(jg);
      const float2* bs = b_scales(jg);
      if constexpr (F::kSuper) {
        k_half<kType>(
            group, half, [&](int jj, const uint32_t(&q)[8], float f_lo, float f_hi, float m) {
              if constexpr (kRegB) {
                k_block_accumulate<kType>(q, f_lo, f_hi, m, b_lo[jj], b_hi[jj], b_s[jj], acc[0]);
              } else {
#pragma unroll
                for (int c = 0; c < kCols; ++c) {
                  const int8_t* bb = bq + c * col_quant_bytes + jj * kQBlock;
                  k_block_accumulate<kType>(q, f_lo, f_hi, m, *reinterpret_cast<const int4*>(bb),
                                            *reinterpret_cast<const int4*>(bb + 16),
                                            bs[c * col_scales + jj], acc[c]);
                }
              }
            });
      } else {
        uint32_t w[F::kHalfWords];
        const auto* src = reinterpret_cast<const uint2*>(group + half * F::kHalfBytes);
#pragma unroll
        for (int v = 0; v < F::kHalfWords / 2; ++v) {
          const uint2 x = src[v];
          w[2 * v] = x.x, w[2 * v + 1] = x.y;
        }
        if constexpr (kRegB) {
          half_group_block_held<kType, 0>(w, b_lo, b_hi, b_s, acc[0]);
          half_group_block_held<kType, 1>(w, b_lo, b_hi, b_s, acc[0]);
          half_group_block_held<kType, 2>(w, b_lo, b_hi, b_s, acc[0]);
          half_group_block_held<kType, 3>(w, b_lo, b_hi, b_s, acc[0]);
        } else {
          half_group_block<kType, 0, kCols>(w, bq, bs, col_quant_bytes, col_scales, acc);
          half_group_block<kType, 1, kCols>(w, bq, bs, col_quant_bytes, col_scales, acc);
          half_group_block<kType, 2, kCols>(w, bq, bs, col_quant_bytes, col_scales, acc);
          half_group_block<kType, 3, kCols>(w, bq, bs, col_quant_bytes, col_scales, acc);
        }
      }
    }
    float* red = s_red + (set * red_tiles + filled) * red_stride;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float v = acc[c] + __shfl_xor_sync(0xffffffffu, acc[c], 1);
#pragma unroll
      for (int o = 2; o < 32; o <<= 1) {
        const float n = __shfl_down_sync(0xffffffffu, v, o);
        if (lane + o <= seg_last_lane) v += n;
      }
      if (seg_head) red[c * tile_groups + my_group] = v;
    }
    if (tid == 0) {
      const int part_rows = pick(parts.row_start, cur.part + 1) - cur.part_begin;
      s_out[set * red_tiles + filled] = {
          pick(parts.out, cur.part) + int64_t(z) * part_rows * kCols + (cur.row - cur.part_begin),
          part_rows, nr};
    }
    cur.row += nr;
    slot = slot == (kStages - 1) * stage_bytes ? 0 : slot + stage_bytes;
    if (++ring_slot == kStages) ring_slot = 0, parity ^= 1;
    if (++filled == red_tiles) flush();
  }
  if (filled > 0) flush();
  copy_async_wait<0>();  // no copy may outlive the CTA (the trailing groups are empty)
  if constexpr (kGlu) {
    __syncthreads();  // the flushes' row sums of both parts
    for (int r = row_begin + tid; r < row_end; r += threads) {
      const float g = parts.out[0][r];
      glu[r] = g / (1.0f + expf(-g)) * parts.out[1][r];  // as swiglu_kernel
    }
  }
  if constexpr (kRope) {
    __syncthreads();  // the flushes' row sums
    const int32_t position = *rope.pos;
    for (int r = row_begin + 2 * tid; r < row_end; r += 2 * threads) {
      const int p = part_of(parts, r);
      const int lr = r - pick(parts.row_start, p);
      const float* o = pick(parts.out, p);
      rope_tail_pair(rope, p, lr, position, o[lr], o[lr + 1]);
    }
  }
}

}  // namespace tandem::cuda::staged
