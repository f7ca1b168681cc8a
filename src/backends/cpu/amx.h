// AMX int8 tiles for the matrix-matrix quantized product (prefill): weights unpacked to int8
// panels of 16 rows, activations packed to the tile's 4-byte-interleaved layout, one
// TDPBSSD per 32-element block and 16x16 outputs, scaled in float after each block.
// Only isa_amx.cpp is compiled with AMX flags; call these only when amx_usable().
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::cpu::amx {

inline constexpr int kTile = 16;  // rows and columns of one output tile

// True when the CPU has AMX-INT8 and the OS granted the tile state.
bool amx_usable();

// Unpacks up to 16 weight rows (GGUF Q4_0 or Q8_0, nb blocks each, rows w_row_bytes apart)
// into wp[nb][16][32] int8 (Q4_0 as q - 8) and their scales into wd[nb][16]; missing rows 0.
void pack_weights(bool q4, const uint8_t* w, size_t w_row_bytes, int rows, int64_t nb, int8_t* wp,
                  float* wd);

// Packs up to 16 quantized activation columns (quants qs[c * k ...], scales d[c * nb ...]) into
// bp[nb][8][64] (column n's 4 bytes of each k-quad side by side) and dap[nb][16].
void pack_activations(const int8_t* qs, const float* d, int cols, int64_t k, int8_t* bp,
                      float* dap);

// out[m * 16 + n] = sum over blocks of wd * dap * (int8 dot of row m and column n).
// The calling thread must have called configure_tiles().
void tile_product(const int8_t* wp, const float* wd, const int8_t* bp, const float* dap, int64_t nb,
                  float* out);

void configure_tiles();  // per thread, before tile_product
void release_tiles();

}  // namespace tandem::cpu::amx
