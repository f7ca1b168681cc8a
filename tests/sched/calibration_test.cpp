// Calibration: the fitting math on synthetic measurements, interpolation and learning in the
// estimate, device keys, the profile file's round trip and its refusals, and a quick
// calibration of the CPU backend giving sane numbers (never its speed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "calibration_measure.h"
#include "tandem/calibration.h"
#include "tandem/error.h"
#include "tandem/registry.h"
#include "tandem/scheduler.h"
#include "tandem/telemetry.h"
#include "test_backends.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

static_assert(std::is_same_v<ExecutionStrategy, Strategy>);
static_assert(std::is_same_v<BackendStats, BackendUsage>);

// A temporary folder removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("tandem-calib-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

DeviceKey cpu_key(std::string host = "Test CPU 9000", std::string features = "avx2,threads_4") {
  return {"cpu", "cpu", std::move(host), "", "", std::move(features)};
}

TEST(Calibration, MedianOfOddAndEvenCounts) {
  EXPECT_DOUBLE_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_DOUBLE_EQ(median({1.0, 1.1, 0.9, 1000.0, 1.0}), 1.0);  // one outlier moves nothing
  EXPECT_THROW(median({}), Error);
}

TEST(Calibration, LinkFitRecoversBandwidthAndLatency) {
  // time = 12 us + bytes / 20 GB/s, exactly.
  std::vector<std::pair<double, double>> points;
  for (double bytes : {65536.0, 1048576.0, 16777216.0})
    points.push_back({bytes, 12.0 + bytes / 2e4});
  LinkFit fit = fit_link(points);
  EXPECT_NEAR(fit.bandwidth_gbs, 20.0, 1e-9);
  EXPECT_NEAR(fit.latency_us, 12.0, 1e-9);
  // One size cannot separate latency from bandwidth.
  std::vector<std::pair<double, double>> one{{1024.0, 5.0}, {1024.0, 6.0}};
  EXPECT_THROW(fit_link(one), Error);
}

TEST(Calibration, BaseFiguresAreTheBestRatesBeyondLaunch) {
  BackendProfile p = CostModel::default_profile(BackendKind::Cpu);
  p.launch_us = 2.0;
  // A matmul over many tokens: 4e9 flops in 2 + 40000 us -> 100 GFLOP/s for f32.
  p.op_samples[{OpKind::MatMul, DType::F32, false}] = {{4e9, 1e6, 40002.0}};
  // A q4_0 one: 1e9 flops in 2 + 5000 us -> 200 GFLOP/s, quantized.
  p.op_samples[{OpKind::QuantizedMatMul, DType::Q4_0, false}] = {{1e9, 1e6, 5002.0}};
  // Streaming 32 MB in 2 + 1000 us -> 32 GB/s; a small cached op is faster but not counted.
  p.op_samples[{OpKind::Add, DType::F32, false}] = {{8e6, 32e6, 1002.0}, {1e3, 12e3, 2.1}};
  const double f16_before = p.peak_gflops[size_t(DTypeClass::F16)];
  fit_base_figures(p);
  EXPECT_NEAR(p.peak_gflops[size_t(DTypeClass::F32)], 100.0, 1e-9);
  EXPECT_NEAR(p.peak_gflops[size_t(DTypeClass::Quantized)], 200.0, 1e-9);
  EXPECT_DOUBLE_EQ(p.peak_gflops[size_t(DTypeClass::F16)], f16_before);  // never measured
  EXPECT_NEAR(p.memory_bandwidth_gbs, 32.0, 1e-9);
}

// An add over n floats: flops n, bytes 12 n.
Graph add_graph(int64_t n, TensorId& node) {
  Graph g;
  node = g.add(g.input("a", DType::F32, {n}), g.input("b", DType::F32, {n}));
  return g;
}

// An expert product without samples of its own runs at the efficiency its weights' dense
// product was measured at: for many tokens the quantized matmul's, for one token the
// matrix-vector product's.
TEST(Calibration, ExpertProductTakesTheDenseProductsEfficiency) {
  BackendProfile p = CostModel::default_profile(BackendKind::Cpu);
  p.launch_us = 0.0;
  p.peak_gflops[size_t(DTypeClass::Quantized)] = 1000.0;
  p.memory_bandwidth_gbs = 1e6;  // compute-bound
  // Dense Q4_0 over many tokens at a quarter of the peak, one token at half.
  p.op_samples[{OpKind::QuantizedMatMul, DType::Q4_0, false}] = {{1e9, 1e3, 4000.0}};
  p.op_samples[{OpKind::QuantizedMatMul, DType::Q4_0, true}] = {{1e9, 1e3, 2000.0}};
  for (int64_t tokens : {64, 1}) {
    Graph g;
    const int64_t K = 256, M = 128, E = 8, k = 2;
    const TensorId out = g.expert_matmul(g.weight("a", DType::Q4_0, {K, M, E}),
                                         g.input("b", DType::F32, {K, 1, tokens}),
                                         g.input("ids", DType::I32, {k, tokens}));
    const double roofline = 2.0 * K * M * double(k * tokens) / 1e6;  // 1e6 flops per us
    EXPECT_NEAR(CostModel::estimate(g, g.node(out), p).compute_us,
                (tokens == 1 ? 2.0 : 4.0) * roofline, 1e-6 * roofline)
        << tokens << " tokens";
  }
}

TEST(Calibration, EstimateMatchesSamplesAndInterpolatesBetween) {
  BackendProfile p = CostModel::default_profile(BackendKind::Cpu);
  p.launch_us = 1.0;
  p.memory_bandwidth_gbs = 10.0;  // roofline: 12 n bytes / 1e4 bytes per us
  const OpKey key{OpKind::Add, DType::F32, false};
  // n = 1000: roofline 1.2 us, measured 1 + 2.4 (efficiency 2); n = 1e6: roofline 1200, 1 + 1200.
  p.op_samples[key] = {{1e3, 12e3, 3.4}, {1e6, 12e6, 1201.0}};
  TensorId id;
  Graph small = add_graph(1000, id);
  EXPECT_NEAR(CostModel::estimate(small, small.node(id), p).compute_us, 3.4, 1e-9);
  Graph big = add_graph(1000000, id);
  EXPECT_NEAR(CostModel::estimate(big, big.node(id), p).compute_us, 1201.0, 1e-9);
  // Geometric middle (n = 31623): the geometric mean of the efficiencies 2 and 1.
  Graph mid = add_graph(31623, id);
  const double roofline = 12.0 * 31623 / 1e4;
  EXPECT_NEAR(CostModel::estimate(mid, mid.node(id), p).compute_us, 1.0 + std::sqrt(2.0) * roofline,
              1e-3);
  // Beyond the samples the nearest efficiency holds; tiny ops tend to the launch cost.
  Graph huge = add_graph(100000000, id);
  EXPECT_NEAR(CostModel::estimate(huge, huge.node(id), p).compute_us, 1.0 + 120000.0, 1e-6);
  Graph tiny = add_graph(1, id);
  EXPECT_NEAR(CostModel::estimate(tiny, tiny.node(id), p).compute_us, 1.0 + 2.0 * 12.0 / 1e4, 1e-9);
  // Between a launch-bound sample and a large one the time stays between theirs (measured on
  // a GPU: kv_write of 0.09 MB in 16.4 us and of 12.6 MB in 13.7 us, launch 6.3 us).
  BackendProfile gpu = CostModel::default_profile(BackendKind::Gpu);
  gpu.launch_us = 6.3;
  gpu.memory_bandwidth_gbs = 2834.0;
  gpu.op_samples[key] = {{0.0, 0.086e6, 16.4}, {0.0, 12.585e6, 13.7}};
  for (int64_t n : {10000, 100000, 250000, 500000}) {
    Graph between = add_graph(n, id);
    const double us = CostModel::estimate(between, between.node(id), gpu).compute_us;
    EXPECT_GE(us, 13.7 - 1e-9) << n;
    EXPECT_LE(us, 16.4 + 1e-9) << n;
  }
  // Another op keeps the roofline formula.
  Graph g;
  TensorId m = g.mul(g.input("a", DType::F32, {1000}), g.input("b", DType::F32, {1000}));
  EXPECT_NEAR(CostModel::estimate(g, g.node(m), p).compute_us, 1.0 + 1.2, 1e-9);
}

TEST(Calibration, OneTokenProductsScaleWithTheirBytes) {
  // A peak of 10 GFLOP/s would make every q4_0 matrix-vector product compute bound (2 flops per
  // 0.5625 bytes) and two weights of 2048 x 512 and 1024 x 1024 the same size; a one-token
  // product is bound by its bytes, so each takes its own sample, and between samples of the same
  // efficiency the time follows the bytes.
  BackendProfile p = CostModel::default_profile(BackendKind::Cpu);
  p.launch_us = 0.0;
  p.peak_gflops.fill(10.0);
  p.memory_bandwidth_gbs = 10.0;
  auto product = [](Graph& g, int64_t k, int64_t m) {
    return g.matmul(g.weight("w", DType::Q4_0, {k, m}), g.input("x", DType::F32, {k, 1}));
  };
  Graph square, wide, big;
  const TensorId s = product(square, 1024, 1024), w = product(wide, 2048, 512),
                 b = product(big, 4096, 4096);
  const OpKey key = op_key(square, square.node(s));
  auto sample = [](const Graph& g, TensorId id, double efficiency) {
    const OpWork work = op_work(g, g.node(id));
    return OpSample{work.flops, work.bytes, efficiency * work.bytes / 1e4};
  };
  p.op_samples[key] = {sample(square, s, 3.0), sample(wide, w, 2.0)};
  EXPECT_NEAR(CostModel::estimate(square, square.node(s), p).compute_us, p.op_samples[key][0].us,
              1e-9);
  EXPECT_NEAR(CostModel::estimate(wide, wide.node(w), p).compute_us, p.op_samples[key][1].us, 1e-9);
  // Beyond the samples the largest one's efficiency holds over the bytes (not the flops).
  EXPECT_NEAR(CostModel::estimate(big, big.node(b), p).compute_us,
              2.0 * op_work(big, big.node(b)).bytes / 1e4, 1e-6);
}

TEST(Calibration, OpKeysSeparateOneTokenProducts) {
  Graph g;
  TensorId w = g.weight("w", DType::Q4_0, {64, 32});
  TensorId vec = g.matmul(w, g.input("x", DType::F32, {64, 1}));
  TensorId mat = g.matmul(w, g.input("y", DType::F32, {64, 7}));
  const OpKey kv = op_key(g, g.node(vec)), km = op_key(g, g.node(mat));
  EXPECT_EQ(kv.op, OpKind::QuantizedMatMul);
  EXPECT_EQ(kv.dtype, DType::Q4_0);
  EXPECT_TRUE(kv.one_token);
  EXPECT_FALSE(km.one_token);
  EXPECT_EQ(op_key_name(kv), "quantized_matmul q4_0 vec");
  TensorId q = g.input("q", DType::F32, {16, 4, 1});
  TensorId kc = g.kv_cache("k", DType::F16, {16, 2, 32});
  TensorId vc = g.kv_cache("v", DType::F16, {16, 2, 32});
  TensorId a = g.attention(q, kc, vc, g.input("pos", DType::I32, {1}), 0.25f);
  EXPECT_EQ(op_key(g, g.node(a)).dtype, DType::F16);  // the cache's dtype picks the kernel
  EXPECT_TRUE(op_key(g, g.node(a)).one_token);
  // Small ops carry the op that runs before them (views skipped); products and attention not.
  TensorId sum = g.add(g.reshape(vec, {32, 1}), g.input("r", DType::F32, {32, 1}));
  EXPECT_EQ(op_key(g, g.node(sum)).after, OpKind::Attention);
  EXPECT_EQ(op_key_name(op_key(g, g.node(sum))), "add f32 after attention");
  EXPECT_EQ(op_key(g, g.node(a)).after, OpKind::Input);
  EXPECT_EQ(op_key(g, g.node(mat)).after, OpKind::Input);
}

TEST(Calibration, LearningTakesTheMedianOfRecentRuns) {
  CostModel model;
  BackendProfile p = CostModel::default_profile(BackendKind::Cpu);
  p.launch_us = 0.0;
  p.memory_bandwidth_gbs = 10.0;
  model.set_profile("cpu", p);
  TensorId id;
  Graph g = add_graph(100000, id);  // roofline 120 us
  auto estimate = [&] {
    return CostModel::estimate(g, g.node(id), model.profile("cpu", BackendKind::Cpu)).compute_us;
  };
  // One graph run: its ops' times, then end_observations().
  auto run = [&](std::initializer_list<double> actual_us) {
    for (double us : actual_us) model.observe(g, g.node(id), "cpu", BackendKind::Cpu, us);
    model.end_observations();
  };
  EXPECT_NEAR(estimate(), 120.0, 1e-9);
  // Fewer than kMinLearnedSamples runs change nothing.
  run({240.0});
  run({240.0, 250.0, 230.0});
  EXPECT_NEAR(estimate(), 120.0, 1e-9);
  // A run counts once, with its median: an outlier op inside it moves nothing.
  run({24000.0, 240.0, 240.0});
  EXPECT_NEAR(estimate(), 240.0, 1e-9);
  // Nor does one stray run among the recent ones.
  run({240.0});
  run({12.0});
  EXPECT_NEAR(estimate(), 240.0, 1e-9);
  // Only the most recent runs are kept.
  for (size_t i = 0; i < kLearnedSamples + 4; ++i) run({60.0});
  const BackendProfile learned = model.profile("cpu", BackendKind::Cpu);
  ASSERT_EQ(learned.learned.size(), 1u);
  EXPECT_EQ(learned.learned.begin()->second.ratios.size(), kLearnedSamples);
  EXPECT_NEAR(estimate(), 60.0, 1e-9);
}

TEST(Calibration, ReferenceBackendHasItsOwnSlowFigures) {
  CostModel model;
  BackendProfile cpu = CostModel::default_profile(BackendKind::Cpu);
  cpu.calibrated = true;
  model.set_profile("cpu", cpu);
  const BackendProfile ref = model.profile(kReferenceBackendId, BackendKind::Cpu);
  EXPECT_FALSE(ref.calibrated);  // not the CPU's profile
  EXPECT_LT(ref.memory_bandwidth_gbs, cpu.memory_bandwidth_gbs);
  EXPECT_LT(ref.peak_gflops[0], cpu.peak_gflops[0]);
}

CalibratedDevice sample_device() {
  CalibratedDevice d;
  d.key = cpu_key();
  d.profile = CostModel::default_profile(BackendKind::Cpu);
  d.profile.launch_us = 1.5;
  d.profile.segment_launch_us = 0.25;
  d.profile.segment_saving_us = 3.5;
  d.profile.memory_bandwidth_gbs = 42.0;
  d.profile.link.pinned_bandwidth_gbs = 24.0;
  d.profile.calibrated = true;
  d.profile.op_samples[{OpKind::QuantizedMatMul, DType::Q4_0, true}] = {{1e6, 5e5, 20.0},
                                                                        {1e8, 5e7, 900.0}};
  d.profile.learned[{{OpKind::Add, DType::F32, false}, 7}].ratios = {1.1, 0.9, 1.3};
  return d;
}

TEST(Calibration, ProfileFileRoundTrips) {
  TempDir dir;
  const std::string path = dir.file("sub/profile.json");
  std::vector<CalibratedDevice> devices{sample_device()};
  write_cost_profile(path, devices);
  std::vector<CalibratedDevice> back = read_cost_profile(path);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].key, devices[0].key);
  const BackendProfile &a = devices[0].profile, &b = back[0].profile;
  EXPECT_DOUBLE_EQ(b.launch_us, a.launch_us);
  EXPECT_DOUBLE_EQ(b.segment_launch_us, 0.25);
  EXPECT_DOUBLE_EQ(b.segment_saving_us, 3.5);
  EXPECT_DOUBLE_EQ(b.memory_bandwidth_gbs, a.memory_bandwidth_gbs);
  EXPECT_DOUBLE_EQ(b.link.pinned_bandwidth_gbs, a.link.pinned_bandwidth_gbs);
  EXPECT_TRUE(b.calibrated);
  ASSERT_EQ(b.op_samples.size(), 1u);
  const auto& s = b.op_samples.at({OpKind::QuantizedMatMul, DType::Q4_0, true});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_DOUBLE_EQ(s[1].us, 900.0);
  ASSERT_EQ(b.learned.size(), 1u);
  EXPECT_EQ(b.learned.begin()->first.second, 7);
  EXPECT_EQ(b.learned.begin()->second.ratios, (std::vector<double>{1.1, 0.9, 1.3}));
  // Applied to a model, the entry becomes the backend's profile.
  CostModel model;
  std::vector<DeviceKey> here{cpu_key()};
  apply_cost_profile(back, here, path, model);
  EXPECT_DOUBLE_EQ(model.profile("cpu", BackendKind::Cpu).memory_bandwidth_gbs, 42.0);
}

TEST(Calibration, DefaultPathDependsOnTheDevices) {
  std::vector<DeviceKey> a{cpu_key()}, b{cpu_key("Test CPU 9000", "avx2,threads_8")};
  EXPECT_EQ(default_cost_profile_path(a), default_cost_profile_path(a));
  EXPECT_NE(default_cost_profile_path(a), default_cost_profile_path(b));
  EXPECT_NE(default_cost_profile_path(a).find("cost-profile-"), std::string::npos);
}

// The message of the Error `f` throws (empty when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Format);
    return e.what();
  }
  return "";
}

TEST(Calibration, ForeignProfileIsRefusedNamingTheFile) {
  std::vector<CalibratedDevice> devices{sample_device()};
  CostModel model;
  // Same backend id, another host.
  std::vector<DeviceKey> other_host{cpu_key("Other CPU 1")};
  std::string msg = error_of([&] { apply_cost_profile(devices, other_host, "/x/p.json", model); });
  EXPECT_NE(msg.find("/x/p.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("another device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Other CPU 1"), std::string::npos) << msg;
  // Another thread count is another device.
  std::vector<DeviceKey> other_threads{cpu_key("Test CPU 9000", "avx2,threads_2")};
  EXPECT_NE(error_of([&] { apply_cost_profile(devices, other_threads, "p", model); }), "");
  // No entry for any backend here.
  std::vector<DeviceKey> gpu_only{
      {"cuda:0", "gpu", "Test CPU 9000", "H100 80 GiB", "550", "sm_90"}};
  msg = error_of([&] { apply_cost_profile(devices, gpu_only, "p.json", model); });
  EXPECT_NE(msg.find("no entry for cuda:0"), std::string::npos) << msg;
  // Nothing was applied.
  EXPECT_FALSE(model.profile("cpu", BackendKind::Cpu).calibrated);
}

TEST(Calibration, CorruptProfileIsRefusedNamingTheFile) {
  const std::string good = cost_profile_to_json(std::vector<CalibratedDevice>{sample_device()});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {good.substr(0, good.size() / 2), "not valid JSON"},
      {"{\"profiles\": {}}", "not a cost profile"},
      {"{\"format\": \"tandem-cost-profile\", \"version\": 99, \"devices\": []}", "version"},
      {"{\"format\": \"tandem-cost-profile\", \"version\": 1, \"devices\": [{\"device\": {}, "
       "\"profile\": {}}]}",
       "lacks"},
  };
  for (const auto& [text_, why] : cases) {
    const std::string& text = text_;  // a lambda captures this name (clang before 16: no binding)
    const std::string msg = error_of([&] { cost_profile_from_json(text, "/cache/p.json"); });
    EXPECT_NE(msg.find("/cache/p.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << msg;
  }
  // A bad value inside a profile.
  std::string bad = good;
  const auto at = bad.find("\"launch_us\": 1.5");
  ASSERT_NE(at, std::string::npos);
  bad.replace(at, 16, "\"launch_us\": -3");
  const std::string msg = error_of([&] { cost_profile_from_json(bad, "q.json"); });
  EXPECT_NE(msg.find("launch_us"), std::string::npos) << msg;
}

// Sets XDG_CACHE_HOME for one test.
struct CacheHome {
  std::string old;
  bool had = false;
  explicit CacheHome(const std::string& dir) {
    if (const char* v = std::getenv("XDG_CACHE_HOME")) {
      old = v;
      had = true;
    }
    ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  }
  ~CacheHome() {
    if (had) {
      ::setenv("XDG_CACHE_HOME", old.c_str(), 1);
    } else {
      ::unsetenv("XDG_CACHE_HOME");
    }
  }
};

TEST(Calibration, LoadFallsBackToBuiltInFiguresOnARefusedFile) {
  TempDir dir;
  auto cpu = create_backend("cpu", BackendOptions{1});
  std::vector<std::shared_ptr<Backend>> backends{cpu};
  const BackendProfile builtin = CostModel::default_profile(BackendKind::Cpu);
  // Corrupt.
  const std::string corrupt = dir.file("corrupt.json");
  std::ofstream(corrupt) << "{\"format\": \"tandem-cost-profile\", \"vers";
  CostProfileOptions options;
  options.path = corrupt;
  std::ostringstream log;
  LoadedCostModel loaded = load_cost_model(backends, options, log);
  EXPECT_NE(log.str().find(corrupt), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("built-in"), std::string::npos) << log.str();
  EXPECT_FALSE(loaded.measured);
  EXPECT_DOUBLE_EQ(loaded.model.profile(*cpu).memory_bandwidth_gbs, builtin.memory_bandwidth_gbs);
  // Foreign: a valid file made on another host.
  const std::string foreign = dir.file("foreign.json");
  CalibratedDevice d = sample_device();
  d.key = device_key(*cpu);
  d.key.host_cpu = "Some Other CPU";
  write_cost_profile(foreign, std::vector<CalibratedDevice>{d});
  options.path = foreign;
  log.str("");
  loaded = load_cost_model(backends, options, log);
  EXPECT_NE(log.str().find(foreign), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("another device"), std::string::npos) << log.str();
  EXPECT_DOUBLE_EQ(loaded.model.profile(*cpu).launch_us, builtin.launch_us);
  // The same file with this machine's key is used.
  d.key = device_key(*cpu);
  write_cost_profile(foreign, std::vector<CalibratedDevice>{d});
  log.str("");
  loaded = load_cost_model(backends, options, log);
  EXPECT_EQ(log.str(), "");
  EXPECT_TRUE(loaded.measured);
  EXPECT_DOUBLE_EQ(loaded.model.profile(*cpu).launch_us, 1.5);
  // --no-calibrate: built-in figures and a warning.
  CostProfileOptions none;
  none.use_builtin = true;
  log.str("");
  loaded = load_cost_model(backends, none, log);
  EXPECT_NE(log.str().find("--no-calibrate"), std::string::npos);
  EXPECT_FALSE(loaded.measured);
}

TEST(Calibration, QuickCpuCalibrationIsSaneAndCached) {
  TempDir dir;
  CacheHome home(dir.path.string());
  auto cpu = create_backend("cpu", BackendOptions{1});
  std::vector<std::shared_ptr<Backend>> backends{cpu, create_backend("reference")};
  std::ostringstream log;
  LoadedCostModel loaded = load_cost_model(backends, CostProfileOptions{}, log);
  EXPECT_NE(log.str().find("calibrating"), std::string::npos) << log.str();
  ASSERT_TRUE(loaded.measured);
  ASSERT_EQ(loaded.keys.size(), 1u);  // the reference is never calibrated
  EXPECT_EQ(loaded.path.rfind(dir.path.string(), 0), 0u) << loaded.path;
  const BackendProfile p = loaded.model.profile(*cpu);
  EXPECT_TRUE(p.calibrated);
  EXPECT_GT(p.launch_us, 0.0);
  EXPECT_TRUE(std::isfinite(p.memory_bandwidth_gbs) && p.memory_bandwidth_gbs > 0.0);
  for (double g : p.peak_gflops) EXPECT_TRUE(std::isfinite(g) && g > 0.0);
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    for (bool one : {true, false}) {
      const OpKind op =
          dt == DType::Q8_0 || dt == DType::Q4_0 ? OpKind::QuantizedMatMul : OpKind::MatMul;
      EXPECT_TRUE(p.op_samples.count({op, dt, one})) << dtype_name(dt) << " " << one;
    }
  }
  // Expert products are timed as themselves, one token and many.
  for (DType dt : {DType::Q8_0, DType::Q4_0}) {
    for (bool one : {true, false}) {
      EXPECT_TRUE(p.op_samples.count({OpKind::ExpertMatMul, dt, one}))
          << dtype_name(dt) << " " << one;
    }
  }
  for (const auto& [key, samples] : p.op_samples) {
    for (const OpSample& s : samples) {
      EXPECT_TRUE(std::isfinite(s.us) && s.us > 0.0) << op_key_name(key);
      EXPECT_GT(s.bytes, 0.0) << op_key_name(key);
    }
  }
  // A quick calibration skips a shape whose run it predicts over 20 ms: one thread takes far
  // longer than that for the 17 GFLOP f32 product of 512 tokens (it would need 850 GFLOP/s).
  for (const OpSample& s : p.op_samples.at({OpKind::MatMul, DType::F32, false})) {
    EXPECT_LT(s.flops, 4096.0 * 4096 * 512 * 2) << s.us << " us";
  }
  EXPECT_FALSE(loaded.model.profile(kReferenceBackendId, BackendKind::Cpu).calibrated);
  // The second load reads the saved file and measures nothing.
  log.str("");
  LoadedCostModel again = load_cost_model(backends, CostProfileOptions{}, log);
  EXPECT_EQ(log.str(), "");
  EXPECT_EQ(again.path, loaded.path);
  EXPECT_DOUBLE_EQ(again.model.profile(*cpu).launch_us, p.launch_us);
}

TEST(Calibration, CpuTimesTheOpsOfADecodeLayerAtTheirOwnShapes) {
  // One-token ops of a 1B layer, in a layer's order, that no isolated shape matches (k and v are
  // 8 heads of 64): the decode layer run in place gives each a sample of its own, the small ops
  // under the op that runs before them as in a model (the K cache write after the K RoPE, the V
  // write after the K write: two samples), and the estimate of such a node is that sample's time.
  auto cpu = create_backend("cpu", BackendOptions{1});
  CalibrationOptions quick;
  quick.quick = true;
  const BackendProfile p = calibrate_backend(*cpu, quick);
  Graph g;
  TensorId h = g.input("h", DType::F32, {2048, 1});
  TensorId pos = g.input("pos", DType::I32, {1});
  auto product = [&](const char* name, int64_t rows) {
    return g.matmul(g.weight(name, DType::Q4_0, {2048, rows}), h);
  };
  TensorId q = g.reshape(product("wq", 2048), {64, 32, 1});
  TensorId k = g.reshape(product("wk", 512), {64, 8, 1});
  TensorId v = g.reshape(product("wv", 512), {64, 8, 1});
  TensorId q_roped = g.rope(q, pos, 64, 500000.0f);
  TensorId k_roped = g.rope(k, pos, 64, 500000.0f);
  // Caches as long as the layer's: attention reads every key.
  const int64_t cache = detail::kFirstPosition + 1;
  TensorId kw = g.kv_write(g.kv_cache("kc", DType::F16, {64, 8, cache}), k_roped, pos);
  TensorId vw = g.kv_write(g.kv_cache("vc", DType::F16, {64, 8, cache}), v, pos);
  TensorId attended = g.attention(q_roped, kw, vw, pos, 0.125f);
  TensorId glu = g.swiglu(product("wg", 8192), product("wu", 8192));
  EXPECT_EQ(op_key(g, g.node(kw)).after, OpKind::Rope);
  EXPECT_EQ(op_key(g, g.node(vw)).after, OpKind::KvWrite);
  for (TensorId id : {g.node(k).inputs[0], k_roped, kw, vw, glu, attended}) {
    const Node& n = g.node(id);
    const OpKey key = op_key(g, n);
    const OpWork w = op_work(g, n);
    ASSERT_TRUE(p.op_samples.count(key)) << op_key_name(key);
    const std::vector<OpSample>& samples = p.op_samples.at(key);
    const auto same = std::find_if(samples.begin(), samples.end(), [&](const OpSample& s) {
      return s.flops == w.flops && s.bytes == w.bytes;
    });
    ASSERT_NE(same, samples.end()) << op_key_name(key) << " has no sample at its shape";
    // No estimate is below the launch cost: where the op timed faster than the measured launch
    // (an ASan build: 10.6 us against a launch of 12.6), the estimate is the launch.
    const double want = std::max(same->us, p.launch_us);
    EXPECT_NEAR(CostModel::estimate(g, n, p).compute_us, want, 1e-6 * want + 0.01)
        << op_key_name(key) << ": sample " << same->us << " us, launch " << p.launch_us << " us";
  }
}

TEST(Calibration, DeviceLinkIsFittedEachWayAndOnlyDeclaredOpsAreTimed) {
  // A host-memory stand-in for a GPU that runs only Add: quick to calibrate, and its copies go
  // through the backend API as a device's do.
  std::vector<OpCapability> caps;
  for (const OpCapability& c : ReferenceBackend::reference_capabilities()) {
    if (c.op == OpKind::Add) caps.push_back(c);
  }
  auto gpu = test::make_gpu("cuda:7", caps);
  CalibrationOptions quick;
  quick.quick = true;
  std::vector<std::string> said;
  quick.progress = [&](std::string_view line) { said.emplace_back(line); };
  const BackendProfile p = calibrate_backend(*gpu, quick);
  EXPECT_TRUE(p.calibrated);
  for (double v : {p.link.bandwidth_gbs, p.link.to_host_bandwidth_gbs}) {
    EXPECT_TRUE(std::isfinite(v) && v > 0.0) << v;
  }
  EXPECT_GE(p.link.latency_us, 0.0);
  EXPECT_EQ(p.link.pinned_bandwidth_gbs, 0.0);  // this device keeps no page-locked copies
  ASSERT_FALSE(p.op_samples.empty());
  for (const auto& [key, samples] : p.op_samples) EXPECT_EQ(key.op, OpKind::Add);
  // Each progress line ends with the seconds spent so far and where they went:
  // "link (0.12 s; setup 0.01, flush 0.00, runs 0.02)".
  EXPECT_NE(std::find_if(said.begin(), said.end(),
                         [](const std::string& l) {
                           return l.rfind("link (", 0) == 0 && l.back() == ')' &&
                                  l.find(" s; setup ") != std::string::npos &&
                                  l.find(", flush ") != std::string::npos &&
                                  l.find(", runs ") != std::string::npos;
                         }),
            said.end());
  const DeviceKey key = device_key(*gpu);
  EXPECT_EQ(key.kind, "gpu");
  EXPECT_FALSE(key.device.empty());
}

// This machine's cached profile from before the segment figures: its GPU entry has none, so
// run and bench calibrate again (and save it); the same file named with --cost-profile is used
// as it is.
TEST(Calibration, ACachedGpuProfileWithoutSegmentFiguresIsMeasuredAgain) {
  TempDir dir;
  CacheHome home(dir.path.string());
  std::vector<OpCapability> adds;  // enough for the segment figures
  for (const OpCapability& c : ReferenceBackend::reference_capabilities()) {
    if (c.op == OpKind::Add) adds.push_back(c);
  }
  auto gpu = test::make_gpu("cuda:7", adds);
  std::vector<std::shared_ptr<Backend>> backends{gpu};
  CalibratedDevice old;
  old.key = device_key(*gpu);
  old.profile = CostModel::default_profile(BackendKind::Gpu);
  old.profile.launch_us = 9.0;
  old.profile.calibrated = true;
  const std::vector<DeviceKey> keys{old.key};
  const std::string cached = default_cost_profile_path(keys);
  write_cost_profile(cached, std::vector<CalibratedDevice>{old});
  std::ostringstream log;
  LoadedCostModel loaded = load_cost_model(backends, CostProfileOptions{}, log);
  EXPECT_NE(log.str().find("again"), std::string::npos) << log.str();
  EXPECT_TRUE(loaded.measured);
  EXPECT_GT(loaded.model.profile(*gpu).segment_launch_us, 0.0);
  EXPECT_GT(read_cost_profile(cached).at(0).profile.segment_launch_us, 0.0);
  // Named, the old file is used as it is.
  const std::string named = dir.file("old.json");
  write_cost_profile(named, std::vector<CalibratedDevice>{old});
  CostProfileOptions options;
  options.path = named;
  log.str("");
  loaded = load_cost_model(backends, options, log);
  EXPECT_EQ(log.str(), "");
  EXPECT_DOUBLE_EQ(loaded.model.profile(*gpu).launch_us, 9.0);
  EXPECT_DOUBLE_EQ(loaded.model.profile(*gpu).segment_launch_us, 0.0);
}

TEST(Calibration, EstimateReportFlagsStrayOpTypes) {
  std::vector<ExecutionEvent> events;
  auto op = [&](OpKind k, double est, double act) {
    ExecutionEvent e;
    e.op = k;
    e.backend = "cpu";
    e.estimated_us = est;
    e.actual_us = act;
    events.push_back(e);
  };
  op(OpKind::Add, 10.0, 11.0);   // 9.1%
  op(OpKind::Add, 10.0, 10.0);   // 0%
  op(OpKind::Rope, 10.0, 40.0);  // 75%, 4x
  ExecutionEvent untimed;
  untimed.op = OpKind::Add;
  events.push_back(untimed);  // actual < 0: not counted
  EstimateReport r = estimate_report(events);
  EXPECT_EQ(r.ops, 3u);
  EXPECT_NEAR(r.median_abs_error, 1.0 / 11.0, 1e-12);
  std::ostringstream os;
  print_estimate_report(r, os);
  EXPECT_NE(os.str().find("rope on cpu: actual 4.00x"), std::string::npos) << os.str();
  EXPECT_EQ(os.str().find("add on cpu: actual"), std::string::npos) << os.str();
}

}  // namespace
}  // namespace tandem
