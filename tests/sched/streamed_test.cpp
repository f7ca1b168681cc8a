// Streamed weights: a GPU runs ops whose weights live in host memory, copying each weight into
// its staging memory ahead of use on the copy queue. The results are the reference's bits
// whether the copy queue runs early or late, every streamed weight crosses once per run, the
// staging memory is reused across layers without overwriting a weight still to be read, and
// nothing leaks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <sstream>

#include "mini_model.h"
#include "model_runs.h"
#include "tandem/executor.h"
#include "tandem/scheduler.h"
#include "test_backends.h"

namespace tandem {
namespace {

using test::MiniModel;
using test::TestBackend;

// A "GPU" whose copy queue runs late: a streamed copy poisons its destination when issued and
// lands only when execution waits for its event (with every copy queued before it, as a CUDA
// stream would) or at synchronize. An op that reads a weight it did not wait for reads NaN.
class LateCopyGpu : public TestBackend {
 public:
  LateCopyGpu() : TestBackend(gpu_config()) {}
  void stream_from_host(void* dst, const void* src, size_t bytes, int event) override {
    ASSERT_GE(event, 0);
    ASSERT_LT(event, kStreamEvents);
    std::memset(dst, 0xFF, bytes);  // NaN in f32 and f16, a NaN scale in q8_0 and q4_0
    queue_.push_back({dst, src, bytes, event});
    ++streamed;
  }
  void wait_stream_event(int event) override {
    size_t last = queue_.size();
    for (size_t i = 0; i < queue_.size(); ++i) {
      if (queue_[i].event == event) last = i;
    }
    if (last == queue_.size()) return;
    for (size_t i = 0; i <= last; ++i) land(queue_.front());
  }
  void synchronize() override {
    while (!queue_.empty()) land(queue_.front());
  }
  int streamed = 0;

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
    int event;
  };
  static Config gpu_config() {
    Config c;
    c.id = "gpu";
    c.kind = BackendKind::Gpu;
    c.host_accessible = false;
    return c;
  }
  void land(const Copy& c) {
    std::memcpy(c.dst, c.src, c.bytes);
    queue_.pop_front();
  }
  std::deque<Copy> queue_;
};

// Figures under which streaming always wins: a very slow CPU and a very fast link.
CostModel streaming_wins() {
  CostModel m;
  BackendProfile cpu = CostModel::default_profile(BackendKind::Cpu);
  cpu.peak_gflops = {1e-3, 1e-3, 1e-3};
  cpu.memory_bandwidth_gbs = 1e-3;
  m.set_profile("cpu", cpu);
  BackendProfile gpu = CostModel::default_profile(BackendKind::Gpu);
  gpu.link = {1e6, 0.0};
  m.set_profile("gpu", gpu);
  return m;
}

std::vector<float> run(HybridScheduler& sched, HybridExecutor& exec, const Graph& g,
                       const std::map<std::string, std::vector<uint8_t>>& weights,
                       const std::vector<float>& x, size_t out_elements) {
  for (const auto& [name, bytes] : weights) exec.bind_weight(name, bytes.data(), bytes.size());
  auto p = sched.plan(g, exec.residency());
  std::vector<float> out(out_elements, -7.0f);
  exec.run(g, *p,
           Bindings().input("x", x.data(), 4 * x.size()).output("y", out.data(), 4 * out.size()));
  return out;
}

class StreamedTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { baseline_ = TestBackend::live_buffers; }
  void TearDown() override { EXPECT_EQ(TestBackend::live_buffers, baseline_) << "leaked buffers"; }
  std::shared_ptr<TestBackend> gpu() const {
    if (GetParam()) return std::make_shared<LateCopyGpu>();
    return test::make_gpu("gpu");  // copies land when issued
  }
  // CPU and `gpu`, every layer's weights in host memory, figures under which streaming wins;
  // a `budget` for the GPU when given.
  static HybridScheduler streaming_scheduler(std::shared_ptr<TestBackend> gpu, size_t budget = 0) {
    auto b = HybridScheduler::builder()
                 .with_backend(test::make_cpu())
                 .with_backend(std::move(gpu))
                 .pin_tensor("^blk\\.", "cpu")
                 .cost_model(streaming_wins());
    if (budget > 0) b.memory_budget("gpu", budget);
    return b.build();
  }
  std::mt19937 rng_{test::test_seed()};
  int baseline_ = 0;
};

TEST_P(StreamedTest, ALlamaModelWithHostWeightsGivesTheReferenceBits) {
  MiniModel model(rng_);
  const std::vector<test::ModelStep> steps = test::prefill_then_decode(rng_);
  const auto expected = test::reference_logits(model, steps);

  auto g = gpu();
  auto sched = streaming_scheduler(g);
  {
    HybridExecutor exec(sched);
    test::expect_bitwise_equal(test::run_steps(sched, exec, model, steps), expected);
    // What the placements stream for each step.
    size_t planned = 0;
    for (const test::ModelStep& s : steps) {
      planned +=
          sched.plan(model.build(int64_t(s.tokens.size())), exec.residency())->streamed_bytes;
    }
    // Each layer weight crossed once per run, and none stayed on the GPU.
    size_t layer_bytes = 0;
    for (const auto& [name, w] : model.weights) {
      if (name.rfind("blk.", 0) == 0) layer_bytes += w.bytes.size();
    }
    EXPECT_EQ(planned, steps.size() * layer_bytes);
    EXPECT_EQ(exec.stats().streamed_bytes, planned);
    for (const auto& [name, w] : model.weights) {
      EXPECT_EQ(exec.residency().contains("gpu", name), name.rfind("blk.", 0) != 0) << name;
    }
    EXPECT_GT(g->executed, 0);
  }
}

TEST_P(StreamedTest, ManyLayersReuseTheStagingMemoryWithoutOverwritingAWeightInUse) {
  // 16 layers of matmul(w_l [64, 64], x) + silu, every weight streamed; each layer's weight
  // holds other values, so reading a neighbour's weight changes the answer.
  constexpr int kLayers = 16;
  constexpr int64_t T = 8;
  Graph graph;
  TensorId x = graph.input("x", DType::F32, {64, T});
  std::map<std::string, std::vector<uint8_t>> weights;
  for (int l = 0; l < kLayers; ++l) {
    const std::string name = "blk." + std::to_string(l) + ".w";
    std::vector<float> w = test::random_floats(64 * 64, rng_);
    std::vector<uint8_t> bytes(w.size() * 4);
    std::memcpy(bytes.data(), w.data(), bytes.size());
    weights[name] = std::move(bytes);
    x = graph.silu(graph.matmul(graph.weight(name, DType::F32, {64, 64}), x));
  }
  graph.set_name(x, "y");
  graph.mark_output(x);
  const std::vector<float> input = test::random_floats(64 * T, rng_);

  auto ref = HybridScheduler::builder().with_backend(std::make_shared<ReferenceBackend>()).build();
  HybridExecutor ref_exec(ref);
  const std::vector<float> expected = run(ref, ref_exec, graph, weights, input, 64 * T);

  // Budgets with room to stage four weights at once, and the fewest the scheduler streams
  // with (kStreamAheadWeights in flight plus the one being read): the staging memory must be
  // reused.
  for (const size_t weights_staged : {size_t(4), size_t(kStreamAheadWeights + 1)}) {
    SCOPED_TRACE("staging for " + std::to_string(weights_staged) + " weights");
    auto g = gpu();
    auto sched = streaming_scheduler(g, weights_staged * 64 * 64 * 4 + 64 * T * 4 * 2);
    HybridExecutor exec(sched);
    for (int repeat = 0; repeat < 2; ++repeat) {
      const std::vector<float> got = run(sched, exec, graph, weights, input, 64 * T);
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), 4 * got.size()), 0)
          << "run " << repeat << ", seed " << test::test_seed();
    }
    EXPECT_EQ(exec.stats().streamed_weights, size_t(2 * kLayers));
    EXPECT_EQ(exec.stats().streamed_bytes, size_t(2 * kLayers) * 64 * 64 * 4);
    EXPECT_EQ(exec.stats().weight_uploads, 0u);
    // The staging memory holds at most the weights the budget stages at once (and the
    // activations), not all sixteen.
    EXPECT_LE(exec.stats().last_plan_arena_bytes, weights_staged * 64 * 64 * 4 + 4 * 64 * T * 4);
    // Every op ran on the GPU; its copies came from host memory each run.
    EXPECT_EQ(g->executed, 2 * 2 * kLayers);
  }
}

TEST_P(StreamedTest, AStreamedExpertTensorIsCopiedByTheExpertsItsIdsName) {
  // One expert product, 8 experts of 32 x 64 f32, streamed. Between runs the weight's host
  // bytes change in place, so an expert the run needs and does not copy keeps the last run's
  // values and changes the answer. Run 1 copies every expert ahead (nothing is known yet); a
  // later run copies ahead the experts the run before used and, once its ids are known, the
  // named experts that copy missed.
  constexpr int64_t K = 64, M = 32, E = 8, k = 2, T = 3;
  constexpr size_t kExpertBytes = size_t(K * M) * 4;
  Graph graph;
  const TensorId w = graph.weight("blk.0.ffn_up_exps", DType::F32, {K, M, E});
  const TensorId x = graph.input("x", DType::F32, {K, 1, T});
  const TensorId ids = graph.input("ids", DType::I32, {k, T});
  const TensorId y = graph.expert_matmul(w, x, ids);
  graph.set_name(y, "y");
  graph.mark_output(y);
  std::vector<float> weight(size_t(K * M * E));
  const std::vector<float> input = test::random_floats(size_t(K * T), rng_);
  auto run_with = [&](HybridScheduler& sched, HybridExecutor& exec, std::vector<int32_t> route) {
    exec.bind_weight("blk.0.ffn_up_exps", weight.data(), 4 * weight.size());
    auto p = sched.plan(graph, exec.residency());
    std::vector<float> out(size_t(M * k * T), -7.0f);
    exec.run(graph, *p,
             Bindings()
                 .input("x", input.data(), 4 * input.size())
                 .input("ids", route.data(), 4 * route.size())
                 .output("y", out.data(), 4 * out.size()));
    return out;
  };
  auto ref = HybridScheduler::builder().with_backend(std::make_shared<ReferenceBackend>()).build();
  struct Run {
    std::vector<int32_t> ids;
    size_t experts_copied;  // by expert
  };
  const std::vector<Run> runs = {{{0, 1, 1, 0, 0, 1}, size_t(E)},
                                 {{2, 3, 3, 2, 2, 3}, 4},
                                 {{3, 2, 2, 3, 3, 2}, 2},
                                 {{0, 3, 3, 0, 7, 3}, 4}};
  for (const bool by_expert : {true, false}) {
    SCOPED_TRACE(by_expert ? "copied by expert" : "copied whole");
    auto g = gpu();
    auto sched = streaming_scheduler(g);
    ExecutorOptions options;
    options.routed_expert_copies = by_expert;
    HybridExecutor exec(sched, options);
    size_t streamed = 0;
    for (size_t r = 0; r < runs.size(); ++r) {
      SCOPED_TRACE("run " + std::to_string(r + 1));
      const std::vector<float> values = test::random_floats(weight.size(), rng_);
      std::copy(values.begin(), values.end(), weight.begin());  // in place: the same binding
      HybridExecutor ref_exec(ref);
      const std::vector<float> expected = run_with(ref, ref_exec, runs[r].ids);
      const std::vector<float> got = run_with(sched, exec, runs[r].ids);
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), 4 * got.size()), 0)
          << "seed " << test::test_seed();
      const size_t bytes = exec.stats().streamed_bytes - streamed;
      streamed = exec.stats().streamed_bytes;
      EXPECT_EQ(bytes, (by_expert ? runs[r].experts_copied : size_t(E)) * kExpertBytes);
    }
    EXPECT_EQ(g->executed, int(runs.size()));  // on the GPU every run
    // The summary tells how much of the tensor the copies carried, ahead and after the router.
    const ExecutionSummary summary = exec.telemetry().execution_summary();
    std::ostringstream printed;
    exec.telemetry().print_debug_summary(printed);
    if (by_expert) {
      EXPECT_EQ(summary.expert_tensor_bytes, runs.size() * size_t(E) * kExpertBytes);
      EXPECT_EQ(summary.expert_ahead_bytes, size_t(E + 2 + 2 + 2) * kExpertBytes);
      EXPECT_EQ(summary.expert_routed_bytes, size_t(0 + 2 + 0 + 2) * kExpertBytes);
      EXPECT_NE(printed.str().find("expert tensors streamed by expert: 56.2% of their 256.00 KiB "
                                   "(43.8% ahead of the router, 12.5% after it)"),
                std::string::npos)
          << printed.str();
    } else {
      EXPECT_EQ(summary.expert_tensor_bytes, 0u);
      EXPECT_EQ(printed.str().find("streamed by expert"), std::string::npos);
    }
  }
}

// Layers of matmul(w_l [1024, 1024] f32 = 4 MiB) + silu over a batch of T columns.
struct WideLayers {
  Graph g;
  std::vector<TensorId> w, mm, act;
  WideLayers(int64_t T, int n = 3) {
    TensorId x = g.input("x", DType::F32, {1024, T});
    for (int l = 0; l < n; ++l) {
      w.push_back(g.weight("blk." + std::to_string(l) + ".w", DType::F32, {1024, 1024}));
      mm.push_back(g.matmul(w.back(), x));
      x = g.silu(mm.back());
      act.push_back(x);
    }
    g.mark_output(x);
  }
};

TEST(Scheduler, AHostWeightIsStreamedForABatchAndReadInPlaceForOneToken) {
  auto sched = HybridScheduler::builder()
                   .with_backend(test::make_cpu())
                   .with_backend(test::make_gpu())
                   .pin_tensor("^blk\\.", "cpu")
                   .build();
  // 256 columns: 537 MFLOP per layer is ~0.5 ms on the CPU's figures, against a 4 MiB copy
  // (~0.17 ms at 25 GB/s) overlapped with ~11 us on the GPU.
  WideLayers prefill(256);
  auto p = sched.plan(prefill.g);
  for (size_t l = 0; l < prefill.mm.size(); ++l) {
    const BackendSelection& sel = p->at(prefill.mm[l]);
    EXPECT_EQ(sel.backend->backend_id(), "gpu") << l;
    EXPECT_EQ(sel.reason.kind, SelectionReason::Kind::Streamed) << sel.reason.to_string();
    ASSERT_EQ(sel.streamed.size(), 1u);
    EXPECT_EQ(sel.streamed[0], prefill.w[l]);
    // Both candidates are listed, the host one dearer.
    ASSERT_EQ(sel.reason.costs.size(), 2u);
    EXPECT_EQ(sel.reason.costs[0].backend_id, "cpu");
    EXPECT_GT(sel.reason.costs[0].cost.total_us(), sel.reason.costs[1].cost.total_us());
    EXPECT_NE(sel.reason.why.find("pin '^blk\\.'"), std::string::npos) << sel.reason.why;
    EXPECT_EQ(p->at(prefill.act[l]).backend->backend_id(), "gpu") << l;
  }
  EXPECT_EQ(p->planned_uploads, 0u);  // the weights live in host memory
  EXPECT_EQ(p->streamed_bytes, 3u * 1024 * 1024 * 4);

  // One column: the CPU reads 4 MiB in ~42 us, less than the copy alone. The activations
  // stay with it (no round trip per op).
  WideLayers decode(1);
  auto q = sched.plan(decode.g);
  for (size_t l = 0; l < decode.mm.size(); ++l) {
    EXPECT_EQ(q->at(decode.mm[l]).backend->backend_id(), "cpu") << l;
    EXPECT_EQ(q->at(decode.mm[l]).reason.kind, SelectionReason::Kind::UserPreference);
    EXPECT_TRUE(q->at(decode.mm[l]).streamed.empty());
    EXPECT_EQ(q->at(decode.act[l]).backend->backend_id(), "cpu") << l;
  }
  EXPECT_EQ(q->planned_transfers, 0u);
  EXPECT_EQ(q->streamed_bytes, 0u);

  // cpu_preferred and backend_only never stream.
  auto cpu_first = HybridScheduler::builder()
                       .with_backend(test::make_cpu())
                       .with_backend(test::make_gpu())
                       .pin_tensor("^blk\\.", "cpu")
                       .strategy(Strategy::cpu_preferred())
                       .build();
  EXPECT_EQ(cpu_first.plan(prefill.g)->streamed_bytes, 0u);
}

TEST(Scheduler, OneTokenSharesHostWeightsBetweenTheCpuAndTheCopyQueue) {
  // Eight layers on host-pinned 4 MiB weights, one column: the CPU reads a weight in ~42 us,
  // the link carries it in ~168 us. The copy queue streams from the step's start while the CPU
  // computes, so the best split puts the first layers on the CPU and streams the last (here
  // seven and one: max(7 x 42, 168) beats all on the CPU, 8 x 42).
  auto sched = HybridScheduler::builder()
                   .with_backend(test::make_cpu())
                   .with_backend(test::make_gpu())
                   .pin_tensor("^blk\\.", "cpu")
                   .build();
  WideLayers decode(1, 8);
  auto p = sched.plan(decode.g);
  int on_cpu = 0;
  bool streamed_after_cpu = true, seen_stream = false;
  for (size_t l = 0; l < decode.mm.size(); ++l) {
    const BackendSelection& sel = p->at(decode.mm[l]);
    const bool streamed = sel.reason.kind == SelectionReason::Kind::Streamed;
    EXPECT_NE(sel.reason.why.find("host weights split"), std::string::npos) << sel.reason.why;
    if (streamed) {
      seen_stream = true;
      EXPECT_EQ(sel.backend->backend_id(), "gpu");
    } else {
      EXPECT_EQ(sel.backend->backend_id(), "cpu") << l;
      on_cpu++;
      streamed_after_cpu = streamed_after_cpu && !seen_stream;  // no CPU op after a streamed one
    }
  }
  EXPECT_TRUE(seen_stream);
  EXPECT_TRUE(streamed_after_cpu);
  EXPECT_GT(on_cpu, 0);
  EXPECT_EQ(p->streamed_bytes, size_t(8 - on_cpu) * 1024 * 1024 * 4);
}

TEST(Scheduler, ThePrefillSplitCountsTheResidentLayersBeforeTheHostOnes) {
  // A host-pinned embedding first (cheap on the CPU), then 100 layers resident on the GPU
  // (~11 us each at 256 columns), then 4 host-pinned layers: their weights (~168 us each on
  // the link) have streamed long before the GPU reaches them, so each runs on the GPU. The
  // CPU (~537 us a layer) would only delay the step; a split that ignored the resident
  // layers' GPU time saw the copy queue as the bound and put the first host layer there.
  auto sched = HybridScheduler::builder()
                   .with_backend(test::make_cpu())
                   .with_backend(test::make_gpu())
                   .pin_tensor("^(token_embd|blk)\\.", "cpu")
                   .build();
  Graph g;
  TensorId ids = g.input("ids", DType::I32, {256});
  TensorId x = g.get_rows(g.weight("token_embd.weight", DType::F32, {1024, 1000}), ids);
  for (int l = 0; l < 100; ++l) {
    x = g.silu(g.matmul(g.weight("res." + std::to_string(l) + ".w", DType::F32, {1024, 1024}), x));
  }
  std::vector<TensorId> host_mm;
  for (int l = 0; l < 4; ++l) {
    host_mm.push_back(
        g.matmul(g.weight("blk." + std::to_string(l) + ".w", DType::F32, {1024, 1024}), x));
    x = g.silu(host_mm.back());
  }
  g.mark_output(x);
  auto p = sched.plan(g);
  for (size_t l = 0; l < host_mm.size(); ++l) {
    const BackendSelection& sel = p->at(host_mm[l]);
    EXPECT_EQ(sel.backend->backend_id(), "gpu") << l << ": " << sel.reason.to_string();
    EXPECT_EQ(sel.reason.kind, SelectionReason::Kind::Streamed) << l;
  }
}

TEST(Scheduler, AOneTokenExpertProductIsNotStreamedForTheLittleItSavesTheHost) {
  // 300 layers resident on the GPU, one token, then host-pinned experts: 64 of 64 x 1024 f32
  // (16 MiB, ~670 us on the link) of which the token reads 4 (~10 us on the CPU). The copy
  // queue has the whole resident part to carry the tensor, so the simulated step gains the
  // CPU's ~10 us by streaming it; the GPU would wait on the queue as soon as its estimate is a
  // few percent off. The product stays on the CPU.
  auto sched = HybridScheduler::builder()
                   .with_backend(test::make_cpu())
                   .with_backend(test::make_gpu())
                   .pin_tensor("^blk\\.", "cpu")
                   .build();
  Graph g;
  TensorId x = g.input("x", DType::F32, {1024, 1});
  for (int l = 0; l < 300; ++l) {
    x = g.silu(g.matmul(g.weight("res." + std::to_string(l) + ".w", DType::F32, {1024, 1024}), x));
  }
  const TensorId experts =
      g.expert_matmul(g.weight("blk.0.ffn_up_exps", DType::F32, {1024, 64, 64}),
                      g.reshape(x, {1024, 1, 1}), g.input("ids", DType::I32, {4, 1}));
  g.mark_output(experts);
  auto p = sched.plan(g);
  const BackendSelection& sel = p->at(experts);
  EXPECT_EQ(sel.backend->backend_id(), "cpu") << sel.reason.to_string();
  EXPECT_TRUE(sel.streamed.empty());
  EXPECT_EQ(p->streamed_bytes, 0u);
}

TEST_P(StreamedTest, ATimelineTimesSegmentsAndCopiesWithoutPerOpEvents) {
  MiniModel model(rng_);
  const std::vector<test::ModelStep> steps = test::prefill_then_decode(rng_);
  const auto expected = test::reference_logits(model, steps);
  auto g = gpu();
  auto sched = streaming_scheduler(g);
  ExecutorOptions options;
  options.timing = TimingMode::Timeline;
  HybridExecutor exec(sched, options);
  test::expect_bitwise_equal(test::run_steps(sched, exec, model, steps), expected);
  size_t ops = 0, segment_ops = 0, copies = 0;
  for (const test::ModelStep& s : steps) {
    const Graph graph = model.build(int64_t(s.tokens.size()));
    for (const Node& n : graph.nodes()) ops += is_compute(n.op) ? 1 : 0;
  }
  for (const ExecutionEvent& e : exec.telemetry().get_telemetry()) {
    EXPECT_NE(e.kind, EventKind::Op) << "per-op events are not recorded on a timeline";
    if (e.kind == EventKind::Segment) {
      segment_ops += size_t(e.segment_ops);
      EXPECT_GE(e.actual_us, 0.0);
    }
    if (e.kind == EventKind::Transfer && e.streamed) {
      ++copies;
      EXPECT_GE(e.actual_us, 0.0);
      EXPECT_EQ(e.actual_us, e.transfer_us);
    }
  }
  EXPECT_EQ(segment_ops, ops);  // every op is in exactly one timed segment
  EXPECT_EQ(copies, exec.stats().streamed_weights);
  const std::string trace = exec.telemetry().to_chrome_trace_json();
  EXPECT_NE(trace.find("gpu copy queue"), std::string::npos);
  EXPECT_NE(trace.find("\"segment\""), std::string::npos);
}

// A "GPU" whose copies to and from its page-locked host memory run late: an asynchronous
// upload poisons its device destination and a download its host destination when issued; each
// lands (reading its source then) only when the host waits for it (wait_host_copies,
// synchronize) or the device runs later work. Host code that reads a download, or overwrites
// an upload's source, before waiting computes with NaN or sends the wrong values.
class LateHostCopyGpu : public TestBackend {
 public:
  LateHostCopyGpu() : TestBackend(config()) {}
  Buffer allocate_host(size_t bytes) override {
    Buffer b = allocate(bytes);
    host_[b.data()] = bytes;
    return b;
  }
  bool upload_async(void* dst, const void* src, size_t bytes) override {
    if (!page_locked(src, bytes)) return TestBackend::upload_async(dst, src, bytes);
    return later(dst, src, bytes);
  }
  bool download_async(void* dst, const void* src, size_t bytes) override {
    if (!page_locked(dst, bytes)) return TestBackend::download_async(dst, src, bytes);
    return later(dst, src, bytes);
  }
  void wait_host_copies() override { land(); }
  void synchronize() override { land(); }
  void execute(const Graph& graph, const NodeExecution& exec) override {
    land();
    TestBackend::execute(graph, exec);
  }
  int async_copies = 0;

 protected:
  void free_buffer(void* data, size_t bytes) override {
    host_.erase(data);
    TestBackend::free_buffer(data, bytes);
  }

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  static Config config() {
    Config c;
    c.id = "gpu";
    c.kind = BackendKind::Gpu;
    c.host_accessible = false;
    return c;
  }
  bool page_locked(const void* p, size_t bytes) const {
    const auto* q = static_cast<const uint8_t*>(p);
    for (const auto& [data, n] : host_) {
      const auto* d = static_cast<const uint8_t*>(data);
      if (q >= d && q + bytes <= d + n) return true;
    }
    return false;
  }
  bool later(void* dst, const void* src, size_t bytes) {
    std::memset(dst, 0xFF, bytes);
    queue_.push_back({dst, src, bytes});
    ++async_copies;
    return true;
  }
  void land() {
    for (const Copy& c : queue_) std::memcpy(c.dst, c.src, c.bytes);
    queue_.clear();
  }
  std::map<void*, size_t> host_;
  std::vector<Copy> queue_;
};

// Figures under which streaming never wins (a link far slower than the CPU): ops on host
// weights run on the CPU, the rest on the GPU, and activations cross both ways.
TEST(HostCopies, AsynchronousActivationCopiesGiveTheReferenceBits) {
  const int baseline = TestBackend::live_buffers;
  std::mt19937 rng(test::test_seed());
  MiniModel model(rng);
  const std::vector<test::ModelStep> steps = test::prefill_then_decode(rng);
  const auto expected = test::reference_logits(model, steps);
  CostModel costs;
  BackendProfile gpu_profile = CostModel::default_profile(BackendKind::Gpu);
  gpu_profile.link = {1e-3, 0.0};
  costs.set_profile("gpu", gpu_profile);
  auto gpu = std::make_shared<LateHostCopyGpu>();
  auto cpu = test::make_cpu();
  {
    auto sched = HybridScheduler::builder()
                     .with_backend(cpu)
                     .with_backend(gpu)
                     .pin_tensor("^blk\\.0\\.", "cpu")
                     .pin_tensor("^output\\.weight$", "cpu")
                     .cost_model(costs)
                     .build();
    HybridExecutor exec(sched);
    for (int repeat = 0; repeat < 2; ++repeat) {
      test::expect_bitwise_equal(test::run_steps(sched, exec, model, steps), expected);
    }
    // Activations crossed both ways without waiting, and both backends computed.
    EXPECT_GT(gpu->async_copies, 0);
    EXPECT_GT(gpu->executed, 0);
    EXPECT_GT(cpu->executed, 0);
    EXPECT_GT(exec.stats().transfers, 0u);
  }
  EXPECT_EQ(TestBackend::live_buffers, baseline) << "leaked buffers";
}

INSTANTIATE_TEST_SUITE_P(CopyQueue, StreamedTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "late" : "early";
                         });

}  // namespace
}  // namespace tandem
