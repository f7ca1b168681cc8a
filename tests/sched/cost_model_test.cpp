// The cost model: FLOP and byte counts checked by hand for every op, the time formula, and the
// JSON overrides.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tandem/cost_model.h"
#include "tandem/error.h"

namespace tandem {
namespace {

struct Expect {
  double flops;
  double bytes;
  DTypeClass cls;
};

void expect_work(const Graph& g, TensorId id, Expect e) {
  OpWork w = op_work(g, g.node(id));
  EXPECT_DOUBLE_EQ(w.flops, e.flops) << op_name(g.node(id).op);
  EXPECT_DOUBLE_EQ(w.bytes, e.bytes) << op_name(g.node(id).op);
  EXPECT_EQ(w.dtype_class, e.cls) << op_name(g.node(id).op);
}

constexpr auto F32 = DTypeClass::F32;

TEST(CostModel, ExactWorkForEveryOp) {
  Graph g;
  // x: f32 [64, 5] = 1280 bytes
  TensorId x = g.input("x", DType::F32, {64, 5});
  TensorId y = g.input("y", DType::F32, {64, 5});
  TensorId row = g.input("row", DType::F32, {64, 1});
  TensorId w64 = g.weight("w64", DType::F32, {64});
  TensorId b64 = g.weight("b64", DType::F32, {64});

  // Copy: one conversion per element only when the dtype changes.
  expect_work(g, g.copy(x, DType::F16), {320, 1280 + 640, F32});
  expect_work(g, g.copy(x, DType::F32), {0, 2560, F32});
  // GetRows: ids + the selected rows only + output. table f16 [64, 10], 3 ids.
  TensorId table = g.weight("table", DType::F16, {64, 10});
  TensorId ids = g.input("ids", DType::I32, {3});
  expect_work(g, g.get_rows(table, ids), {0, 12 + 3 * 128 + 3 * 256, DTypeClass::F16});
  // MatMul: 2*K*M*N. a f16 [64, 32] (4096 B), b f32 [64, 5] (1280 B), out f32 [32, 5] (640 B).
  TensorId a16 = g.weight("a16", DType::F16, {64, 32});
  expect_work(g, g.matmul(a16, x), {2.0 * 64 * 32 * 5, 4096 + 1280 + 640, DTypeClass::F16});
  // QuantizedMatMul: q8_0 [64, 32] = 32 rows * 2 blocks * 34 B = 2176 B.
  TensorId a8 = g.weight("a8", DType::Q8_0, {64, 32});
  TensorId qmm = g.matmul(a8, x);
  EXPECT_EQ(g.node(qmm).op, OpKind::QuantizedMatMul);
  expect_work(g, qmm, {2.0 * 64 * 32 * 5, 2176 + 1280 + 640, DTypeClass::Quantized});
  // Batched matmul: b [64, 5, 3] against a [64, 32, 1] -> 3 batches.
  TensorId xb = g.input("xb", DType::F32, {64, 5, 3});
  TensorId a32 = g.weight("a32", DType::F32, {64, 32});
  expect_work(g, g.matmul(a32, xb), {2.0 * 64 * 32 * 5 * 3, 8192 + 3840 + 1920, F32});
  // Element-wise: Add/Mul/Scale 1, Silu 4, Gelu 8, SwiGlu 5 per element.
  expect_work(g, g.add(x, row), {320, 1280 + 256 + 1280, F32});
  expect_work(g, g.mul(x, y), {320, 3840, F32});
  expect_work(g, g.scale(x, 0.5f), {320, 2560, F32});
  expect_work(g, g.silu(x), {4 * 320, 2560, F32});
  expect_work(g, g.gelu(x), {8 * 320, 2560, F32});
  expect_work(g, g.swiglu(x, y), {5 * 320, 3840, F32});
  // Softmax: 6 per element, 7 with a mask.
  expect_work(g, g.softmax(x), {6 * 320, 2560, F32});
  expect_work(g, g.softmax(x, y, 0.5f), {7 * 320, 3840, F32});
  // Norms: RmsNorm 3 (+1 with weight), LayerNorm 5 (+1 weight, +1 bias) per element.
  expect_work(g, g.rms_norm(x, kNoTensor, 1e-5f), {3 * 320, 2560, F32});
  expect_work(g, g.rms_norm(x, w64, 1e-5f), {4 * 320, 2560 + 256, F32});
  expect_work(g, g.layer_norm(x, w64, b64, 1e-5f), {7 * 320, 2560 + 512, F32});
  expect_work(g, g.layer_norm(x, kNoTensor, kNoTensor, 1e-5f), {5 * 320, 2560, F32});
  // Rope: 6 per rotated pair: 3 * n_rot * rows. x [16, 4, 5], n_rot 8 -> rows 20.
  TensorId xr = g.input("xr", DType::F32, {16, 4, 5});
  TensorId pos = g.input("pos", DType::I32, {5});
  expect_work(g, g.rope(xr, pos, 8, 10000.0f), {3.0 * 8 * 20, 1280 + 20 + 1280, F32});
  // Attention: Hq*T*C*(4D + 5). q [16, 4, 2], caches f32 [16, 2, 8].
  TensorId q = g.input("q", DType::F32, {16, 4, 2});
  TensorId kc = g.kv_cache("k", DType::F32, {16, 2, 8});
  TensorId vc = g.kv_cache("v", DType::F32, {16, 2, 8});
  TensorId pos2 = g.input("pos2", DType::I32, {2});
  expect_work(g, g.attention(q, kc, vc, pos2, 0.25f),
              {4.0 * 2 * 8 * (4 * 16 + 5), 512 + 1024 + 1024 + 8 + 512, F32});
  // Dequantize: one multiply per element. q4_0 [64, 3] = 3 * 2 * 18 = 108 B.
  TensorId q4 = g.weight("q4", DType::Q4_0, {64, 3});
  expect_work(g, g.dequantize(q4), {192, 108 + 768, DTypeClass::Quantized});
  // KvWrite: src + positions + the T written rows (f16 cache: 3 tokens * 32 * 2 B).
  TensorId kh = g.kv_cache("kh", DType::F16, {16, 2, 8});
  TensorId src = g.input("src", DType::F32, {16, 2, 3});
  TensorId pos3 = g.input("pos3", DType::I32, {3});
  expect_work(g, g.kv_write(kh, src, pos3), {0, 384 + 12 + 192, F32});
  // RopeNeox: as Rope.
  expect_work(g, g.rope_neox(xr, pos, 8, 10000.0f), {3.0 * 8 * 20, 1280 + 20 + 1280, F32});
  // Mixture of experts. logits f32 [8, 3] (96 B), ids i32 [2, 3] (24 B).
  TensorId logits = g.input("logits", DType::F32, {8, 3});
  TensorId route = g.moe_route(logits, 2);  // one comparison per expert per pick
  expect_work(g, route, {8 * 3 * 2, 96 + 24, F32});
  expect_work(g, g.moe_weights(logits, route, true), {3 * 24, 96 + 24 + 24, F32});
  // ExpertMatMul reads only the chosen experts' matrices: q8_0 [64, 32, 8] is 8 * 2176 B, of
  // which 6 (token, choice) pairs read at most 6; b f32 [64, 1, 3], out f32 [32, 2, 3].
  TensorId experts = g.weight("experts", DType::Q8_0, {64, 32, 8});
  TensorId xe = g.input("xe", DType::F32, {64, 1, 3});
  expect_work(g, g.expert_matmul(experts, xe, route),
              {2.0 * 64 * 32 * 6, 6 * 2176 + 768 + 24 + 768, DTypeClass::Quantized});
  // Ten pairs over eight experts read every matrix once.
  TensorId ids5 = g.input("ids5", DType::I32, {2, 5});
  TensorId xe5 = g.input("xe5", DType::F32, {64, 1, 5});
  expect_work(g, g.expert_matmul(experts, xe5, ids5),
              {2.0 * 64 * 32 * 10, 8 * 2176 + 1280 + 40 + 1280, DTypeClass::Quantized});
  // MoeCombine: a multiply and an add per expert output element. [32, 2, 3] -> [32, 3].
  TensorId outs = g.input("outs", DType::F32, {32, 2, 3});
  TensorId gates = g.input("gates", DType::F32, {2, 3});
  expect_work(g, g.moe_combine(outs, gates), {2.0 * 192, 768 + 24 + 384, F32});
  // Leaves and metadata do no work.
  expect_work(g, x, {0, 0, F32});
  expect_work(g, g.reshape(x, {320}), {0, 0, F32});
  expect_work(g, g.transpose(x), {0, 0, F32});
}

TEST(CostModel, EstimateFollowsTheFormula) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {256, 4});
  TensorId w = g.weight("w", DType::F32, {256, 256});
  TensorId y = g.matmul(w, x);
  BackendProfile p;
  p.peak_gflops = {100.0, 200.0, 400.0};
  p.memory_bandwidth_gbs = 10.0;
  p.launch_us = 1.0;
  p.link = {10.0, 2.0};
  // flops 524288 -> 5.24288 us; bytes 262144 + 4096 + 4096 = 270336 -> 27.0336 us (bound).
  OpCost c = CostModel::estimate(g, g.node(y), p);
  EXPECT_DOUBLE_EQ(c.compute_us, 27.0336 + 1.0);
  EXPECT_DOUBLE_EQ(c.transfer_us, 0.0);
  EXPECT_EQ(c.memory_bytes, 262144u + 4096u + 4096u);
  // The weight one hop away, the input two hops: bytes / 10 GB/s + 2 us per hop.
  const uint8_t hops[] = {1, 2};
  c = CostModel::estimate(g, g.node(y), p, hops);
  EXPECT_NEAR(c.transfer_us, (26.2144 + 2.0) + 2 * (0.4096 + 2.0), 1e-9);
  // A weight's one upload spread over 4 runs; x is not a weight and moves every run.
  c = CostModel::estimate(g, g.node(y), p, hops, 4.0);
  EXPECT_NEAR(c.transfer_us, (26.2144 + 2.0) / 4 + 2 * (0.4096 + 2.0), 1e-9);
  // Compute bound: make memory fast.
  p.memory_bandwidth_gbs = 1e6;
  c = CostModel::estimate(g, g.node(y), p);
  EXPECT_NEAR(c.compute_us, 5.24288 + 1.0, 1e-9);
  // A repeated input counts once.
  TensorId sq = g.mul(x, x);
  const uint8_t both[] = {1, 1};
  c = CostModel::estimate(g, g.node(sq), p, both);
  EXPECT_NEAR(c.transfer_us, 0.4096 + 2.0, 1e-9);
  EXPECT_EQ(c.memory_bytes, 4096u + 4096u);
  // Leaves cost nothing.
  EXPECT_EQ(CostModel::estimate(g, g.node(x), p).total_us(), 0.0);
}

// K-quant weights cost their own bytes (Q4_K 144 per 256, Q6_K 210): at the roofline when nothing
// is calibrated, at a calibrated 32-element format's efficiency when only that one is.
TEST(CostModel, KQuantsCostTheirBytesAtACalibratedFormatsEfficiency) {
  BackendProfile p = CostModel::default_profile(BackendKind::Cpu);
  p.launch_us = 0.0;
  p.memory_bandwidth_gbs = 10.0;  // 1e4 bytes per us
  p.peak_gflops[size_t(DTypeClass::Quantized)] = 1e9;
  auto matvec_us = [&](DType dt) {
    Graph g;
    TensorId y = g.matmul(g.weight("w", dt, {4096, 1024}), g.input("x", DType::F32, {4096, 1}));
    EXPECT_EQ(op_work(g, g.node(y)).dtype_class, DTypeClass::Quantized);
    return CostModel::estimate(g, g.node(y), p).compute_us;
  };
  const double x_bytes = 4096 * 4, out_bytes = 1024 * 4;
  EXPECT_NEAR(matvec_us(DType::Q4_K), (1024 * 16 * 144 + x_bytes + out_bytes) / 1e4, 1e-6);
  EXPECT_NEAR(matvec_us(DType::Q6_K), (1024 * 16 * 210 + x_bytes + out_bytes) / 1e4, 1e-6);
  // Q4_0 measured at half the roofline speed (efficiency 2): Q4_K and Q5_K take it, Q6_K not.
  Graph probe;
  TensorId y = probe.matmul(probe.weight("w", DType::Q4_0, {4096, 1024}),
                            probe.input("x", DType::F32, {4096, 1}));
  const OpWork w = op_work(probe, probe.node(y));
  p.op_samples[{OpKind::QuantizedMatMul, DType::Q4_0, true}] = {
      {w.flops, w.bytes, 2.0 * w.bytes / 1e4}};
  const double q4k_roofline = (1024 * 16 * 144 + x_bytes + out_bytes) / 1e4;
  EXPECT_NEAR(matvec_us(DType::Q4_K), 2.0 * q4k_roofline, 1e-6);
  EXPECT_NEAR(matvec_us(DType::Q6_K), (1024 * 16 * 210 + x_bytes + out_bytes) / 1e4, 1e-6);
  // Its own samples win.
  p.op_samples[{OpKind::QuantizedMatMul, DType::Q4_K, true}] = {
      {w.flops, q4k_roofline * 1e4, 3.0 * q4k_roofline}};
  EXPECT_NEAR(matvec_us(DType::Q4_K), 3.0 * q4k_roofline, 1e-6);
}

// A small op measured after the op that runs before it in the graph is priced by that sample;
// after another op (or none measured), by the samples of its plain key; and the key's "after"
// round-trips through the profile's JSON.
TEST(CostModel, SmallOpsArePricedByWhatRanBeforeThemWhereMeasured) {
  BackendProfile p = CostModel::default_profile(BackendKind::Cpu);
  p.launch_us = 0.0;
  Graph g;
  TensorId pos = g.input("pos", DType::I32, {1});
  TensorId k = g.input("k", DType::F32, {16, 2, 1});
  TensorId after_rope =
      g.kv_write(g.kv_cache("kc", DType::F32, {16, 2, 8}), g.rope(k, pos, 16, 10000.0f), pos);
  TensorId after_write = g.kv_write(g.kv_cache("vc", DType::F32, {16, 2, 8}), k, pos);
  const OpWork w = op_work(g, g.node(after_rope));
  p.op_samples[{OpKind::KvWrite, DType::F32, false}] = {{w.flops, w.bytes, 2.0}};
  p.op_samples[{OpKind::KvWrite, DType::F32, false, OpKind::Rope}] = {{w.flops, w.bytes, 10.0}};
  EXPECT_NEAR(CostModel::estimate(g, g.node(after_rope), p).compute_us, 10.0, 1e-9);
  EXPECT_NEAR(CostModel::estimate(g, g.node(after_write), p).compute_us, 2.0, 1e-9);
  CostModel m;
  m.set_profile("cpu", p);
  CostModel back;
  back.load_json(m.to_json());
  EXPECT_NEAR(
      CostModel::estimate(g, g.node(after_rope), back.profile("cpu", BackendKind::Cpu)).compute_us,
      10.0, 1e-9);
  EXPECT_THROW(back.load_json(R"({"profiles": {"cpu": {"op_samples": [{"op": "kv_write",
      "dtype": "f32", "after": "no_such_op", "samples": [[0, 64, 1.0]]}]}}})"),
               Error);
}

TEST(CostModel, DefaultsAndLookupOrder) {
  CostModel m;
  BackendProfile cpu = m.profile("cpu", BackendKind::Cpu);
  EXPECT_EQ(cpu.peak_gflops[0], kDefaultCpuF32Gflops);
  EXPECT_EQ(cpu.memory_bandwidth_gbs, kDefaultCpuBandwidthGbs);
  BackendProfile gpu = m.profile("cuda:0", BackendKind::Gpu);
  EXPECT_EQ(gpu.memory_bandwidth_gbs, kDefaultGpuBandwidthGbs);
  EXPECT_EQ(gpu.link.bandwidth_gbs, kDefaultLinkBandwidthGbs);
  BackendProfile p = gpu;
  p.launch_us = 42;
  m.set_profile("gpu", p);
  EXPECT_EQ(m.profile("cuda:1", BackendKind::Gpu).launch_us, 42);
  p.launch_us = 7;
  m.set_profile("cuda:1", p);
  EXPECT_EQ(m.profile("cuda:1", BackendKind::Gpu).launch_us, 7);
  EXPECT_EQ(m.profile("cuda:0", BackendKind::Gpu).launch_us, 42);
}

TEST(CostModel, JsonOverrides) {
  CostModel m;
  m.load_json(R"({"profiles": {
      "gpu": {"memory_bandwidth_gbs": 3350, "link": {"bandwidth_gbs": 55}},
      "cuda:1": {"peak_gflops": {"f16": 123}, "launch_us": 3},
      "fast": {"kind": "cpu", "launch_us": 0.5}}})");
  BackendProfile g0 = m.profile("cuda:0", BackendKind::Gpu);
  EXPECT_EQ(g0.memory_bandwidth_gbs, 3350);
  EXPECT_EQ(g0.link.bandwidth_gbs, 55);
  EXPECT_EQ(g0.link.latency_us, kDefaultLinkLatencyUs);  // unchanged fields keep defaults
  BackendProfile g1 = m.profile("cuda:1", BackendKind::Gpu);
  EXPECT_EQ(g1.peak_gflops[size_t(DTypeClass::F16)], 123);
  EXPECT_EQ(g1.peak_gflops[size_t(DTypeClass::F32)], kDefaultGpuF32Gflops);
  EXPECT_EQ(g1.launch_us, 3);
  EXPECT_EQ(m.profile("fast", BackendKind::Cpu).memory_bandwidth_gbs, kDefaultCpuBandwidthGbs);
  EXPECT_EQ(m.profile("fast", BackendKind::Cpu).launch_us, 0.5);

  // Round trip through to_json.
  CostModel again;
  again.load_json(m.to_json());
  EXPECT_EQ(again.profile("cuda:1", BackendKind::Gpu).launch_us, 3);

  // Files.
  std::string path = ::testing::TempDir() + "/tandem_profile.json";
  {
    std::ofstream f(path);
    f << R"({"profiles": {"cpu": {"launch_us": 9}}})";
  }
  CostModel from_file;
  from_file.load_json_file(path);
  EXPECT_EQ(from_file.profile("cpu", BackendKind::Cpu).launch_us, 9);
  std::remove(path.c_str());
}

TEST(CostModel, JsonErrorsAreClearAndChangeNothing) {
  CostModel m;
  auto code_of = [&](const std::string& text) {
    try {
      m.load_json(text);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::Internal;
  };
  EXPECT_EQ(code_of("{nope"), ErrorCode::Format);
  EXPECT_EQ(code_of(R"({"cpu": {}})"), ErrorCode::Format);
  EXPECT_EQ(code_of(R"({"profiles": {"cpu": {"launch_us": "fast"}}})"), ErrorCode::Format);
  EXPECT_EQ(code_of(R"({"profiles": {"cpu": {"launch_us": -1}}})"), ErrorCode::Format);
  EXPECT_EQ(
      code_of(R"({"profiles": {"gpu": {"launch_us": 1}, "cpu": {"memory_bandwidth_gbs": 0}}})"),
      ErrorCode::Format);
  EXPECT_EQ(m.profile("gpu", BackendKind::Gpu).launch_us, kDefaultGpuLaunchUs);
  try {
    m.load_json_file("/nonexistent/profile.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Io);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/profile.json"), std::string::npos);
  }
}

// The fuzzer's corpus (tests/fuzz/corpus/cost_model): every file loads or fails with Format, and
// a loaded model saves JSON that loads back to the same JSON.
TEST(CostModel, FuzzCorpusLoadsOrFailsCleanly) {
  size_t files = 0, loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TANDEM_COST_MODEL_FUZZ_DIR)) {
    std::ifstream f(entry.path(), std::ios::binary);
    std::stringstream text;
    text << f.rdbuf();
    SCOPED_TRACE(entry.path().filename().string());
    ++files;
    CostModel m;
    try {
      m.load_json(text.str());
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::Format) << e.what();
      continue;
    }
    ++loaded;
    CostModel reloaded;
    reloaded.load_json(m.to_json());
    EXPECT_EQ(reloaded.to_json(), m.to_json());
  }
  EXPECT_GT(files, 0u);
  EXPECT_GT(loaded, 0u) << "the corpus should hold valid profiles too";
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(CostModel, StreamedWeightsUseThePinnedLinkWhereMeasured) {
  LinkProfile link;
  link.bandwidth_gbs = 5.0;  // pageable
  link.latency_us = 20.0;
  // Not measured: the link's own figures.
  EXPECT_DOUBLE_EQ(CostModel::stream_us(1'000'000, link), CostModel::transfer_us(1'000'000, link));
  link.pinned_bandwidth_gbs = 50.0;
  link.pinned_latency_us = 5.0;
  EXPECT_DOUBLE_EQ(CostModel::stream_us(1'000'000, link), 1e6 / 50e3 + 5.0);  // 25 us
  EXPECT_DOUBLE_EQ(CostModel::transfer_us(1'000'000, link), 1e6 / 5e3 + 20.0);
}

}  // namespace
}  // namespace tandem
