// What the files of the quantized matrix-vector product share: quantized_matmul.cu picks the
// path (f32 for tiny products, the staged kernel, the generic kernel, the GEMM),
// staged_matvec.cu holds the staged kernel and expert_matmul.cu the MoE expert products; the
// int8 row loops below serve the generic and the expert kernels.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "common.cuh"
#include "ops.h"
#include "rope_kv.h"

namespace tandem::cuda {

// fn(std::integral_constant<int, n>) for n columns of b, 1 <= n <= kMatvecMaxColumns: the
// matrix-vector kernels are compiled per column count.
template <int kN = 1, typename Fn>
decltype(auto) with_columns(int64_t n, Fn&& fn) {
  if constexpr (kN < kMatvecMaxColumns) {
    if (n > kN) return with_columns<kN + 1>(n, fn);
  }
  return fn(std::integral_constant<int, kN>{});
}

// fn(std::integral_constant<DType, d>) for the quantized weight dtype d (Q4_0, Q8_0, Q4_K, Q5_K
// or Q6_K; any other reads as Q6_K): the kernels are compiled per dtype.
template <typename Fn>
decltype(auto) with_quantized_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::Q4_0:
      return fn(std::integral_constant<DType, DType::Q4_0>{});
    case DType::Q8_0:
      return fn(std::integral_constant<DType, DType::Q8_0>{});
    case DType::Q4_K:
      return fn(std::integral_constant<DType, DType::Q4_K>{});
    case DType::Q5_K:
      return fn(std::integral_constant<DType, DType::Q5_K>{});
    default:
      return fn(std::integral_constant<DType, DType::Q6_K>{});
  }
}

// How many of the segment's first nodes (at most `most`) are products that `fits` accepts and
// that multiply the same b as the first (same data and shape) with weights of the first's K and,
// with same_dtype, its dtype: the run one fused launch can take.
template <typename Fits>
size_t count_same_b(std::span<const NodeExecution> segment, size_t most, Fits fits,
                    bool same_dtype = true) {
  if (segment.empty() || !fits(segment[0])) return 0;
  const NodeExecution& first = segment[0];
  size_t n = 1;
  while (n < segment.size() && n < most && fits(segment[n]) &&
         segment[n].inputs[1].data == first.inputs[1].data &&
         segment[n].inputs[1].desc->ne == first.inputs[1].desc->ne &&
         (!same_dtype || segment[n].inputs[0].desc->dtype == first.inputs[0].desc->dtype) &&
         segment[n].inputs[0].desc->ne[0] == first.inputs[0].desc->ne[0]) {
    ++n;
  }
  return n;
}

// One contiguous f32 row of k values at a 16-byte aligned address (read as float4).
inline bool f32_row(const TensorRef& t, int64_t k) {
  return t.desc->dtype == DType::F32 && t.desc->is_contiguous() && t.desc->elements() == k &&
         reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

// With norm (one column, decode), b is made by the kernel from the residual stream, as the Add and
// RmsNorm before the products would write it (run_fused_norm_matvecs), and written out to b (the
// norm's output) too.
struct NormedB {
  const float* a;  // the Add's first input, or the norm's input without an Add
  const float* r;  // the Add's second input; nullptr: no Add
  const float* w;  // the norm's weight; nullptr: none
  float* sum;      // the Add's output (written with r)
  float eps;
};

// The [Add,] RmsNorm that a fused matrix-vector launch makes b from, at the segment's start: one
// row of K f32 values, the Add's output apart from its inputs (one CTA writes it while the others
// read them) and, without an Add, the norm's output apart from its input (likewise). Returns the
// nodes it takes (1 or 2; 0: no such start) and fills `in`; the products follow them.
inline size_t match_normed_b(std::span<const NodeExecution> segment, NormedB& in) {
  const size_t at = !segment.empty() && segment[0].node->op == OpKind::Add ? 1 : 0;
  if (segment.size() < at + 2 || segment[at].node->op != OpKind::RmsNorm) return 0;
  const NodeExecution& norm = segment[at];
  const TensorDesc& x = *norm.inputs[0].desc;
  const int64_t K = x.ne[0];
  if (x.rows() != 1 || !f32_row(norm.inputs[0], K) || !f32_row(norm.output, K) ||
      (norm.inputs.size() > 1 && !f32_row(norm.inputs[1], K)) || norm.inputs.size() > 2) {
    return 0;
  }
  in = NormedB{static_cast<const float*>(norm.inputs[0].data), nullptr,
               norm.inputs.size() > 1 ? static_cast<const float*>(norm.inputs[1].data) : nullptr,
               nullptr, norm.node->params.eps};
  if (at == 0) return overlap(norm.output, norm.inputs[0]) ? 0 : 1;
  const NodeExecution& add = segment[0];
  if (add.inputs.size() != 2 || !f32_row(add.inputs[0], K) || !f32_row(add.inputs[1], K) ||
      !f32_row(add.output, K) || norm.inputs[0].data != add.output.data ||
      overlap(add.output, add.inputs[0]) || overlap(add.output, add.inputs[1])) {
    return 0;
  }
  in.a = static_cast<const float*>(add.inputs[0].data);
  in.r = static_cast<const float*>(add.inputs[1].data);
  in.sum = static_cast<float*>(add.output.data);
  return 2;
}
// Rows lr and lr + 1 of part p of a launch with a RopeTail, y0 and y1 their products at the
// token's position: rotated where the part rotates (as rope_kv_write_kernel), written to its Rope
// output, and to its cache row.
__device__ __forceinline__ void rope_tail_pair(const RopeTail& rope, int p, int lr,
                                               int32_t position, float y0, float y1) {
  auto at = [p](const auto& v) { return p == 0 ? v[0] : p == 1 ? v[1] : v[2]; };  // no local copy
  if (float* out = at(rope.out)) {
    const int i = lr % rope.head_dim;
    if (i < rope.n_rot) rope_pair(y0, y1, i / 2, position, rope.n_rot, rope.log_base, y0, y1);
    out[lr] = y0;
    out[lr + 1] = y1;
  }
  if (uint8_t* cache = at(rope.cache)) {
    if (position < 0 || position >= at(rope.capacity)) {
      atomicCAS(rope.error_flag, kDeviceOk, kPositionOutOfRange);
      return;
    }
    uint8_t* row = cache + position * at(rope.token_stride);
    store_f32(rope.cache_dtype, row, lr, y0);
    store_f32(rope.cache_dtype, row, lr + 1, y1);
  }
}

// The staged kernel for one node, or for up to kMaxParts that share b (one part each), when the
// layout allows it; false leaves them to the generic kernel (strided or unaligned weights, K not a
// multiple of 256, too little shared memory).
// With glu (gate and up of one column, then the SwiGlu of their outputs) a CTA takes the same rows
// of both and writes their GLU too; with rope, see RopeTail.
bool launch_staged_matvec(const OpContext& ctx, std::span<const NodeExecution> execs,
                          const NormedB* norm = nullptr, float* glu = nullptr,
                          const RopeTail* rope = nullptr);
// The same with the GLU where glu is given, or the RoPE tail where the nodes after the products
// are what it takes, and the launch takes it, else without: how many nodes ran (the products,
// plus the SwiGlu or the Rope and KvWrite nodes where the launch did their work), 0 where the
// staged kernel did not take them.
inline size_t launch_staged_products(const OpContext& ctx, std::span<const NodeExecution> segment,
                                     size_t n, const NormedB* norm, float* glu) {
  const std::span<const NodeExecution> execs = segment.first(n);
  if (glu && launch_staged_matvec(ctx, execs, norm, glu)) return n + 1;
  RopeTail rope;
  if (const size_t tail = rope_tail_of(segment, n, &rope)) {
    if (launch_staged_matvec(ctx, execs, norm, nullptr, &rope)) return n + tail;
  }
  return launch_staged_matvec(ctx, execs, norm) ? n : 0;
}

// The SwiGlu output where products[0] and products[1] (the first n products of one b) are gate
// and up and products[2] the SwiGlu of their outputs (same shapes, f32, contiguous); else nullptr.
inline float* swiglu_of(std::span<const NodeExecution> products, size_t n) {
  if (n != 2 || products.size() < 3) return nullptr;
  const NodeExecution& glu = products[2];
  const TensorDesc& out = *products[0].output.desc;
  const bool match = glu.node->op == OpKind::SwiGlu &&
                     glu.inputs[0].data == products[0].output.data &&
                     glu.inputs[1].data == products[1].output.data &&
                     glu.inputs[0].desc->ne == out.ne && glu.inputs[1].desc->ne == out.ne &&
                     products[1].output.desc->ne == out.ne && glu.output.desc->ne == out.ne &&
                     glu.output.desc->dtype == DType::F32 && glu.output.desc->is_contiguous();
  return match ? static_cast<float*>(glu.output.data) : nullptr;
}

// Two 16-bit loads: quants follow the 2-byte scale, so they are only 2-byte aligned.
__device__ __forceinline__ int load_int_b2(const uint8_t* p) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return int(uint32_t(h[0]) | (uint32_t(h[1]) << 16));
}

// One weight row `ar` times kCols quantized columns of b (column c: quants bq[c], block scales
// bd[c]): this lane's partial sums in acc (the caller adds them over the warp). Q4_0: two lanes per
// block (8 quant bytes = 16 elements each); Q8_0: four lanes per block (8 bytes each). Consecutive
// lanes read consecutive bytes of the row.
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

// b (f32) quantized into the scratch buffer as int8 blocks with their scales (bq, then bd).
struct QuantizedB {
  int8_t* bq;
  float* bd;
};
QuantizedB quantize_b(const OpContext& ctx, const TensorDesc& b, const void* b_data);

}  // namespace tandem::cuda
