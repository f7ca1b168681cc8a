// AMX int8 tile kernels (flags set per file in CMakeLists.txt). See amx.h. Like the other
// isa_*.cpp files it includes no std templates, so no AMX code can leak into shared symbols.
// GCC 12 flags _mm512_undefined_* inside its own AVX-512 intrinsics (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "amx.h"
#include "tandem/blocks.h"

namespace tandem::cpu::amx {

namespace {

// Tile registers: 0 = C (16 x 16 int32), 1 = A (16 rows x 32 int8), 2 = B (8 rows x 64 int8).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace

void configure_tiles() {
  TileConfig cfg;
  cfg.colsb[0] = 64;
  cfg.rows[0] = 16;
  cfg.colsb[1] = 32;
  cfg.rows[1] = 16;
  cfg.colsb[2] = 64;
  cfg.rows[2] = 8;
  // GCC 12 does not see ldtilecfg read the struct and drops the stores above without this.
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

void release_tiles() {
  _tile_release();
}

void pack_weights(bool q4, const uint8_t* w, size_t w_row_bytes, int rows, int64_t nb, int8_t* wp,
                  float* wd) {
  const size_t bs = q4 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < kTile; ++r) {
      int8_t* dst = wp + (b * kTile + r) * 32;
      if (r >= rows) {
        std::memset(dst, 0, 32);
        wd[b * kTile + r] = 0.0f;
        continue;
      }
      const uint8_t* blk = w + size_t(r) * w_row_bytes + size_t(b) * bs;
      uint16_t h;
      std::memcpy(&h, blk, 2);
      wd[b * kTile + r] = _cvtsh_ss(h);
      if (q4) {
        const __m128i raw = _mm_loadu_si128((const __m128i*)(blk + 2));
        const __m128i m = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
        _mm_storeu_si128((__m128i*)dst, _mm_sub_epi8(_mm_and_si128(raw, m), eight));
        _mm_storeu_si128((__m128i*)(dst + 16),
                         _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m), eight));
      } else {
        std::memcpy(dst, blk + 2, 32);
      }
    }
  }
}

void pack_activations(const int8_t* qs, const float* d, int cols, int64_t k, int8_t* bp,
                      float* dap) {
  const int64_t nb = k / 32;
  for (int64_t b = 0; b < nb; ++b) {
    auto* dst = reinterpret_cast<int32_t*>(bp + b * 512);  // [8 quads][16 columns]
    for (int n = 0; n < kTile; ++n) {
      dap[b * kTile + n] = n < cols ? d[n * nb + b] : 0.0f;
      for (int quad = 0; quad < 8; ++quad) {
        int32_t v = 0;
        if (n < cols) std::memcpy(&v, qs + n * k + b * 32 + quad * 4, 4);
        dst[quad * kTile + n] = v;
      }
    }
  }
}

void tile_product(const int8_t* wp, const float* wd, const int8_t* bp, const float* dap, int64_t nb,
                  float* out) {
  __m512 acc[kTile];
  for (int m = 0; m < kTile; ++m) acc[m] = _mm512_setzero_ps();
  alignas(64) int32_t c[kTile * kTile];
  for (int64_t b = 0; b < nb; ++b) {
    _tile_zero(0);
    _tile_loadd(1, wp + b * kTile * 32, 32);
    _tile_loadd(2, bp + b * 512, 64);
    _tile_dpbssd(0, 1, 2);
    _tile_stored(0, c, 64);
    const __m512 da = _mm512_loadu_ps(dap + b * kTile);
    for (int m = 0; m < kTile; ++m) {
      const __m512 s = _mm512_mul_ps(da, _mm512_set1_ps(wd[b * kTile + m]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + m * kTile)), s, acc[m]);
    }
  }
  for (int m = 0; m < kTile; ++m) _mm512_storeu_ps(out + m * kTile, acc[m]);
}

}  // namespace tandem::cpu::amx
