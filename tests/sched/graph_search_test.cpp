// The whole-graph search behind --strategy auto: the execution search equals brute force over
// every assignment of a generated set of small graphs, auto equals all-GPU when everything
// fits, and a budget that holds part of the model keeps whole layers resident.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "graph_search.h"
#include "model_runs.h"
#include "tandem/scheduler.h"
#include "test_backends.h"

namespace tandem {
namespace {

using test::make_cpu;
using test::make_gpu;

BackendProfile profile(double gflops, double bandwidth, double launch, LinkProfile link) {
  BackendProfile p;
  p.peak_gflops = {gflops, gflops, gflops};
  p.memory_bandwidth_gbs = bandwidth;
  p.launch_us = launch;
  p.link = link;
  return p;
}

PlannerConfig config_for(const std::vector<std::shared_ptr<Backend>>& backends,
                         const std::vector<BackendProfile>& profiles) {
  PlannerConfig c;
  c.backends = backends;
  int next = 1;
  for (const auto& b : backends) {
    c.group.push_back(b->host_accessible() ? 0 : next++);
    c.budgets.push_back(b->memory().free_bytes);
  }
  c.n_groups = next;
  c.profiles = profiles;
  c.strategy = Strategy::automatic();
  c.op_pin.fill(kNoBackend);
  return c;
}

// A random chain of matmuls (weights homed on a random backend), silus and residual adds.
struct GeneratedCase {
  Graph g;
  ResidencyHomes homes;
};

GeneratedCase generate(std::mt19937& rng, int n_ops, int n_backends) {
  GeneratedCase c;
  const int64_t T = std::uniform_int_distribution<int64_t>(1, 16)(rng);
  std::vector<TensorId> acts{c.g.input("x", DType::F32, {64, T})};
  std::uniform_int_distribution<int> kind(0, 2), home(-1, n_backends - 1);
  for (int i = 0; i < n_ops; ++i) {
    const TensorId cur = acts.back();
    TensorId y;
    const int k = i == 0 ? 0 : kind(rng);
    if (k == 0) {
      const std::string name = "blk." + std::to_string(i) + ".w";
      TensorId w = c.g.weight(name, DType::F32, {64, 64});
      const int h = home(rng);
      if (h > 0) c.homes[name] = h;  // 0 (the CPU) and -1 both mean host memory
      y = c.g.matmul(w, cur);
    } else if (k == 1) {
      y = c.g.silu(cur);
    } else {
      TensorId earlier = acts[std::uniform_int_distribution<size_t>(0, acts.size() - 1)(rng)];
      y = c.g.add(cur, earlier);
    }
    acts.push_back(y);
  }
  c.g.mark_output(acts.back());
  // Sometimes an output made earlier too (as a router's ids kept for statistics): read back
  // once its last op ran.
  if (acts.size() > 2 && std::uniform_int_distribution<int>(0, 2)(rng) == 0)
    c.g.mark_output(acts[std::uniform_int_distribution<size_t>(1, acts.size() - 2)(rng)]);
  return c;
}

TEST(GraphSearch, ExecutionSearchEqualsBruteForceOnGeneratedGraphs) {
  std::mt19937 rng(test::test_seed());
  std::uniform_real_distribution<double> factor(0.5, 200.0), latency(0.0, 20.0), bw(1.0, 60.0);
  for (int trial = 0; trial < 60; ++trial) {
    const int n_backends = trial % 3 == 2 ? 3 : 2;
    const int n_ops = std::uniform_int_distribution<int>(2, n_backends == 3 ? 7 : 10)(rng);
    std::vector<std::shared_ptr<Backend>> backends{make_cpu()};
    // Some devices lack silu: the search must route around them.
    for (int d = 1; d < n_backends; ++d) {
      backends.push_back(
          trial % 4 == 1 ? make_gpu("gpu" + std::to_string(d), test::caps_without({OpKind::Silu}))
                         : make_gpu("gpu" + std::to_string(d)));
    }
    std::vector<BackendProfile> profiles{profile(100.0, 10.0, 1.0, {})};
    for (int d = 1; d < n_backends; ++d) {
      const double f = factor(rng);
      profiles.push_back(profile(100.0 * f, 10.0 * f, latency(rng), {bw(rng), latency(rng)}));
    }
    const PlannerConfig config = config_for(backends, profiles);
    GeneratedCase gc = generate(rng, n_ops, n_backends);
    const ExecutionChoice found = search_execution(config, gc.g, gc.homes);
    ASSERT_TRUE(found.ok) << found.failure;
    EXPECT_TRUE(found.exact);
    // Every assignment of a backend to each compute node.
    std::vector<TensorId> compute;
    for (const Node& n : gc.g.nodes()) {
      if (is_compute(n.op)) compute.push_back(n.id);
    }
    std::vector<int> assign(gc.g.size(), kNoBackend);
    double best = std::numeric_limits<double>::infinity();
    size_t total = 1;
    for (size_t i = 0; i < compute.size(); ++i) total *= size_t(n_backends);
    for (size_t code = 0; code < total; ++code) {
      size_t c = code;
      for (TensorId id : compute) {
        assign[size_t(id)] = int(c % size_t(n_backends));
        c /= size_t(n_backends);
      }
      best = std::min(best, evaluate_execution(config, gc.g, gc.homes, assign));
    }
    EXPECT_NEAR(found.cost_us, best, 1e-9 * std::max(1.0, best))
        << "trial " << trial << ", seed " << test::test_seed();
    EXPECT_NEAR(evaluate_execution(config, gc.g, gc.homes, found.backend), found.cost_us,
                1e-9 * std::max(1.0, best));
  }
}

// An output made mid-graph on a device costs one copy to host memory, counted at its last op:
// the same assignment costs exactly that much more than with the output unmarked.
TEST(GraphSearch, AnOutputMadeMidGraphCostsItsCopyToTheHost) {
  std::vector<std::shared_ptr<Backend>> backends{make_cpu(), make_gpu("gpu")};
  const LinkProfile link{12.0, 7.0};
  const PlannerConfig config =
      config_for(backends, {profile(100.0, 10.0, 1.0, {}), profile(1e4, 1000.0, 2.0, link)});
  auto build = [](bool marked) {
    Graph g;
    TensorId x = g.input("x", DType::F32, {256, 4});
    TensorId a = g.matmul(g.weight("blk.0.w", DType::F32, {256, 256}), x);
    TensorId b = g.silu(a);
    TensorId c = g.matmul(g.weight("blk.1.w", DType::F32, {256, 256}), b);
    g.mark_output(c);
    if (marked) g.mark_output(a);
    return std::pair{std::move(g), a};
  };
  const ResidencyHomes homes{{"blk.0.w", 1}, {"blk.1.w", 1}};
  auto [plain, a0] = build(false);
  auto [marked, a1] = build(true);
  std::vector<int> all_gpu(plain.size(), kNoBackend);
  for (const Node& n : plain.nodes()) {
    if (is_compute(n.op)) all_gpu[size_t(n.id)] = 1;
  }
  const double without = evaluate_execution(config, plain, homes, all_gpu);
  const double with = evaluate_execution(config, marked, homes, all_gpu);
  const double copy = CostModel::activation_us(marked.tensor(a1).bytes(), link);
  EXPECT_GT(copy, 0.0);
  EXPECT_NEAR(with - without, copy, 1e-9 * with);
  const ExecutionChoice found = search_execution(config, marked, homes);
  ASSERT_TRUE(found.ok) << found.failure;
  EXPECT_LE(found.cost_us, with + 1e-9 * with);
  // Sixteen outputs along a chain (a router's ids per layer): none stays live past its op, so
  // the search's states stay few and it stays exact (kept to the end, their locations alone
  // would make more than kMaxSearchStates states).
  Graph chain;
  TensorId y = chain.input("x", DType::F32, {256, 4});
  ResidencyHomes chain_homes;
  for (int l = 0; l < 16; ++l) {
    const std::string w = "blk." + std::to_string(l) + ".w";
    chain_homes[w] = l % 2;
    y = chain.silu(chain.matmul(chain.weight(w, DType::F32, {256, 256}), y));
    chain.mark_output(y);
  }
  const ExecutionChoice long_chain = search_execution(config, chain, chain_homes);
  ASSERT_TRUE(long_chain.ok) << long_chain.failure;
  EXPECT_TRUE(long_chain.exact);
}

TEST(GraphSearch, AChainWorthMovingAsAWholeMovesThoughItsFirstOpIsCheaperWhereItStarts) {
  // x -> silu -> silu -> silu -> silu: each silu alone is cheaper on the CPU than moving x to
  // the GPU and running it there; together the GPU wins. A greedy walk with hysteresis stays on
  // the CPU; the search moves the chain.
  Graph g;
  TensorId a = g.input("x", DType::F32, {1 << 16, 1});
  for (int i = 0; i < 4; ++i) a = g.silu(a);
  g.mark_output(a);
  // silu over 256 KiB in + 256 KiB out: cpu 1 us + 524288 B / 10 GB/s = 53.4 us; gpu 1 us +
  // 0.52 us; the link 20 GB/s, 5 us: 18.1 us per crossing. One op on the GPU: 18.1 + 1.5 +
  // 18.1 > 53.4; four: 2 * 18.1 + 4 * 1.5 = 42.2 < 4 * 53.4.
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .strategy(Strategy::automatic())
                   .cost_model([] {
                     CostModel m;
                     m.set_profile("cpu", profile(100.0, 10.0, 1.0, {}));
                     m.set_profile("gpu", profile(1e5, 1000.0, 1.0, {20.0, 5.0}));
                     return m;
                   }())
                   .build();
  auto p = sched.plan(g);
  for (const Node& n : g.nodes()) {
    if (!is_compute(n.op)) continue;
    EXPECT_EQ(p->at(n.id).backend->backend_id(), "gpu") << n.id;
    EXPECT_NE(p->at(n.id).reason.why.find("whole-graph search"), std::string::npos);
  }
  EXPECT_EQ(p->planned_transfers, 1u);  // x in (the result's read-back is the bindings')
}

CostModel fast_gpu() {
  CostModel m;
  m.set_profile("cpu", profile(100.0, 10.0, 1.0, {}));
  m.set_profile("gpu", profile(1e4, 1000.0, 0.5, {20.0, 2.0}));
  return m;
}

// A device's ops inside a segment cost their estimates less the launch plus the segment's
// per-op cost, the first (its input just arrived) its estimate: ten small ops on the GPU
// predict 9 x (5 - 1) us less with a segment launch of 1 us than without one; the CPU's do not
// change.
TEST(GraphSearch, ADevicesOpsAreTimedAsInsideASegment) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {64});
  for (int i = 0; i < 10; ++i) x = g.silu(x);
  g.mark_output(x);
  auto predict = [&](double segment_launch_us, int on) {
    BackendProfile gpu = profile(1e4, 1000.0, 5.0, {20.0, 2.0});
    gpu.segment_launch_us = segment_launch_us;
    const PlannerConfig c =
        config_for({make_cpu(), make_gpu()}, {profile(100.0, 10.0, 1.0, {}), gpu});
    std::vector<int> backend(g.size(), kNoBackend);
    for (const Node& n : g.nodes())
      if (is_compute(n.op)) backend[size_t(n.id)] = on;
    return timeline_execution(c, g, {}, backend);
  };
  EXPECT_NEAR(predict(0.0, 1) - predict(1.0, 1), 36.0, 1e-9);
  EXPECT_DOUBLE_EQ(predict(0.0, 0), predict(1.0, 0));
}

TEST(GraphSearch, AutoEqualsAllGpuWhenEverythingFitsAndGivesTheReferenceBits) {
  std::mt19937 rng(test::test_seed());
  test::MiniModel model(rng);
  auto steps = test::prefill_then_decode(rng);
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .strategy(Strategy::automatic())
                   .cost_model(fast_gpu())
                   .build();
  HybridExecutor exec(sched);
  auto logits = test::run_steps(sched, exec, model, steps);
  test::expect_bitwise_equal(logits, test::reference_logits(model, steps));
  const ResidencyPlan* rp = sched.residency_plan();
  ASSERT_NE(rp, nullptr);
  EXPECT_EQ(rp->best()->name, "everything on gpu") << rp->why;
  for (int64_t T : {3, 1}) {
    Graph g = model.build(T);
    auto p = sched.plan(g, exec.residency());
    auto ops = p->ops_per_backend();
    EXPECT_EQ(ops[0], 0u) << "T=" << T;  // nothing on the CPU
    EXPECT_GT(ops[1], 0u);
  }
}

// Four layers of x += w_a silu(w_b x), [64, 64] f32 weights (16 KiB each, 32 KiB a layer).
struct Layered {
  static constexpr int kLayers = 4;
  static constexpr int64_t kDim = 64;
  std::map<std::string, std::vector<float>> weights;

  explicit Layered(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    for (int l = 0; l < kLayers; ++l) {
      for (const char* w : {"a", "b"}) {
        auto& v = weights["blk." + std::to_string(l) + "." + w];
        v.resize(size_t(kDim * kDim));
        for (float& x : v) x = u(rng);
      }
    }
  }
  Graph build(int64_t T) const {
    Graph g;
    TensorId x = g.input("x", DType::F32, {kDim, T});
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      TensorId wa = g.weight(p + "a", DType::F32, {kDim, kDim});
      TensorId wb = g.weight(p + "b", DType::F32, {kDim, kDim});
      x = g.add(x, g.matmul(wa, g.silu(g.matmul(wb, x))));
    }
    g.set_name(x, "y");
    g.mark_output(x);
    return g;
  }
};

TEST(GraphSearch, ABudgetForOneLayerKeepsAWholeLayerResidentAndStreamsTheRest) {
  std::mt19937 rng(test::test_seed());
  Layered model(rng);
  Graph prefill = model.build(8), decode = model.build(1);
  const size_t weight = size_t(Layered::kDim * Layered::kDim * 4), layer = 2 * weight;
  size_t transient = 0;
  for (const Node& n : prefill.nodes()) {
    if (!is_compute(n.op)) continue;
    size_t t = prefill.tensor(n.id).bytes();
    for (TensorId in : n.inputs) {
      if (prefill.node(prefill.storage_of(in)).op != OpKind::Weight)
        t += prefill.tensor(prefill.storage_of(in)).bytes();
    }
    transient = std::max(transient, t);
  }
  // The budget bounds what stays resident: one and a half layers hold one layer, not two, and
  // not everything (four layers). Activations and staging come on top.
  const size_t budget = layer + layer / 2;
  auto sched = HybridScheduler::builder()
                   .with_backend(make_cpu())
                   .with_backend(make_gpu())
                   .strategy(Strategy::automatic())
                   .cost_model(fast_gpu())
                   .memory_budget("gpu", budget)
                   .build();
  const Graph* phases[] = {&prefill, &decode};
  const ResidencyPlan& rp = sched.plan_residency(phases);
  ASSERT_NE(rp.best(), nullptr);
  int layers_on_gpu = 0;
  for (int l = 0; l < Layered::kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const int on = int(rp.home.count(p + "a") + rp.home.count(p + "b"));
    EXPECT_TRUE(on == 0 || on == 2) << "layer " << l << " split: " << rp.why;
    layers_on_gpu += on == 2;
  }
  EXPECT_EQ(layers_on_gpu, 1) << rp.why;
  EXPECT_GT(rp.candidates.size(), 2u);
  // On a timeline the first layer resident lets the copy queue stream the others while it
  // computes; the last layer resident makes the prefill wait for the first copy.
  const ResidencyPlan::Candidate *first = nullptr, *last = nullptr;
  for (const auto& c : rp.candidates) {
    if (c.name.rfind("layers 0,", 0) == 0 || c.name.rfind("layers 0 ", 0) == 0 ||
        c.name == "layers 0, KV with layers")
      first = &c;
    if (c.name.rfind("layers 3,", 0) == 0) last = &c;
  }
  ASSERT_TRUE(first && last) << rp.why;
  EXPECT_LT(first->phase_us[0], last->phase_us[0]);
  EXPECT_TRUE(rp.home.count("blk.0.a")) << rp.why;
  for (const auto& c : rp.candidates) {
    ASSERT_EQ(c.phase_us.size(), 2u);
    EXPECT_LE(rp.best()->score, c.score);
  }
  // The plans follow it: the prefill streams the host layers' weights to the GPU, and the
  // device never holds more than its budget.
  HybridExecutor exec(sched);
  auto ref_sched =
      HybridScheduler::builder().with_backend(std::make_shared<ReferenceBackend>()).build();
  HybridExecutor ref_exec(ref_sched);
  for (int64_t T : {8, 1}) {
    Graph g = model.build(T);
    for (const auto& [name, w] : model.weights) {
      exec.bind_weight(name, w.data(), 4 * w.size());
      ref_exec.bind_weight(name, w.data(), 4 * w.size());
    }
    std::vector<float> x(size_t(Layered::kDim * T)), y(x.size()), want(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) * 0.25f - 0.5f;
    const std::string out = "y";
    auto p = sched.plan(g, exec.residency());
    if (T > 1) {
      EXPECT_GT(p->streamed_bytes, 0u);
    }
    exec.run(g, *p,
             Bindings().input("x", x.data(), 4 * x.size()).output(out, y.data(), 4 * y.size()));
    ref_exec.run(
        g, *ref_sched.plan(g),
        Bindings().input("x", x.data(), 4 * x.size()).output(out, want.data(), 4 * want.size()));
    EXPECT_EQ(y, want) << "T=" << T;
  }
  EXPECT_LE(exec.resident_bytes("gpu"), budget);
  EXPECT_EQ(rp.reserve_bytes[1], 3 * weight + transient);
}

TEST(GraphSearch, SeveralDevicesTakeLayersFastestFirstWithinTheirBudgets) {
  // Two devices of calibrated speeds 10x apart: gpu0 (listed first) has room for three of the
  // four layers, gpu1 (ten times its bandwidth) for two. A sequence runs the layers one after
  // another, so by hand: gpu1 takes two layers and gpu0 the other two (decode 2 x 16 + 2 x 1.6
  // us of weight reads), not gpu0 three and gpu1 one (3 x 16 + 1.6), the backends' order. The
  // link is slow enough that streaming a weight (16 KiB at 0.1 GB/s: 164 us) never pays.
  std::mt19937 rng(test::test_seed());
  Layered model(rng);
  Graph prefill = model.build(8), decode = model.build(1);
  const size_t layer = size_t(2 * Layered::kDim * Layered::kDim * 4);
  // The CPU and the two GPUs at these bandwidths (GB/s); room for three and two layers.
  auto two_gpus = [&](double gpu0_gbs, double gpu1_gbs) {
    CostModel costs;
    costs.set_profile("cpu", profile(100.0, 0.5, 0.01, {}));
    costs.set_profile("gpu0", profile(1e4, gpu0_gbs, 0.01, {0.1, 1.0}));
    costs.set_profile("gpu1", profile(1e4, gpu1_gbs, 0.01, {0.1, 1.0}));
    return HybridScheduler::builder()
        .with_backend(make_cpu())
        .with_backend(make_gpu("gpu0"))
        .with_backend(make_gpu("gpu1"))
        .strategy(Strategy::automatic())
        .cost_model(costs)
        .memory_budget("gpu0", 3 * layer + layer / 2)
        .memory_budget("gpu1", 2 * layer + layer / 2)
        .build();
  };
  auto sched = two_gpus(2.0, 20.0);
  const Graph* phases[] = {&prefill, &decode};
  const ResidencyPlan& rp = sched.plan_residency(phases);
  ASSERT_NE(rp.best(), nullptr);
  std::map<std::string, int> layers_on;
  for (int l = 0; l < Layered::kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto a = rp.home.find(p + "a"), b = rp.home.find(p + "b");
    ASSERT_TRUE(a != rp.home.end() && b != rp.home.end()) << "layer " << l << ": " << rp.why;
    EXPECT_EQ(a->second, b->second) << "layer " << l << " split: " << rp.why;
    ++layers_on[a->second];
  }
  EXPECT_EQ(layers_on["gpu1"], 2) << rp.why;
  EXPECT_EQ(layers_on["gpu0"], 2) << rp.why;
  EXPECT_NE(rp.best()->name.find("fastest device first"), std::string::npos) << rp.why;
  // The backends' order was weighed and lost.
  const ResidencyPlan::Candidate* listed = nullptr;
  for (const auto& c : rp.candidates) {
    if (c.name.find("fastest") == std::string::npos && c.name.rfind("layers 0-3", 0) == 0)
      listed = &c;
  }
  ASSERT_NE(listed, nullptr) << rp.why;
  EXPECT_GT(listed->score, rp.best()->score);
  // Devices of one speed keep the backends' order alone (no candidate twice).
  auto even = two_gpus(20.0, 20.0);
  for (const auto& c : even.plan_residency(phases).candidates) {
    EXPECT_EQ(c.name.find("fastest"), std::string::npos) << c.name;
  }
}

}  // namespace
}  // namespace tandem
