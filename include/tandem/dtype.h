// Element types, including GGUF's block-quantized formats in their exact byte layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "tandem/blocks.h"

namespace tandem {

enum class DType : uint8_t { F32, F16, BF16, I32, I8, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K };
inline constexpr int kDTypeCount = 10;
inline constexpr DType kAllDTypes[kDTypeCount] = {
    DType::F32,  DType::F16,  DType::BF16, DType::I32,  DType::I8,
    DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};
// The K-quants (256-element super-blocks), which every backend lists apart from the 32-element
// formats: their rows reach fewer ops.
inline constexpr DType kKQuantDTypes[] = {DType::Q4_K, DType::Q5_K, DType::Q6_K};
inline constexpr bool is_k_quant(DType d) {
  return d == DType::Q4_K || d == DType::Q5_K || d == DType::Q6_K;
}

struct DTypeTraits {
  std::string_view name;
  int64_t block_elements;  // elements per block (1 for plain types)
  int64_t block_bytes;     // bytes per block
  bool is_float;           // F32, F16, BF16
  bool is_quantized;       // Q8_0, Q4_0 and the K-quants
};

const DTypeTraits& dtype_traits(DType dtype);
inline std::string_view dtype_name(DType dtype) {
  return dtype_traits(dtype).name;
}
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of a row of n elements; throws InvalidArgument unless n is a multiple of the block.
size_t row_bytes(DType dtype, int64_t n);

// A product of quantized weights with fewer than this many outputs per matrix (M x N) multiplies
// f32 activations, not 8-bit ones: with 8-bit activations one dot product of 32 terms carries
// ~0.4% relative error, which a handful of outputs does not average out (a 1x1 product missed the
// conformance bound in ~10% of random draws). Such products cost nothing; every backend agrees.
inline constexpr int64_t kMinOutputsForInt8Activations = 16;
// Whether an M x N product of quantized weights may round its activations to 8 bits.
inline constexpr bool int8_activations(int64_t M, int64_t N) {
  return M * N >= kMinOutputsForInt8Activations;
}

// IEEE half and bfloat16 conversions (round to nearest even).
uint16_t f32_to_f16(float value);
float f16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float value);
inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

// Reference quantization, bit-compatible with ggml's quantize_row_q8_0_ref / q4_0_ref.
// n must be a multiple of kQuantBlock.
void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t n);
void quantize_row_q4_0(const float* src, BlockQ4_0* dst, int64_t n);
void dequantize_row_q8_0(const BlockQ8_0* src, float* dst, int64_t n);
void dequantize_row_q4_0(const BlockQ4_0* src, float* dst, int64_t n);

// Reference K-quantization, bit-compatible with ggml's quantize_row_q4_K_ref / q5_K_ref /
// q6_K_ref (make_qkx2_quants / make_qx_quants, no importance matrix). n must be a multiple of
// kSuperBlock.
void quantize_row_q4_K(const float* src, BlockQ4_K* dst, int64_t n);
void quantize_row_q5_K(const float* src, BlockQ5_K* dst, int64_t n);
void quantize_row_q6_K(const float* src, BlockQ6_K* dst, int64_t n);
void dequantize_row_q4_K(const BlockQ4_K* src, float* dst, int64_t n);
void dequantize_row_q5_K(const BlockQ5_K* src, float* dst, int64_t n);
void dequantize_row_q6_K(const BlockQ6_K* src, float* dst, int64_t n);

// Converts n elements of any dtype to float32 and back (quantized: n a multiple of the block).
void to_f32(DType dtype, const void* src, float* dst, int64_t n);
void from_f32(DType dtype, const float* src, void* dst, int64_t n);

}  // namespace tandem
