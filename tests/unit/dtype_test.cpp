// DType traits, f16/bf16 conversions (rounding, subnormals, inf, nan) and the GGUF block
// formats, bit-exact against blocks computed by hand from ggml's quantize_row_*_ref.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tandem/dtype.h"
#include "test_util.h"

namespace tandem {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// An IEEE half conversion that is not ours (round to nearest even): an independent oracle.
uint16_t oracle_f16(float f) {
  return test::oracle_f32_to_f16(f);
}
// bfloat16 by choosing the nearer of the two truncation neighbours in float64, ties to even.
uint16_t oracle_bf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  const uint32_t u = bits(f);
  const auto lo = uint16_t(u >> 16);
  if ((u & 0xffffu) == 0) return lo;
  const auto hi = uint16_t(lo + 1);
  auto value = [](uint16_t b) {
    if ((b & 0x7fffu) == 0x7f80u) return std::ldexp(b & 0x8000u ? -1.0 : 1.0, 128);
    return double(bf16_to_f32(b));
  };
  const double dl = std::fabs(double(f) - value(lo)), dh = std::fabs(value(hi) - double(f));
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1u) ? hi : lo;
}

TEST(DType, TraitsAndNames) {
  EXPECT_EQ(dtype_name(DType::F32), "f32");
  EXPECT_EQ(dtype_name(DType::Q4_0), "q4_0");
  for (DType d : kAllDTypes) EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  EXPECT_EQ(dtype_from_name("q5_1"), std::nullopt);
  EXPECT_EQ(dtype_name(DType::Q4_K), "q4_k");
  EXPECT_EQ(dtype_traits(DType::Q4_K).block_elements, 256);
  EXPECT_EQ(dtype_traits(DType::Q4_K).block_bytes, 144);
  EXPECT_EQ(dtype_traits(DType::Q5_K).block_bytes, 176);
  EXPECT_EQ(dtype_traits(DType::Q6_K).block_bytes, 210);
  EXPECT_TRUE(dtype_traits(DType::Q6_K).is_quantized);
  EXPECT_EQ(dtype_traits(DType::Q8_0).block_elements, 32);
  EXPECT_EQ(dtype_traits(DType::Q8_0).block_bytes, 34);
  EXPECT_EQ(dtype_traits(DType::Q4_0).block_bytes, 18);
  EXPECT_TRUE(dtype_traits(DType::BF16).is_float);
  EXPECT_FALSE(dtype_traits(DType::I8).is_float);
  EXPECT_TRUE(dtype_traits(DType::Q4_0).is_quantized);
  test::expect_error([] { dtype_traits(DType(99)); }, ErrorCode::InvalidArgument, "dtype",
                     {"unknown dtype (99)"});
}

TEST(DType, RowBytes) {
  EXPECT_EQ(row_bytes(DType::F32, 3), 12u);
  EXPECT_EQ(row_bytes(DType::F16, 3), 6u);
  EXPECT_EQ(row_bytes(DType::I8, 5), 5u);
  EXPECT_EQ(row_bytes(DType::Q8_0, 64), 68u);
  EXPECT_EQ(row_bytes(DType::Q4_0, 4096), 4096u / 32 * 18);
  test::expect_error([] { row_bytes(DType::Q8_0, 33); }, ErrorCode::InvalidArgument, "dtype",
                     {"row of 33 elements", "q8_0 block (32)"});
  test::expect_error([] { row_bytes(DType::F32, -1); }, ErrorCode::InvalidArgument, "dtype",
                     {"-1"});
}

TEST(F16, KnownValues) {
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(0.5f), 0x3800);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);                        // largest half
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);  // just below the tie
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                        // tie rounds to inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);                           // overflow
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);         // tie to even: 0
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);         // tie to even: 2
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);         // underflow
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.0f, -24)), 0x03ff);      // largest subnormal
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie, even below
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie, even above
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  const uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);

  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x83ff), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
}

TEST(F16, EveryHalfRoundTripsAndMatchesTheCompiler) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    const float oh = test::oracle_f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(oh));
      EXPECT_EQ(f32_to_f16(f) & 0x7c00, 0x7c00);
      EXPECT_NE(f32_to_f16(f) & 0x3ff, 0);
      continue;
    }
    ASSERT_EQ(bits(f), bits(oh)) << std::hex << h;
    ASSERT_EQ(uint32_t(f32_to_f16(f)), h) << std::hex << h;
  }
}

TEST(F16, TiesAndNeighboursRoundToNearestEven) {
  // Every midpoint between adjacent finite halves, and the floats right beside it.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const double lo = f16_to_f32(uint16_t(h)), hi = f16_to_f32(uint16_t(h + 1));
    const auto mid = float((lo + hi) / 2);  // exact in float
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid}) {
      ASSERT_EQ(f32_to_f16(f), oracle_f16(f)) << f;
    }
    ASSERT_EQ(uint32_t(f32_to_f16(mid)), (h & 1) ? h + 1 : h) << mid;
  }
}

TEST(F16, RandomBitPatternsMatchTheCompiler) {
  std::mt19937_64 rng(test::test_seed());
  for (int i = 0; i < 2000000; ++i) {
    const float f = from_bits(uint32_t(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), oracle_f16(f)) << std::hexfloat << f << " seed " << test::test_seed();
  }
}

TEST(BF16, KnownValues) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie, even below
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);  // tie, even above
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);    // subnormal tie to even
  const uint16_t nan = f32_to_bf16(from_bits(0x7f800001));  // a signalling nan stays nan
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc049), -3.140625f);
}

TEST(BF16, RandomBitPatternsMatchAnIndependentRounding) {
  std::mt19937_64 rng(test::test_seed());
  for (int i = 0; i < 2000000; ++i) {
    const float f = from_bits(uint32_t(rng()));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_bf16(f), oracle_bf16(f)) << std::hexfloat << f;
  }
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_f32(uint16_t(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(uint32_t(f32_to_bf16(f)), b);
    }
  }
}

// Block 1: amax 127, so d = 1 and q = roundf(x) (ties away from zero).
// Block 2: amax 63.5, so d = 0.5, id = 2 (every product exact).
TEST(Q8_0, QuantizesBitExactToHandComputedBlocks) {
  std::vector<float> x{127, -127, 2.5, -2.5, 0.5, -0.5, 1.49f, 0,  -12, -11, -10,
                       -9,  -8,   -7,  -6,   -5,  -4,   -3,    -2, -1,  0,   1,
                       2,   3,    4,   5,    6,   7,    8,     9,  10,  11};
  const int8_t q1[32] = {127, -127, 3,  -3, 1, -1, 1, 0, -12, -11, -10, -9, -8, -7, -6, -5,
                         -4,  -3,   -2, -1, 0, 1,  2, 3, 4,   5,   6,   7,  8,  9,  10, 11};
  x.push_back(-63.5f);
  for (int j = 1; j < 32; ++j) x.push_back(float(j - 16) * 0.625f);
  const int8_t q2[32] = {-127, -19, -18, -16, -15, -14, -13, -11, -10, -9, -8, -6, -5, -4, -3, -1,
                         0,    1,   3,   4,   5,   6,   8,   9,   10,  11, 13, 14, 15, 16, 18, 19};
  BlockQ8_0 blocks[2];
  quantize_row_q8_0(x.data(), blocks, 64);
  EXPECT_EQ(blocks[0].d, 0x3c00);  // 1.0
  EXPECT_EQ(blocks[1].d, 0x3800);  // 0.5
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(blocks[0].qs[j], q1[j]) << j;
    EXPECT_EQ(blocks[1].qs[j], q2[j]) << j;
  }
  // GGUF byte layout: little-endian half scale, then 32 signed bytes.
  uint8_t raw[68];
  std::memcpy(raw, blocks, sizeof raw);
  EXPECT_EQ(raw[0], 0x00);
  EXPECT_EQ(raw[1], 0x3c);
  EXPECT_EQ(raw[2], 127);
  EXPECT_EQ(raw[3], 0x81);  // -127
  EXPECT_EQ(raw[34], 0x00);
  EXPECT_EQ(raw[35], 0x38);

  std::vector<float> back(64);
  dequantize_row_q8_0(blocks, back.data(), 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(back[size_t(j)], float(q1[j]));
    EXPECT_EQ(back[size_t(32 + j)], float(q2[j]) * 0.5f);
  }
}

TEST(Q8_0, AllZeroBlockHasZeroScale) {
  std::vector<float> x(32, 0.0f);
  BlockQ8_0 b;
  quantize_row_q8_0(x.data(), &b, 32);
  EXPECT_EQ(b.d, 0);
  for (int8_t q : b.qs) EXPECT_EQ(q, 0);
}

// Block 1: the largest magnitude is -8, so d = -8 / -8 = 1, q = min(15, trunc(x + 8.5)).
// Block 2: the largest magnitude is +4, so d = -0.5 and id = -2 (the sign flips).
// Block 3: all zeros: d = -0 (0 / -8) and every quant is 8.
TEST(Q4_0, QuantizesBitExactToHandComputedBlocks) {
  std::vector<float> x{-0.5f, 0.5f,   -0.6f, 3.25f, -3.5f, -8,     7,    7.9f,  0,     1,     2,
                       3,     -1,     -2,    -3,    -4,    4,      5,    6,     -5,    -6,    -7,
                       0.25f, -0.25f, 1.5f,  -1.5f, 2.75f, -2.75f, 6.5f, -6.5f, 0.75f, -0.75f};
  const uint8_t b1[16] = {0xc8, 0xd9, 0xe7, 0x3b, 0x25, 0x10, 0x8f, 0x8f,
                          0xa8, 0x79, 0xba, 0x5b, 0xf7, 0x26, 0x95, 0x74};
  const float half2[16] = {4, -4, 1,    -1.25f, 0.5f,  -0.5f,  2,     -2,
                           3, -3, 3.5f, -3.5f,  0.25f, -0.25f, 1.75f, -1.75f};
  for (float v : half2) x.push_back(v);
  x.push_back(3.9f);
  for (int j = 1; j < 16; ++j) x.push_back(half2[j]);
  const uint8_t b2[16] = {0x00, 0xff, 0x66, 0xbb, 0x77, 0x99, 0x44, 0xcc,
                          0x22, 0xee, 0x11, 0xff, 0x88, 0x99, 0x55, 0xcc};
  for (int j = 0; j < 32; ++j) x.push_back(0.0f);

  BlockQ4_0 blocks[3];
  quantize_row_q4_0(x.data(), blocks, 96);
  EXPECT_EQ(blocks[0].d, 0x3c00);  // 1.0
  EXPECT_EQ(blocks[1].d, 0xb800);  // -0.5
  EXPECT_EQ(blocks[2].d, 0x8000);  // 0 / -8 is -0 in ggml too
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(blocks[0].qs[j], b1[j]) << j;
    EXPECT_EQ(blocks[1].qs[j], b2[j]) << j;
    EXPECT_EQ(blocks[2].qs[j], 0x88) << j;
  }
  uint8_t raw[54];
  std::memcpy(raw, blocks, sizeof raw);
  EXPECT_EQ(raw[0], 0x00);
  EXPECT_EQ(raw[1], 0x3c);
  EXPECT_EQ(raw[2], 0xc8);  // element 0 in the low nibble, element 16 in the high one
  EXPECT_EQ(raw[19], 0xb8);

  std::vector<float> back(96);
  dequantize_row_q4_0(blocks, back.data(), 96);
  EXPECT_EQ(back[0], 0.0f);    // q 8 -> 0
  EXPECT_EQ(back[5], -8.0f);   // q 0 -> -8
  EXPECT_EQ(back[7], 7.0f);    // 7.9 clamps to q 15 -> 7
  EXPECT_EQ(back[16], 4.0f);   // q 12
  EXPECT_EQ(back[32], 4.0f);   // block 2: q 0 -> -8 * -0.5
  EXPECT_EQ(back[33], -3.5f);  // -4 clamps to q 15 -> 7 * -0.5
  EXPECT_EQ(back[48], 4.0f);   // 3.9 -> q 0
  for (int j = 64; j < 96; ++j) EXPECT_EQ(back[size_t(j)], 0.0f);
}

// K-quant super-blocks built so that every step of ggml's search is exact: sub-block j holds
// scale_j * q - min_j for quants q covering the whole range, with scale_j = k_j * 2^-6 and
// min_j = m_j * 2^-5, so the largest (k 63, m 63) fix d = 2^-6 and dmin = 2^-5 and each sub-block's
// 6-bit scale and min are k_j and m_j.
constexpr int kK[8] = {63, 1, 2, 4, 8, 16, 32, 48};
constexpr int kM[8] = {0, 63, 5, 17, 33, 40, 1, 62};
// k and m packed by hand: j < 4 in bytes j and j + 4, j >= 4 split over byte j + 4's nibbles and
// the top two bits of bytes j - 4 (k) and j (m).
constexpr uint8_t kPackedScales[12] = {0x3F, 0x41, 0x82, 0xC4, 0x80, 0xBF,
                                       0x05, 0xD1, 0x18, 0x80, 0x10, 0xE0};

std::vector<float> k_quant_super_block(int nmax, std::vector<int>& q) {
  std::vector<float> x(256);
  q.resize(256);
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l) {
      q[size_t(32 * j + l)] = (7 * l + j) % (nmax + 1);  // every quant 0..nmax appears
      x[size_t(32 * j + l)] =
          float(kK[j]) * 0x1p-6f * float(q[size_t(32 * j + l)]) - float(kM[j]) * 0x1p-5f;
    }
  return x;
}

TEST(Q4_K, QuantizesBitExactToHandBuiltSuperBlock) {
  std::vector<int> q;
  const std::vector<float> x = k_quant_super_block(15, q);
  BlockQ4_K b;
  quantize_row_q4_K(x.data(), &b, 256);
  EXPECT_EQ(b.d, 0x2400);     // 2^-6
  EXPECT_EQ(b.dmin, 0x2800);  // 2^-5
  for (int i = 0; i < 12; ++i) EXPECT_EQ(b.scales[i], kPackedScales[i]) << i;
  // 32 bytes per pair of sub-blocks: the even one in the low nibbles.
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      EXPECT_EQ(b.qs[32 * c + l], q[size_t(64 * c + l)] | (q[size_t(64 * c + 32 + l)] << 4));
    }
  uint8_t raw[144];
  std::memcpy(raw, &b, sizeof raw);
  EXPECT_EQ(raw[0], 0x00);  // d, little-endian, then dmin, scales, quants
  EXPECT_EQ(raw[1], 0x24);
  EXPECT_EQ(raw[3], 0x28);
  EXPECT_EQ(raw[4], 0x3F);
  EXPECT_EQ(raw[16], 0x10);  // element 0 (q 0) low, element 32 (q 1) high
  std::vector<float> back(256);
  dequantize_row_q4_K(&b, back.data(), 256);
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(back[i], x[i]) << i;
}

TEST(Q5_K, QuantizesBitExactToHandBuiltSuperBlock) {
  std::vector<int> q;
  const std::vector<float> x = k_quant_super_block(31, q);
  BlockQ5_K b;
  quantize_row_q5_K(x.data(), &b, 256);
  EXPECT_EQ(b.d, 0x2400);
  EXPECT_EQ(b.dmin, 0x2800);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(b.scales[i], kPackedScales[i]) << i;
  for (int l = 0; l < 32; ++l) {
    int qh = 0;
    for (int j = 0; j < 8; ++j)
      qh |= (q[size_t(32 * j + l)] >> 4) << j;  // fifth bit of sub-block j
    EXPECT_EQ(b.qh[l], qh) << l;
  }
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      EXPECT_EQ(b.qs[32 * c + l],
                (q[size_t(64 * c + l)] & 15) | ((q[size_t(64 * c + 32 + l)] & 15) << 4));
    }
  uint8_t raw[176];
  std::memcpy(raw, &b, sizeof raw);
  EXPECT_EQ(raw[16], 0x00);  // qh[0]: element 0 of sub-block j is q j, never 16 or more
  EXPECT_EQ(raw[18], 0xFC);  // qh[2]: q 14 + j, so sub-blocks 2..7 reach 16
  EXPECT_EQ(raw[19], 0xFF);  // qh[3]: q 21 + j
  std::vector<float> back(256);
  dequantize_row_q5_K(&b, back.data(), 256);
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(back[i], x[i]) << i;
}

// Q6_K: sub-block j of 16 holds s_j * q with q in [-32, 31] (each sub-block reaches -32, so the
// symmetric search lands on s_j) and s_j = c_j * 2^-9. ggml scales the largest (c 128) to -128, so
// d = -2^-9 and every stored scale is -c_j.
TEST(Q6_K, QuantizesBitExactToHandBuiltSuperBlock) {
  constexpr int kC[16] = {128, 64, 96, 1, 17, 100, 127, 2, 50, 33, 77, 5, 120, 64, 3, 90};
  std::vector<float> x(256);
  std::vector<int> q(256);
  for (int j = 0; j < 16; ++j)
    for (int l = 0; l < 16; ++l) {
      const int v = l == 0 ? -32 : (5 * l + 3 * j) % 64 - 32;
      q[size_t(16 * j + l)] = v;
      x[size_t(16 * j + l)] = float(kC[j]) * 0x1p-9f * float(v);
    }
  BlockQ6_K b;
  quantize_row_q6_K(x.data(), &b, 256);
  EXPECT_EQ(b.d, 0x9800);  // -2^-9
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.scales[j], -kC[j]) << j;
  // Per half of 128: element 32k + l keeps its low nibble in ql[l + 32 (k & 1)] (high nibble for
  // k >= 2) and its top two bits at bit 2k of qh[l].
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      auto u = [&](int k) { return q[size_t(128 * h + 32 * k + l)] + 32; };
      EXPECT_EQ(b.ql[64 * h + l], (u(0) & 15) | ((u(2) & 15) << 4));
      EXPECT_EQ(b.ql[64 * h + 32 + l], (u(1) & 15) | ((u(3) & 15) << 4));
      EXPECT_EQ(b.qh[32 * h + l],
                (u(0) >> 4) | ((u(1) >> 4) << 2) | ((u(2) >> 4) << 4) | ((u(3) >> 4) << 6));
    }
  uint8_t raw[210];
  std::memcpy(raw, &b, sizeof raw);
  EXPECT_EQ(raw[0], 0x00);    // element 0 (q -32 -> 0) and element 64 (q -32 -> 0)
  EXPECT_EQ(raw[192], 0x80);  // scale 0: -128
  EXPECT_EQ(raw[208], 0x00);  // d last
  EXPECT_EQ(raw[209], 0x98);
  std::vector<float> back(256);
  dequantize_row_q6_K(&b, back.data(), 256);
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(back[i], x[i]) << i;
}

TEST(KQuants, AllZeroSuperBlocksAreAllZeroBytes) {
  const std::vector<float> x(256, 0.0f);
  for (DType d : kKQuantDTypes) {
    std::vector<uint8_t> buf(row_bytes(d, 256), 0xAB);
    from_f32(d, x.data(), buf.data(), 256);
    for (size_t i = 0; i < buf.size(); ++i) EXPECT_EQ(buf[i], 0) << dtype_name(d) << " byte " << i;
    std::vector<float> y(256, 1.0f);
    to_f32(d, buf.data(), y.data(), 256);
    for (float v : y) EXPECT_EQ(v, 0.0f);
  }
}

// Random rows: each format's error over uniform [-1, 1] data stays near its rounding noise,
// finer with every bit (Q4_K ~ Q4_0's step with a fitted min, Q5_K half of it, Q6_K a quarter).
TEST(KQuants, RoundTripErrorBounds) {
  std::mt19937_64 rng(test::test_seed());
  const int64_t n = 256 * 64;
  const std::vector<float> x = test::random_values(size_t(n), rng);
  double s = 0;
  for (float v : x) s += double(v) * double(v);
  double previous = 1.0;
  for (DType d : kKQuantDTypes) {
    std::vector<uint8_t> buf(row_bytes(d, n));
    std::vector<float> y(static_cast<size_t>(n));
    from_f32(d, x.data(), buf.data(), n);
    to_f32(d, buf.data(), y.data(), n);
    double e = 0;
    for (size_t i = 0; i < x.size(); ++i) e += double(x[i] - y[i]) * double(x[i] - y[i]);
    const double nmse = e / s;
    EXPECT_LT(nmse, 3.0 * 3.0 / (8.0 * 8.0 * 12.0)) << dtype_name(d);
    EXPECT_LT(nmse, previous / 2.5) << dtype_name(d) << ": no better than the format below";
    previous = nmse;
  }
}

TEST(Quantize, RejectsPartialBlocks) {
  std::vector<float> x(48, 1.0f);
  std::vector<BlockQ8_0> q8(2);
  std::vector<BlockQ4_0> q4(2);
  test::expect_error([&] { quantize_row_q8_0(x.data(), q8.data(), 48); },
                     ErrorCode::InvalidArgument, "dtype", {"48"});
  test::expect_error([&] { quantize_row_q4_0(x.data(), q4.data(), 33); },
                     ErrorCode::InvalidArgument, "dtype", {"33"});
  test::expect_error([&] { from_f32(DType::Q8_0, x.data(), q8.data(), 31); },
                     ErrorCode::InvalidArgument, "dtype", {"31"});
  std::vector<BlockQ4_K> q4k(1);
  test::expect_error([&] { quantize_row_q4_K(x.data(), q4k.data(), 32); },
                     ErrorCode::InvalidArgument, "dtype",
                     {"row of 32 elements", "q4_k block (256)"});
}

// Per element: q8_0 is within half a step plus the half-precision scale's error; q4_0 within
// one step (the +8 clamp). Over random rows the NMSE matches the uniform-noise estimate.
TEST(Quantize, RoundTripErrorBounds) {
  std::mt19937_64 rng(test::test_seed());
  const int64_t n = 32 * 512;
  const std::vector<float> x = test::random_values(size_t(n), rng);
  std::vector<BlockQ8_0> q8(static_cast<size_t>(n / 32));
  std::vector<BlockQ4_0> q4(static_cast<size_t>(n / 32));
  std::vector<float> y8(static_cast<size_t>(n)), y4(static_cast<size_t>(n));
  from_f32(DType::Q8_0, x.data(), q8.data(), n);
  from_f32(DType::Q4_0, x.data(), q4.data(), n);
  to_f32(DType::Q8_0, q8.data(), y8.data(), n);
  to_f32(DType::Q4_0, q4.data(), y4.data(), n);
  double e8 = 0, e4 = 0, s = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(b * 32 + j)]));
    for (int j = 0; j < 32; ++j) {
      const size_t i = size_t(b * 32 + j);
      ASSERT_LE(std::fabs(x[i] - y8[i]), 0.57f * amax / 127.0f) << i;
      ASSERT_LE(std::fabs(x[i] - y4[i]), 1.01f * amax / 8.0f) << i;
      e8 += double(x[i] - y8[i]) * double(x[i] - y8[i]);
      e4 += double(x[i] - y4[i]) * double(x[i] - y4[i]);
      s += double(x[i]) * double(x[i]);
    }
  }
  // Uniform rounding noise: step^2 / 12 over E[x^2] = 1/3 with step ~ 1/127 and ~ 1/8.
  EXPECT_LT(e8 / s, 3.0 * 3.0 / (127.0 * 127.0 * 12.0)) << "seed " << test::test_seed();
  EXPECT_GT(e8 / s, 0.3 * 3.0 / (127.0 * 127.0 * 12.0));
  EXPECT_LT(e4 / s, 3.0 * 3.0 / (8.0 * 8.0 * 12.0));
  EXPECT_GT(e4 / s, 0.3 * 3.0 / (8.0 * 8.0 * 12.0));
}

TEST(Convert, ToAndFromF32ForEveryDType) {
  const std::vector<float> x{1.0f, -2.5f, 3.75f, -0.125f};
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    std::vector<uint8_t> buf(row_bytes(d, 4));
    std::vector<float> y(4);
    from_f32(d, x.data(), buf.data(), 4);
    to_f32(d, buf.data(), y.data(), 4);
    EXPECT_EQ(y, x) << dtype_name(d);  // all exactly representable
  }
  const std::vector<float> ints{1.4f, -2.6f, 300.0f, -300.0f};
  std::vector<int32_t> i32(4);
  from_f32(DType::I32, ints.data(), i32.data(), 4);
  EXPECT_EQ(i32, (std::vector<int32_t>{1, -3, 300, -300}));
  std::vector<int8_t> i8(4);
  from_f32(DType::I8, ints.data(), i8.data(), 4);
  EXPECT_EQ(i8, (std::vector<int8_t>{1, -3, 127, -128}));  // saturates
  std::vector<float> back(4);
  to_f32(DType::I8, i8.data(), back.data(), 4);
  EXPECT_EQ(back, (std::vector<float>{1, -3, 127, -128}));
  to_f32(DType::I32, i32.data(), back.data(), 4);
  EXPECT_EQ(back, (std::vector<float>{1, -3, 300, -300}));
}

}  // namespace
}  // namespace tandem
