// GGUF's block-quantized formats in their exact byte layout. Only <cstdint>: the per-ISA kernel
// files include it and must not instantiate std templates (see src/backends/cpu/isa_body.inc).
#pragma once

#include <cstdint>

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

}  // namespace tandem
