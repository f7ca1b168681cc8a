// GGUF's block-quantized formats in their exact byte layout. Only <cstdint>: the per-ISA kernel
// files include it and must not instantiate std templates (see src/backends/cpu/isa_body.inc).
#pragma once

#include <cstdint>

// The block helpers below also run in CUDA kernels.
#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem {

// ggml's block_q8_0 and block_q4_0: a float16 scale then the quants. Code that steps over
// blocks uses sizeof(BlockQ8_0) and sizeof(BlockQ4_0), never their byte counts.
inline constexpr int64_t kQuantBlock = 32;
struct BlockQ8_0 {
  uint16_t d;  // float16 scale
  int8_t qs[kQuantBlock];
};
struct BlockQ4_0 {
  uint16_t d;                   // float16 scale
  uint8_t qs[kQuantBlock / 2];  // element j in the low nibble of qs[j], element j+16 in the high
};
static_assert(sizeof(BlockQ8_0) == 34, "GGUF q8_0 layout");
static_assert(sizeof(BlockQ4_0) == 18, "GGUF q4_0 layout");

// ggml's K-quants: super-blocks of 256 elements. Q4_K and Q5_K hold eight sub-blocks of 32, each
// with a 6-bit scale and a 6-bit min (x = d * scale * q - dmin * min); Q6_K sixteen of 16 with an
// int8 scale each (x = d * scale * (q - 32)).
inline constexpr int64_t kSuperBlock = 256;
inline constexpr int kKScaleBytes = 12;  // eight 6-bit scales and eight 6-bit mins, packed
struct BlockQ4_K {
  uint16_t d;                    // float16 scale of the scales
  uint16_t dmin;                 // float16 scale of the mins
  uint8_t scales[kKScaleBytes];  // see k_scale_min()
  uint8_t qs[kSuperBlock / 2];   // 64 elements per 32 bytes: low nibbles, then high nibbles
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kSuperBlock / 8];  // bit j of qh[l]: the fifth bit of element 32 * j + l
  uint8_t qs[kSuperBlock / 2];  // the low four bits, laid out as in Q4_K
};
struct BlockQ6_K {
  uint8_t ql[kSuperBlock / 2];  // low four bits
  uint8_t qh[kSuperBlock / 4];  // high two bits
  int8_t scales[kSuperBlock / 16];
  uint16_t d;  // float16 scale of the scales
};
static_assert(sizeof(BlockQ4_K) == 144, "GGUF q4_K layout");
static_assert(sizeof(BlockQ5_K) == 176, "GGUF q5_K layout");
static_assert(sizeof(BlockQ6_K) == 210, "GGUF q6_K layout");

// Sub-block j's (j < 8) 6-bit scale and min in Q4_K/Q5_K's packed 12 bytes: j < 4 in the low six
// bits of bytes j and j + 4; j >= 4 in the nibbles of byte j + 4 plus the top two bits of bytes
// j - 4 (scale) and j (min).
TANDEM_HOST_DEVICE inline void k_scale_min(int j, const uint8_t* q, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = uint8_t((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
    min = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}
// The inverse: stores sub-block j's scale and min (each < 64). Sub-blocks go in order 0..7, as
// j >= 4 adds bits to bytes that j - 4 wrote.
TANDEM_HOST_DEVICE inline void k_pack_scale_min(int j, uint8_t scale, uint8_t min, uint8_t* q) {
  if (j < 4) {
    q[j] = scale;
    q[j + 4] = min;
  } else {
    q[j + 4] = uint8_t((scale & 0x0F) | ((min & 0x0F) << 4));
    q[j - 4] = uint8_t(q[j - 4] | ((scale >> 4) << 6));
    q[j] = uint8_t(q[j] | ((min >> 4) << 6));
  }
}

}  // namespace tandem
