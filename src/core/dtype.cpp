#include "tandem/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "tandem/error.h"

namespace tandem {

namespace {
constexpr DTypeTraits kTraits[kDTypeCount] = {
    {"f32", 1, 4, true, false},
    {"f16", 1, 2, true, false},
    {"bf16", 1, 2, true, false},
    {"i32", 1, 4, false, false},
    {"i8", 1, 1, false, false},
    {"q8_0", kQuantBlock, sizeof(BlockQ8_0), false, true},
    {"q4_0", kQuantBlock, sizeof(BlockQ4_0), false, true},
    {"q4_k", kSuperBlock, sizeof(BlockQ4_K), false, true},
    {"q5_k", kSuperBlock, sizeof(BlockQ5_K), false, true},
    {"q6_k", kSuperBlock, sizeof(BlockQ6_K), false, true},
};

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace

const DTypeTraits& dtype_traits(DType dtype) {
  auto index = size_t(dtype);
  if (index >= size_t(kDTypeCount)) {
    throw_error(ErrorCode::InvalidArgument, "dtype",
                "unknown dtype (" + std::to_string(index) + ")");
  }
  return kTraits[index];
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType d : kAllDTypes) {
    if (dtype_traits(d).name == name) return d;
  }
  return std::nullopt;
}

size_t row_bytes(DType dtype, int64_t n) {
  const auto& t = dtype_traits(dtype);
  if (n < 0 || n % t.block_elements != 0) {
    throw_error(ErrorCode::InvalidArgument, "dtype",
                "row of " + std::to_string(n) + " elements is not a multiple of the " +
                    std::string(t.name) + " block (" + std::to_string(t.block_elements) + ")");
  }
  return size_t(n / t.block_elements) * size_t(t.block_bytes);
}

uint16_t f32_to_f16(float value) {
  uint32_t x = float_bits(value);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u));
  }
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {                                  // subnormal half or zero
    // value * 2^24 rounded to nearest even gives the subnormal mantissa.
    float scaled = bits_float(abs) * 16777216.0f;
    auto m = uint32_t(std::nearbyint(scaled));
    return uint16_t(sign | m);
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return uint16_t(sign | (abs >> 13));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float f = float(mant) * (1.0f / 16777216.0f);  // subnormal: mant * 2^-24
    return sign ? -f : f;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_bf16(float value) {
  uint32_t x = float_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t n) {
  row_bytes(DType::Q8_0, n);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* x = src + b * kQuantBlock;
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = f32_to_f16(d);
    for (int j = 0; j < kQuantBlock; ++j) dst[b].qs[j] = int8_t(std::roundf(x[j] * id));
  }
}

void quantize_row_q4_0(const float* src, BlockQ4_0* dst, int64_t n) {
  row_bytes(DType::Q4_0, n);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* x = src + b * kQuantBlock;
    float amax = 0.0f, max = 0.0f;  // max keeps the sign of the largest magnitude
    for (int j = 0; j < kQuantBlock; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = f32_to_f16(d);
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[j + kQuantBlock / 2] * id;
      const auto q0 = uint8_t(std::min(15, int(int8_t(x0 + 8.5f))));
      const auto q1 = uint8_t(std::min(15, int(int8_t(x1 + 8.5f))));
      dst[b].qs[j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

void dequantize_row_q8_0(const BlockQ8_0* src, float* dst, int64_t n) {
  row_bytes(DType::Q8_0, n);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float d = f16_to_f32(src[b].d);
    for (int j = 0; j < kQuantBlock; ++j) dst[b * kQuantBlock + j] = float(src[b].qs[j]) * d;
  }
}

void dequantize_row_q4_0(const BlockQ4_0* src, float* dst, int64_t n) {
  row_bytes(DType::Q4_0, n);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float d = f16_to_f32(src[b].d);
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      dst[b * kQuantBlock + j] = float((src[b].qs[j] & 0x0f) - 8) * d;
      dst[b * kQuantBlock + j + kQuantBlock / 2] = float((src[b].qs[j] >> 4) - 8) * d;
    }
  }
}

void to_f32(DType dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    case DType::I32:
      for (int64_t i = 0; i < n; ++i) dst[i] = float(static_cast<const int32_t*>(src)[i]);
      return;
    case DType::I8:
      for (int64_t i = 0; i < n; ++i) dst[i] = float(static_cast<const int8_t*>(src)[i]);
      return;
    case DType::Q8_0:
      dequantize_row_q8_0(static_cast<const BlockQ8_0*>(src), dst, n);
      return;
    case DType::Q4_0:
      dequantize_row_q4_0(static_cast<const BlockQ4_0*>(src), dst, n);
      return;
    case DType::Q4_K:
      dequantize_row_q4_K(static_cast<const BlockQ4_K*>(src), dst, n);
      return;
    case DType::Q5_K:
      dequantize_row_q5_K(static_cast<const BlockQ5_K*>(src), dst, n);
      return;
    case DType::Q6_K:
      dequantize_row_q6_K(static_cast<const BlockQ6_K*>(src), dst, n);
      return;
  }
  throw_error(ErrorCode::InvalidArgument, "to_f32", "unknown dtype");
}

void from_f32(DType dtype, const float* src, void* dst, int64_t n) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      return;
    case DType::I32:
      for (int64_t i = 0; i < n; ++i) static_cast<int32_t*>(dst)[i] = int32_t(std::lrintf(src[i]));
      return;
    case DType::I8:
      for (int64_t i = 0; i < n; ++i) {
        static_cast<int8_t*>(dst)[i] = int8_t(std::clamp(std::lrintf(src[i]), -128L, 127L));
      }
      return;
    case DType::Q8_0:
      quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return;
    case DType::Q4_0:
      quantize_row_q4_0(src, static_cast<BlockQ4_0*>(dst), n);
      return;
    case DType::Q4_K:
      quantize_row_q4_K(src, static_cast<BlockQ4_K*>(dst), n);
      return;
    case DType::Q5_K:
      quantize_row_q5_K(src, static_cast<BlockQ5_K*>(dst), n);
      return;
    case DType::Q6_K:
      quantize_row_q6_K(src, static_cast<BlockQ6_K*>(dst), n);
      return;
  }
  throw_error(ErrorCode::InvalidArgument, "from_f32", "unknown dtype");
}

}  // namespace tandem
