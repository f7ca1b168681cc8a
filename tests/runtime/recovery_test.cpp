// A device that fails in the middle of a run. Out of memory: the session lowers the device's
// budget to what it held, frees what the failed attempt allocated and runs the step again, as
// a run given that budget from the start. Lost: the session drops the device, rebuilds the KV
// caches it held from the tokens so far and goes on, as a run on the other backends alone.
// Under strict both stop with an error naming the device. Test backends (reference kernels)
// stand for the CPU and the GPU, so every placement computes the same numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "tandem/error.h"
#include "tandem/runtime.h"
#include "test_backends.h"
#include "tiny_model.h"

namespace tandem {
namespace {

using test::TestBackend;

struct Devices {
  std::shared_ptr<TestBackend> cpu = test::make_cpu("cpu");
  std::shared_ptr<TestBackend> gpu = test::make_gpu("gpu");
};

SessionOptions options_with(std::vector<std::shared_ptr<Backend>> backends,
                            const std::string& strategy = "gpu") {
  SessionOptions o;
  o.model_path = test::tiny_model_path();
  o.backends = std::move(backends);
  o.strategy = strategy;
  o.n_ctx = 32;
  o.no_calibrate = true;
  return o;
}

// Under auto the tiny model's ops are cheaper on the CPU (built-in figures): layer 0 and its KV
// cache are pinned to the GPU so it holds state to lose.
SessionOptions options_on(const Devices& d, const std::string& strategy = "gpu") {
  SessionOptions o = options_with({d.cpu, d.gpu}, strategy);
  if (strategy == "auto") o.pins = {{"^blk\\.0\\.", "gpu"}, {"^cache_[kv]\\.0$", "gpu"}};
  return o;
}

const std::vector<int32_t> kPrompt = {1, 22, 333, 44, 5};
const std::vector<int32_t> kDecoded = {7, 111, 13, 170};

// The logits of every step: the prompt, then one token at a time.
std::vector<std::vector<float>> run_steps(Session& s) {
  std::vector<std::vector<float>> out;
  auto keep = [&](std::span<const float> l) { out.emplace_back(l.begin(), l.end()); };
  keep(s.prefill(kPrompt));
  for (int32_t t : kDecoded) keep(s.decode(t));
  return out;
}

size_t ops_on(const Placement& p, const std::string& id) {
  const auto ops = p.ops_per_backend();
  for (size_t i = 0; i < p.backends.size(); ++i) {
    if (p.backends[i]->backend_id() == id) return ops[i];
  }
  return 0;
}

// A fresh session's GPU executions after the prompt and after each later step.
std::vector<int> gpu_executions_per_step(const std::string& strategy) {
  Devices d;
  Session s(options_on(d, strategy));
  std::vector<int> after;
  s.prefill(kPrompt);
  after.push_back(d.gpu->executed);
  for (int32_t t : kDecoded) {
    s.decode(t);
    after.push_back(d.gpu->executed);
  }
  return after;
}

TEST(Recovery, OutOfMemoryMidRunLowersTheBudgetLikeASmallerBudgetFromTheStart) {
  // The GPU claims 64 GiB free but holds less than the model's weights: its uploads run out in
  // the first step.
  Devices failing;
  const size_t limit = size_t(256) << 10;
  failing.gpu->allocation_limit = limit;
  Session a(options_on(failing));
  const auto got = run_steps(a);

  ASSERT_FALSE(a.recoveries().empty());
  const Recovery& r = a.recoveries().front();
  EXPECT_EQ(r.error, ErrorCode::OutOfMemory);
  EXPECT_EQ(r.backend, "gpu");
  EXPECT_EQ(r.step, 1);
  const size_t lowered = a.scheduler().memory_budget("gpu");
  EXPECT_LT(lowered, limit);
  EXPECT_GT(lowered, 0u) << "the GPU held part of the model when it ran out";

  // A run told the lowered budget from the start, on a GPU that never fails.
  Devices clean;
  SessionOptions o = options_on(clean);
  o.gpu_memory_by_id["gpu"] = lowered;
  Session b(o);
  const auto want = run_steps(b);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;

  // The same placement, and on the GPU exactly what that run holds: nothing the failed attempts
  // allocated is left.
  ASSERT_NE(a.last_placement(), nullptr);
  EXPECT_GT(ops_on(*a.last_placement(), "gpu"), 0u);
  EXPECT_GT(ops_on(*a.last_placement(), "cpu"), 0u);
  EXPECT_EQ(a.last_placement()->ops_per_backend(), b.last_placement()->ops_per_backend());
  EXPECT_EQ(a.executor().resident_bytes("gpu"), b.executor().resident_bytes("gpu"));
  EXPECT_EQ(failing.gpu->allocated_bytes, clean.gpu->allocated_bytes);
  EXPECT_EQ(failing.gpu->allocated_bytes, a.executor().device_bytes("gpu"));
  EXPECT_LE(failing.gpu->allocated_bytes, limit);

  // The placement says why the work left the GPU, and the telemetry and summary what happened.
  bool noted = false;
  for (const BackendSelection& sel : a.last_placement()->nodes) {
    noted = noted || (sel.reason.kind == SelectionReason::Kind::MemoryConstraint &&
                      sel.reason.why.find("out of memory in step 1") != std::string::npos);
  }
  EXPECT_TRUE(noted) << "no MemoryConstraint names the failure";
  bool recorded = false;
  for (const ExecutionEvent& e : a.telemetry().get_telemetry()) {
    recorded = recorded || (e.kind == EventKind::Op && e.backend == "cpu" &&
                            e.reason == SelectionReason::Kind::MemoryConstraint);
  }
  EXPECT_TRUE(recorded);
  const auto t = nlohmann::json::parse(a.telemetry_json());
  ASSERT_FALSE(t["recoveries"].empty());
  EXPECT_EQ(t["recoveries"][0]["error"], "OutOfMemory");
  EXPECT_EQ(t["recoveries"][0]["backend"], "gpu");
  EXPECT_NE(a.placement_summary().find("gpu out of memory in step 1"), std::string::npos);
  EXPECT_TRUE(nlohmann::json::parse(b.telemetry_json())["recoveries"].empty());
}

TEST(Recovery, OutOfMemoryMovesTheWorkToTheNextGpu) {
  // Two GPUs, the layers split between them; the first runs out while loading its share and
  // what it cannot hold goes to the second, not to the CPU.
  auto cpu = test::make_cpu("cpu");
  auto gpu0 = test::make_gpu("gpu0"), gpu1 = test::make_gpu("gpu1");
  gpu0->allocation_limit = size_t(200) << 10;
  Session a(options_with({cpu, gpu0, gpu1}));
  const auto got = run_steps(a);
  ASSERT_EQ(a.recoveries().size(), 1u);
  EXPECT_EQ(a.recoveries()[0].backend, "gpu0");
  const Placement& p = *a.last_placement();
  EXPECT_GT(ops_on(p, "gpu0"), 0u);
  EXPECT_GT(ops_on(p, "gpu1"), 0u);
  EXPECT_EQ(ops_on(p, "cpu"), 0u);
  // An op gpu0 would have run says why it did not.
  bool refused = false;
  for (const BackendSelection& sel : p.nodes) {
    if (!sel.backend || sel.backend->backend_id() != "gpu1") continue;
    for (const RejectedCandidate& c : sel.rejected) {
      refused = refused || (c.backend_id == "gpu0" && c.reason == RejectReason::OutOfMemory &&
                            c.detail.find("out of memory in step 1") != std::string::npos);
    }
  }
  EXPECT_TRUE(refused);

  auto clean_cpu = test::make_cpu("cpu");
  auto clean0 = test::make_gpu("gpu0"), clean1 = test::make_gpu("gpu1");
  SessionOptions o = options_with({clean_cpu, clean0, clean1});
  o.gpu_memory_by_id["gpu0"] = a.scheduler().memory_budget("gpu0");
  Session b(o);
  const auto want = run_steps(b);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;
  EXPECT_EQ(p.ops_per_backend(), b.last_placement()->ops_per_backend());
  EXPECT_EQ(gpu0->allocated_bytes, clean0->allocated_bytes);
  EXPECT_EQ(gpu0->allocated_bytes, a.executor().device_bytes("gpu0"));
}

TEST(Recovery, OutOfMemoryInALaterStepKeepsWhatTheDeviceHolds) {
  // The first step fits; then the device can allocate nothing more, so a longer step's
  // activations do not fit. Its budget drops to what it holds, which it keeps (nothing is
  // uploaded again), and the ops that need new memory there move to the CPU.
  Devices failing;
  Session a(options_on(failing));
  a.prefill(kPrompt);
  const size_t held = a.executor().resident_bytes("gpu");
  ASSERT_GT(held, 0u);
  const size_t uploads = a.executor().stats().weight_uploads;
  failing.gpu->allocation_limit = failing.gpu->allocated_bytes;
  const std::vector<int32_t> longer = {9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12};
  const std::span<const float> step = a.eval(longer);
  const std::vector<float> got(step.begin(), step.end());
  ASSERT_EQ(a.recoveries().size(), 1u);
  EXPECT_EQ(a.recoveries()[0].error, ErrorCode::OutOfMemory);
  EXPECT_EQ(a.recoveries()[0].step, 2);
  EXPECT_EQ(a.scheduler().memory_budget("gpu"), held);
  EXPECT_EQ(a.executor().resident_bytes("gpu"), held);
  EXPECT_EQ(a.executor().stats().weight_uploads, uploads);
  // What the GPU holds is its weights and caches: the failed step's arena is gone.
  // Every byte on the GPU is what the executor holds now (its weights and caches, the arena of
  // the ops colocated with the caches): the failed step's allocations are gone.
  EXPECT_EQ(failing.gpu->allocated_bytes, a.executor().device_bytes("gpu"));
  EXPECT_GT(ops_on(*a.last_placement(), "cpu"), 0u);

  Devices survivors;
  Session b(options_with({survivors.cpu}));
  b.prefill(kPrompt);
  const std::span<const float> clean = b.eval(longer);
  EXPECT_EQ(got, std::vector<float>(clean.begin(), clean.end()));
}

TEST(Recovery, ADeviceThatCannotHoldEvenItsCachesGivesThemUp) {
  // After the first step the GPU has room for its weights and KV caches alone: the ops that
  // must run beside its caches find no room for their activations either. It ends with
  // nothing, its caches rebuilt on the CPU, as a run on the CPU alone.
  Devices failing;
  Session a(options_on(failing));
  const auto first = a.prefill(kPrompt);
  const std::vector<float> got_first(first.begin(), first.end());
  failing.gpu->allocation_limit = a.executor().resident_bytes("gpu");
  std::vector<std::vector<float>> got = {got_first};
  for (int32_t t : kDecoded) {
    const auto l = a.decode(t);
    got.emplace_back(l.begin(), l.end());
  }
  Devices survivors;
  Session b(options_with({survivors.cpu}));
  const auto want = run_steps(b);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;
  ASSERT_EQ(a.recoveries().size(), 2u);
  EXPECT_EQ(a.scheduler().memory_budget("gpu"), 0u);
  EXPECT_NE(a.recoveries()[1].action.find("KV caches it held rebuilt"), std::string::npos)
      << a.recoveries()[1].action;
  EXPECT_EQ(failing.gpu->allocated_bytes, 0u);
  EXPECT_EQ(ops_on(*a.last_placement(), "gpu"), 0u);
}

class DeviceLost : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceLost, MidRunTheRunContinuesOnTheOthersWithTheSameLogits) {
  const std::string strategy = GetParam();
  // The loss comes in the middle of the second decode step, counted on a clean run.
  const std::vector<int> per_step = gpu_executions_per_step(strategy);
  ASSERT_GT(per_step[2], per_step[1]) << "the GPU runs nothing in a decode step";
  Devices failing;
  failing.gpu->lose_at_execution = per_step[1] + (per_step[2] - per_step[1]) / 2 + 1;
  Session a(options_on(failing, strategy));
  const auto got = run_steps(a);

  // The same steps on the CPU alone.
  Devices survivors;
  Session b(options_with({survivors.cpu}, strategy));
  const auto want = run_steps(b);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;

  EXPECT_TRUE(failing.gpu->lost());
  EXPECT_EQ(failing.gpu->allocated_bytes, 0u) << "the lost device still holds buffers";
  EXPECT_EQ(a.executor().resident_bytes("gpu"), 0u);
  ASSERT_EQ(a.recoveries().size(), 1u);
  const Recovery& r = a.recoveries()[0];
  EXPECT_EQ(r.error, ErrorCode::DeviceLost);
  EXPECT_EQ(r.backend, "gpu");
  EXPECT_EQ(r.step, 3);
  EXPECT_NE(r.action.find("KV caches"), std::string::npos) << r.action;
  ASSERT_NE(a.last_placement(), nullptr);
  EXPECT_EQ(ops_on(*a.last_placement(), "gpu"), 0u);
  bool refused = false;
  for (const BackendSelection& sel : a.last_placement()->nodes) {
    for (const RejectedCandidate& c : sel.rejected)
      refused = refused || (c.backend_id == "gpu" && c.reason == RejectReason::DeviceLost);
  }
  EXPECT_TRUE(refused) << "the placement does not say the GPU is lost";
  EXPECT_NE(a.placement_summary().find("gpu lost in step 3"), std::string::npos);
  const auto t = nlohmann::json::parse(a.telemetry_json());
  ASSERT_EQ(t["recoveries"].size(), 1u);
  EXPECT_EQ(t["recoveries"][0]["error"], "DeviceLost");
}

INSTANTIATE_TEST_SUITE_P(Strategies, DeviceLost, ::testing::Values("gpu", "auto"));

TEST(Recovery, SeveralSequencesAreRebuiltAfterALoss) {
  // Two sequences with their own caches on the GPU; the loss rebuilds both.
  auto run = [](Session& s) {
    std::vector<std::vector<float>> out;
    auto keep = [&](std::span<const float> l) { out.emplace_back(l.begin(), l.end()); };
    keep(s.eval_sequence(0, kPrompt));
    keep(s.eval_sequence(1, kDecoded));
    keep(s.eval_sequence(0, std::vector<int32_t>{3}));
    keep(s.eval_sequence(1, std::vector<int32_t>{4}));
    return out;
  };
  Devices clean;
  SessionOptions o = options_on(clean);
  o.n_sequences = 2;
  {
    Session probe(o);
    probe.eval_sequence(0, kPrompt);
    probe.eval_sequence(1, kDecoded);
    ASSERT_GT(clean.gpu->executed, 0);
  }
  Devices failing;
  failing.gpu->lose_at_execution = clean.gpu->executed + 1;  // the third step's first op
  o.backends = {failing.cpu, failing.gpu};
  Session a(o);
  const auto got = run(a);
  Devices survivors;
  o.backends = {survivors.cpu};
  Session b(o);
  const auto want = run(b);
  ASSERT_EQ(a.recoveries().size(), 1u);
  const size_t earlier = kPrompt.size() + kDecoded.size();
  EXPECT_NE(a.recoveries()[0].action.find(std::to_string(earlier) + " earlier tokens"),
            std::string::npos)
      << a.recoveries()[0].action;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;
}

TEST(Recovery, StrictStopsWithAnErrorNamingTheDevice) {
  const std::vector<int> per_step = gpu_executions_per_step("gpu");
  Devices lost;
  lost.gpu->lose_at_execution = per_step[0] + 1;  // the first decode step
  SessionOptions o = options_on(lost);
  o.strict = true;
  Session a(o);
  a.prefill(kPrompt);
  try {
    a.decode(kDecoded[0]);
    FAIL() << "a lost device under strict must stop the run";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DeviceLost);
    EXPECT_EQ(e.backend(), "gpu");
    const std::string what = e.what();
    EXPECT_NE(what.find("gpu was lost"), std::string::npos) << what;
    EXPECT_NE(what.find("--strict"), std::string::npos) << what;
  }
  EXPECT_TRUE(a.recoveries().empty());

  Devices full;
  full.gpu->allocation_limit = size_t(64) << 10;
  o = options_on(full);
  o.strict = true;
  Session b(o);
  try {
    b.prefill(kPrompt);
    FAIL() << "running out of memory under strict must stop the run";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::OutOfMemory);
    EXPECT_EQ(e.backend(), "gpu");
    const std::string what = e.what();
    EXPECT_NE(what.find("gpu ran out of memory"), std::string::npos) << what;
    EXPECT_NE(what.find("--gpu-mem"), std::string::npos) << what;
  }
  EXPECT_TRUE(b.recoveries().empty());
}

}  // namespace
}  // namespace tandem
