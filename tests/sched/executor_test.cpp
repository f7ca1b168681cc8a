// The executor: mixed placements give the reference's bits, each tensor crosses to a backend
// at most once per run, weights and KV caches persist, pointers are stable per signature,
// errors leave outputs untouched and nothing leaks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "mini_model.h"
#include "model_runs.h"
#include "tandem/error.h"
#include "tandem/executor.h"
#include "tandem/scheduler.h"
#include "test_backends.h"

namespace tandem {
namespace {

using test::caps_without;
using test::expect_bitwise_equal;
using test::make_cpu;
using test::make_gpu;
using test::MiniModel;
using test::prefill_then_decode;
using test::reference_logits;
using test::run_steps;
using test::TestBackend;

class ExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override { baseline_ = TestBackend::live_buffers; }
  void TearDown() override { EXPECT_EQ(TestBackend::live_buffers, baseline_) << "leaked buffers"; }
  std::mt19937 rng_{test::test_seed()};
  int baseline_ = 0;
};

// The first run of a graph uploads its weights and creates its caches; the placement the next
// run needs under that residency was planned with the first, not in the second step.
TEST_F(ExecutorTest, TheSecondRunOfAGraphFindsItsPlacementPlanned) {
  MiniModel model(rng_);
  auto sched = HybridScheduler::builder().with_backend(make_cpu()).with_backend(make_gpu()).build();
  HybridExecutor exec(sched);
  const std::vector<test::ModelStep> prefill = {prefill_then_decode(rng_).front()};
  run_steps(sched, exec, model, prefill);
  ASSERT_GT(exec.residency().size(), 0u);  // the run changed the residency
  const size_t planned = sched.cached_plans();
  const size_t built = exec.stats().plans_built;
  run_steps(sched, exec, model, prefill);
  EXPECT_EQ(sched.cached_plans(), planned);
  EXPECT_EQ(exec.stats().plans_built, built);  // the same placement: its compiled plan reused
}

TEST_F(ExecutorTest, MixedPlacementGivesTheReferenceBits) {
  MiniModel model(rng_);
  auto steps = prefill_then_decode(rng_);
  auto expected = reference_logits(model, steps);
  // The "GPU" cannot embed or rotate: the graph crosses back and forth every layer.
  auto cpu = make_cpu();
  auto gpu = make_gpu("gpu", caps_without({OpKind::GetRows, OpKind::Rope}));
  auto sched = HybridScheduler::builder().with_backend(cpu).with_backend(gpu).build();
  {
    HybridExecutor exec(sched);
    auto got = run_steps(sched, exec, model, steps);
    expect_bitwise_equal(got, expected);
    EXPECT_GT(cpu->executed, 0);
    EXPECT_GT(gpu->executed, 0);
    EXPECT_GT(exec.stats().transfers, 0u);
    // Every weight the GPU reads was uploaded once, across prefill and decode graphs.
    size_t gpu_weights = 0, gpu_bytes = 0;
    Graph g = model.build(1);
    auto p = sched.plan(g, exec.residency());
    std::set<TensorId> seen;
    for (const Node& n : g.nodes()) {
      if (p->backend_index(n.id) != 1 || !is_compute(n.op)) continue;
      for (TensorId in : n.inputs) {
        if (g.node(in).op == OpKind::Weight && seen.insert(in).second) {
          ++gpu_weights;
          gpu_bytes += g.tensor(in).bytes();
        }
      }
    }
    EXPECT_EQ(exec.stats().weight_uploads, gpu_weights);
    size_t cache_bytes = 0;
    for (const Node& n : g.nodes()) {
      if (n.op == OpKind::KvCache && exec.kv_cache_backend(g.tensor(n.id).name) == "gpu") {
        cache_bytes += g.tensor(n.id).bytes();
      }
    }
    EXPECT_GT(cache_bytes, 0u);
    EXPECT_EQ(exec.resident_bytes("gpu"), gpu_bytes + cache_bytes);
    EXPECT_TRUE(exec.residency().contains("gpu", "blk.0.attn_q.weight"));
  }
}

TEST_F(ExecutorTest, CarriesOutTheCopiesThePlacementStatesAndRefusesAMissingOne) {
  MiniModel model(rng_);
  auto cpu = make_cpu();
  auto gpu = make_gpu("gpu", caps_without({OpKind::GetRows, OpKind::Rope}));
  auto sched = HybridScheduler::builder().with_backend(cpu).with_backend(gpu).build();
  HybridExecutor exec(sched);
  for (const auto& [name, w] : model.weights)
    exec.bind_weight(name, w.bytes.data(), w.bytes.size());
  const Graph g = model.build(3);
  const std::vector<int32_t> tokens{1, 2, 3}, positions{0, 1, 2};
  std::vector<float> logits(size_t(g.tensor(g.outputs()[0]).elements()));
  auto bindings = [&] {
    return Bindings()
        .input("tokens", tokens.data(), 4 * tokens.size())
        .input("positions", positions.data(), 4 * positions.size())
        .output("logits", logits.data(), 4 * logits.size());
  };
  auto p = sched.plan(g, exec.residency());
  // Each copy goes to the backend of the op it comes before; every KV cache has a home.
  size_t per_run = 0, uploads = 0;
  for (const PlannedCopy& c : p->copies) {
    EXPECT_EQ(c.to, p->backend_index(c.before));
    EXPECT_NE(c.from, c.to);
    EXPECT_EQ(c.bytes, g.tensor(c.storage).bytes());
    per_run += c.kind == PlannedCopy::Kind::Activation || c.kind == PlannedCopy::Kind::Input;
    uploads += c.kind == PlannedCopy::Kind::Upload;
  }
  EXPECT_GT(per_run, 0u);
  EXPECT_GT(uploads, 0u);
  EXPECT_EQ(per_run, p->planned_transfers);
  size_t caches = 0;
  for (const Node& n : g.nodes()) caches += n.op == OpKind::KvCache;
  EXPECT_EQ(p->kv_homes.size(), caches);

  // A placement that leaves out one activation copy is refused, naming it; nothing runs.
  Placement broken = *p;
  auto it = std::find_if(broken.copies.begin(), broken.copies.end(), [](const PlannedCopy& c) {
    return c.kind == PlannedCopy::Kind::Activation;
  });
  ASSERT_NE(it, broken.copies.end());
  const std::string name = g.tensor(it->storage).name;
  broken.copies.erase(it);
  broken.key ^= 1;  // its own execution plan
  const int executed = cpu->executed + gpu->executed;
  try {
    exec.run(g, broken, bindings());
    ADD_FAILURE() << "ran a placement with a copy missing";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("copies no '" + name + "'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cpu->executed + gpu->executed, executed);

  // The placement as planned: the executor's transfers are exactly its per-run copies, and its
  // uploads the listed ones.
  exec.preload(g, *p);
  EXPECT_EQ(exec.stats().weight_uploads, uploads);
  exec.run(g, *p, bindings());
  EXPECT_EQ(exec.stats().transfers, per_run);
}

TEST_F(ExecutorTest, EachTensorCrossesToABackendAtMostOncePerRun) {
  MiniModel model(rng_);
  auto cpu = make_cpu();
  auto gpu = make_gpu("gpu", caps_without({OpKind::Rope}));
  auto sched = HybridScheduler::builder().with_backend(cpu).with_backend(gpu).build();
  HybridExecutor exec(sched);
  for (const auto& [name, w] : model.weights)
    exec.bind_weight(name, w.bytes.data(), w.bytes.size());
  Graph g = model.build(3);
  std::vector<int32_t> tokens{1, 2, 3}, pos{0, 1, 2};
  std::vector<float> logits(MiniModel::kVocab * 3);
  for (int run = 0; run < 2; ++run) {
    auto p = sched.plan(g, exec.residency());
    exec.telemetry().clear_telemetry();
    size_t before = exec.stats().transfers;
    exec.run(g, *p,
             Bindings()
                 .input("tokens", tokens.data(), 12)
                 .input("positions", pos.data(), 12)
                 .output("logits", logits.data(), 4 * logits.size()));
    // The executor makes exactly the copies the scheduler planned.
    EXPECT_EQ(exec.stats().transfers - before, p->planned_transfers) << "run " << run;
    std::map<std::pair<TensorId, std::string>, int> crossings;
    size_t transfer_events = 0;
    for (const ExecutionEvent& e : exec.telemetry().get_telemetry()) {
      if (e.kind != EventKind::Transfer) continue;
      ++transfer_events;
      int& n = crossings[std::make_pair(e.node, e.backend)];
      EXPECT_EQ(++n, 1) << "tensor " << e.node << " crossed to " << e.backend << " twice";
      EXPECT_GT(e.transfer_bytes, 0u);
    }
    EXPECT_EQ(transfer_events, p->planned_transfers);
    EXPECT_GT(transfer_events, 4u);  // positions, q and k of each layer at least
  }
}

TEST_F(ExecutorTest, ThreeBackendsWithDeviceToDeviceCopies) {
  MiniModel model(rng_);
  auto steps = prefill_then_decode(rng_);
  auto expected = reference_logits(model, steps);
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu("gpu0"))
                   .with_backend(make_gpu("gpu1"))
                   .pin_tensor("blk\\.1\\..*", "gpu1")
                   .pin_op(OpKind::GetRows, "cpu")
                   .build();
  HybridExecutor exec(sched);
  expect_bitwise_equal(run_steps(sched, exec, model, steps), expected);
  bool device_to_device = false;
  for (const ExecutionEvent& e : exec.telemetry().get_telemetry()) {
    if (e.kind == EventKind::Transfer && e.source_backend == "gpu0" && e.backend == "gpu1") {
      device_to_device = true;
    }
  }
  EXPECT_TRUE(device_to_device);
}

TEST_F(ExecutorTest, AutomaticAndBackendOnlyGiveTheReferenceBits) {
  MiniModel model(rng_);
  auto steps = prefill_then_decode(rng_);
  auto expected = reference_logits(model, steps);
  for (Strategy s : {Strategy::automatic(), Strategy::backend_only("gpu")}) {
    auto sched = HybridScheduler::builder()
                     .with_backend(make_cpu())
                     .with_backend(make_gpu())
                     .strategy(s)
                     .build();
    HybridExecutor exec(sched);
    expect_bitwise_equal(run_steps(sched, exec, model, steps), expected);
  }
}

TEST_F(ExecutorTest, PointersAreStablePerSignatureAndPlansAreReused) {
  MiniModel model(rng_);
  auto gpu = make_gpu();
  auto sched = HybridScheduler::builder().with_backend(make_cpu()).with_backend(gpu).build();
  HybridExecutor exec(sched);
  std::vector<test::ModelStep> steps{{{1}, {0}}, {{2}, {1}}, {{3}, {2}}, {{4}, {3}}};
  run_steps(sched, exec, model, steps);
  // Run 1 uploads the weights and creates the KV caches: the residency changes, but the
  // placement made for run 2 decides the same (its key is its content), so every run replays
  // the one plan with the same signatures and the same pointers.
  EXPECT_EQ(exec.stats().plans_built, 1u);
  ASSERT_GE(gpu->segment_signatures.size(), 4u);
  const size_t per_run = gpu->segment_signatures.size() / 4;
  for (size_t r = 1; r < 4; ++r) {
    for (size_t k = 0; k < per_run; ++k) {
      EXPECT_EQ(gpu->segment_signatures[k], gpu->segment_signatures[r * per_run + k]);
      EXPECT_EQ(gpu->segment_pointers[k], gpu->segment_pointers[r * per_run + k]);
    }
  }
  // A second executor on the same backend has its own arenas, so never the same signatures.
  std::set<uint64_t> first(gpu->segment_signatures.begin(), gpu->segment_signatures.end());
  const size_t before = gpu->segment_signatures.size();
  HybridExecutor other(sched);
  run_steps(sched, other, model, {steps[0]});
  ASSERT_GT(gpu->segment_signatures.size(), before);
  for (size_t k = before; k < gpu->segment_signatures.size(); ++k) {
    EXPECT_EQ(first.count(gpu->segment_signatures[k]), 0u);
  }
}

TEST_F(ExecutorTest, IntermediatesShareMemoryAfterTheirLastUse) {
  MiniModel model(rng_);
  auto sched = HybridScheduler::builder().with_backend(make_cpu()).build();
  HybridExecutor exec(sched);
  run_steps(sched, exec, model, {{{1, 2, 3}, {0, 1, 2}}});
  const ExecutorStats& s = exec.stats();
  EXPECT_GT(s.last_plan_tensor_bytes, 0u);
  // Two layers of activations fit in well under half of their total.
  EXPECT_LT(2 * s.last_plan_arena_bytes, s.last_plan_tensor_bytes)
      << s.last_plan_arena_bytes << " of " << s.last_plan_tensor_bytes;
}

// A backend that runs up to four consecutive nodes as one launch (the CUDA backend's fusions)
// reads and writes them unordered: the memory plan must give no node's output memory another
// node of such a window reads from outside it. Planned node by node it does (the K RoPE's
// output in the Q projection's buffer), so the check below can fail.
TEST_F(ExecutorTest, NodesOneLaunchMayRunTogetherShareNoMemory) {
  MiniModel model(rng_);
  auto steps = prefill_then_decode(rng_);
  const auto expected = reference_logits(model, steps);
  for (int fused : {1, 4}) {
    TestBackend::Config c;
    c.id = "gpu";
    c.kind = BackendKind::Gpu;
    c.host_accessible = false;
    c.fused_nodes = fused;
    auto gpu = std::make_shared<TestBackend>(c);
    gpu->window = 4;
    auto sched = HybridScheduler::builder()
                     .with_backend(make_cpu())
                     .with_backend(gpu)
                     .strategy(Strategy::backend_only("gpu"))
                     .build();
    HybridExecutor exec(sched);
    expect_bitwise_equal(run_steps(sched, exec, model, steps), expected);
    if (fused == 1) {
      EXPECT_GT(gpu->window_overlaps, 0) << "the plan no longer reuses memory inside a window";
    } else {
      EXPECT_EQ(gpu->window_overlaps, 0);
    }
  }
}

TEST_F(ExecutorTest, KvCachesPersistAndMigrate) {
  MiniModel model(rng_);
  auto steps = prefill_then_decode(rng_);
  auto expected = reference_logits(model, steps);
  auto cpu = make_cpu();
  auto gpu = make_gpu();
  // Prefill with caches on the CPU, then decode with KvWrite pinned to the GPU.
  auto on_cpu = HybridScheduler::builder()
                    .with_backend(cpu)
                    .with_backend(gpu)
                    .strategy(Strategy::cpu_preferred())
                    .build();
  auto on_gpu = HybridScheduler::builder()
                    .with_backend(cpu)
                    .with_backend(gpu)
                    .strategy(Strategy::cpu_preferred())
                    .pin_op(OpKind::KvWrite, "gpu")
                    .build();
  HybridExecutor exec(on_cpu);
  auto first = run_steps(on_cpu, exec, model, {steps[0]});
  EXPECT_EQ(exec.kv_cache_backend(MiniModel::cache_name(0, 'k')), "cpu");
  EXPECT_EQ(exec.stats().kv_migrations, 0u);
  auto rest = run_steps(on_gpu, exec, model, {steps[1], steps[2]});
  EXPECT_EQ(exec.kv_cache_backend(MiniModel::cache_name(0, 'k')), "gpu");
  EXPECT_EQ(exec.stats().kv_migrations, 4u);  // k and v of two layers
  EXPECT_TRUE(exec.residency().contains("gpu", MiniModel::cache_name(1, 'v')));
  EXPECT_FALSE(exec.residency().contains("cpu", MiniModel::cache_name(1, 'v')));
  expect_bitwise_equal({first[0], rest[0], rest[1]}, expected);

  // The cache holds what was written: position 4 of layer 0's K is non-zero, 5.. are zero.
  std::vector<float> k(MiniModel::kHeadDim * MiniModel::kKvHeads * MiniModel::kContext);
  exec.read_kv_cache(MiniModel::cache_name(0, 'k'), k.data(), 4 * k.size());
  const size_t row = MiniModel::kHeadDim * MiniModel::kKvHeads;
  EXPECT_NE(k[4 * row], 0.0f);
  EXPECT_EQ(k[5 * row], 0.0f);
  exec.clear_kv_caches();
  exec.read_kv_cache(MiniModel::cache_name(0, 'k'), k.data(), 4 * k.size());
  EXPECT_EQ(k[4 * row], 0.0f);
}

TEST_F(ExecutorTest, BadBindingsFailBeforeAnythingRuns) {
  MiniModel model(rng_);
  auto cpu = make_cpu();
  auto sched = HybridScheduler::builder().with_backend(cpu).build();
  HybridExecutor exec(sched);
  Graph g = model.build(1);
  auto p = sched.plan(g);
  int32_t tok = 1, pos = 0;
  std::vector<float> logits(MiniModel::kVocab, 0.0f);
  auto msg = [&](const Bindings& b) {
    try {
      exec.run(g, *p, b);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // No weights bound yet.
  EXPECT_NE(
      msg(Bindings().input("tokens", &tok, 4).input("positions", &pos, 4)).find("has no data"),
      std::string::npos);
  for (const auto& [name, w] : model.weights)
    exec.bind_weight(name, w.bytes.data(), w.bytes.size());
  EXPECT_NE(msg(Bindings().input("tokens", &tok, 4)).find("'positions' is not bound"),
            std::string::npos);
  EXPECT_NE(msg(Bindings().input("tokens", &tok, 8).input("positions", &pos, 4))
                .find("bound with 8 bytes"),
            std::string::npos);
  EXPECT_NE(msg(Bindings().input("tokens", &tok, 4).input("positions", &pos, 4).input("x", &pos, 4))
                .find("'x' is not a graph input"),
            std::string::npos);
  EXPECT_NE(msg(Bindings()
                    .input("tokens", &tok, 4)
                    .input("positions", &pos, 4)
                    .output("tokens", logits.data(), 4))
                .find("not a graph output"),
            std::string::npos);
  EXPECT_NE(msg(Bindings()
                    .input("tokens", &tok, 4)
                    .input("positions", &pos, 4)
                    .output("logits", logits.data(), 4))
                .find("needs 128"),
            std::string::npos);
  EXPECT_EQ(cpu->executed, 0);
  // A weight of the wrong size.
  std::vector<uint8_t> small(16);
  exec.bind_weight("output.weight", small.data(), small.size());
  EXPECT_NE(msg(Bindings().input("tokens", &tok, 4).input("positions", &pos, 4))
                .find("'output.weight' is bound with 16 bytes"),
            std::string::npos);
  EXPECT_EQ(cpu->executed, 0);
  // A placement for another graph.
  Graph other = model.build(2);
  try {
    exec.run(other, *p, Bindings());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("placement"), std::string::npos);
  }
}

TEST_F(ExecutorTest, AnInputNoOpReadsMayStayUnbound) {
  auto sched = HybridScheduler::builder().with_backend(make_gpu()).build();
  HybridExecutor exec(sched);
  Graph g;
  TensorId x = g.input("x", DType::F32, {8});
  g.input("unused", DType::F32, {8});
  TensorId y = g.scale(x, 2.0f);
  g.mark_output(y);
  std::vector<float> xs(8, 1.5f), ys(8, 0.0f);
  exec.run(g, *sched.plan(g), Bindings().input("x", xs.data(), 32).output(y, ys.data(), 32));
  EXPECT_EQ(ys[7], 3.0f);
}

TEST_F(ExecutorTest, AFailingBackendLeavesOutputsUntouchedAndLeaksNothing) {
  MiniModel model(rng_);
  auto gpu = make_gpu("gpu", caps_without({OpKind::Rope}));
  gpu->fail_on_op = int(OpKind::SwiGlu);
  auto sched = HybridScheduler::builder().with_backend(make_cpu()).with_backend(gpu).build();
  {
    HybridExecutor exec(sched);
    for (const auto& [name, w] : model.weights)
      exec.bind_weight(name, w.bytes.data(), w.bytes.size());
    Graph g = model.build(2);
    auto p = sched.plan(g, exec.residency());
    std::vector<int32_t> tokens{3, 4}, pos{0, 1};
    std::vector<float> logits(MiniModel::kVocab * 2, 42.0f);
    try {
      exec.run(g, *p,
               Bindings()
                   .input("tokens", tokens.data(), 8)
                   .input("positions", pos.data(), 8)
                   .output("logits", logits.data(), 4 * logits.size()));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::DeviceLost);
      EXPECT_EQ(e.backend(), "gpu");  // the executor names the device it was running on
      EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos);
    }
    for (float v : logits) ASSERT_EQ(v, 42.0f);
    // It runs again once the device recovers.
    gpu->fail_on_op = -1;
    exec.run(g, *p,
             Bindings()
                 .input("tokens", tokens.data(), 8)
                 .input("positions", pos.data(), 8)
                 .output("logits", logits.data(), 4 * logits.size()));
    EXPECT_NE(logits[0], 42.0f);
    // An allocation failure while building the plan is an OutOfMemory error, not a crash.
    gpu->fail_allocations = true;
    Graph g3 = model.build(3);
    std::vector<int32_t> t3{1, 2, 3}, p3{0, 1, 2};
    std::vector<float> l3(MiniModel::kVocab * 3);
    try {
      exec.run(g3, *sched.plan(g3, exec.residency()),
               Bindings().input("tokens", t3.data(), 12).input("positions", p3.data(), 12));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::OutOfMemory);
      EXPECT_EQ(e.backend(), "gpu");
    }
    gpu->fail_allocations = false;
  }
}

TEST_F(ExecutorTest, ReleaseFreesWhatAFailedPreloadAllocated) {
  MiniModel model(rng_);
  auto gpu = make_gpu();
  auto sched = HybridScheduler::builder().with_backend(make_cpu()).with_backend(gpu).build();
  HybridExecutor exec(sched);
  for (const auto& [name, w] : model.weights)
    exec.bind_weight(name, w.bytes.data(), w.bytes.size());
  Graph g = model.build(2);
  auto p = sched.plan(g, exec.residency());
  // The first upload is already there; the device has room for the second, not the third.
  std::vector<const PlannedCopy*> uploads;
  for (const PlannedCopy& c : p->copies) {
    if (c.kind == PlannedCopy::Kind::Upload) uploads.push_back(&c);
  }
  ASSERT_GE(uploads.size(), 3u);
  exec.preload_weight(g.tensor(uploads[0]->storage).name, "gpu");
  const Residency before = exec.residency();
  const size_t held = gpu->allocated_bytes;
  ASSERT_EQ(held, exec.device_bytes("gpu"));
  gpu->allocation_limit = held + uploads[1]->bytes;
  try {
    exec.preload(g, *p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::OutOfMemory);
    EXPECT_EQ(e.backend(), "gpu");
  }
  ASSERT_GT(gpu->allocated_bytes, held) << "the failed preload uploaded nothing";
  EXPECT_EQ(gpu->allocated_bytes, exec.device_bytes("gpu"));
  EXPECT_TRUE(exec.release("gpu", before).empty());
  EXPECT_EQ(gpu->allocated_bytes, held);
  EXPECT_EQ(exec.residency().hash(), before.hash());
  // Everything, with the KV caches a run created there.
  gpu->allocation_limit = SIZE_MAX;
  std::vector<int32_t> tokens{3, 4}, pos{0, 1};
  exec.run(g, *sched.plan(g, exec.residency()),
           Bindings().input("tokens", tokens.data(), 8).input("positions", pos.data(), 8));
  EXPECT_FALSE(exec.release("gpu").empty());
  EXPECT_EQ(gpu->allocated_bytes, 0u);
  EXPECT_EQ(exec.resident_bytes("gpu"), 0u);
  EXPECT_THROW(exec.release("nope"), Error);
}

TEST_F(ExecutorTest, ResidencyPreloadAndEviction) {
  MiniModel model(rng_);
  auto gpu = make_gpu();
  auto sched = HybridScheduler::builder().with_backend(make_cpu()).with_backend(gpu).build();
  HybridExecutor exec(sched);
  for (const auto& [name, w] : model.weights)
    exec.bind_weight(name, w.bytes.data(), w.bytes.size());
  const auto& w = model.weights.at("output.weight");
  exec.preload_weight("output.weight", "gpu");
  EXPECT_EQ(exec.resident_bytes("gpu"), w.bytes.size());
  EXPECT_EQ(exec.stats().weight_uploads, 1u);
  exec.preload_weight("output.weight", "gpu");  // already there
  exec.preload_weight("output.weight", "cpu");  // host memory: nothing to do
  EXPECT_EQ(exec.stats().weight_uploads, 1u);
  EXPECT_EQ(exec.resident_bytes("cpu"), 0u);
  Graph g = model.build(1);
  exec.preload(g, *sched.plan(g, exec.residency()));
  EXPECT_GT(exec.resident_bytes("gpu"), w.bytes.size());
  EXPECT_TRUE(exec.has_kv_cache(MiniModel::cache_name(1, 'k')));
  exec.evict_weight("output.weight");
  EXPECT_FALSE(exec.residency().contains("gpu", "output.weight"));
  // Unbound: its device copy freed and the name unknown (its host data may go).
  exec.preload_weight("output.weight", "gpu");
  const size_t with_it = exec.resident_bytes("gpu");
  exec.unbind_weight("output.weight");
  EXPECT_EQ(exec.resident_bytes("gpu"), with_it - w.bytes.size());
  EXPECT_THROW(exec.preload_weight("output.weight", "gpu"), Error);
  exec.unbind_weight("output.weight");  // no longer bound: nothing to do
  EXPECT_THROW(exec.preload_weight("nope", "gpu"), Error);
  EXPECT_THROW(exec.preload_weight("output.weight", "tpu"), Error);
}

// A weight rewritten in part on the host between runs (SessionOptions::hot_experts swaps an
// expert so): refresh_weight gives its device copy the same bytes, without an upload or a new
// plan; the next run is the reference's on the new weight.
TEST_F(ExecutorTest, ARefreshedWeightReachesItsDeviceCopy) {
  MiniModel model(rng_), other(rng_);
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .strategy(Strategy::backend_only("gpu"))
                   .build();
  HybridExecutor exec(sched);
  std::vector<test::ModelStep> steps{{{1, 2}, {0, 1}}};
  const auto before = run_steps(sched, exec, model, steps);
  ASSERT_TRUE(exec.residency().contains("gpu", "output.weight"));
  auto& w = model.weights.at("output.weight").bytes;  // F16: a whole value at any even byte
  const auto& o = other.weights.at("output.weight").bytes;
  ASSERT_EQ(w.size(), o.size());
  const size_t at = (w.size() / 2) & ~size_t(1);
  std::memcpy(w.data() + at, o.data() + at, w.size() - at);
  exec.refresh_weight("output.weight", at, w.size() - at);
  const auto uploads = exec.stats().weight_uploads;
  const auto plans = exec.stats().plans_built;
  const auto after = run_steps(sched, exec, model, steps);  // binds the same pointers again
  expect_bitwise_equal(after, reference_logits(model, steps));
  EXPECT_NE(std::memcmp(after[0].data(), before[0].data(), 4 * after[0].size()), 0);
  EXPECT_EQ(exec.stats().weight_uploads, uploads) << "rewritten in place";
  EXPECT_EQ(exec.stats().plans_built, plans);
  EXPECT_THROW(exec.refresh_weight("output.weight", at, w.size()), Error) << "past its end";
  EXPECT_THROW(exec.refresh_weight("nope", 0, 1), Error);
}

TEST_F(ExecutorTest, TimingModes) {
  MiniModel model(rng_);
  auto sched = HybridScheduler::builder().with_backend(make_cpu()).with_backend(make_gpu()).build();
  ExecutorOptions opts;
  opts.timing = TimingMode::PerOp;
  HybridExecutor exec(sched, opts);
  std::vector<test::ModelStep> steps{{{1, 2}, {0, 1}}};
  auto per_op = run_steps(sched, exec, model, steps);
  size_t ops = 0, graphs = 0;
  for (const ExecutionEvent& e : exec.telemetry().get_telemetry()) {
    if (e.kind == EventKind::Op) {
      ++ops;
      EXPECT_GE(e.actual_us, 0.0);
      EXPECT_GT(e.estimated_us, 0.0);
    }
    if (e.kind == EventKind::Graph) ++graphs;
  }
  EXPECT_GT(ops, 20u);
  EXPECT_EQ(graphs, 1u);
  exec.telemetry().clear_telemetry();
  exec.set_timing(TimingMode::Off);
  auto off = run_steps(sched, exec, model, steps);
  exec.clear_kv_caches();
  for (const ExecutionEvent& e : exec.telemetry().get_telemetry()) {
    EXPECT_NE(e.kind, EventKind::Graph);
    EXPECT_LT(e.actual_us, 0.0);  // not measured
  }
  EXPECT_EQ(exec.telemetry().execution_summary().ops, ops);
  // A plan's later untimed runs store no op events (the first run's tally counts them), each
  // run still counts.
  const size_t stored = exec.telemetry().size();
  const size_t matmuls = exec.telemetry().operations_by_type().at("matmul").count;
  EXPECT_GT(matmuls, 0u);
  run_steps(sched, exec, model, steps);
  exec.clear_kv_caches();
  size_t op_events = 0;
  for (const ExecutionEvent& e : exec.telemetry().get_telemetry()) {
    op_events += e.kind == EventKind::Op ? 1 : 0;
  }
  EXPECT_EQ(op_events, ops);
  EXPECT_LT(exec.telemetry().size(), 2 * stored);
  EXPECT_EQ(exec.telemetry().execution_summary().ops, 2 * ops);
  EXPECT_EQ(exec.telemetry().operations_by_type().at("matmul").count, 2 * matmuls);
  exec.telemetry().clear_telemetry();
  EXPECT_EQ(exec.telemetry().execution_summary().ops, 0u);
}

}  // namespace
}  // namespace tandem
