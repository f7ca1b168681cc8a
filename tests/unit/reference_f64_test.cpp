// The reference backend against an independent float64 evaluation written here, on random
// inputs: matmul (every weight dtype, batched), softmax, rms_norm, rope, grouped-query causal
// attention, and kv_write followed by attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "test_util.h"

namespace tandem {
namespace {

using test::HostRun;

// |got - want| <= tol * (|want| + floor): float rounding of a float64 result.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol = 1e-6,
                  double floor = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (std::fabs(want[i]) + floor))
        << "element " << i << " seed " << test::test_seed();
  }
}

float round_f16(float x) {
  return test::oracle_f16_to_f32(test::oracle_f32_to_f16(x));  // not our conversion
}

class ReferenceF64 : public ::testing::Test {
 protected:
  std::mt19937_64 rng{test::test_seed()};
  std::vector<float> random(size_t n) { return test::random_values(n, rng); }
};

TEST_F(ReferenceF64, MatMulEveryWeightDTypeBatched) {
  const int64_t K = 96, M = 13, N = 7;
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Graph g;
    TensorId a = g.weight("a", dt, {K, M, 2});
    TensorId b = g.input("b", DType::F32, {K, N, 6});
    TensorId out = g.matmul(a, b);
    HostRun run(g);
    const auto av = random(size_t(K * M * 2)), bv = random(size_t(K * N * 6));
    run.set_f32(a, av);
    run.set_f32(b, bv);
    const std::vector<float> a_stored = run.get_f32(a);  // what the weight holds after rounding
    run.run();
    std::vector<double> want(size_t(M * N * 6));
    for (int64_t batch = 0; batch < 6; ++batch) {
      const int64_t ab = batch / 3;  // a's 2 batches broadcast over b's 6
      for (int64_t n = 0; n < N; ++n)
        for (int64_t m = 0; m < M; ++m) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) {
            s += double(a_stored[size_t((ab * M + m) * K + k)]) *
                 double(bv[size_t((batch * N + n) * K + k)]);
          }
          want[size_t((batch * N + n) * M + m)] = s;
        }
    }
    expect_close(run.get_f32(out), want, 1e-6, 1e-3);
    if (dt == DType::F32) {
      EXPECT_EQ(a_stored, av);
    } else {
      // The weight really was rounded (so the check above used the stored values).
      EXPECT_NE(a_stored, av);
    }
  }
}

TEST_F(ReferenceF64, SoftmaxWithScaleAndMask) {
  const int64_t n = 37, rows = 5, batches = 3;
  Graph g;
  TensorId x = g.input("x", DType::F32, {n, rows, batches});
  TensorId mask = g.input("mask", DType::F32, {n, rows + 2});
  TensorId out = g.softmax(x, mask, 0.37f);
  HostRun run(g);
  const auto xv = random(size_t(n * rows * batches));
  auto mv = random(size_t(n * (rows + 2)));
  for (size_t i = 0; i < mv.size(); i += 5) mv[i] = -INFINITY;
  run.set_f32(x, xv);
  run.set_f32(mask, mv);
  run.run();
  std::vector<double> want(xv.size());
  for (int64_t r = 0; r < rows * batches; ++r) {
    const int64_t mrow = r % rows;
    std::vector<double> e(static_cast<size_t>(n));
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      e[size_t(i)] = double(xv[size_t(r * n + i)]) * double(0.37f) + mv[size_t(mrow * n + i)];
      mx = std::max(mx, e[size_t(i)]);
    }
    for (double& v : e) sum += (v = std::exp(v - mx));
    for (int64_t i = 0; i < n; ++i) want[size_t(r * n + i)] = e[size_t(i)] / sum;
  }
  expect_close(run.get_f32(out), want, 1e-6, 1e-7);
}

TEST_F(ReferenceF64, RmsNorm) {
  const int64_t n = 4096, rows = 3;
  Graph g;
  TensorId x = g.input("x", DType::F32, {n, rows});
  TensorId w = g.weight("w", DType::F32, {n});
  TensorId out = g.rms_norm(x, w, 1e-5f);
  HostRun run(g);
  const auto xv = random(size_t(n * rows)), wv = random(size_t(n));
  run.set_f32(x, xv);
  run.set_f32(w, wv);
  run.run();
  std::vector<double> want(xv.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xv[size_t(r * n + i)]) * xv[size_t(r * n + i)];
    const double scale = 1.0 / std::sqrt(ss / double(n) + double(1e-5f));
    for (int64_t i = 0; i < n; ++i) {
      want[size_t(r * n + i)] = double(xv[size_t(r * n + i)]) * scale * double(wv[size_t(i)]);
    }
  }
  expect_close(run.get_f32(out), want);
}

TEST_F(ReferenceF64, RopeAtLargePositions) {
  const int64_t d = 80, heads = 3, tokens = 6;
  const int32_t n_rot = 64;
  const double base = 500000.0;
  Graph g;
  TensorId x = g.input("x", DType::F32, {d, heads, tokens});
  TensorId pos = g.input("pos", DType::I32, {tokens});
  TensorId out = g.rope(x, pos, n_rot, float(base));
  HostRun run(g);
  const auto xv = random(size_t(d * heads * tokens));
  const std::vector<int32_t> pv{0, 1, 17, 1000, 4095, 131071};
  run.set_f32(x, xv);
  run.set_i32(pos, pv);
  run.run();
  std::vector<double> want(xv.begin(), xv.end());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < n_rot / 2; ++j) {
        // theta = pos * base^(-2j / n_rot), via exp/log rather than pow.
        const double theta = pv[size_t(t)] * std::exp(-2.0 * double(j) / n_rot * std::log(base));
        const size_t i = size_t((t * heads + h) * d + 2 * j);
        const double x0 = xv[i], x1 = xv[i + 1];
        want[i] = x0 * std::cos(theta) - x1 * std::sin(theta);
        want[i + 1] = x0 * std::sin(theta) + x1 * std::cos(theta);
      }
  expect_close(run.get_f32(out), want, 1e-6, 1e-3);
}

// Causal grouped-query attention in float64: query t of head h sees cache positions
// [0, pos[t]] of kv head h / (hq / hkv).
std::vector<double> attention_f64(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, const std::vector<int32_t>& pos,
                                  int64_t d, int64_t hq, int64_t hkv, double scale) {
  const int64_t tokens = int64_t(pos.size());
  std::vector<double> out(static_cast<size_t>(d * hq * tokens));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kvh = h / (hq / hkv);
      std::vector<double> w;
      for (int64_t j = 0; j <= pos[size_t(t)]; ++j) {
        double s = 0;
        for (int64_t i = 0; i < d; ++i) {
          s += double(q[size_t((t * hq + h) * d + i)]) * k[size_t((j * hkv + kvh) * d + i)];
        }
        w.push_back(s * scale);
      }
      const double mx = *std::max_element(w.begin(), w.end());
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < d; ++i) {
        double acc = 0;
        for (size_t j = 0; j < w.size(); ++j)
          acc += w[j] * v[(j * size_t(hkv) + size_t(kvh)) * size_t(d) + size_t(i)];
        out[size_t((t * hq + h) * d + i)] = acc / sum;
      }
    }
  return out;
}

TEST_F(ReferenceF64, GroupedQueryCausalAttention) {
  const int64_t d = 64, hq = 8, hkv = 2, tokens = 7, context = 40;
  for (DType cache_type : {DType::F32, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(cache_type)));
    Graph g;
    TensorId q = g.input("q", DType::F32, {d, hq, tokens});
    TensorId k = g.kv_cache("k", cache_type, {d, hkv, context});
    TensorId v = g.kv_cache("v", cache_type, {d, hkv, context});
    TensorId pos = g.input("pos", DType::I32, {tokens});
    const double scale = 1.0 / std::sqrt(double(d));
    TensorId out = g.attention(q, k, v, pos, float(scale));
    HostRun run(g);
    const auto qv = random(size_t(d * hq * tokens));
    auto kv = random(size_t(d * hkv * context)), vv = random(size_t(d * hkv * context));
    std::vector<int32_t> pv(static_cast<size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t) pv[size_t(t)] = int32_t(30 + t);  // a prefill chunk
    pv[0] = 3;  // and an out-of-order token (any position is valid)
    run.set_f32(q, qv);
    run.set_f32(k, kv);
    run.set_f32(v, vv);
    run.set_i32(pos, pv);
    run.run();
    if (cache_type == DType::F16) {
      for (float& x : kv) x = round_f16(x);
      for (float& x : vv) x = round_f16(x);
    }
    expect_close(run.get_f32(out), attention_f64(qv, kv, vv, pv, d, hq, hkv, float(scale)), 1e-5,
                 1e-3);
  }
}

TEST_F(ReferenceF64, KvWriteThenAttention) {
  const int64_t d = 32, hq = 4, hkv = 1, tokens = 5, context = 16, start = 6;
  Graph g;
  TensorId k = g.kv_cache("k", DType::F16, {d, hkv, context});
  TensorId v = g.kv_cache("v", DType::F16, {d, hkv, context});
  TensorId k_new = g.input("k_new", DType::F32, {d, hkv, tokens});
  TensorId v_new = g.input("v_new", DType::F32, {d, hkv, tokens});
  TensorId q = g.input("q", DType::F32, {d, hq, tokens});
  TensorId pos = g.input("pos", DType::I32, {tokens});
  TensorId kw = g.kv_write(k, k_new, pos);
  TensorId vw = g.kv_write(v, v_new, pos);
  TensorId out = g.attention(q, kw, vw, pos, 0.25f);
  HostRun run(g);
  auto kv = random(size_t(d * hkv * context)), vv = random(size_t(d * hkv * context));
  const auto kn = random(size_t(d * hkv * tokens)), vn = random(size_t(d * hkv * tokens));
  const auto qv = random(size_t(d * hq * tokens));
  std::vector<int32_t> pv;
  for (int64_t t = 0; t < tokens; ++t) pv.push_back(int32_t(start + t));
  run.set_f32(k, kv);
  run.set_f32(v, vv);
  run.set_f32(k_new, kn);
  run.set_f32(v_new, vn);
  run.set_f32(q, qv);
  run.set_i32(pos, pv);
  run.run();
  // The cache after the writes: old rows, with rows start.. replaced, all in f16.
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < d * hkv; ++i) {
      kv[size_t((start + t) * d * hkv + i)] = kn[size_t(t * d * hkv + i)];
      vv[size_t((start + t) * d * hkv + i)] = vn[size_t(t * d * hkv + i)];
    }
  }
  for (float& x : kv) x = round_f16(x);
  for (float& x : vv) x = round_f16(x);
  std::vector<double> k_want(kv.begin(), kv.end());
  expect_close(run.get_f32(kw), k_want, 0.0, 0.0);  // exactly the rounded rows
  expect_close(run.get_f32(out), attention_f64(qv, kv, vv, pv, d, hq, hkv, 0.25), 1e-5, 1e-3);
}

}  // namespace
}  // namespace tandem
