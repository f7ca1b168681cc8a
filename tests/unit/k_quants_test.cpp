// K-quants (Q4_K, Q5_K, Q6_K) against ggml's reference quantizers: edge cases whose bytes are
// worked out here by hand, and digests of ggml's own output over rows of every kind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tandem/dtype.h"

namespace tandem {
namespace {

// Portable test rows (no <random> distributions, whose output differs between standard libraries):
// xorshift32 draws turned into floats by exact integer arithmetic.
struct RowSource {
  uint32_t state;
  uint32_t next() {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  }
  float uniform() { return float(int32_t(next()) >> 8) * 0x1p-23f; }  // [-1, 1), exact
};

enum class RowKind { Uniform, Scaled, NegativeOnly, PositiveOnly, Outlier, Sparse, Grid, Mixed };
constexpr RowKind kRowKinds[] = {RowKind::Uniform,      RowKind::Scaled,  RowKind::NegativeOnly,
                                 RowKind::PositiveOnly, RowKind::Outlier, RowKind::Sparse,
                                 RowKind::Grid,         RowKind::Mixed};

// n_super super-blocks of one kind: Scaled spans 2^-20..2^11 per super-block, Outlier has one
// value 2^6 times the rest per super-block, Grid puts many values on rounding ties, Mixed gives
// each 16-element group its own magnitude.
std::vector<float> test_row(RowKind kind, int n_super, uint32_t seed) {
  RowSource src{seed};
  std::vector<float> x(size_t(n_super) * 256);
  for (int s = 0; s < n_super; ++s) {
    const float scale = std::ldexp(1.0f, int(src.next() % 32) - 20);
    float* xs = x.data() + size_t(s) * 256;
    for (int i = 0; i < 256; ++i) {
      const float u = src.uniform();
      switch (kind) {
        case RowKind::Uniform:
          xs[i] = u;
          break;
        case RowKind::Scaled:
          xs[i] = u * scale;
          break;
        case RowKind::NegativeOnly:
          xs[i] = -std::fabs(u) * scale;
          break;
        case RowKind::PositiveOnly:
          xs[i] = std::fabs(u) * scale;
          break;
        case RowKind::Outlier:
          xs[i] = u;
          break;
        case RowKind::Sparse:
          xs[i] = src.next() % 8 == 0 ? u : 0.0f;
          break;
        case RowKind::Grid:
          xs[i] = float(int(src.next() % 33) - 16) * 0.125f;
          break;
        case RowKind::Mixed:
          xs[i] = u * std::ldexp(1.0f, i / 16 - 8);
          break;
      }
    }
    if (kind == RowKind::Outlier) xs[src.next() % 256] = src.next() % 2 ? 64.0f : -64.0f;
  }
  return x;
}

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// FNV-1a of the bytes ggml's quantize_row_q4_K_ref / q5_K_ref / q6_K_ref write for test_row(kind,
// 64, 0x9E3779B9 + kind index). Taken on 2026-11-26 (x86-64) from libggml-base.so as shipped
// in node-llama-cpp 3.21.1's linux-x64 prebuilt, called directly; a bit that differs anywhere in
// the 64 super-blocks changes the digest.
struct GgmlDigests {
  RowKind kind;
  uint64_t q4_k, q5_k, q6_k;
};
constexpr GgmlDigests kGgmlDigests[] = {
    {RowKind::Uniform, 0xab579218964358c0ull, 0x05a250ada312683dull, 0xdc211288be871847ull},
    {RowKind::Scaled, 0xcf5d85369a497742ull, 0x34b8a8c3843cd62bull, 0xcfcba1713d0bd56full},
    {RowKind::NegativeOnly, 0x1cc3a4dfe0fd2927ull, 0x017b6adc8363c20cull, 0x0ede10dc6de32b4full},
    {RowKind::PositiveOnly, 0x6984a958e9be484aull, 0x81851410f9092268ull, 0x6f243ea59c65ac23ull},
    {RowKind::Outlier, 0xbf2826edb131ab9full, 0x39265adb15bb14d9ull, 0xc13d6249444a7f33ull},
    {RowKind::Sparse, 0xa323e8e457f44aa0ull, 0x9172c1aed7e5a3a7ull, 0xffa0af57af4ddfc9ull},
    {RowKind::Grid, 0xd12013257e688feaull, 0x1f9d8043d614ff12ull, 0xe2558c8b2969d66eull},
    {RowKind::Mixed, 0x6b7ac2c038950e99ull, 0x37cd0e3b4fa5ee54ull, 0xf9e27e53063f6054ull},
};

std::vector<uint8_t> quantize(DType d, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_bytes(d, int64_t(x.size())));
  from_f32(d, x.data(), q.data(), int64_t(x.size()));
  return q;
}

std::vector<float> dequantize(DType d, const std::vector<uint8_t>& q, size_t n) {
  std::vector<float> y(n);
  to_f32(d, q.data(), y.data(), int64_t(n));
  return y;
}

TEST(KQuantsGgml, EveryRowKindMatchesGgmlsDigest) {
  for (size_t k = 0; k < std::size(kGgmlDigests); ++k) {
    const GgmlDigests& g = kGgmlDigests[k];
    ASSERT_EQ(g.kind, kRowKinds[k]);
    const std::vector<float> x = test_row(g.kind, 64, 0x9E3779B9u + uint32_t(k));
    const uint64_t want[3] = {g.q4_k, g.q5_k, g.q6_k};
    for (int f = 0; f < 3; ++f) {
      const DType d = kKQuantDTypes[f];
      const std::vector<uint8_t> q = quantize(d, x);
      EXPECT_EQ(fnv1a(q.data(), q.size()), want[f]) << dtype_name(d) << ", row kind " << k;
    }
  }
}

// Round trip over every row kind: finite, and the error within 3x (9x in the sum of squares) of
// each format's rounding noise over [-1, 1]. Outlier rows are bound by their outlier's group
// instead: it spans [-1, 64] (Q6_K: [-64, 64] symmetric), so its step is ~65 / 15, 65 / 31, 2.
TEST(KQuantsGgml, RoundTripErrorPerRowKind) {
  struct Format {
    int levels, group;  // quant levels
    double step;        // of a group with the outlier
  };
  const Format formats[3] = {{16, 32, 65.0 / 15.0}, {32, 32, 65.0 / 31.0}, {64, 16, 2.0}};
  for (size_t k = 0; k < std::size(kRowKinds); ++k) {
    const std::vector<float> x = test_row(kRowKinds[k], 16, 7u + uint32_t(k));
    double s = 0;
    for (float v : x) s += double(v) * double(v);
    for (int f = 0; f < 3; ++f) {
      const DType d = kKQuantDTypes[f];
      const Format& fm = formats[f];
      const double step = 2.0 / (fm.levels - 1);
      double bound = 9.0 * step * step / 12.0 / (1.0 / 3.0);  // over the mean square of [-1, 1]
      if (kRowKinds[k] == RowKind::Outlier) {
        const double per_super = double(fm.group - 1) * fm.step * fm.step / 12.0;
        bound = 9.0 * per_super / (64.0 * 64.0 + 255.0 / 3.0);
      }
      const std::vector<float> y = dequantize(d, quantize(d, x), x.size());
      double e = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << dtype_name(d) << " kind " << k << " element " << i;
        e += double(x[i] - y[i]) * double(x[i] - y[i]);
      }
      EXPECT_LT(e / s, bound) << dtype_name(d) << ", row kind " << k;
    }
  }
}

// The packed 12 scale bytes of Q4_K/Q5_K when every sub-block has 6-bit scale ls and min lm.
std::vector<uint8_t> packed_uniform_scales(int ls, int lm) {
  std::vector<uint8_t> p(12);
  for (int j = 0; j < 4; ++j) {
    p[size_t(j)] = uint8_t(ls | ((ls >> 4) << 6));      // sub-block j, plus j + 4's top bits
    p[size_t(j + 4)] = uint8_t(lm | ((lm >> 4) << 6));  // min j, plus min j + 4's top bits
    p[size_t(j + 8)] = uint8_t((ls & 15) | ((lm & 15) << 4));
  }
  return p;
}

// A constant negative row: each sub-block's search sees max == min, so its scale is 0 and its
// min is -c; ggml then stores d = 0, every 6-bit min 63 with dmin = |c| / 63, quants 0 (the
// requantization skips sub-blocks of scale 0). With c = -63 * 2^-6 all of it is exact.
TEST(KQuantsGgml, ConstantNegativeRowIsAllMin) {
  const std::vector<float> x(256, -63.0f * 0x1p-6f);
  for (DType d : {DType::Q4_K, DType::Q5_K}) {
    const std::vector<uint8_t> q = quantize(d, x);
    EXPECT_EQ(q[0] | (q[1] << 8), 0x0000) << dtype_name(d);  // d
    EXPECT_EQ(q[2] | (q[3] << 8), 0x2400) << dtype_name(d);  // dmin 2^-6
    const std::vector<uint8_t> want = packed_uniform_scales(0, 63);
    for (size_t i = 0; i < 12; ++i) EXPECT_EQ(q[4 + i], want[i]) << dtype_name(d) << " " << i;
    for (size_t i = 16; i < q.size(); ++i) EXPECT_EQ(q[i], 0) << dtype_name(d) << " byte " << i;
    for (float v : dequantize(d, q, 256)) EXPECT_EQ(v, x[0]) << dtype_name(d);
  }
}

// A constant positive row: the min is clamped to 0, so every element takes the top quant with
// scale c / nmax; c = nmax / 2^4 (Q4_K) or nmax / 2^5 (Q5_K) makes the first guess exact, which
// no step of the search can beat. Every 6-bit scale is 63 and dmin 0.
TEST(KQuantsGgml, ConstantPositiveRowIsAllTopQuant) {
  struct Case {
    DType d;
    int nmax;
    float scale;
  };
  for (const Case& c : {Case{DType::Q4_K, 15, 0x1p-4f}, Case{DType::Q5_K, 31, 0x1p-5f}}) {
    const std::vector<float> x(256, float(c.nmax) * c.scale);
    const std::vector<uint8_t> q = quantize(c.d, x);
    const uint16_t d = f32_to_f16(c.scale / 63.0f);
    EXPECT_EQ(q[0] | (q[1] << 8), d) << dtype_name(c.d);
    EXPECT_EQ(q[2] | (q[3] << 8), 0) << dtype_name(c.d);
    const std::vector<uint8_t> want = packed_uniform_scales(63, 0);
    for (size_t i = 0; i < 12; ++i) EXPECT_EQ(q[4 + i], want[i]) << dtype_name(c.d) << " " << i;
    // Q4_K: 128 bytes of 0xFF; Q5_K: qh all ones (every quant is 31 = 16 + 15), then 0xFF.
    for (size_t i = 16; i < q.size(); ++i) EXPECT_EQ(q[i], 0xFF) << dtype_name(c.d) << " " << i;
    const float back = f16_to_f32(d) * 63.0f * float(c.nmax);
    for (float v : dequantize(c.d, q, 256)) EXPECT_EQ(v, back) << dtype_name(c.d);
  }
}

// Q6_K of a constant row +-1: every group of 16 lands on scale -+1/32 with all quants -32
// (the ties of the 18-step search do not replace it: every candidate scores exactly as well),
// so d = +-2^-12, every int8 scale -128, every stored quant 0.
TEST(KQuantsGgml, Q6KConstantRows) {
  for (float c : {1.0f, -1.0f}) {
    const std::vector<float> x(256, c);
    const std::vector<uint8_t> q = quantize(DType::Q6_K, x);
    for (size_t i = 0; i < 192; ++i) EXPECT_EQ(q[i], 0) << c << " byte " << i;  // ql, qh
    for (size_t i = 192; i < 208; ++i) EXPECT_EQ(q[i], 0x80) << c << " scale " << i - 192;
    EXPECT_EQ(q[208] | (q[209] << 8), c > 0 ? 0x0C00 : 0x8C00);
    for (float v : dequantize(DType::Q6_K, q, 256)) EXPECT_EQ(v, c);
  }
}

// One outlier in a zero row. Q4_K: element 40 (sub-block 1, l 8) = 1 gives that sub-block scale
// 1/15 and every other sub-block scale 0; the quant sits in the high nibble of qs[8]. The
// other sub-blocks keep quant 0 and dequantize to exactly 0.
TEST(KQuantsGgml, Q4KSingleOutlier) {
  std::vector<float> x(256, 0.0f);
  x[40] = 1.0f;
  const std::vector<uint8_t> q = quantize(DType::Q4_K, x);
  const uint16_t d = f32_to_f16((1.0f / 15.0f) / 63.0f);
  EXPECT_EQ(q[0] | (q[1] << 8), d);
  EXPECT_EQ(q[2] | (q[3] << 8), 0);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(q[4 + i], i == 1 ? 63 : 0) << "scale byte " << i;
  for (size_t i = 0; i < 128; ++i) EXPECT_EQ(q[16 + i], i == 8 ? 0xF0 : 0) << "qs " << i;
  const std::vector<float> y = dequantize(DType::Q4_K, q, 256);
  EXPECT_EQ(y[40], f16_to_f32(d) * 63.0f * 15.0f);
  EXPECT_NEAR(y[40], 1.0f, 1e-3f);
  for (size_t i = 0; i < 256; ++i) {
    if (i == 40) continue;
    EXPECT_EQ(y[i], 0.0f) << i;
  }
}

// Q6_K with one outlier, element 37 (group 2) = 1: group 2 gets scale -1/32 (its zeros quantize
// to 0, stored 32), the other groups scale 0 with ggml's all-zero quants (stored 0, i.e. -32),
// which dequantize to -0.0 (0 * -32), bit for bit as in ggml.
TEST(KQuantsGgml, Q6KSingleOutlierAndNegativeZeros) {
  std::vector<float> x(256, 0.0f);
  x[37] = 1.0f;
  const std::vector<uint8_t> q = quantize(DType::Q6_K, x);
  for (size_t i = 0; i < 128; ++i) EXPECT_EQ(q[i], 0) << "ql " << i;
  // Element 32 + l (l < 16) is k = 1 of half 0: its top two bits (2 for stored 32) at bits 2-3
  // of qh[l]; element 37 (stored 0) leaves qh[5] empty.
  for (size_t l = 0; l < 64; ++l) EXPECT_EQ(q[128 + l], l < 16 && l != 5 ? 0x08 : 0) << "qh " << l;
  for (size_t j = 0; j < 16; ++j) EXPECT_EQ(q[192 + j], j == 2 ? 0x80 : 0) << "scale " << j;
  EXPECT_EQ(q[208] | (q[209] << 8), 0x0C00);
  const std::vector<float> y = dequantize(DType::Q6_K, q, 256);
  EXPECT_EQ(y[37], 1.0f);
  for (size_t i = 0; i < 256; ++i) {
    if (i == 37) continue;
    EXPECT_TRUE(y[i] == 0.0f && std::signbit(y[i])) << i << ": " << y[i];
  }
}

// Negative-only rows. Q4_K/Q5_K: sub-block j holds k_j 2^-8 q - m_j 2^-3 with 31 k_j <= 32 m_j,
// so no value is positive; the search lands on k_j and m_j as in the mixed-sign hand-built blocks,
// with d = 2^-8 (k 63) and dmin = 2^-3 (m 63).
TEST(KQuantsGgml, NegativeOnlyRows) {
  constexpr int kK[8] = {63, 1, 2, 4, 8, 16, 32, 48};
  constexpr int kM[8] = {62, 63, 5, 17, 33, 40, 31, 62};
  for (DType d : {DType::Q4_K, DType::Q5_K}) {
    const int nmax = d == DType::Q4_K ? 15 : 31;
    std::vector<float> x(256);
    std::vector<int> lq(256);
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) {
        const int v = (7 * l + j) % (nmax + 1);
        lq[size_t(32 * j + l)] = v;
        x[size_t(32 * j + l)] = float(kK[j]) * 0x1p-8f * float(v) - float(kM[j]) * 0x1p-3f;
        ASSERT_LE(x[size_t(32 * j + l)], 0.0f);
      }
    const std::vector<uint8_t> q = quantize(d, x);
    EXPECT_EQ(q[0] | (q[1] << 8), 0x1C00) << dtype_name(d);  // 2^-8
    EXPECT_EQ(q[2] | (q[3] << 8), 0x3000) << dtype_name(d);  // 2^-3
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k_scale_min(j, q.data() + 4, sc, m);
      EXPECT_EQ(sc, kK[j]) << dtype_name(d) << " sub-block " << j;
      EXPECT_EQ(m, kM[j]) << dtype_name(d) << " sub-block " << j;
    }
    const uint8_t* qs = q.data() + (d == DType::Q4_K ? 16 : 48);
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) {
        int v = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
        if (d == DType::Q5_K) v |= ((q[16 + size_t(l)] >> j) & 1) << 4;
        EXPECT_EQ(v, lq[size_t(32 * j + l)]) << dtype_name(d) << " element " << 32 * j + l;
      }
    EXPECT_EQ(dequantize(d, q, 256), x) << dtype_name(d);
  }
  // Q6_K: group j holds c_j 2^-9 v with v in [-32, 0] (v = -32 at l = 0); c 128 fixes
  // d = -2^-9 and each int8 scale is -c_j.
  constexpr int kC[16] = {128, 64, 96, 1, 17, 100, 127, 2, 50, 33, 77, 5, 120, 64, 3, 90};
  std::vector<float> x(256);
  std::vector<int> v(256);
  for (int j = 0; j < 16; ++j)
    for (int l = 0; l < 16; ++l) {
      v[size_t(16 * j + l)] = l == 0 ? -32 : -((5 * l + 3 * j) % 33);
      x[size_t(16 * j + l)] = float(kC[j]) * 0x1p-9f * float(v[size_t(16 * j + l)]);
    }
  const std::vector<uint8_t> q = quantize(DType::Q6_K, x);
  EXPECT_EQ(q[208] | (q[209] << 8), 0x9800);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(int8_t(q[192 + size_t(j)]), -kC[j]) << j;
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const int lo = (q[size_t(64 * h + l + 32 * (k & 1))] >> (4 * (k >> 1))) & 15;
    const int hi = (q[128 + size_t(32 * h + l)] >> (2 * k)) & 3;
    EXPECT_EQ((lo | (hi << 4)) - 32, v[size_t(e)]) << "element " << e;
  }
  EXPECT_EQ(dequantize(DType::Q6_K, q, 256), x);
}

}  // namespace
}  // namespace tandem
