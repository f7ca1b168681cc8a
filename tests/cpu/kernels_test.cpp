// Kernel-level checks the graph harness cannot reach: every tile shape and odd block count of
// the integer dot kernels on every ISA, exp accuracy, bit-exact half/bfloat conversions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu_features.h"
#include "kernels.h"
#include "tandem/dtype.h"

namespace tandem::cpu {
namespace {

std::vector<const Kernels*> runnable_tables() {
  std::vector<const Kernels*> out;
  for (int i = 0; i <= int(best_isa()); ++i) out.push_back(&kernels_for(Isa(i)));
  return out;
}

// Exact dot of dequantized weights with dequantized activations (what the kernels compute,
// up to float rounding).
double exact_dot(DType wt, const uint8_t* row, const int8_t* qs, const float* d, int64_t k) {
  std::vector<float> w(static_cast<size_t>(k));
  to_f32(wt, row, w.data(), k);
  double s = 0.0;
  for (int64_t i = 0; i < k; ++i) s += double(w[size_t(i)]) * double(qs[i]) * double(d[i / 32]);
  return s;
}

TEST(CpuKernels, QuantTilesEveryShapeAndIsa) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t blocks : {1, 2, 3, 7, 8}) {
    const int64_t k = blocks * 32;
    const int rows = 4, cols = 4;
    std::vector<float> wf(static_cast<size_t>(rows * k)), xf(static_cast<size_t>(cols * k));
    for (float& v : wf) v = dist(rng);
    for (float& v : xf) v = dist(rng);
    for (DType wt : {DType::Q4_0, DType::Q8_0}) {
      const size_t rb = row_bytes(wt, k);
      std::vector<uint8_t> w(rb * rows);
      for (int r = 0; r < rows; ++r) from_f32(wt, wf.data() + r * k, w.data() + r * rb, k);
      for (const Kernels* kt : runnable_tables()) {
        SCOPED_TRACE(std::string(isa_name(kt->isa)) + " " + std::string(dtype_name(wt)) +
                     " blocks " + std::to_string(blocks));
        std::vector<int8_t> qs(static_cast<size_t>(cols * k));
        std::vector<float> d(static_cast<size_t>(cols * blocks));
        std::vector<int32_t> bias(static_cast<size_t>(cols * blocks * kBiasLanes));
        for (int c = 0; c < cols; ++c) {
          kt->quantize_activations(xf.data() + c * k, k, qs.data() + c * k, d.data() + c * blocks,
                                   bias.data() + c * blocks * kBiasLanes);
        }
        const QuantizedActivations act{qs.data(), d.data(), bias.data(), k};
        auto tile = wt == DType::Q4_0 ? kt->q4_0_tile : kt->q8_0_tile;
        for (int tr = 1; tr <= rows; ++tr)
          for (int tc = 1; tc <= cols; ++tc)
            for (int col0 = 0; col0 + tc <= cols; ++col0) {
              std::vector<float> out(static_cast<size_t>(cols * rows), -7.0f);
              tile(w.data(), rb, tr, act, col0, tc, out.data(), rows);
              for (int c = 0; c < tc; ++c)
                for (int r = 0; r < tr; ++r) {
                  const double want = exact_dot(wt, w.data() + r * rb, qs.data() + (col0 + c) * k,
                                                d.data() + (col0 + c) * blocks, k);
                  EXPECT_NEAR(out[size_t(c * rows + r)], want, 1e-4 * (1.0 + std::fabs(want)))
                      << "tile " << tr << "x" << tc << " col0 " << col0 << " r " << r << " c " << c;
                }
              // Nothing outside the tile is written.
              for (int c = 0; c < cols; ++c)
                for (int r = 0; r < rows; ++r) {
                  if (c >= tc || r >= tr) {
                    ASSERT_EQ(out[size_t(c * rows + r)], -7.0f);
                  }
                }
            }
      }
    }
  }
}

// Exact dot of dequantized K-quant weights with activations of one scale per 256.
double exact_k_dot(DType wt, const uint8_t* row, const int8_t* qs, const float* d, int64_t k) {
  std::vector<float> w(static_cast<size_t>(k));
  to_f32(wt, row, w.data(), k);
  double s = 0.0;
  for (int64_t i = 0; i < k; ++i) s += double(w[size_t(i)]) * double(qs[i]) * double(d[i / 256]);
  return s;
}

// Runs every tile shape and column offset of one K-quant dtype on every ISA for the given
// weight and activation values and compares with exact_k_dot (relative to the sum of |terms|,
// so rows that cancel are judged by their terms' size).
void check_k_tiles(DType wt, int64_t supers, const std::vector<float>& wf,
                   const std::vector<float>& xf, int rows, int cols) {
  const int64_t k = supers * 256;
  const size_t rb = row_bytes(wt, k);
  std::vector<uint8_t> w(rb * size_t(rows));
  for (int r = 0; r < rows; ++r) from_f32(wt, wf.data() + r * k, w.data() + r * rb, k);
  for (const Kernels* kt : runnable_tables()) {
    SCOPED_TRACE(std::string(isa_name(kt->isa)) + " " + std::string(dtype_name(wt)) +
                 " super-blocks " + std::to_string(supers));
    std::vector<int8_t> qs(static_cast<size_t>(cols * k));
    std::vector<float> d(static_cast<size_t>(cols * supers));
    std::vector<int16_t> sums(static_cast<size_t>(cols * k / 16));
    for (int c = 0; c < cols; ++c) {
      kt->quantize_activations_k(xf.data() + c * k, k, qs.data() + c * k, d.data() + c * supers,
                                 sums.data() + c * k / 16);
    }
    const KQuantizedActivations act{qs.data(), d.data(), sums.data(), k};
    auto tile = wt == DType::Q4_K   ? kt->q4_k_tile
                : wt == DType::Q5_K ? kt->q5_k_tile
                                    : kt->q6_k_tile;
    for (int tr = 1; tr <= rows; ++tr)
      for (int tc = 1; tc <= cols; ++tc)
        for (int col0 = 0; col0 + tc <= cols; ++col0) {
          std::vector<float> out(static_cast<size_t>(cols * rows), -7.0f);
          tile(w.data(), rb, tr, act, col0, tc, out.data(), rows);
          for (int c = 0; c < cols; ++c)
            for (int r = 0; r < rows; ++r) {
              const float got = out[size_t(c * rows + r)];
              if (c >= tc || r >= tr) {
                ASSERT_EQ(got, -7.0f);  // nothing outside the tile is written
                continue;
              }
              const int8_t* aq = qs.data() + (col0 + c) * k;
              const float* ad = d.data() + (col0 + c) * supers;
              const double want = exact_k_dot(wt, w.data() + r * rb, aq, ad, k);
              std::vector<float> wr(static_cast<size_t>(k));
              to_f32(wt, w.data() + r * rb, wr.data(), k);
              double mag = 0.0;
              for (int64_t i = 0; i < k; ++i)
                mag += std::fabs(double(wr[size_t(i)]) * double(aq[i]) * double(ad[i / 256]));
              EXPECT_NEAR(got, want, 1e-5 * (1.0 + mag))
                  << "tile " << tr << "x" << tc << " col0 " << col0 << " r " << r << " c " << c;
            }
        }
  }
}

// The K-quant tiles on every ISA against the exact dot of dequantized operands: 1 to 3
// super-blocks, every tile shape and column offset.
TEST(CpuKernels, KQuantTilesEveryShapeAndIsa) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t supers : {1, 2, 3}) {
    const int64_t k = supers * 256;
    const int rows = 4, cols = 3;
    std::vector<float> wf(static_cast<size_t>(rows * k)), xf(static_cast<size_t>(cols * k));
    for (float& v : wf) v = dist(rng);
    for (float& v : xf) v = dist(rng);
    for (DType wt : kKQuantDTypes) check_k_tiles(wt, supers, wf, xf, rows, cols);
  }
}

// The integer sums at their extremes: weights whose quants hit the top of their range (and
// Q6_K's -32) against activations of +-127, all of one sign or alternating, where a 16-bit
// intermediate would overflow if any path kept one too long.
TEST(CpuKernels, KQuantTilesAtExtremeQuants) {
  const int64_t supers = 2, k = supers * 256;
  const int rows = 4, cols = 2;
  std::vector<float> wf(static_cast<size_t>(rows * k)), xf(static_cast<size_t>(cols * k));
  for (int64_t i = 0; i < k; ++i) {
    wf[size_t(i)] = 1.0f;                          // constant: every quant at the top
    wf[size_t(k + i)] = -1.0f;                     // Q6_K -32, Q4_K/Q5_K all min
    wf[size_t(2 * k + i)] = i % 2 ? 1.0f : -1.0f;  // both ends
    wf[size_t(3 * k + i)] = i % 32 == 0 ? 1.0f : 0.01f;
    xf[size_t(i)] = 1.0f;
    xf[size_t(k + i)] = i % 2 ? -1.0f : 1.0f;
  }
  for (DType wt : kKQuantDTypes) check_k_tiles(wt, supers, wf, xf, rows, cols);
}

TEST(CpuKernels, KQuantActivationsHaveOneScalePer256AndExactSums) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> x(512);
  for (float& v : x) v = dist(rng);
  x[300] = 0.0f;
  for (const Kernels* kt : runnable_tables()) {
    SCOPED_TRACE(std::string(isa_name(kt->isa)));
    std::vector<int8_t> qs(512);
    std::vector<float> d(2);
    std::vector<int16_t> sums(32);
    kt->quantize_activations_k(x.data(), 512, qs.data(), d.data(), sums.data());
    for (int s = 0; s < 2; ++s) {
      float amax = 0.0f;
      for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(x[size_t(256 * s + i)]));
      EXPECT_FLOAT_EQ(d[size_t(s)], amax / 127.0f);
    }
    for (int g = 0; g < 32; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += qs[size_t(16 * g + i)];
      EXPECT_EQ(sums[size_t(g)], sum) << "group " << g;
    }
    for (int i = 0; i < 512; ++i) {
      EXPECT_NEAR(float(qs[size_t(i)]) * d[size_t(i / 256)], x[size_t(i)],
                  0.5f * d[size_t(i / 256)] + 1e-6f)
          << i;
    }
  }
}

TEST(CpuKernels, ActivationQuantizationIsCloseAndSumsMatch) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(256);
  for (float& v : x) v = dist(rng);
  for (const Kernels* kt : runnable_tables()) {
    std::vector<int8_t> qs(256);
    std::vector<float> d(8);
    std::vector<int32_t> bias(64);
    kt->quantize_activations(x.data(), 256, qs.data(), d.data(), bias.data());
    for (int b = 0; b < 8; ++b) {
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) {
        sum += qs[size_t(b * 32 + j)];
        EXPECT_NEAR(qs[size_t(b * 32 + j)] * d[size_t(b)], x[size_t(b * 32 + j)],
                    d[size_t(b)] * 0.5001f);
      }
      EXPECT_EQ(bias[size_t(b * 8)], -8 * sum) << isa_name(kt->isa);
      for (int j = 1; j < 8; ++j) EXPECT_EQ(bias[size_t(b * 8 + j)], 0);
    }
  }
}

TEST(CpuKernels, ExpIsAccurate) {
  for (const Kernels* kt : runnable_tables()) {
    std::vector<float> x;
    for (float v = -100.0f; v <= 88.0f; v += 0.037f) x.push_back(v);
    std::vector<float> y = x;
    kt->exp_inplace(y.data(), int64_t(y.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp(double(x[i]));
      if (x[i] < -87.3f) {
        EXPECT_LE(y[i], 1.2e-38f);
      } else {
        EXPECT_NEAR(y[i] / want, 1.0, 3e-7) << isa_name(kt->isa) << " x " << x[i];
      }
    }
  }
}

TEST(CpuKernels, HalfAndBfloatConversionsAreBitExact) {
  std::mt19937 rng(std::random_device{}());
  std::vector<float> x;
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  for (int i = 0; i < 4000; ++i) x.push_back(dist(rng) * (i % 3 == 0 ? 1e-8f : 1.0f));
  x.push_back(NAN);
  x.push_back(INFINITY);
  x.push_back(-0.0f);
  for (const Kernels* kt : runnable_tables()) {
    std::vector<uint16_t> h(x.size()), b(x.size());
    kt->f32_to_f16(x.data(), h.data(), int64_t(x.size()));
    kt->f32_to_bf16(x.data(), b.data(), int64_t(x.size()));
    std::vector<float> back(x.size());
    kt->f16_to_f32(h.data(), back.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(f16_to_f32(h[i])));
        EXPECT_TRUE(std::isnan(bf16_to_f32(b[i])));
        continue;
      }
      EXPECT_EQ(h[i], f32_to_f16(x[i])) << isa_name(kt->isa) << " " << x[i];
      EXPECT_EQ(b[i], f32_to_bf16(x[i])) << isa_name(kt->isa) << " " << x[i];
      const float hb = f16_to_f32(h[i]);
      EXPECT_EQ(std::memcmp(&back[i], &hb, sizeof hb), 0);
    }
  }
}

TEST(CpuKernels, DequantizeIsBitExact) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> x(32 * 9);
  for (float& v : x) v = dist(rng);
  for (DType dt : {DType::Q8_0, DType::Q4_0}) {
    std::vector<uint8_t> q(row_bytes(dt, int64_t(x.size())));
    from_f32(dt, x.data(), q.data(), int64_t(x.size()));
    std::vector<float> want(x.size());
    to_f32(dt, q.data(), want.data(), int64_t(x.size()));
    for (const Kernels* kt : runnable_tables()) {
      std::vector<float> got(x.size(), -1.0f);
      (dt == DType::Q8_0 ? kt->dequantize_q8_0 : kt->dequantize_q4_0)(q.data(), got.data(),
                                                                      int64_t(x.size()));
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << isa_name(kt->isa) << " " << dtype_name(dt);
    }
  }
}

// The attention row kernels serve several query heads per cache row read; each score must have
// the bits dot_f32 gives (f16 rows: summed in pieces of 256), each accumulator those of axpy in
// row order, over odd widths, head counts and tails, on every ISA.
TEST(CpuKernels, AttentionRowKernelsGiveTheBitsOfDotAndAxpy) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Kernels* kt : runnable_tables())
    for (int64_t n : {16, 37, 64, 128, 300})
      for (int64_t n_x : {1, 3, 4, 5, 8})
        for (int64_t n_rows : {1, 7, 64}) {
          SCOPED_TRACE(std::string(isa_name(kt->isa)) + " n " + std::to_string(n) + " heads " +
                       std::to_string(n_x) + " rows " + std::to_string(n_rows));
          const int64_t stride = n + 13;
          std::vector<float> rf(size_t(n_rows * stride)), xs(size_t(n_x * n)),
              w(size_t(n_x * n_rows));
          for (float& v : rf) v = dist(rng);
          for (float& v : xs) v = dist(rng);
          for (float& v : w) v = dist(rng);
          std::vector<uint16_t> rh(rf.size());
          kt->f32_to_f16(rf.data(), rh.data(), int64_t(rf.size()));
          std::vector<float> rhf(rf.size());
          kt->f16_to_f32(rh.data(), rhf.data(), int64_t(rf.size()));
          std::vector<float> s32(size_t(n_x * n_rows)), s16(s32.size());
          kt->dot_rows_f32(rf.data(), stride, n_rows, xs.data(), n_x, n, s32.data());
          kt->dot_rows_f16(rh.data(), stride, n_rows, xs.data(), n_x, n, s16.data());
          for (int64_t j = 0; j < n_rows; ++j)
            for (int64_t x = 0; x < n_x; ++x) {
              const float want32 = kt->dot_f32(rf.data() + j * stride, xs.data() + x * n, n);
              float want16 = 0.0f;
              for (int64_t p = 0; p < n; p += 256) {
                want16 += kt->dot_f32(rhf.data() + j * stride + p, xs.data() + x * n + p,
                                      std::min<int64_t>(256, n - p));
              }
              ASSERT_EQ(s32[size_t(x * n_rows + j)], want32) << "row " << j << " head " << x;
              ASSERT_EQ(s16[size_t(x * n_rows + j)], want16) << "row " << j << " head " << x;
            }
          for (bool half : {false, true}) {
            std::vector<float> acc(size_t(n_x * n)), want(acc.size());
            for (size_t i = 0; i < acc.size(); ++i) want[i] = acc[i] = dist(rng);
            if (half) {
              kt->accumulate_rows_f16(rh.data(), stride, n_rows, w.data(), n_x, acc.data(), n);
            } else {
              kt->accumulate_rows_f32(rf.data(), stride, n_rows, w.data(), n_x, acc.data(), n);
            }
            const float* src = half ? rhf.data() : rf.data();
            for (int64_t j = 0; j < n_rows; ++j)
              for (int64_t x = 0; x < n_x; ++x) {
                kt->axpy_f32(w[size_t(x * n_rows + j)], src + j * stride, want.data() + x * n, n);
              }
            for (size_t i = 0; i < acc.size(); ++i) ASSERT_EQ(acc[i], want[i]) << "element " << i;
          }
        }
}

TEST(CpuKernels, SoftmaxOfFullyMaskedRowIsZero) {
  for (const Kernels* kt : runnable_tables()) {
    std::vector<float> x(40, 1.0f), mask(40, -INFINITY), out(40, 5.0f);
    kt->softmax_row(x.data(), mask.data(), 1.0f, out.data(), 40);
    for (float v : out) EXPECT_EQ(v, 0.0f);
  }
}

TEST(CpuKernels, F32TileEveryShape) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t k : {1, 7, 16, 33, 100}) {
    std::vector<float> a(static_cast<size_t>(4 * k)), b(static_cast<size_t>(4 * k));
    for (float& v : a) v = dist(rng);
    for (float& v : b) v = dist(rng);
    for (const Kernels* kt : runnable_tables())
      for (int r = 1; r <= 4; ++r)
        for (int c = 1; c <= 4; ++c) {
          std::vector<float> out(16, -7.0f);
          kt->f32_tile(a.data(), k, r, b.data(), k, c, k, out.data(), 4);
          for (int j = 0; j < c; ++j)
            for (int i = 0; i < r; ++i) {
              double want = 0.0;
              for (int64_t t = 0; t < k; ++t)
                want += double(a[size_t(i * k + t)]) * b[size_t(j * k + t)];
              EXPECT_NEAR(out[size_t(j * 4 + i)], want, 1e-4) << isa_name(kt->isa);
            }
        }
  }
}

}  // namespace
}  // namespace tandem::cpu
