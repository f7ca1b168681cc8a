// How a thread of the staged matrix-vector kernel (staged_matvec.cuh) decodes its part of a
// K-quant super-block from the shared-memory tile, and multiplies it with b's quantized blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.cuh"
#include "tandem/blocks.h"

namespace tandem::cuda::staged {

// acc plus the products of four int8x4 words q[0..3] with the four of v, in order.
__device__ __forceinline__ int dot_words(const uint32_t* q, const int4& v, int acc) {
  acc = __dp4a(int(q[0]), v.x, acc);
  acc = __dp4a(int(q[1]), v.y, acc);
  acc = __dp4a(int(q[2]), v.z, acc);
  return __dp4a(int(q[3]), v.w, acc);
}

// A K-quant super-block in shared memory (`blk`), the half `half` of its elements (128: the
// sub-blocks of 32 that meet b's blocks 4 * half to 4 * half + 3). For each of its four blocks of
// 32 it calls apply(jj, q, f_lo, f_hi, m) with the block's quants as eight int8x4 words and its
// scales: element i of the block weighs q_i * (i < 16 ? f_lo : f_hi) - m (Q6_K: (q_i - 32) * f,
// the 32 left to k_block_accumulate).
//   Q4_K / Q5_K (16-byte aligned: 144 and 176 are multiples of 16): d, dmin and the 12 scale
//   bytes are one 16-byte load; byte jj of sc4 / m4 is sub-block 4 * half + jj's 6-bit scale /
//   min (k_scale_min() on four sub-blocks at once). Neighbouring sub-blocks share their quant
//   bytes (low and high nibbles), so each 16-byte load of quants serves two blocks.
//   Q6_K (210 bytes: every other super-block starts 2 bytes past a word) is read as aligned
//   words shifted into place; a 16-element group has its own int8 scale.
template <DType kType, typename Apply>
__device__ __forceinline__ void k_half(const uint8_t* blk, int half, Apply&& apply) {
  if constexpr (kType == DType::Q4_K || kType == DType::Q5_K) {
    constexpr int kQsOffset =
        kType == DType::Q4_K ? offsetof(BlockQ4_K, qs) : offsetof(BlockQ5_K, qs);
    const uint4 head = *reinterpret_cast<const uint4*>(blk);
    const float d = f16_bits_to_f32(uint16_t(head.x & 0xFFFFu));
    const float dmin = f16_bits_to_f32(uint16_t(head.x >> 16));
    const uint32_t sc4 =
        half == 0 ? head.y & 0x3F3F3F3Fu : (head.w & 0x0F0F0F0Fu) | ((head.y >> 2) & 0x30303030u);
    const uint32_t m4 = half == 0 ? head.z & 0x3F3F3F3Fu
                                  : ((head.w >> 4) & 0x0F0F0F0Fu) | ((head.z >> 2) & 0x30303030u);
    uint32_t qh[kType == DType::Q5_K ? 8 : 1];
    if constexpr (kType == DType::Q5_K) {
      const uint4 h0 = *reinterpret_cast<const uint4*>(blk + offsetof(BlockQ5_K, qh));
      const uint4 h1 = *reinterpret_cast<const uint4*>(blk + offsetof(BlockQ5_K, qh) + 16);
      qh[0] = h0.x, qh[1] = h0.y, qh[2] = h0.z, qh[3] = h0.w;
      qh[4] = h1.x, qh[5] = h1.y, qh[6] = h1.z, qh[7] = h1.w;
      // This half's sub-blocks' bits (4 * half to 4 * half + 3 of each byte) to bits 0-3.
#pragma unroll
      for (int i = 0; i < 8; ++i) qh[i] >>= 4 * half;
    }
    const uint8_t* qs = blk + kQsOffset + 64 * half;
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      const uint4 x0 = *reinterpret_cast<const uint4*>(qs + 32 * pair);
      const uint4 x1 = *reinterpret_cast<const uint4*>(qs + 32 * pair + 16);
      const uint32_t x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int nib = 0; nib < 2; ++nib) {
        const int jj = 2 * pair + nib;
        uint32_t q[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          q[i] = (x[i] >> (4 * nib)) & 0x0F0F0F0Fu;
          if constexpr (kType == DType::Q5_K) {
            q[i] |= (qh[i] << (4 - jj)) & 0x10101010u;  // bit 4 * half + jj to bit 4
          }
        }
        const float f = d * float((sc4 >> (8 * jj)) & 0xFFu);
        apply(jj, q, f, f, dmin * float((m4 >> (8 * jj)) & 0xFFu));
      }
    }
  } else {
    static_assert(kType == DType::Q6_K, "K-quant type");
    // The aligned words around the super-block, addressed from blk itself (an address rebuilt
    // from an integer is read as generic memory, not shared).
    const int skew = int(reinterpret_cast<uintptr_t>(blk) & 3);  // 0 or 2
    const auto* w = reinterpret_cast<const uint32_t*>(blk - skew);
    const uint32_t sh = uint32_t(skew) * 8;
    // kN words of the bytes from byte offset `off` (a multiple of 4) of the super-block: kN + 1
    // aligned loads, each word shifted into place.
    auto words = [&]<int kN>(int off, uint32_t(&out)[kN]) {
      uint32_t a[kN + 1];
#pragma unroll
      for (int i = 0; i <= kN; ++i) a[i] = w[off / 4 + i];
#pragma unroll
      for (int i = 0; i < kN; ++i) out[i] = __funnelshift_r(a[i], a[i + 1], sh);
    };
    uint32_t qh[8], sc[2], ql[16];  // sc: the half's 8 scale bytes
    words(offsetof(BlockQ6_K, qh) + 32 * half, qh);
    words(offsetof(BlockQ6_K, scales) + 8 * half, sc);
    words(64 * half, ql);
    // d, the block's last two bytes, in a load of its own: read as a word shifted into place it
    // took the next super-block's first bytes, another warp's copy where the block ends a warp's
    // share of the tile (a race on bytes it threw away; compute-sanitizer's racecheck saw it).
    // The word loads above stay inside a block that starts 2 bytes past a word; one that starts
    // on a word may read 2 bytes past its end, but never ends a share (16 blocks from a 16-byte
    // boundary: the last starts 2 bytes past a word).
    const float d =
        f16_bits_to_f32(*reinterpret_cast<const uint16_t*>(blk + offsetof(BlockQ6_K, d)));
#pragma unroll
    for (int part = 0; part < 2; ++part) {  // ql bytes 32 * part: blocks part and part + 2
      const uint32_t* x = ql + 8 * part;
#pragma unroll
      for (int nib = 0; nib < 2; ++nib) {
        const int k = part + 2 * nib;
        uint32_t q[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t v =
              ((x[i] >> (4 * nib)) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * k)) & 0x03030303u) << 4);
          q[i] = v;  // 0..63: the -32 comes with b's sums
        }
        // The scales of the block's two 16-element groups: bytes 2k and 2k + 1 of the half's 8.
        const uint32_t sw = sc[k / 2];
        const float f_lo = d * float(int8_t((sw >> (16 * (k % 2))) & 0xFFu));
        const float f_hi = d * float(int8_t((sw >> (16 * (k % 2) + 8)) & 0xFFu));
        apply(k, q, f_lo, f_hi, 0.0f);
      }
    }
  }
}

// acc += a K-quant block (quants q, scales f_lo / f_hi, min m) times b's block: quants lo / hi,
// scales s = {d, d sum(q)}. One scale for the whole block (Q4_K, Q5_K) takes one dot product.
template <DType kType>
__device__ __forceinline__ void k_block_accumulate(const uint32_t (&q)[8], float f_lo, float f_hi,
                                                   float m, const int4& lo, const int4& hi,
                                                   float2 s, float& acc) {
  if constexpr (kType == DType::Q6_K) {
    int dlo = dot_words(q, lo, 0), dhi = dot_words(q + 4, hi, 0);
    // The quants are unsigned (q + 32): subtract 32 times b's sums of each 16-element half.
    const int sums = __float_as_int(s.y);
    dlo -= 32 * ((sums << 16) >> 16);
    dhi -= 32 * (sums >> 16);
    acc += s.x * (f_lo * float(dlo) + f_hi * float(dhi));
  } else {
    const int dot = dot_words(q + 4, hi, dot_words(q, lo, 0));
    acc += f_lo * (s.x * float(dot)) - m * s.y;
  }
}

}  // namespace tandem::cuda::staged
