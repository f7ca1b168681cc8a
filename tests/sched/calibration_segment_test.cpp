// Calibration of a device's launch and of its ops inside one segment, on a host-memory stand-in
// whose timer reads scripted times: the launch timed again once the device (or a host) has worked,
// the per-op cost of a segment of tiny ops, what a product saves in a segment, and how the planner
// prices a device op from them (CostModel::in_segment_us).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "tandem/calibration.h"
#include "test_backends.h"

namespace tandem {
namespace {

// A stand-in for a device ("cuda:7") declaring the reference's rows of `ops` (Q4_0 weights alone
// for QuantizedMatMul, which it does not compute: the tests read only its timer). Its timer reads
// read(the last op run alone, the ops of the last segment or 0).
class ScriptedDevice : public test::TestBackend {
 public:
  using Read = std::function<double(OpKind last, size_t segment_ops)>;
  ScriptedDevice(std::initializer_list<OpKind> ops, Read read, bool host = false)
      : TestBackend(config(ops, host)), read_(std::move(read)) {}
  void execute(const Graph& graph, const NodeExecution& exec) override {
    last_ = exec.node->op;
    if (last_ != OpKind::QuantizedMatMul) TestBackend::execute(graph, exec);
  }
  void execute_segment(const Graph& graph, std::span<const NodeExecution> segment,
                       uint64_t signature) override {
    TestBackend::execute_segment(graph, segment, signature);
    segment_ops_ = segment.size();
  }
  void timer_start() override { segment_ops_ = 0; }
  double timer_stop_us() override {
    ++timed;
    return read_(last_, segment_ops_);
  }
  int timed = 0;

 private:
  static Config config(std::initializer_list<OpKind> ops, bool host) {
    Config c;
    c.id = host ? "cpu" : "cuda:7";
    c.kind = host ? BackendKind::Cpu : BackendKind::Gpu;
    c.host_accessible = host;
    c.capabilities.clear();  // the default declares every reference row
    for (const OpCapability& cap : ReferenceBackend::reference_capabilities()) {
      if (std::find(ops.begin(), ops.end(), cap.op) == ops.end()) continue;
      if (cap.op == OpKind::QuantizedMatMul && (cap.dtypes.empty() || cap.dtypes[0] != DType::Q4_0))
        continue;
      c.capabilities.push_back(cap);
    }
    return c;
  }
  Read read_;
  OpKind last_ = OpKind::Add;
  size_t segment_ops_ = 0;
};

BackendProfile quick_calibration(Backend& b) {
  CalibrationOptions quick;
  quick.quick = true;
  return calibrate_backend(b, quick);
}

// A device read slow while it warms up: the first 40 timings (the launch's, which come first)
// read 13 us, every later one 7 us. The launch is timed again at the end and the lower reading
// kept: the first calibration on an H100 that had stood idle read 12.96 us, the next three
// 6.2-7.5 us.
TEST(Calibration, ADeviceLaunchIsTimedAgainOnceTheDeviceHasWorked) {
  int reads = 0;
  ScriptedDevice gpu({OpKind::Add}, [&](OpKind, size_t) { return ++reads <= 40 ? 13.0 : 7.0; });
  const BackendProfile p = quick_calibration(gpu);
  EXPECT_GT(gpu.timed, 40);
  EXPECT_DOUBLE_EQ(p.launch_us, 7.0);
}

// The same on a host backend: five quick calibrations of a 2-core VM's CPU read the launch at
// 0.78-1.52 us first, at 0.68-0.84 us the second time.
TEST(Calibration, AHostLaunchIsTimedAgainToo) {
  int reads = 0;
  ScriptedDevice cpu(
      {OpKind::Add}, [&](OpKind, size_t) { return ++reads <= 40 ? 1.5 : 0.7; }, true);
  const BackendProfile p = quick_calibration(cpu);
  EXPECT_GT(cpu.timed, 40);
  EXPECT_DOUBLE_EQ(p.launch_us, 0.7);
  EXPECT_DOUBLE_EQ(p.segment_launch_us, 0.0);  // a host runs a segment op by op
}

// A device's ops in one segment: the timer reads the whole segment of 64 adds as 96 us (1.5 us
// an op) where one add alone reads 7 us, so an op in a segment costs its estimate less 5.5 us,
// never less than 1.5; without the figure an op costs its estimate.
TEST(Calibration, ADeviceSegmentsOpsAtTheirCostInsideOne) {
  ScriptedDevice gpu({OpKind::Add},
                     [](OpKind, size_t ops) { return ops > 0 ? 1.5 * double(ops) : 7.0; });
  const BackendProfile p = quick_calibration(gpu);
  EXPECT_DOUBLE_EQ(p.launch_us, 7.0);
  EXPECT_DOUBLE_EQ(p.segment_launch_us, 1.5);
  EXPECT_DOUBLE_EQ(CostModel::in_segment_us(20.0, p), 14.5);
  EXPECT_DOUBLE_EQ(CostModel::in_segment_us(7.5, p), 2.0);
  EXPECT_DOUBLE_EQ(CostModel::in_segment_us(3.0, p), 1.5);
  BackendProfile host = p;
  host.segment_launch_us = 0.0;  // not measured: ops cost their estimates
  EXPECT_DOUBLE_EQ(CostModel::in_segment_us(20.0, host), 20.0);
}

// One-token products in a segment: alone each reads 20 us, sixteen in one segment 192 us, so
// an op saves 8 us there (more than the launch less the tiny ops' 1.5 us).
TEST(Calibration, ADeviceMeasuresWhatAProductSavesInsideASegment) {
  ScriptedDevice gpu({OpKind::Add, OpKind::QuantizedMatMul}, [](OpKind last, size_t ops) {
    const bool product = last == OpKind::QuantizedMatMul;
    if (ops > 0) return (product ? 12.0 : 1.5) * double(ops);
    return product ? 20.0 : 7.0;
  });
  const BackendProfile p = quick_calibration(gpu);
  EXPECT_DOUBLE_EQ(p.segment_launch_us, 1.5);
  EXPECT_DOUBLE_EQ(p.segment_saving_us, 8.0);
  EXPECT_DOUBLE_EQ(CostModel::in_segment_us(30.0, p), 22.0);
  EXPECT_DOUBLE_EQ(CostModel::in_segment_us(7.0, p), 1.5);
}

}  // namespace
}  // namespace tandem
