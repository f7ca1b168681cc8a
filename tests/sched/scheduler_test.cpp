// Strategies, reasons, pins, memory budgets, colocation and the plan cache. Every reason is
// produced here, with test backends whose tables, kinds, features and memory differ.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tandem/error.h"
#include "tandem/scheduler.h"
#include "test_backends.h"

namespace tandem {
namespace {

using test::caps_without;
using test::make_cpu;
using test::make_gpu;
using test::TestBackend;
using K = SelectionReason::Kind;

// x -> matmul(w) -> silu -> reshape -> rope (output)
struct Small {
  Graph g;
  TensorId x, w, mm, act, resh, pos, rope;
  explicit Small(DType wtype = DType::F32) {
    x = g.input("x", DType::F32, {64, 4});
    w = g.weight("blk.0.w", wtype, {64, 64});
    mm = g.matmul(w, x);
    act = g.silu(mm);
    resh = g.reshape(act, {16, 4, 4});
    pos = g.input("pos", DType::I32, {4});
    rope = g.rope(resh, pos, 16, 10000.0f);
    g.mark_output(rope);
  }
};

// A GPU behind a link so slow that streaming a host weight never pays: pins and budgets then
// decide alone, as in llama.cpp's placement at decode batch sizes.
CostModel slow_link() {
  CostModel m;
  BackendProfile gpu = CostModel::default_profile(BackendKind::Gpu);
  gpu.link.bandwidth_gbs = 1e-3;
  m.set_profile("gpu", gpu);
  return m;
}

std::string error_of(const std::function<void()>& f, ErrorCode* code = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

const RejectedCandidate* rejected(const BackendSelection& s, const std::string& id) {
  for (const RejectedCandidate& r : s.rejected) {
    if (r.backend_id == id) return &r;
  }
  return nullptr;
}

TEST(Scheduler, GpuPreferredRunsEverythingOnACapableGpu) {
  Small s;
  auto sched = HybridScheduler::builder()
                   .with_cpu_backend(make_cpu())
                   .with_gpu_backend(make_gpu())
                   .strategy(Strategy::gpu_preferred())
                   .build();
  auto p = sched.plan(s.g);
  for (TensorId id : {s.mm, s.act, s.rope}) {
    EXPECT_EQ(p->at(id).backend->backend_id(), "gpu");
    EXPECT_EQ(p->at(id).reason.kind, K::GpuAvailable);
    const RejectedCandidate* r = rejected(p->at(id), "cpu");
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->reason, RejectReason::NotAllowed);
    EXPECT_GT(p->at(id).estimated_cost.total_us(), 0.0);
  }
  // Metadata follows its source; leaves are not placed.
  EXPECT_EQ(p->at(s.resh).reason.kind, K::FollowsSource);
  EXPECT_EQ(p->at(s.resh).backend->backend_id(), "gpu");
  EXPECT_EQ(p->at(s.x).backend, nullptr);
  EXPECT_EQ(p->at(s.x).reason.kind, K::None);
  EXPECT_EQ(p->ops_per_backend(), (std::vector<size_t>{0, 3}));
  // x and pos cross to the GPU each run; the weight is uploaded once.
  EXPECT_EQ(p->planned_transfers, 2u);
  EXPECT_EQ(p->planned_uploads, 1u);
}

TEST(Scheduler, GpuPreferredWithoutAGpuSaysGpuUnavailable) {
  Small s;
  auto sched = HybridScheduler::builder().with_backend(make_cpu()).build();
  auto p = sched.plan(s.g);
  EXPECT_EQ(p->at(s.mm).reason.kind, K::GpuUnavailable);
  EXPECT_EQ(p->at(s.mm).backend->backend_id(), "cpu");
  EXPECT_EQ(p->planned_transfers, 0u);

  auto strict = HybridScheduler::builder().with_backend(make_cpu()).strict().build();
  ErrorCode code{};
  std::string msg = error_of([&] { strict.plan(s.g); }, &code);
  EXPECT_EQ(code, ErrorCode::Unsupported);
  EXPECT_NE(msg.find("strict"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no gpu backend"), std::string::npos) << msg;
}

TEST(Scheduler, CpuFallbackForAnUnsupportedOp) {
  Small s;
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu("gpu", caps_without({OpKind::Rope})))
                   .build();
  auto p = sched.plan(s.g);
  EXPECT_EQ(p->at(s.mm).backend->backend_id(), "gpu");
  const BackendSelection& r = p->at(s.rope);
  EXPECT_EQ(r.backend->backend_id(), "cpu");
  EXPECT_EQ(r.reason.kind, K::CpuFallback);
  EXPECT_NE(r.reason.why.find("does not run rope"), std::string::npos) << r.reason.why;
  EXPECT_EQ(rejected(r, "gpu")->reason, RejectReason::UnsupportedOp);
  // The silu output comes back to the host; pos stays there.
  EXPECT_EQ(p->planned_transfers, 2u);

  auto strict = HybridScheduler::builder()
                    .with_backend(make_cpu())
                    .with_backend(make_gpu("gpu", caps_without({OpKind::Rope})))
                    .strict()
                    .build();
  std::string msg = error_of([&] { strict.plan(s.g); });
  EXPECT_NE(msg.find("rope"), std::string::npos) << msg;
  EXPECT_NE(msg.find("strict mode refuses the fallback to cpu"), std::string::npos) << msg;
}

TEST(Scheduler, CpuFallbackForAnUnsupportedDType) {
  Small s(DType::F16);
  std::vector<OpCapability> caps = caps_without({OpKind::MatMul});
  caps.push_back({OpKind::MatMul, {DType::F32}, 0, ""});
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu("gpu", caps))
                   .build();
  auto p = sched.plan(s.g);
  EXPECT_EQ(p->at(s.mm).reason.kind, K::CpuFallback);
  EXPECT_EQ(rejected(p->at(s.mm), "gpu")->reason, RejectReason::UnsupportedDType);
  EXPECT_NE(p->at(s.mm).reason.why.find("f16"), std::string::npos) << p->at(s.mm).reason.why;
}

TEST(Scheduler, CpuFallbackForATensorTooLarge) {
  Small s;
  std::vector<OpCapability> caps = caps_without({OpKind::Silu});
  caps.push_back({OpKind::Silu, {DType::F32}, 100, ""});  // silu here has 256 elements
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu("gpu", caps))
                   .build();
  auto p = sched.plan(s.g);
  EXPECT_EQ(p->at(s.act).reason.kind, K::CpuFallback);
  EXPECT_EQ(rejected(p->at(s.act), "gpu")->reason, RejectReason::TooLarge);
  EXPECT_NE(p->at(s.act).reason.why.find("256"), std::string::npos);
}

TEST(Scheduler, MissingFeaturePicksTheGpuThatHasIt) {
  Small s;
  std::vector<OpCapability> caps = caps_without({OpKind::MatMul});
  caps.push_back({OpKind::MatMul, {DType::F32}, 0, "tensor_cores"});
  TestBackend::Config with;
  with.id = "gpu1";
  with.kind = BackendKind::Gpu;
  with.host_accessible = false;
  with.capabilities = caps;
  with.features = {"tensor_cores"};
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu("gpu0", caps))
                   .with_backend(std::make_shared<TestBackend>(with))
                   .build();
  auto p = sched.plan(s.g);
  EXPECT_EQ(p->at(s.mm).backend->backend_id(), "gpu1");
  EXPECT_EQ(p->at(s.mm).reason.kind, K::GpuAvailable);
  EXPECT_EQ(rejected(p->at(s.mm), "gpu0")->reason, RejectReason::MissingFeature);
  EXPECT_NE(rejected(p->at(s.mm), "gpu0")->detail.find("tensor_cores"), std::string::npos);

  // With only the featureless GPU the op falls back to the CPU.
  auto only0 = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu("gpu0", caps))
                   .build();
  EXPECT_EQ(only0.plan(s.g)->at(s.mm).reason.kind, K::CpuFallback);
}

TEST(Scheduler, ALostDeviceIsNotChosen) {
  Small s;
  auto gpu = make_gpu();
  gpu->set_lost(true);
  auto sched = HybridScheduler::builder().with_backend(make_cpu()).with_backend(gpu).build();
  auto p = sched.plan(s.g);
  EXPECT_EQ(p->at(s.mm).reason.kind, K::CpuFallback);
  EXPECT_EQ(rejected(p->at(s.mm), "gpu")->reason, RejectReason::DeviceLost);
  // A cached plan is not reused once a device it chose is lost.
  gpu->set_lost(false);
  EXPECT_EQ(sched.plan(s.g)->at(s.mm).backend->backend_id(), "gpu");
  gpu->set_lost(true);
  EXPECT_EQ(sched.plan(s.g)->at(s.mm).backend->backend_id(), "cpu");
}

// Four layers of matmul(w_l [64, 64] f32 = 16 KiB) + silu.
struct Layers {
  Graph g;
  std::vector<TensorId> mm, act;
  explicit Layers(int n = 4) {
    TensorId x = g.input("x", DType::F32, {64, 1});
    for (int l = 0; l < n; ++l) {
      TensorId w = g.weight("blk." + std::to_string(l) + ".w", DType::F32, {64, 64});
      mm.push_back(g.matmul(w, x));
      x = g.silu(mm.back());
      act.push_back(x);
    }
    g.mark_output(x);
  }
};
constexpr size_t kW = 64 * 64 * 4;

TEST(Scheduler, ABudgetLoweredAfterBuildReplansAndSaysWhy) {
  Layers L;
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .cost_model(slow_link())
                   .build();
  auto all = sched.plan(L.g);
  EXPECT_EQ(all->at(L.mm[3]).backend->backend_id(), "gpu");
  // Lowered to one layer's weight and its activations: the cached plan is not reused.
  sched.set_memory_budget("gpu", kW + 1024, "budget lowered: out of memory in step 4");
  EXPECT_EQ(sched.memory_budget("gpu"), kW + 1024);
  EXPECT_EQ(sched.cached_plans(), 0u);
  auto p = sched.plan(L.g);
  EXPECT_NE(p, all);
  EXPECT_EQ(p->at(L.mm[0]).backend->backend_id(), "gpu");
  const BackendSelection& m1 = p->at(L.mm[1]);
  EXPECT_EQ(m1.backend->backend_id(), "cpu");
  EXPECT_EQ(m1.reason.kind, K::MemoryConstraint);
  EXPECT_NE(m1.reason.why.find("(budget lowered: out of memory in step 4)"), std::string::npos)
      << m1.reason.why;
  EXPECT_THROW(sched.set_memory_budget("nope", 1), Error);
}

TEST(Scheduler, MemoryBudgetPutsALayerPrefixOnTheGpu) {
  Layers L;
  const size_t budget = 2 * kW + 4096;
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .memory_budget("gpu", budget)
                   .cost_model(slow_link())
                   .build();
  EXPECT_EQ(sched.memory_budget("gpu"), budget);
  auto p = sched.plan(L.g);
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(p->at(L.mm[size_t(l)]).backend->backend_id(), "gpu") << l;
    EXPECT_EQ(p->at(L.act[size_t(l)]).backend->backend_id(), "gpu") << l;
  }
  // Layer 2's weight does not fit: 16 KiB + its 256-byte output, 4 KiB left.
  const BackendSelection& m2 = p->at(L.mm[2]);
  EXPECT_EQ(m2.backend->backend_id(), "cpu");
  EXPECT_EQ(m2.reason.kind, K::MemoryConstraint);
  EXPECT_EQ(m2.reason.needed_bytes, kW + 256);
  EXPECT_EQ(m2.reason.free_bytes, 4096u);
  EXPECT_EQ(rejected(m2, "gpu")->reason, RejectReason::OutOfMemory);
  // Everything after stays off the GPU (no ping-pong), with the same figures.
  for (TensorId id : {L.act[2], L.mm[3], L.act[3]}) {
    EXPECT_EQ(p->at(id).backend->backend_id(), "cpu");
    EXPECT_EQ(p->at(id).reason.kind, K::MemoryConstraint);
    EXPECT_EQ(p->at(id).reason.needed_bytes, kW + 256);
    EXPECT_NE(p->at(id).reason.why.find("exhausted"), std::string::npos);
  }
  // A weight already resident counts once: the same prefix when layer 0's weight is there.
  Residency r;
  r.add("gpu", "blk.0.w", kW);
  auto p2 = sched.plan(L.g, r);
  EXPECT_NE(p2.get(), p.get());
  EXPECT_EQ(p2->at(L.mm[1]).backend->backend_id(), "gpu");
  EXPECT_EQ(p2->at(L.mm[2]).backend->backend_id(), "cpu");
  EXPECT_EQ(p2->planned_uploads, 1u);  // only layer 1's weight is new

  // A preloaded weight is still used after the budget ran out: layer 0 does not fit, layer 3's
  // weight is already on the GPU (and its 512 transient bytes fit the 4 KiB left).
  auto small = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .memory_budget("gpu", kW + 4096)
                   .cost_model(slow_link())
                   .build();
  Residency r3;
  r3.add("gpu", "blk.3.w", kW);
  auto p3 = small.plan(L.g, r3);
  EXPECT_EQ(p3->at(L.mm[0]).reason.kind, K::MemoryConstraint);
  EXPECT_EQ(p3->at(L.act[2]).reason.kind, K::MemoryConstraint);
  EXPECT_EQ(p3->at(L.mm[3]).backend->backend_id(), "gpu");
  EXPECT_EQ(p3->at(L.mm[3]).reason.kind, K::GpuAvailable);

  auto strict = HybridScheduler::builder()
                    .with_backend(make_cpu())
                    .with_backend(make_gpu())
                    .memory_budget("gpu", budget)
                    .strict()
                    .cost_model(slow_link())
                    .build();
  ErrorCode code{};
  std::string msg = error_of([&] { strict.plan(L.g); }, &code);
  EXPECT_EQ(code, ErrorCode::OutOfMemory);
  EXPECT_NE(msg.find("memory_constraint"), std::string::npos) << msg;
}

TEST(Scheduler, BudgetsSplitLayersAcrossTwoGpus) {
  Layers L;
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu("gpu0"))
                   .with_backend(make_gpu("gpu1"))
                   .memory_budget("gpu0", 2 * kW + 4096)
                   .memory_budget("gpu1", 2 * kW + 4096)
                   .build();
  auto p = sched.plan(L.g);
  const char* want[] = {"gpu0", "gpu0", "gpu1", "gpu1"};
  for (size_t l = 0; l < 4; ++l) {
    EXPECT_EQ(p->at(L.mm[l]).backend->backend_id(), want[l]) << l;
    EXPECT_EQ(p->at(L.act[l]).backend->backend_id(), want[l]) << l;
  }
  EXPECT_EQ(p->at(L.mm[2]).reason.kind, K::GpuAvailable);
  EXPECT_EQ(rejected(p->at(L.mm[2]), "gpu0")->reason, RejectReason::OutOfMemory);
  EXPECT_EQ(p->planned_transfers, 2u);  // x to gpu0, then layer 1's output to gpu1
}

TEST(Scheduler, DefaultBudgetIsTheBackendsFreeMemory) {
  TestBackend::Config c;
  c.id = "gpu";
  c.kind = BackendKind::Gpu;
  c.host_accessible = false;
  c.free_bytes = kW + 1024;  // room for one layer
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(std::make_shared<TestBackend>(c))
                   .build();
  EXPECT_EQ(sched.memory_budget("gpu"), kW + 1024);
  Layers L;
  auto p = sched.plan(L.g);
  EXPECT_EQ(p->at(L.mm[0]).backend->backend_id(), "gpu");
  EXPECT_EQ(p->at(L.mm[1]).backend->backend_id(), "cpu");
  EXPECT_EQ(p->at(L.mm[1]).reason.kind, K::MemoryConstraint);
}

TEST(Scheduler, TensorAndOpPinsAreUserPreferences) {
  Layers L;
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .pin_tensor("blk\\.1\\..*", "cpu")
                   .pin_op(OpKind::Silu, "cpu")
                   .cost_model(slow_link())
                   .build();
  auto p = sched.plan(L.g);
  EXPECT_EQ(p->at(L.mm[0]).reason.kind, K::GpuAvailable);
  const BackendSelection& m1 = p->at(L.mm[1]);
  EXPECT_EQ(m1.backend->backend_id(), "cpu");
  EXPECT_EQ(m1.reason.kind, K::UserPreference);
  EXPECT_NE(m1.reason.why.find("blk\\.1\\..*"), std::string::npos) << m1.reason.why;
  EXPECT_NE(m1.reason.why.find("blk.1.w"), std::string::npos) << m1.reason.why;
  EXPECT_EQ(rejected(m1, "gpu")->reason, RejectReason::NotAllowed);
  for (TensorId a : L.act) {
    EXPECT_EQ(p->at(a).backend->backend_id(), "cpu");
    EXPECT_EQ(p->at(a).reason.kind, K::UserPreference);
    EXPECT_NE(p->at(a).reason.why.find("op pin silu"), std::string::npos);
  }
  // Patterns are searched, as --override-tensor: "\\.3\\." pins layer 3 only; the first
  // matching pin wins.
  auto search = HybridScheduler::builder()
                    .with_backend(make_cpu())
                    .with_backend(make_gpu())
                    .pin_tensor("\\.3\\.", "cpu")
                    .pin_tensor("blk", "gpu")
                    .cost_model(slow_link())
                    .build();
  auto q = search.plan(L.g);
  EXPECT_EQ(q->at(L.mm[3]).backend->backend_id(), "cpu");
  EXPECT_EQ(q->at(L.mm[0]).backend->backend_id(), "gpu");
  EXPECT_EQ(q->at(L.mm[0]).reason.kind, K::UserPreference);
}

TEST(Scheduler, APinToABackendThatCannotRunTheOp) {
  Small s;
  auto build = [](bool strict) {
    return HybridScheduler::builder()
        .with_backend(make_cpu())
        .with_backend(make_gpu("gpu", caps_without({OpKind::Rope})))
        .strategy(Strategy::cpu_preferred())
        .pin_op(OpKind::Rope, "gpu")
        .strict(strict)
        .build();
  };
  auto loose = build(false);
  auto p = loose.plan(s.g);
  EXPECT_EQ(p->at(s.rope).backend->backend_id(), "cpu");
  EXPECT_EQ(p->at(s.rope).reason.kind, K::CpuAvailable);
  EXPECT_EQ(rejected(p->at(s.rope), "gpu")->reason, RejectReason::UnsupportedOp);
  auto strict = build(true);
  std::string msg = error_of([&] { strict.plan(s.g); });
  EXPECT_NE(msg.find("op pin rope -> gpu"), std::string::npos) << msg;
}

TEST(Scheduler, BuilderRejectsBadConfigurations) {
  ErrorCode code{};
  std::string msg = error_of(
      [&] {
        HybridScheduler::builder()
            .with_backend(make_cpu())
            .strategy(Strategy::backend_only("nope"))
            .build();
      },
      &code);
  EXPECT_EQ(code, ErrorCode::InvalidArgument);
  EXPECT_NE(msg.find("'nope'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("known: cpu"), std::string::npos) << msg;
  EXPECT_NE(error_of([] { HybridScheduler::builder().build(); }).find("at least one"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              HybridScheduler::builder().with_backend(make_cpu()).with_backend(make_cpu()).build();
            }).find("twice"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              HybridScheduler::builder().with_backend(make_cpu()).pin_tensor("(", "cpu").build();
            }).find("not a valid regex"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              HybridScheduler::builder().with_backend(make_cpu()).pin_op(OpKind::Add, "x").build();
            }).find("unknown backend 'x'"),
            std::string::npos);
  EXPECT_NE(error_of([] { HybridScheduler::builder().with_gpu_backend(make_cpu()); }).find("cpu"),
            std::string::npos);
  EXPECT_NE(error_of([] { HybridScheduler::builder().switch_threshold(0.5); }).find(">= 1"),
            std::string::npos);
}

TEST(Scheduler, BackendOnlyUsesThatBackendOrSaysWhatItCannotDo) {
  Small s;
  auto ok = HybridScheduler::builder()
                .with_backend(make_cpu())
                .with_backend(make_gpu())
                .strategy(Strategy::backend_only("cpu"))
                .build();
  auto p = ok.plan(s.g);
  for (TensorId id : {s.mm, s.act, s.rope}) {
    EXPECT_EQ(p->at(id).backend->backend_id(), "cpu");
    EXPECT_EQ(p->at(id).reason.kind, K::UserPreference);
    EXPECT_EQ(rejected(p->at(id), "gpu")->reason, RejectReason::NotAllowed);
  }
  auto bad = HybridScheduler::builder()
                 .with_backend(make_cpu())
                 .with_backend(make_gpu("gpu", caps_without({OpKind::Rope})))
                 .strategy(Strategy::backend_only("gpu"))
                 .build();
  ErrorCode code{};
  std::string msg = error_of([&] { bad.plan(s.g); }, &code);
  EXPECT_EQ(code, ErrorCode::Unsupported);
  EXPECT_NE(msg.find("backend_only(gpu) cannot run"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rope"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unsupported op"), std::string::npos) << msg;
}

TEST(Scheduler, CpuPreferredAndItsFallback) {
  Small s;
  auto sched = HybridScheduler::builder()
                   .with_backend(make_gpu())
                   .with_backend(make_cpu("cpu", caps_without({OpKind::Rope})))
                   .strategy(Strategy::cpu_preferred())
                   .build();
  auto p = sched.plan(s.g);
  EXPECT_EQ(p->at(s.mm).backend->backend_id(), "cpu");
  EXPECT_EQ(p->at(s.mm).reason.kind, K::CpuAvailable);
  EXPECT_EQ(rejected(p->at(s.mm), "gpu")->reason, RejectReason::NotAllowed);
  EXPECT_EQ(p->at(s.rope).backend->backend_id(), "gpu");
  EXPECT_EQ(p->at(s.rope).reason.kind, K::GpuFallback);
  EXPECT_NE(p->at(s.rope).reason.why.find("does not run rope"), std::string::npos);

  auto gpu_only = HybridScheduler::builder()
                      .with_backend(make_gpu())
                      .strategy(Strategy::cpu_preferred())
                      .build();
  auto q = gpu_only.plan(s.g);
  EXPECT_EQ(q->at(s.mm).reason.kind, K::GpuFallback);
  EXPECT_EQ(q->at(s.mm).reason.why, "no cpu backend");

  auto strict = HybridScheduler::builder()
                    .with_backend(make_gpu())
                    .strategy(Strategy::cpu_preferred())
                    .strict()
                    .build();
  EXPECT_NE(error_of([&] { strict.plan(s.g); }).find("strict"), std::string::npos);
}

TEST(Scheduler, NoBackendCanRunTheOp) {
  Small s;
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu("cpu", caps_without({OpKind::Rope})))
                   .with_backend(make_gpu("gpu", caps_without({OpKind::Rope})))
                   .build();
  ErrorCode code{};
  std::string msg = error_of([&] { sched.plan(s.g); }, &code);
  EXPECT_EQ(code, ErrorCode::Unsupported);
  EXPECT_NE(msg.find("no backend can run it"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu: cpu does not run rope"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gpu: gpu does not run rope"), std::string::npos) << msg;
}

// Profiles that differ by known factors: the GPU computes 100x faster and reads memory 100x
// faster but pays launch and link costs.
CostModel two_profiles(LinkProfile gpu_link = {10.0, 2.0}) {
  CostModel m;
  BackendProfile cpu;
  cpu.peak_gflops = {100.0, 100.0, 100.0};
  cpu.memory_bandwidth_gbs = 10.0;
  cpu.launch_us = 1.0;
  BackendProfile gpu;
  gpu.peak_gflops = {10000.0, 10000.0, 10000.0};
  gpu.memory_bandwidth_gbs = 1000.0;
  gpu.launch_us = 5.0;
  gpu.link = gpu_link;
  m.set_profile("cpu", cpu);
  m.set_profile("gpu", gpu);
  return m;
}

TEST(Scheduler, AutomaticMatchesCostsComputedByHand) {
  // y = w [256, 256] f32 x x [256, 4]: 524288 flops, 262144 + 4096 + 4096 = 270336 bytes.
  Graph g;
  TensorId x = g.input("x", DType::F32, {256, 4});
  TensorId w = g.weight("w", DType::F32, {256, 256});
  TensorId y = g.matmul(w, x);
  g.mark_output(y);
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .strategy(Strategy::automatic())
                   .cost_model(two_profiles())
                   .build();
  // cpu: max(5.24288, 27.0336) + 1 = 28.0336 us, nothing to move.
  // gpu: max(0.0524288, 0.270336) + 5 = 5.270336 us compute, plus the weight's one-time upload
  //      (26.2144 + 2) spread over kWeightReuseRuns = 32 runs (0.8817) and x (0.4096 + 2):
  //      3.2913 us of transfers, 8.561636 us in all: the GPU, 3.27x cheaper.
  auto p = sched.plan(g);
  const BackendSelection& s = p->at(y);
  EXPECT_EQ(s.backend->backend_id(), "gpu");
  EXPECT_EQ(s.reason.kind, K::CostModel);
  ASSERT_EQ(s.reason.costs.size(), 2u);
  EXPECT_NEAR(s.reason.costs[0].cost.total_us(), 28.0336, 1e-9);
  EXPECT_NEAR(s.reason.costs[1].cost.compute_us, 5.270336, 1e-9);
  EXPECT_NEAR(s.reason.costs[1].cost.transfer_us, 28.2144 / 32 + 2.4096, 1e-9);
  EXPECT_EQ(rejected(s, "cpu")->reason, RejectReason::MoreExpensive);
  EXPECT_EQ(p->planned_transfers, 1u);  // x
  EXPECT_EQ(p->planned_uploads, 1u);    // w, once

  // A link 40x slower makes even the amortized upload dearer than the CPU:
  // gpu = 5.270336 + (1048.576 + 2) / 32 + (16.384 + 2) = 56.485 us > 28.0336 us.
  auto slow_sched = HybridScheduler::builder()
                        .with_backend(make_cpu())
                        .with_backend(make_gpu())
                        .strategy(Strategy::automatic())
                        .cost_model(two_profiles({0.25, 2.0}))
                        .build();
  auto ps = slow_sched.plan(g);
  EXPECT_EQ(ps->at(y).backend->backend_id(), "cpu");
  EXPECT_NEAR(ps->at(y).reason.costs[1].cost.transfer_us, (1048.576 + 2) / 32 + 18.384, 1e-9);
  EXPECT_EQ(ps->planned_transfers, 0u);

  // With the weight resident on the GPU only x moves: 5.270336 + 2.4096 = 7.679936 us.
  Residency r;
  r.add("gpu", "w", 262144);
  auto q = sched.plan(g, r);
  EXPECT_EQ(q->at(y).backend->backend_id(), "gpu");
  EXPECT_NEAR(q->at(y).estimated_cost.total_us(), 7.679936, 1e-9);
  EXPECT_EQ(q->planned_transfers, 1u);  // x, once
  EXPECT_EQ(q->planned_uploads, 0u);
}

TEST(Scheduler, AutomaticPlacesTheWholeGraphNotOpByOp) {
  // a = silu(x) runs on the CPU (the GPU would pay for moving x); then a matmul whose weight
  // lives on the GPU, where it is 3.65x cheaper than on the CPU.
  Graph g;
  TensorId x = g.input("x", DType::F32, {256, 4});
  TensorId a = g.silu(x);
  TensorId w = g.weight("w", DType::F32, {256, 256});
  TensorId y = g.matmul(w, a);
  g.mark_output(y);
  Residency r;
  r.add("gpu", "w", 262144);
  auto plan_with = [&](double threshold) {
    return HybridScheduler::builder()
        .with_backend(make_cpu())
        .with_backend(make_gpu())
        .strategy(Strategy::automatic())
        .cost_model(two_profiles())
        .switch_threshold(threshold)
        .build()
        .plan(g, r);
  };
  auto p = plan_with(kDefaultSwitchThreshold);
  ASSERT_EQ(p->at(a).backend->backend_id(), "cpu");
  // silu: cpu max(4096 flops -> 0.04096, 8192 B -> 0.8192) + 1 = 1.8192;
  // gpu 5.008192 + x over the link 2.4096 = 7.417792.
  EXPECT_NEAR(p->at(a).reason.costs[0].cost.total_us(), 1.8192, 1e-9);
  EXPECT_NEAR(p->at(a).reason.costs[1].cost.total_us(), 7.417792, 1e-9);
  // matmul: cpu 28.0336, gpu 5.270336 + a over the link 2.4096 = 7.679936; y back to the host
  // 2.4096. The step: 1.8192 + 7.679936 + 2.4096 = 11.908736 us, the optimum of the four.
  EXPECT_EQ(p->at(y).backend->backend_id(), "gpu");
  EXPECT_EQ(p->at(y).reason.kind, K::CostModel);
  EXPECT_NE(p->at(y).reason.why.find("whole-graph search (step predicted 11.9 us)"),
            std::string::npos)
      << p->at(y).reason.why;
  EXPECT_EQ(rejected(p->at(y), "cpu")->reason, RejectReason::MoreExpensive);
  EXPECT_EQ(p->planned_transfers, 1u);  // a crosses once
  // The op-by-op hysteresis is gone from auto: any threshold gives the same placement.
  auto q = plan_with(10.0);
  EXPECT_EQ(q->at(a).backend->backend_id(), "cpu");
  EXPECT_EQ(q->at(y).backend->backend_id(), "gpu");
}

TEST(Scheduler, AutomaticStreamsAWeightItsBudgetCannotHold) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {256, 4});
  TensorId w = g.weight("w", DType::F32, {256, 256});
  TensorId y = g.matmul(w, x);
  g.mark_output(y);
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .strategy(Strategy::automatic())
                   .cost_model(two_profiles({1e6, 0.0}))  // free transfers: the GPU is cheapest
                   .memory_budget("gpu", 1000)
                   .build();
  auto p = sched.plan(g);
  // The weight (262144 B) does not fit the budget, so it lives in host memory; with a free link
  // the GPU runs the matmul with it streamed in (staging on top of the budget).
  EXPECT_EQ(sched.residency_plan()->home.count("w"), 0u);
  EXPECT_EQ(p->at(y).backend->backend_id(), "gpu");
  EXPECT_EQ(p->at(y).reason.kind, K::Streamed);
  ASSERT_EQ(p->at(y).streamed.size(), 1u);
  EXPECT_EQ(p->streamed_bytes, 262144u);
  EXPECT_EQ(p->planned_uploads, 0u);
  EXPECT_GE(p->stream_staging_bytes[1], 262144u);
  // A slow link makes the CPU the better home for the op.
  auto slow = HybridScheduler::builder()
                  .with_backend(make_cpu())
                  .with_backend(make_gpu())
                  .strategy(Strategy::automatic())
                  .cost_model(two_profiles({0.25, 2.0}))
                  .memory_budget("gpu", 1000)
                  .build();
  auto q = slow.plan(g);
  EXPECT_EQ(q->at(y).backend->backend_id(), "cpu");
  EXPECT_EQ(q->at(y).reason.kind, K::CostModel);
}

// One attention block over persistent K/V caches.
struct Attn {
  Graph g;
  TensorId kw, vw, attn;
  Attn() {
    TensorId q = g.input("q", DType::F32, {16, 4, 2});
    TensorId k = g.input("k", DType::F32, {16, 2, 2});
    TensorId v = g.input("v", DType::F32, {16, 2, 2});
    TensorId pos = g.input("pos", DType::I32, {2});
    TensorId kc = g.kv_cache("cache.k", DType::F32, {16, 2, 8});
    TensorId vc = g.kv_cache("cache.v", DType::F32, {16, 2, 8});
    kw = g.kv_write(kc, k, pos);
    vw = g.kv_write(vc, v, pos);
    attn = g.attention(q, kw, vw, pos, 0.25f);
    g.mark_output(attn);
  }
};

TEST(Scheduler, AttentionAndKvWriteRunWhereTheCacheLives) {
  Attn a;
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .strategy(Strategy::cpu_preferred())
                   .build();
  auto p = sched.plan(a.g);
  EXPECT_EQ(p->at(a.kw).reason.kind, K::CpuAvailable);
  EXPECT_EQ(p->at(a.vw).reason.kind, K::Colocated);  // v shares k's attention
  EXPECT_EQ(p->at(a.attn).reason.kind, K::Colocated);
  EXPECT_EQ(p->at(a.attn).backend->backend_id(), "cpu");

  Residency r;
  r.add("gpu", "cache.k", 16 * 2 * 8 * 4);
  auto q = sched.plan(a.g, r);
  for (TensorId id : {a.kw, a.vw, a.attn}) {
    EXPECT_EQ(q->at(id).backend->backend_id(), "gpu");
    EXPECT_EQ(q->at(id).reason.kind, K::Colocated);
    EXPECT_NE(q->at(id).reason.why.find("lives on gpu"), std::string::npos);
  }
  // A pin on KvWrite moves the cache, and attention follows it.
  auto pinned = HybridScheduler::builder()
                    .with_backend(make_cpu())
                    .with_backend(make_gpu())
                    .strategy(Strategy::cpu_preferred())
                    .pin_op(OpKind::KvWrite, "gpu")
                    .build();
  auto s = pinned.plan(a.g);
  EXPECT_EQ(s->at(a.kw).reason.kind, K::UserPreference);
  EXPECT_EQ(s->at(a.attn).backend->backend_id(), "gpu");
  EXPECT_EQ(s->at(a.attn).reason.kind, K::Colocated);
}

TEST(Scheduler, PlansAreCachedBySignatureNamesAndResidency) {
  auto sched = HybridScheduler::builder().with_backend(make_cpu()).with_backend(make_gpu()).build();
  Small a, b;
  auto p1 = sched.plan(a.g);
  EXPECT_EQ(sched.plan(a.g).get(), p1.get());
  EXPECT_EQ(sched.plan(b.g).get(), p1.get());  // an equal graph built again
  EXPECT_EQ(p1->signature, a.g.signature());
  Residency r;
  r.add("gpu", "blk.0.w", kW);
  EXPECT_NE(sched.plan(a.g, r).get(), p1.get());
  Small c;
  c.g.set_name(c.w, "blk.9.w");  // names key pins and residency
  EXPECT_NE(sched.plan(c.g).get(), p1.get());
  // Each first plan also planned the graph under the residency its run leaves (the weight on
  // the GPU): r is that residency for a.
  EXPECT_EQ(sched.cached_plans(), 4u);
  sched.clear_cache();
  EXPECT_EQ(sched.cached_plans(), 0u);

  BackendSelection sel = sched.select_backend(a.g, a.mm);
  EXPECT_EQ(sel.backend->backend_id(), "gpu");
  EXPECT_EQ(sel.reason.kind, K::GpuAvailable);
  EXPECT_EQ(sched.select_backend(a.g, a.g.node(a.rope)).backend_index, 1);
}

TEST(Scheduler, StrategyParseAndNames) {
  EXPECT_EQ(Strategy::parse("gpu").kind, Strategy::Kind::GpuPreferred);
  EXPECT_EQ(Strategy::parse("cpu_preferred").kind, Strategy::Kind::CpuPreferred);
  EXPECT_EQ(Strategy::parse("auto").kind, Strategy::Kind::Automatic);
  Strategy only = Strategy::parse("only:cuda:0");
  EXPECT_EQ(only.kind, Strategy::Kind::BackendOnly);
  EXPECT_EQ(only.backend_id, "cuda:0");
  EXPECT_EQ(only.to_string(), "backend_only(cuda:0)");
  EXPECT_NE(error_of([] { Strategy::parse("fastest"); }).find("only:<backend id>"),
            std::string::npos);
  for (int k = 0; k <= int(K::Colocated); ++k) {
    EXPECT_NE(reason_kind_name(K(k)), "unknown");
  }
}

TEST(Scheduler, PlacementPrintsATable) {
  Small s;
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu("gpu", caps_without({OpKind::Rope})))
                   .build();
  std::ostringstream os;
  sched.plan(s.g)->print(os, s.g);
  EXPECT_NE(os.str().find("cpu_fallback"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("gpu_available"), std::string::npos);
  EXPECT_NE(os.str().find("cpu=1 gpu=2"), std::string::npos) << os.str();
}

TEST(Capabilities, DescribedAsTextAndJson) {
  auto gpu = make_gpu("gpu", caps_without({OpKind::Rope, OpKind::RopeNeox}));
  std::string text = describe_capabilities(*gpu);
  EXPECT_NE(text.find("backend gpu (gpu)"), std::string::npos);
  EXPECT_NE(text.find("quantized_matmul"), std::string::npos);
  EXPECT_EQ(text.find("rope"), std::string::npos);
  auto j = nlohmann::json::parse(describe_capabilities_json(*gpu));
  EXPECT_EQ(j["backend"].get<std::string>(), "gpu");
  EXPECT_EQ(j["kind"].get<std::string>(), "gpu");
  EXPECT_EQ(j["capabilities"].size(), gpu->capabilities().size());
  bool found = false;
  for (const auto& c : j["capabilities"]) {
    if (c["op"].get<std::string>() == "quantized_matmul" &&
        c["dtypes"][0].get<std::string>() == "q4_0") {
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace tandem
