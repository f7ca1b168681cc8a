// The reference backend against values computed by hand (small cases, one or more per op),
// and its errors for bad positions, bad ids and nodes it does not run.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "reference_backend.h"
#include "test_util.h"

namespace tandem {
namespace {

using test::HostRun;
constexpr float kInf = std::numeric_limits<float>::infinity();

void expect_near(const std::vector<float>& got, const std::vector<double>& want,
                 double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << "element " << i;
  }
}

TEST(ReferenceOps, CopyConvertsAndFollowsStrides) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {3, 2});
  TensorId h = g.copy(x, DType::F16);
  TensorId t = g.copy(g.transpose(x), DType::F32);
  TensorId v = g.copy(g.view(x, {2, 2}, {4, 12}, 4), DType::BF16);  // columns 1..2
  HostRun run(g);
  run.set_f32(x, {1, -2.5f, 100000, 4, 5, 6});
  run.run();
  const auto* hb = run.as<uint16_t>(h);
  EXPECT_EQ(hb[0], 0x3c00);
  EXPECT_EQ(hb[1], 0xc100);
  EXPECT_EQ(hb[2], 0x7c00);  // beyond half's range: inf
  EXPECT_EQ(run.get_f32(t), (std::vector<float>{1, 4, -2.5f, 5, 100000, 6}));
  EXPECT_EQ(run.get_f32(v), (std::vector<float>{-2.5f, 99840, 5, 6}));  // bf16 rounds 1e5
}

TEST(ReferenceOps, CopyQuantizesAndIntegerCopiesKeepBits) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {32});
  TensorId q = g.copy(x, DType::Q8_0);
  TensorId back = g.copy(q, DType::F32);
  TensorId ids = g.input("ids", DType::I32, {2, 2});
  TensorId idt = g.copy(g.transpose(ids), DType::I32);
  HostRun run(g);
  std::vector<float> values(32);
  for (int i = 0; i < 32; ++i) values[size_t(i)] = float(i - 16) * 4.0f;  // amax 64
  values[0] = -127.0f;                                                    // d = 1: exact
  run.set_f32(x, values);
  run.set_i32(ids, {1 << 30, -7, 3, 123456789});
  run.run();
  EXPECT_EQ(run.get_f32(back), values);
  EXPECT_EQ(run.as<BlockQ8_0>(q)->d, 0x3c00);
  const int32_t* out = run.as<int32_t>(idt);
  EXPECT_EQ(std::vector<int32_t>(out, out + 4), (std::vector<int32_t>{1 << 30, 3, -7, 123456789}));
}

TEST(ReferenceOps, GetRows) {
  Graph g;
  TensorId table = g.weight("table", DType::F32, {2, 3});
  TensorId ids = g.input("ids", DType::I32, {3});
  TensorId rows = g.get_rows(table, ids);
  TensorId qtable = g.weight("qtable", DType::Q4_0, {32, 2});
  TensorId qids = g.input("qids", DType::I32, {1});
  TensorId qrows = g.get_rows(qtable, qids);
  HostRun run(g);
  run.set_f32(table, {1, 2, 3, 4, 5, 6});
  run.set_i32(ids, {2, 0, 2});
  std::vector<float> q(64, 1.0f);
  for (int j = 0; j < 32; ++j) q[size_t(32 + j)] = float(-8 + j % 16);  // amax -8: d = 1
  run.set_f32(qtable, q);
  run.set_i32(qids, {1});
  run.run();
  EXPECT_EQ(run.get_f32(rows), (std::vector<float>{5, 6, 1, 2, 5, 6}));
  EXPECT_EQ(run.get_f32(qrows), std::vector<float>(q.begin() + 32, q.end()));
}

TEST(ReferenceOps, MatMul) {
  Graph g;
  TensorId a = g.weight("a", DType::F32, {2, 3});  // rows m: {1,2} {3,4} {5,6}
  TensorId b = g.input("b", DType::F32, {2, 2});   // rows n: {1,0} {0.5,-1}
  TensorId out = g.matmul(a, b);
  TensorId ah = g.weight("ah", DType::F16, {2, 3});
  TensorId outh = g.matmul(ah, b);
  TensorId a3 = g.weight("a3", DType::BF16, {1, 1, 2});  // batch 2 broadcast over b's 4
  TensorId b3 = g.input("b3", DType::F32, {1, 1, 4});
  TensorId out3 = g.matmul(a3, b3);
  HostRun run(g);
  run.set_f32(a, {1, 2, 3, 4, 5, 6});
  run.set_f32(ah, {1, 2, 3, 4, 5, 6});
  run.set_f32(b, {1, 0, 0.5f, -1});
  run.set_f32(a3, {2, 3});
  run.set_f32(b3, {1, 1, 1, 1});
  run.run();
  // out[n][m] = sum_k a[m][k] b[n][k]
  const std::vector<float> want{1, 3, 5, -1.5f, -2.5f, -3.5f};
  EXPECT_EQ(run.get_f32(out), want);
  EXPECT_EQ(run.get_f32(outh), want);
  EXPECT_EQ(run.get_f32(out3), (std::vector<float>{2, 2, 3, 3}));
}

TEST(ReferenceOps, QuantizedMatMul) {
  Graph g;
  TensorId a = g.weight("a", DType::Q8_0, {32, 2});
  TensorId b = g.input("b", DType::F32, {32, 1});
  TensorId out = g.matmul(a, b);
  HostRun run(g);
  std::vector<float> w(64);
  for (int i = 0; i < 32; ++i) w[size_t(i)] = float(i % 2 ? -i : i);  // row 0: 0,-1,2,-3,...
  w[31] = -127;                                                       // d = 1: exact
  for (int i = 32; i < 64; ++i) w[size_t(i)] = 127;                   // row 1: all 127
  run.set_f32(a, w);
  std::vector<float> ones(32, 1.0f);
  run.set_f32(b, ones);
  run.run();
  // Row 0: sum of 0,-1,2,...,-29,30 is 15, then -127. Row 1: 32 * 127.
  EXPECT_EQ(run.get_f32(out), (std::vector<float>{15 - 127, 32 * 127}));
}

TEST(ReferenceOps, ElementwiseAndBroadcast) {
  Graph g;
  TensorId a = g.input("a", DType::F32, {2, 2});
  TensorId row = g.input("row", DType::F32, {2});
  TensorId col = g.input("col", DType::F32, {1, 2});
  TensorId sum = g.add(a, row);
  TensorId prod = g.mul(a, col);
  TensorId sc = g.scale(a, -0.5f);
  TensorId x = g.input("x", DType::F32, {4});
  TensorId si = g.silu(x);
  TensorId ge = g.gelu(x);
  TensorId up = g.input("up", DType::F32, {4});
  TensorId sw = g.swiglu(x, up);
  HostRun run(g);
  run.set_f32(a, {1, 2, 3, 4});
  run.set_f32(row, {10, 20});
  run.set_f32(col, {2, 3});
  run.set_f32(x, {1, -2, -0.5f, 3});
  run.set_f32(up, {3, 1, 1, 1});
  run.run();
  EXPECT_EQ(run.get_f32(sum), (std::vector<float>{11, 22, 13, 24}));
  EXPECT_EQ(run.get_f32(prod), (std::vector<float>{2, 4, 9, 12}));
  EXPECT_EQ(run.get_f32(sc), (std::vector<float>{-0.5f, -1, -1.5f, -2}));
  const double silu1 = 0.7310585786300049, silu_2 = -0.2384058440442351;
  expect_near(run.get_f32(si), {silu1, silu_2, -0.5 / (1 + std::exp(0.5)), 3 / (1 + std::exp(-3))});
  // ggml's tanh approximation, values from 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
  expect_near(run.get_f32(ge),
              {0.8411919906082768, -0.04540230591222494, -0.15428599017485606, 2.996362607918227});
  expect_near(run.get_f32(sw),
              {3 * silu1, silu_2, -0.5 / (1 + std::exp(0.5)), 3 / (1 + std::exp(-3))});
}

TEST(ReferenceOps, Softmax) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {3});
  TensorId plain = g.softmax(x);
  TensorId mask = g.input("mask", DType::F32, {3});
  TensorId masked = g.softmax(x, mask, 2.0f);
  TensorId all_masked = g.softmax(x, g.input("none", DType::F32, {3}), 1.0f);
  HostRun run(g);
  run.set_f32(x, {1, 2, 3});
  run.set_f32(mask, {0, -kInf, 0});
  run.set_f32(g.node(all_masked).inputs[1], {-kInf, -kInf, -kInf});
  run.run();
  expect_near(run.get_f32(plain), {0.09003057317038046, 0.24472847105479764, 0.6652409557748218});
  // (2, -inf, 6) after scale and mask.
  expect_near(run.get_f32(masked), {0.017986209962091555, 0, 0.9820137900379085});
  EXPECT_EQ(run.get_f32(all_masked), (std::vector<float>{0, 0, 0}));  // no NaN
}

TEST(ReferenceOps, Norms) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {2});
  TensorId w = g.weight("w", DType::F32, {2});
  TensorId rms = g.rms_norm(x, kNoTensor, 0.0f);
  TensorId rmsw = g.rms_norm(x, w, 0.0f);
  TensorId y = g.input("y", DType::F32, {4, 2});
  TensorId lw = g.weight("lw", DType::F32, {4});
  TensorId lb = g.weight("lb", DType::F32, {4});
  TensorId ln = g.layer_norm(y, lw, lb, 1e-5f);
  HostRun run(g);
  run.set_f32(x, {3, 4});
  run.set_f32(w, {2, -1});
  run.set_f32(y, {1, 2, 3, 4, 5, 5, 5, 5});
  run.set_f32(lw, {2, 2, 2, 2});
  run.set_f32(lb, {1, 1, 1, 1});
  run.run();
  expect_near(run.get_f32(rms), {0.848528137423857, 1.131370849898476});  // x / sqrt(12.5)
  expect_near(run.get_f32(rmsw), {1.697056274847714, -1.131370849898476});
  // Row 0: mean 2.5, var 1.25. Row 1: constant, so only the bias remains.
  expect_near(run.get_f32(ln), {1 - 2 * 1.3416354199689269, 1 - 2 * 0.447211806656309,
                                1 + 2 * 0.447211806656309, 1 + 2 * 1.3416354199689269, 1, 1, 1, 1});
}

TEST(ReferenceOps, RopeRotatesAdjacentPairs) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {4, 1, 2});
  TensorId pos = g.input("pos", DType::I32, {2});
  TensorId full = g.rope(x, pos, 4, 100.0f);
  TensorId half = g.rope(x, pos, 2, 100.0f);
  HostRun run(g);
  run.set_f32(x, {1, 0, 0, 1, 1, 0, 0, 1});
  run.set_i32(pos, {0, 1});
  run.run();
  // Token 1: pair 0 turns by 1 rad, pair 1 by 1 * 100^(-2/4) = 0.1 rad.
  const double c1 = 0.5403023058681398, s1 = 0.8414709848078965;
  expect_near(run.get_f32(full), {1, 0, 0, 1, c1, s1, -0.09983341664682815, 0.9950041652780258});
  expect_near(run.get_f32(half), {1, 0, 0, 1, c1, s1, 0, 1});  // n_rot 2: pair 1 untouched
}

TEST(ReferenceOps, AttentionIsCausalAndGrouped) {
  Graph g;
  TensorId q = g.input("q", DType::F32, {2, 2, 2});  // [head_dim, heads, tokens]
  TensorId k = g.kv_cache("k", DType::F32, {2, 1, 3});
  TensorId v = g.kv_cache("v", DType::F32, {2, 1, 3});
  TensorId pos = g.input("pos", DType::I32, {2});
  TensorId out = g.attention(q, k, v, pos, 0.5f);
  HostRun run(g);
  run.set_f32(q, {1, 1, 1, 1, /* token 1 */ 1, 0, 0, 2});
  run.set_f32(k, {1, 0, 0, 1, 9, 9});  // position 2 is in the future for both tokens
  run.set_f32(v, {1, 2, 3, 4, 100, 100});
  run.set_i32(pos, {0, 1});
  run.run();
  // Token 0 sees only position 0; token 1 sees 0 and 1, both heads read kv head 0.
  expect_near(run.get_f32(out), {1, 2, 1, 2, 1.755081337596291, 2.755081337596291,
                                 2.4621171572600096, 3.4621171572600096});
}

TEST(ReferenceOps, KvWriteThenDequantize) {
  Graph g;
  TensorId cache = g.kv_cache("cache", DType::F16, {2, 1, 3});
  TensorId src = g.input("src", DType::F32, {2, 1, 2});
  TensorId pos = g.input("pos", DType::I32, {2});
  TensorId written = g.kv_write(cache, src, pos);
  TensorId deq = g.dequantize(written);
  HostRun run(g);
  run.set_f32(cache, {7, 7, 7, 7, 7, 7});
  run.set_f32(src, {1, 2, 3.0009765625f, 4});
  run.set_i32(pos, {2, 0});
  run.run();
  // Position 1 keeps its old value; 3.0009765625 rounds to the half 3.0 (tie to even).
  EXPECT_EQ(run.get_f32(deq), (std::vector<float>{3, 4, 7, 7, 1, 2}));
}

TEST(ReferenceOps, DequantizeBlocks) {
  Graph g;
  TensorId q = g.weight("q", DType::Q4_0, {32});
  TensorId b = g.weight("b", DType::BF16, {2});
  TensorId dq = g.dequantize(q);
  TensorId db = g.dequantize(b);
  HostRun run(g);
  auto* block = run.as<BlockQ4_0>(q);
  block->d = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) block->qs[j] = uint8_t(j | ((15 - j) << 4));
  run.as<uint16_t>(b)[0] = 0x3f80;
  run.as<uint16_t>(b)[1] = 0xc049;
  run.run();
  const std::vector<float> out = run.get_f32(dq);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[size_t(j)], float(j - 8) * 0.5f);
    EXPECT_EQ(out[size_t(j + 16)], float(7 - j) * 0.5f);
  }
  EXPECT_EQ(run.get_f32(db), (std::vector<float>{1.0f, -3.140625f}));
}

TEST(ReferenceErrors, BadIdsAndPositionsAreInvalidArguments) {
  Graph g;
  TensorId table = g.weight("table", DType::F32, {2, 3});
  TensorId ids = g.input("ids", DType::I32, {1});
  g.get_rows(table, ids);
  HostRun rows(g);
  rows.set_i32(ids, {3});
  test::expect_error([&] { rows.run(); }, ErrorCode::InvalidArgument, "reference get_rows",
                     {"row id 3 outside [0, 3)"});
  rows.set_i32(ids, {-1});
  test::expect_error([&] { rows.run(); }, ErrorCode::InvalidArgument, "reference get_rows",
                     {"row id -1"});

  Graph a;
  TensorId q = a.input("q", DType::F32, {2, 1, 1});
  TensorId k = a.kv_cache("k", DType::F32, {2, 1, 3});
  TensorId pos = a.input("pos", DType::I32, {1});
  a.attention(q, k, k, pos, 1.0f);
  HostRun att(a);
  att.set_i32(pos, {3});
  test::expect_error([&] { att.run(); }, ErrorCode::InvalidArgument, "reference attention",
                     {"position 3 outside the cache [0, 3)"});

  Graph w;
  TensorId cache = w.kv_cache("c", DType::F32, {2, 1, 3});
  TensorId src = w.input("s", DType::F32, {2, 1, 1});
  TensorId wpos = w.input("pos", DType::I32, {1});
  w.kv_write(cache, src, wpos);
  HostRun kw(w);
  kw.set_i32(wpos, {-1});
  test::expect_error([&] { kw.run(); }, ErrorCode::InvalidArgument, "reference kv_write",
                     {"position -1 outside the cache [0, 3)"});
}

TEST(ReferenceErrors, RefusesWhatItDoesNotRun) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {4});
  TensorId r = g.reshape(x, {2, 2});
  ReferenceBackend ref;
  std::vector<float> data(4);
  NodeExecution e;
  e.node = &g.node(r);
  e.inputs = {{&g.tensor(x), data.data()}};
  e.output = {&g.tensor(r), data.data()};
  const CapabilityCheck c = ref.check(g, g.node(r));
  EXPECT_EQ(c.reason, RejectReason::UnsupportedOp);
  test::expect_error([&] { ref.execute(g, e); }, ErrorCode::Unsupported, "reference",
                     {"reference does not run reshape"});
  test::expect_error([&] { reference_execute(g, e); }, ErrorCode::Unsupported, "reference",
                     {"op reshape is not executable"});
}

TEST(ReferenceBackendTable, DeclaresEveryComputeOp) {
  ReferenceBackend ref;
  for (int i = 0; i < kOpKindCount; ++i) {
    const auto op = OpKind(i);
    bool declared = false;
    for (const OpCapability& row : ref.capabilities()) declared |= row.op == op;
    EXPECT_EQ(declared, is_compute(op)) << op_name(op);
  }
  EXPECT_EQ(ReferenceBackend::reference_capabilities().size(), ref.capabilities().size());
}

}  // namespace
}  // namespace tandem
