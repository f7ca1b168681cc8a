// Telemetry: summaries, the debug table (also with nothing recorded), and both exports parsed.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tandem/cost_model.h"
#include "tandem/executor.h"
#include "tandem/telemetry.h"
#include "test_backends.h"

namespace tandem {
namespace {

ExecutionEvent op(const std::string& backend, OpKind kind, double est, double actual) {
  ExecutionEvent e;
  e.kind = EventKind::Op;
  e.op = kind;
  e.backend = backend;
  e.estimated_us = est;
  e.actual_us = actual;
  e.n_dims = 2;
  e.shape = {64, 4, 1, 1};
  e.reason = SelectionReason::Kind::GpuAvailable;
  return e;
}

ExecutionEvent transfer(const std::string& from, const std::string& to, size_t bytes, double us) {
  ExecutionEvent e;
  e.kind = EventKind::Transfer;
  e.source_backend = from;
  e.backend = to;
  e.transfer_bytes = bytes;
  e.transfer_us = us;
  return e;
}

TEST(Telemetry, SummariesAddUp) {
  Telemetry t;
  t.record_execution(op("gpu", OpKind::MatMul, 10, 12));
  t.record_execution(op("gpu", OpKind::MatMul, 10, 8));
  t.record_execution(op("cpu", OpKind::Rope, 3, 4));
  t.record_execution(transfer("cpu", "gpu", 1024, 2.5));
  EXPECT_EQ(t.size(), 4u);
  auto usage = t.backend_usage_stats();
  EXPECT_EQ(usage["gpu"].ops, 2u);
  EXPECT_DOUBLE_EQ(usage["gpu"].actual_us, 20.0);
  EXPECT_DOUBLE_EQ(usage["gpu"].estimated_us, 20.0);
  EXPECT_EQ(usage["gpu"].transfers_in, 1u);
  EXPECT_EQ(usage["gpu"].transfer_bytes, 1024u);
  EXPECT_EQ(usage["cpu"].ops, 1u);
  ExecutionSummary s = t.execution_summary();
  EXPECT_EQ(s.ops, 3u);
  EXPECT_EQ(s.transfers, 1u);
  EXPECT_DOUBLE_EQ(s.actual_us, 24.0);
  EXPECT_DOUBLE_EQ(s.transfer_us, 2.5);
  auto by_type = t.operations_by_type();
  EXPECT_EQ(by_type["matmul"].count, 2u);
  EXPECT_EQ(by_type["rope"].count, 1u);
  EXPECT_EQ(by_type.count("input"), 0u);
  std::ostringstream os;
  t.print_debug_summary(os);
  EXPECT_NE(os.str().find("matmul"), std::string::npos);
  EXPECT_NE(os.str().find("total"), std::string::npos);
  t.clear_telemetry();
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.execution_summary().ops, 0u);
}

TEST(Telemetry, DebugSummaryWithNothingRecorded) {
  Telemetry t;
  std::ostringstream os;
  t.print_debug_summary(os);
  EXPECT_NE(os.str().find("no operations recorded"), std::string::npos) << os.str();
  EXPECT_EQ(os.str().find("nan"), std::string::npos) << os.str();
  auto j = nlohmann::json::parse(t.to_json());
  EXPECT_EQ(j["events"].size(), 0u);
  EXPECT_EQ(j["summary"]["ops"].get<int>(), 0);
  auto trace = nlohmann::json::parse(t.to_chrome_trace_json());
  EXPECT_TRUE(trace["traceEvents"].is_array());
}

TEST(Telemetry, KeepsAtMostMaxEvents) {
  Telemetry t(2);
  for (int i = 0; i < 5; ++i) t.record_execution(op("cpu", OpKind::Add, 1, 1));
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.dropped(), 3u);
}

// An attention timed alone over a cache of 64 positions at position 15 read a quarter of the
// keys its estimate's bound counts: its event says so and its estimate is the cost model's at a
// quarter of the work; what the model learns from it divides by that estimate.
TEST(Telemetry, AnAttentionOpIsEstimatedAtThePositionsItRead) {
  auto cpu = test::make_cpu();
  auto sched = HybridScheduler::builder().with_backend(cpu).build();
  ExecutorOptions opts;
  opts.timing = TimingMode::PerOp;
  HybridExecutor exec(sched, opts);
  Graph g;
  const TensorId att =
      g.attention(g.input("q", DType::F32, {16, 2, 1}), g.kv_cache("k", DType::F32, {16, 2, 64}),
                  g.kv_cache("v", DType::F32, {16, 2, 64}), g.input("pos", DType::I32, {1}), 0.25f);
  g.mark_output(att);
  std::vector<float> q(32, 0.5f), out(32);
  const int32_t pos = 15;
  auto placement = sched.plan(g);
  exec.run(g, *placement,
           Bindings()
               .input("q", q.data(), 4 * q.size())
               .input("pos", &pos, sizeof pos)
               .output(att, out.data(), 4 * out.size()));
  const auto events = exec.telemetry().get_telemetry();
  const auto it = std::find_if(events.begin(), events.end(), [](const ExecutionEvent& e) {
    return e.kind == EventKind::Op && e.op == OpKind::Attention;
  });
  ASSERT_NE(it, events.end());
  EXPECT_DOUBLE_EQ(it->work_scale, 0.25);
  const BackendProfile p = sched.cost_model().profile(*cpu);
  EXPECT_DOUBLE_EQ(it->estimated_us, CostModel::compute_us_at(g, g.node(att), p, 0.25));
  EXPECT_LT(it->estimated_us, placement->at(att).estimated_cost.compute_us);
  // Two positions of one step: (1 + 64) keys of 2 x 64.
  const int32_t two[] = {0, 200};
  Graph g2;
  const TensorId att2 = g2.attention(
      g2.input("q", DType::F32, {16, 2, 2}), g2.kv_cache("k", DType::F32, {16, 2, 64}),
      g2.kv_cache("v", DType::F32, {16, 2, 64}), g2.input("pos", DType::I32, {2}), 0.25f);
  EXPECT_DOUBLE_EQ(CostModel::attention_work_scale(g2, g2.node(att2), two), 65.0 / 128.0);
  // What the model learns: an actual time equal to the scaled estimate is a ratio of 1.
  CostModel m;
  m.set_profile("cpu", p);
  for (int run = 0; run < 3; ++run) {
    m.observe(g, g.node(att), "cpu", BackendKind::Cpu,
              CostModel::compute_us_at(g, g.node(att), p, 0.25), 0.25);
    m.end_observations();
  }
  const BackendProfile learned = m.profile("cpu", BackendKind::Cpu);
  ASSERT_EQ(learned.learned.size(), 1u);
  EXPECT_DOUBLE_EQ(learned.learned.begin()->second.ratios.back(), 1.0);
}

TEST(Telemetry, ExportsOfARealRunParse) {
  auto cpu = test::make_cpu();
  auto gpu = test::make_gpu("gpu", test::caps_without({OpKind::Silu}));
  auto sched = HybridScheduler::builder().with_backend(cpu).with_backend(gpu).build();
  ExecutorOptions opts;
  opts.timing = TimingMode::PerOp;
  HybridExecutor exec(sched, opts);
  Graph g;
  TensorId x = g.input("x", DType::F32, {32, 2});
  TensorId w = g.weight("w", DType::F32, {32, 32});
  TensorId y = g.silu(g.matmul(w, x));
  TensorId z = g.matmul(w, y);
  g.mark_output(z);
  std::mt19937 rng(test::test_seed());
  auto xd = test::random_floats(64, rng), wd = test::random_floats(1024, rng);
  std::vector<float> out(64);
  exec.run(g, *sched.plan(g),
           Bindings()
               .weight("w", wd.data(), 4 * wd.size())
               .input("x", xd.data(), 4 * xd.size())
               .output(z, out.data(), 4 * out.size()));
  const auto events = exec.telemetry().get_telemetry();

  auto trace = nlohmann::json::parse(exec.telemetry().to_chrome_trace_json());
  std::map<int, std::string> tracks;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"].get<std::string>() == "M" && e["name"].get<std::string>() == "thread_name")
      tracks[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  }
  std::set<std::string> names;
  for (const auto& [tid, name] : tracks) names.insert(name);
  EXPECT_TRUE(names.count("cpu"));
  EXPECT_TRUE(names.count("gpu"));
  EXPECT_TRUE(names.count("transfers"));
  size_t slices = 0, transfer_slices = 0;
  std::map<int, double> end_of;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"].get<std::string>() != "X") continue;
    ++slices;
    int tid = e["tid"].get<int>();
    ASSERT_TRUE(tracks.count(tid));
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    EXPECT_GE(e["ts"].get<double>() + 1e-9, end_of[tid]);  // no overlap within a track
    end_of[tid] = e["ts"].get<double>() + e["dur"].get<double>();
    if (e["cat"].get<std::string>() == "transfer") {
      ++transfer_slices;
      EXPECT_EQ(tracks[tid], "transfers");
      EXPECT_GT(e["args"]["transfer_bytes"].get<size_t>(), 0u);
    }
    if (e["cat"].get<std::string>() == "op") {
      EXPECT_EQ(tracks[tid], e["args"]["backend"].get<std::string>());
      EXPECT_TRUE(e["args"].contains("reason"));
    }
  }
  EXPECT_EQ(slices, events.size());
  // x to the gpu, mm out back to the cpu, y to the gpu
  EXPECT_EQ(transfer_slices, 3u);

  auto j = nlohmann::json::parse(exec.telemetry().to_json());
  ASSERT_EQ(j["events"].size(), events.size());
  size_t ops = 0;
  for (const auto& e : j["events"]) {
    if (e["kind"].get<std::string>() == "op") {
      ++ops;
      const std::string op = e["op"].get<std::string>();
      EXPECT_TRUE(op == "matmul" || op == "silu") << op;
      EXPECT_EQ(e["shape"].size(), 2u);
      EXPECT_GE(e["actual_us"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(ops, 3u);
  EXPECT_EQ(j["summary"]["ops"].get<int>(), 3);
  EXPECT_EQ(j["summary"]["transfers"].get<int>(), 3);
  EXPECT_EQ(j["summary"]["backends"]["gpu"]["ops"].get<int>(), 2);
  EXPECT_EQ(j["summary"]["backends"]["cpu"]["ops"].get<int>(), 1);
  EXPECT_EQ(j["summary"]["operations_by_type"]["matmul"]["count"].get<int>(), 2);
}

}  // namespace
}  // namespace tandem
