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

// Two 16-bit loads: quants follow the 2-byte scale, so they are only 2-byte aligned.
__device__ __forceinline__ int load_int_b2(const uint8_t* p) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return int(uint32_t(h[0]) | (uint32_t(h[1]) << 16));
}

// One weight row `ar` times kCols quantized columns of b (column c: quants bq[c], block scales
// bd[c]): this lane's partial sums in acc (the caller adds them over the warp). Q4_0: two lanes per block (8 quant bytes =
// 16 elements each); Q8_0: four lanes per block (8 bytes each). Consecutive lanes read
// consecutive bytes of the row.
template <DType kType, int kCols>
__device__ __forceinline__ void quant_row_dot(const uint8_t* ar, int n_blocks,
                                              const int8_t* const (&bq)[kCols],
                                              const float* const (&bd)[kCols],
                                              float (&acc)[kCols]) {
  constexpr bool kQ4 = kType == DType::Q4_0;
  constexpr int kLanesPerBlock = kQ4 ? 2 : 4;
  constexpr int kBlocksPerStep = 32 / kLanesPerBlock;
  constexpr int kBlockBytes = kQ4 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
  const int lane = threadIdx.x % 32;
  const int part = lane % kLanesPerBlock;
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
  // All weight loads of kSteps steps are issued before any is used: the loop is bound by
  // memory latency, so bytes in flight per warp decide the bandwidth.
  constexpr int kSteps = 8;
  for (int base = lane / kLanesPerBlock; base < n_blocks; base += kBlocksPerStep * kSteps) {
    float dw[kSteps];
    int w0[kSteps], w1[kSteps];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int blk = base + s * kBlocksPerStep;
      if (blk < n_blocks) {
        const uint8_t* bp = ar + int64_t(blk) * kBlockBytes;
        dw[s] = f16_bits_to_f32(*reinterpret_cast<const uint16_t*>(bp));
        w0[s] = load_int_b2(bp + 2 + 8 * part);
        w1[s] = load_int_b2(bp + 6 + 8 * part);
      } else {
        dw[s] = 0.0f;
        w0[s] = w1[s] = 0;
      }
    }
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int blk = base + s * kBlocksPerStep;
      if (blk >= n_blocks) break;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int8_t* bb = bq[c] + int64_t(blk) * kQBlock;
        const float db = bd[c][blk];
        int dot;
        if constexpr (kQ4) {
          // Low nibbles are elements 8p..8p+7, high nibbles 16+8p..16+8p+7; q - 8 via the sum.
          const int2 blo = *reinterpret_cast<const int2*>(bb + 8 * part);
          const int2 bhi = *reinterpret_cast<const int2*>(bb + 16 + 8 * part);
          dot = __dp4a(w0[s] & 0x0F0F0F0F, blo.x, 0);
          dot = __dp4a(w1[s] & 0x0F0F0F0F, blo.y, dot);
          dot = __dp4a((w0[s] >> 4) & 0x0F0F0F0F, bhi.x, dot);
          dot = __dp4a((w1[s] >> 4) & 0x0F0F0F0F, bhi.y, dot);
          int sum = __dp4a(0x01010101, blo.x, 0);
          sum = __dp4a(0x01010101, blo.y, sum);
          sum = __dp4a(0x01010101, bhi.x, sum);
          sum = __dp4a(0x01010101, bhi.y, sum);
          dot -= 8 * sum;
        } else {
          const int2 bv = *reinterpret_cast<const int2*>(bb + 8 * part);
          dot = __dp4a(w0[s], bv.x, 0);
          dot = __dp4a(w1[s], bv.y, dot);
        }
        acc[c] += dw[s] * db * float(dot);
      }
    }
  }
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

// K-quant rows (GGUF Q4_K / Q5_K / Q6_K): one warp per row, each lane 8 elements of every
// super-block (lane / 4 is Q4_K/Q5_K's sub-block; Q6_K's 16-element group is one scale), as two
// int8x4 words for __dp4a against b's int8 blocks. Q4_K/Q5_K subtract min * sum(b) per lane;
// Q6_K's quants are made signed (q - 32) per byte. The loads of kKSteps super-blocks are issued
// before any is used: a row of 2,048 elements is 8 super-blocks, and one at a time each waited
// out a load's full latency (1B Q4_K_M decode spent two thirds of its time in these kernels).
// The kernels are programmatic dependents of b's quantization: the first super-blocks' loads go
// out before griddepcontrol.wait, while that kernel runs (weights are never written by a kernel).
// They release their own dependents only as they exit: with many waves of blocks, dependents
// released early would hold SM slots waiting while later waves still need them (8B Q4_K_M tg128
// 242 -> 230 t/s, H100).
constexpr int kKSteps = 8;

// One row `ar` of a K-quant matrix times kCols quantized columns of b: out[c * M + row].
template <DType kType, int kCols>
__device__ __forceinline__ void k_matvec_row(const uint8_t* ar, int M, int row, int n_supers,
                                             const int8_t* bq, const float* bd, float* out) {
  constexpr bool kQ6 = kType == DType::Q6_K;
  constexpr int64_t kSuperBytes = kType == DType::Q4_K   ? sizeof(BlockQ4_K)
                                  : kType == DType::Q5_K ? sizeof(BlockQ5_K)
                                                         : sizeof(BlockQ6_K);
  const int lane = threadIdx.x % 32;
  const int64_t K = int64_t(n_supers) * kSuperBlock, n_blocks = K / kQBlock;
  const int e0 = 8 * lane;  // this lane's first element in each super-block
  // Q4_K / Q5_K: sub-block j, byte l of its 32; the scale bytes j, j + 4 and (j >= 4) j - 4.
  const int j = e0 / 32, l = e0 % 32;
  // Q6_K: half h, quarter k of it, byte l of 32.
  const int h6 = e0 / 128, k6 = (e0 % 128) / 32;
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
  for (int s0 = 0; s0 < n_supers; s0 += kKSteps) {
    // Raw words first (quants, high bits, scales), all in flight together.
    int q0[kKSteps], q1[kKSteps], h0[kKSteps], h1[kKSteps];
    uint32_t dm[kKSteps];  // Q4_K/Q5_K: d | dmin << 16; Q6_K: d | scale << 16
    uint32_t sb[kKSteps];  // Q4_K/Q5_K: scale bytes j | j + 4 << 8 | j - 4 << 16
#pragma unroll
    for (int t = 0; t < kKSteps; ++t) {
      q0[t] = q1[t] = h0[t] = h1[t] = 0;
      dm[t] = sb[t] = 0;
      if (s0 + t >= n_supers) continue;
      const uint8_t* blk = ar + int64_t(s0 + t) * kSuperBytes;
      if constexpr (kQ6) {
        const auto* b = reinterpret_cast<const BlockQ6_K*>(blk);
        const uint8_t* ql = b->ql + 64 * h6 + 32 * (k6 & 1) + l;
        const uint8_t* qh = b->qh + 32 * h6 + l;
        q0[t] = load_int_b2(ql);
        q1[t] = load_int_b2(ql + 4);
        h0[t] = load_int_b2(qh);
        h1[t] = load_int_b2(qh + 4);
        dm[t] = uint32_t(b->d) | (uint32_t(uint8_t(b->scales[8 * h6 + 2 * k6 + l / 16])) << 16);
      } else {
        // 144- and 176-byte blocks keep 4-byte alignment; the quants' 8 bytes are 8-aligned.
        const auto* b = reinterpret_cast<const BlockQ4_K*>(blk);  // d, dmin, scales lead both
        const uint8_t* qs =
            kType == DType::Q4_K ? b->qs : reinterpret_cast<const BlockQ5_K*>(blk)->qs;
        const int2 qv = *reinterpret_cast<const int2*>(qs + 32 * (j / 2) + l);
        q0[t] = qv.x;
        q1[t] = qv.y;
        if constexpr (kType == DType::Q5_K) {
          const int2 hv =
              *reinterpret_cast<const int2*>(reinterpret_cast<const BlockQ5_K*>(blk)->qh + l);
          h0[t] = hv.x;
          h1[t] = hv.y;
        }
        dm[t] = *reinterpret_cast<const uint32_t*>(blk);
        sb[t] = uint32_t(b->scales[j]) | (uint32_t(b->scales[j + 4]) << 8) |
                (uint32_t(b->scales[j >= 4 ? j - 4 : j]) << 16);
      }
    }
    if (s0 == 0) grid_dependency_wait();  // b's quantization is the preceding kernel
#pragma unroll
    for (int t = 0; t < kKSteps; ++t) {
      const int s = s0 + t;
      if (s >= n_supers) break;
      int w0, w1;
      float dw, mw = 0.0f;
      if constexpr (kQ6) {
        const int shift = 4 * (k6 >> 1);
        const int v0 = ((q0[t] >> shift) & 0x0F0F0F0F) | (((h0[t] >> (2 * k6)) & 0x03030303) << 4);
        const int v1 = ((q1[t] >> shift) & 0x0F0F0F0F) | (((h1[t] >> (2 * k6)) & 0x03030303) << 4);
        w0 = int(__vsub4(unsigned(v0), 0x20202020u));
        w1 = int(__vsub4(unsigned(v1), 0x20202020u));
        dw = f16_bits_to_f32(uint16_t(dm[t] & 0xFFFF)) * float(int8_t(dm[t] >> 16));
      } else {
        const int shift = 4 * (j % 2);
        w0 = (q0[t] >> shift) & 0x0F0F0F0F;
        w1 = (q1[t] >> shift) & 0x0F0F0F0F;
        if constexpr (kType == DType::Q5_K) {
          w0 |= ((h0[t] >> j) & 0x01010101) << 4;
          w1 |= ((h1[t] >> j) & 0x01010101) << 4;
        }
        // k_scale_min() on the three bytes this lane's sub-block reads.
        const uint32_t bj = sb[t] & 0xFF, bj4 = (sb[t] >> 8) & 0xFF, bjm4 = (sb[t] >> 16) & 0xFF;
        const uint32_t sc = j < 4 ? bj & 63 : (bj4 & 0x0F) | ((bjm4 >> 6) << 4);
        const uint32_t m = j < 4 ? bj4 & 63 : (bj4 >> 4) | ((bj >> 6) << 4);
        dw = f16_bits_to_f32(uint16_t(dm[t] & 0xFFFF)) * float(sc);
        mw = f16_bits_to_f32(uint16_t(dm[t] >> 16)) * float(m);
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int2 bv = *reinterpret_cast<const int2*>(bq + c * K + s * kSuperBlock + e0);
        const float db = bd[c * n_blocks + s * (kSuperBlock / kQBlock) + e0 / kQBlock];
        const int dot = __dp4a(w1, bv.y, __dp4a(w0, bv.x, 0));
        if constexpr (kQ6) {
          acc[c] += db * dw * float(dot);
        } else {
          const int sum = __dp4a(0x01010101, bv.y, __dp4a(0x01010101, bv.x, 0));
          acc[c] += db * (dw * float(dot) - mw * float(sum));
        }
      }
    }
  }
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
  auto kernel = exact_matvec_kernel<DType::Q8_0>;
  switch (a.dtype) {
    case DType::Q4_0:
      kernel = exact_matvec_kernel<DType::Q4_0>;
      break;
    case DType::Q4_K:
      kernel = exact_matvec_kernel<DType::Q4_K>;
      break;
    case DType::Q5_K:
      kernel = exact_matvec_kernel<DType::Q5_K>;
      break;
    case DType::Q6_K:
      kernel = exact_matvec_kernel<DType::Q6_K>;
      break;
    default:
      break;
  }
  kernel<<<grid, kWarps * 32, 0, ctx.stream>>>(
      static_cast<const uint8_t*>(e.inputs[0].data), a.nb[1], a.nb[2], a.nb[3], b.ne[2] / a.ne[2],
      b.ne[3] / a.ne[3], int(M), int(N), a.ne[0], static_cast<const float*>(e.inputs[1].data),
      b.ne[2], static_cast<float*>(e.output.data));
  ctx.check_launch("quantized_matmul");
}

// b (f32) quantized into the scratch buffer as int8 blocks with their scales (bq, then bd).
struct QuantizedB {
  int8_t* bq;
  float* bd;
};
QuantizedB quantize_b(const OpContext& ctx, const TensorDesc& b, const void* b_data) {
  const int64_t b_blocks = b.elements() / kQBlock;
  auto* bq = static_cast<int8_t*>(ctx.scratch);
  auto* bd = reinterpret_cast<float*>(bq + align_up(size_t(b.elements()), kScratchAlignment));
  ctx.check(launch_programmatic(ctx.stream, dim3(grid_1d(b_blocks * 32, 256, INT32_MAX)),
                                dim3(256), 0, quantize_b_kernel, static_cast<const float*>(b_data),
                                bq, bd, b_blocks),
            "quantized_matmul", "kernel launch");
  return {bq, bd};
}

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

// ExpertMatMul with quantized weights: one warp per output row of each (token, choice) z, the
// chosen expert's row times b's column for z (b quantized once, as for a matrix-vector
// product). The expert comes from data, so nothing is fetched before the wait.
template <DType kType>
__global__ __launch_bounds__(kWarps * 32) void expert_matvec_kernel(
    const uint8_t* a, int64_t row_stride, int64_t expert_stride, int64_t n_expert, int M,
    int64_t K, const int8_t* bq, const float* bd, int64_t b_cols, const int32_t* ids, int k,
    float* out, int32_t* error_flag) {
  grid_dependency_wait();
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;
  const int64_t z = blockIdx.y, col = b_cols == 1 ? z / k : z;
  const int32_t expert = ids[z];
  out += z * M;
  if (expert < 0 || expert >= n_expert) {
    if (lane == 0) {
      out[row] = 0.0f;
      atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
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

// Gate and up ExpertMatMul of one b and one set of ids, then the SwiGlu of their outputs (a MoE
// layer's decode): one launch whose warps take row m of both chosen experts' matrices and write
// both products and silu(gate) * up.
template <DType kType>
__global__ __launch_bounds__(kWarps * 32) void expert_gate_up_kernel(
    const uint8_t* gate_w, const uint8_t* up_w, int64_t row_stride, int64_t expert_stride,
    int64_t n_expert, int M, int64_t K, const int8_t* bq, const float* bd, int64_t b_cols,
    const int32_t* ids, int k, float* gate_out, float* up_out, float* glu, int32_t* error_flag) {
  grid_dependency_wait();
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;
  const int64_t z = blockIdx.y, col = b_cols == 1 ? z / k : z;
  const int32_t expert = ids[z];
  gate_out += z * M;
  up_out += z * M;
  glu += z * M;
  if (expert < 0 || expert >= n_expert) {
    if (lane == 0) {
      gate_out[row] = up_out[row] = glu[row] = 0.0f;
      atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
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

// ExpertMatMul over many tokens (prefill): the (token, choice) pairs grouped by expert on the
// device, then each expert's rows read once per tile of up to kExpertTile pairs instead of once
// per pair. moe_group_kernel (one block) counts the pairs per expert, lays the groups out one
// after another (pairs[]), and lists the tiles (expert, first pair, pairs) for the product.
constexpr int kExpertTile = 8;
constexpr int kMaxGroupedExperts = 2048;  // counts, cursors and offsets in shared memory
struct ExpertGroups {
  int32_t* pairs;        // [pairs]: z = t * k + j, grouped by expert
  int32_t* tile_expert;  // [max_tiles]
  int32_t* tile_start;   // index into pairs
  int32_t* tile_count;
  int32_t* n_tiles;
};

__global__ void moe_group_kernel(const int32_t* ids, int64_t n_pairs, int n_expert,
                                 ExpertGroups g, int32_t* error_flag) {
  __shared__ int32_t count[kMaxGroupedExperts], offset[kMaxGroupedExperts],
      cursor[kMaxGroupedExperts];
  grid_dependency_wait();
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = cursor[e] = 0;
  __syncthreads();
  for (int64_t z = threadIdx.x; z < n_pairs; z += blockDim.x) {
    const int32_t e = ids[z];
    if (e < 0 || e >= n_expert) {
      atomicCAS(error_flag, kDeviceOk, kExpertIdOutOfRange);
      continue;
    }
    atomicAdd(&count[e], 1);
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
    *g.n_tiles = tiles;
  }
  __syncthreads();
  for (int64_t z = threadIdx.x; z < n_pairs; z += blockDim.x) {
    const int32_t e = ids[z];
    if (e < 0 || e >= n_expert) continue;
    g.pairs[offset[e] + atomicAdd(&cursor[e], 1)] = int32_t(z);
  }
}

// One warp per row of a tile's expert, the tile's pairs as the columns (a short tile repeats
// its first pair and does not write the copies). A pair with an invalid expert id was left out
// by the grouping: its output stays unwritten, and the flag is raised.
template <DType kType>
__global__ __launch_bounds__(kWarps * 32) void expert_grouped_kernel(
    const uint8_t* a, int64_t row_stride, int64_t expert_stride, int M, int64_t K,
    const int8_t* bq, const float* bd, int64_t b_cols, int k, ExpertGroups g, float* out) {
  grid_dependency_wait();
  const int tile = blockIdx.y;
  if (tile >= *g.n_tiles) return;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  if (row >= M) return;
  const int expert = g.tile_expert[tile], start = g.tile_start[tile], count = g.tile_count[tile];
  const int n_blocks = int(K / kQBlock);
  int32_t z[kExpertTile];
  const int8_t* bqs[kExpertTile];
  const float* bds[kExpertTile];
#pragma unroll
  for (int c = 0; c < kExpertTile; ++c) {
    z[c] = g.pairs[start + (c < count ? c : 0)];
    const int64_t col = b_cols == 1 ? z[c] / k : z[c];
    bqs[c] = bq + col * K;
    bds[c] = bd + col * int64_t(n_blocks);
  }
  float acc[kExpertTile];
  quant_row_dot<kType, kExpertTile>(a + expert * expert_stride + row * row_stride, n_blocks, bqs,
                                    bds, acc);
#pragma unroll
  for (int c = 0; c < kExpertTile; ++c) {
    const float v = warp_sum(acc[c]);
    if (threadIdx.x % 32 == 0 && c < count) out[int64_t(z[c]) * M + row] = v;
  }
}

// Tokens from which the grouped product reads fewer weight bytes than one product per pair.
constexpr int64_t kGroupedMinTokens = 8;
bool expert_grouped(const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &id = *e.inputs[2].desc;
  return (a.dtype == DType::Q4_0 || a.dtype == DType::Q8_0) && id.ne[1] >= kGroupedMinTokens &&
         a.ne[2] <= kMaxGroupedExperts;
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
  // The staged kernel reads Q4_0 / Q8_0 only; K-quants take the generic one.
  if (is_k_quant(a.dtype) || !launch_staged_matvec(ctx, std::span(&e, 1))) {
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

// The grouped product's lists after b's quantization in the scratch: pairs, then the tiles.
int64_t expert_max_tiles(const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &id = *e.inputs[2].desc;
  return a.ne[2] + (id.ne[0] * id.ne[1] + kExpertTile - 1) / kExpertTile;
}

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
  if (ua.dtype != ga.dtype || ua.ne != ga.ne || ua.nb != ga.nb ||
      up.inputs[1].data != gate.inputs[1].data || up.inputs[1].desc->ne != gate.inputs[1].desc->ne ||
      up.inputs[2].data != gate.inputs[2].data || up.inputs[2].desc->ne != gate.inputs[2].desc->ne ||
      glu.inputs[0].data != gate.output.data || glu.inputs[1].data != up.output.data ||
      glu.inputs[0].desc->ne != out.ne || glu.inputs[1].desc->ne != out.ne ||
      glu.output.desc->ne != out.ne || glu.output.desc->dtype != DType::F32 ||
      !glu.output.desc->is_contiguous()) {
    return 0;
  }
  const TensorDesc &b = *gate.inputs[1].desc, &id = *gate.inputs[2].desc;
  const QuantizedB qb = quantize_b(ctx, b, gate.inputs[1].data);
  const int M = int(ga.ne[1]);
  const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(id.ne[0] * id.ne[1]));
  auto go = [&](auto kernel) {
    ctx.check(launch_programmatic(ctx.stream, grid, dim3(kWarps * 32), 0, kernel,
                                  static_cast<const uint8_t*>(gate.inputs[0].data),
                                  static_cast<const uint8_t*>(up.inputs[0].data),
                                  int64_t(ga.nb[1]), int64_t(ga.nb[2]), ga.ne[2], M, ga.ne[0],
                                  static_cast<const int8_t*>(qb.bq),
                                  static_cast<const float*>(qb.bd), b.ne[1],
                                  static_cast<const int32_t*>(gate.inputs[2].data), int(id.ne[0]),
                                  static_cast<float*>(gate.output.data),
                                  static_cast<float*>(up.output.data),
                                  static_cast<float*>(glu.output.data), ctx.error_flag),
              "expert_matmul + swiglu", "kernel launch");
  };
  switch (ga.dtype) {
    case DType::Q4_0:
      go(expert_gate_up_kernel<DType::Q4_0>);
      break;
    case DType::Q8_0:
      go(expert_gate_up_kernel<DType::Q8_0>);
      break;
    case DType::Q4_K:
      go(expert_gate_up_kernel<DType::Q4_K>);
      break;
    case DType::Q5_K:
      go(expert_gate_up_kernel<DType::Q5_K>);
      break;
    default:
      go(expert_gate_up_kernel<DType::Q6_K>);
      break;
  }
  return 3;
}

bool launch_expert_matvec(const OpContext& ctx, const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &b = *e.inputs[1].desc, &id = *e.inputs[2].desc;
  if (!expert_matvec_fits(e)) return false;
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
    g.n_tiles = take(1);
    ctx.check(launch_programmatic(ctx.stream, dim3(1), dim3(1024), 0, moe_group_kernel,
                                  static_cast<const int32_t*>(e.inputs[2].data), n_pairs,
                                  int(a.ne[2]), g, ctx.error_flag),
              "expert_matmul", "kernel launch");
    const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(max_tiles));
    auto kernel = a.dtype == DType::Q4_0 ? expert_grouped_kernel<DType::Q4_0>
                                         : expert_grouped_kernel<DType::Q8_0>;
    ctx.check(launch_programmatic(ctx.stream, grid, dim3(kWarps * 32), 0, kernel,
                                  static_cast<const uint8_t*>(e.inputs[0].data), int64_t(a.nb[1]),
                                  int64_t(a.nb[2]), M, a.ne[0], static_cast<const int8_t*>(qb.bq),
                                  static_cast<const float*>(qb.bd), b.ne[1], int(id.ne[0]), g,
                                  static_cast<float*>(e.output.data)),
              "expert_matmul", "kernel launch");
    return true;
  }
  const dim3 grid(unsigned((M + kWarps - 1) / kWarps), unsigned(id.ne[0] * id.ne[1]));
  auto go = [&](auto kernel) {
    ctx.check(launch_programmatic(ctx.stream, grid, dim3(kWarps * 32), 0, kernel,
                                  static_cast<const uint8_t*>(e.inputs[0].data), int64_t(a.nb[1]),
                                  int64_t(a.nb[2]), a.ne[2], M, a.ne[0],
                                  static_cast<const int8_t*>(qb.bq),
                                  static_cast<const float*>(qb.bd), b.ne[1],
                                  static_cast<const int32_t*>(e.inputs[2].data), int(id.ne[0]),
                                  static_cast<float*>(e.output.data), ctx.error_flag),
              "expert_matmul", "kernel launch");
  };
  switch (a.dtype) {
    case DType::Q4_0:
      go(expert_matvec_kernel<DType::Q4_0>);
      break;
    case DType::Q8_0:
      go(expert_matvec_kernel<DType::Q8_0>);
      break;
    case DType::Q4_K:
      go(expert_matvec_kernel<DType::Q4_K>);
      break;
    case DType::Q5_K:
      go(expert_matvec_kernel<DType::Q5_K>);
      break;
    default:
      go(expert_matvec_kernel<DType::Q6_K>);
      break;
  }
  return true;
}

size_t run_fused_matvecs(const OpContext& ctx, std::span<const NodeExecution> segment) {
  // K-quant matrices (2-D) multiplying the same b: one quantization of b, fewer launches.
  auto is_k_matvec = [](const NodeExecution& e) {
    const TensorDesc& a = *e.inputs[0].desc;
    const TensorDesc& b = *e.inputs[1].desc;
    return e.node->op == OpKind::QuantizedMatMul && is_k_quant(a.dtype) && b.ne[1] >= 1 &&
           b.ne[1] <= kMatvecMaxColumns && int8_activations(a.ne[1], b.ne[1]) &&
           a.ne[2] * a.ne[3] == 1 && b.ne[2] * b.ne[3] == 1 && a.ne[1] <= INT32_MAX / 4;
  };
  if (const size_t n = count_same_b(segment, kMaxParts, is_k_matvec, /*same_dtype=*/false)) {
    if (n < 2) return 0;
    with_columns(segment[0].inputs[1].desc->ne[1],
                 [&](auto cols) { launch_k_matvec_parts<cols()>(ctx, segment.first(n)); });
    return n;
  }
  auto is_matvec = [](const NodeExecution& e) {
    return e.node->op == OpKind::QuantizedMatMul && !is_k_quant(e.inputs[0].desc->dtype) &&
           e.inputs[1].desc->ne[1] >= 1 && e.inputs[1].desc->ne[1] <= kMatvecMaxColumns &&
           int8_activations(e.inputs[0].desc->ne[1], e.inputs[1].desc->ne[1]);
  };
  const size_t n = count_same_b(segment, kMaxParts, is_matvec);
  if (n < 2) return 0;
  return launch_staged_matvec(ctx, segment.first(n)) ? n : 0;
}

}  // namespace tandem::cuda
