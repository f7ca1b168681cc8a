// Scheduler and executor overheads: planning a ~1000-node LLaMA-shaped graph (uncached and
// cached) and the executor's per-run cost with kernels that do nothing.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "reference_backend.h"
#include "tandem/executor.h"
#include "tandem/scheduler.h"

namespace tandem {
namespace {

// A host backend whose kernels do nothing: what remains is the scheduler's and executor's cost.
class NullBackend : public HostBackend {
 public:
  NullBackend(std::string id, BackendKind kind, bool host)
      : HostBackend(std::move(id)),
        kind_(kind),
        host_(host),
        caps_(ReferenceBackend::reference_capabilities()) {}
  BackendKind kind() const override { return kind_; }
  bool host_accessible() const override { return host_; }
  const std::vector<OpCapability>& capabilities() const override { return caps_; }
  void execute(const Graph&, const NodeExecution&) override {}

 private:
  BackendKind kind_;
  bool host_;
  std::vector<OpCapability> caps_;
};

// LLaMA-shaped layers (25 nodes each) until the graph has at least `nodes` nodes.
Graph llama_like(size_t nodes, int64_t tokens) {
  const int64_t D = 256, H = 8, Hkv = 4, hd = 32, F = 512, V = 1000, C = 64;
  Graph g;
  TensorId ids = g.input("tokens", DType::I32, {tokens});
  TensorId pos = g.input("positions", DType::I32, {tokens});
  TensorId x = g.get_rows(g.weight("tok_embd.weight", DType::Q8_0, {D, V}), ids);
  for (int l = 0; g.size() + 30 < nodes; ++l) {
    std::string p = "blk." + std::to_string(l) + ".";
    TensorId h = g.rms_norm(x, g.weight(p + "attn_norm.weight", DType::F32, {D}), 1e-5f);
    TensorId q =
        g.reshape(g.matmul(g.weight(p + "attn_q.weight", DType::Q4_0, {D, D}), h), {hd, H, tokens});
    TensorId k = g.reshape(g.matmul(g.weight(p + "attn_k.weight", DType::Q4_0, {D, Hkv * hd}), h),
                           {hd, Hkv, tokens});
    TensorId v = g.reshape(g.matmul(g.weight(p + "attn_v.weight", DType::Q4_0, {D, Hkv * hd}), h),
                           {hd, Hkv, tokens});
    q = g.rope(q, pos, int32_t(hd), 10000.0f);
    k = g.rope(k, pos, int32_t(hd), 10000.0f);
    TensorId kw = g.kv_write(g.kv_cache(p + "k", DType::F16, {hd, Hkv, C}), k, pos);
    TensorId vw = g.kv_write(g.kv_cache(p + "v", DType::F16, {hd, Hkv, C}), v, pos);
    TensorId a = g.reshape(g.attention(q, kw, vw, pos, 0.17f), {D, tokens});
    x = g.add(x, g.matmul(g.weight(p + "attn_output.weight", DType::Q4_0, {D, D}), a));
    TensorId h2 = g.rms_norm(x, g.weight(p + "ffn_norm.weight", DType::F32, {D}), 1e-5f);
    TensorId gate = g.matmul(g.weight(p + "ffn_gate.weight", DType::Q4_0, {D, F}), h2);
    TensorId up = g.matmul(g.weight(p + "ffn_up.weight", DType::Q4_0, {D, F}), h2);
    x = g.add(x,
              g.matmul(g.weight(p + "ffn_down.weight", DType::Q4_0, {F, D}), g.swiglu(gate, up)));
  }
  TensorId out = g.matmul(g.weight("output.weight", DType::Q8_0, {D, V}),
                          g.rms_norm(x, g.weight("output_norm.weight", DType::F32, {D}), 1e-5f));
  g.set_name(out, "logits");
  g.mark_output(out);
  return g;
}

HybridScheduler make_scheduler(Strategy strategy) {
  return HybridScheduler::builder()
      .with_backend(std::make_shared<NullBackend>("cpu", BackendKind::Cpu, true))
      .with_backend(std::make_shared<NullBackend>("gpu", BackendKind::Gpu, false))
      .strategy(strategy)
      .memory_budget("gpu", size_t(2) << 20)  // about half the layers on the "GPU"
      .build();
}

void set_counters(benchmark::State& state, size_t nodes) {
  state.counters["nodes"] = double(nodes);
  state.counters["ns_per_node"] =
      benchmark::Counter(double(state.iterations()) * double(nodes),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_PlanUncached(benchmark::State& state) {
  Graph g = llama_like(1000, 1);
  auto sched = make_scheduler(state.range(0) ? Strategy::automatic() : Strategy::gpu_preferred());
  for (auto _ : state) {
    sched.clear_cache();
    benchmark::DoNotOptimize(sched.plan(g));
  }
  set_counters(state, g.size());
  state.SetLabel(state.range(0) ? "automatic" : "gpu_preferred");
}
BENCHMARK(BM_PlanUncached)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_PlanCached(benchmark::State& state) {
  Graph g = llama_like(1000, 1);
  auto sched = make_scheduler(Strategy::gpu_preferred());
  sched.plan(g);
  for (auto _ : state) benchmark::DoNotOptimize(sched.plan(g));
  set_counters(state, g.size());
}
BENCHMARK(BM_PlanCached)->Unit(benchmark::kMicrosecond);

// The first signature() of a graph (computed), and later ones (memoized until it changes).
void BM_GraphSignature(benchmark::State& state) {
  const Graph g = llama_like(1000, 1);
  for (auto _ : state) {
    state.PauseTiming();
    Graph fresh(g);
    fresh.mark_output(fresh.add(fresh.outputs().front(), fresh.outputs().front()));
    state.ResumeTiming();
    benchmark::DoNotOptimize(fresh.signature());
  }
  set_counters(state, g.size());
}
BENCHMARK(BM_GraphSignature)->Unit(benchmark::kMicrosecond);

void BM_GraphSignatureMemo(benchmark::State& state) {
  Graph g = llama_like(1000, 1);
  g.signature();
  for (auto _ : state) benchmark::DoNotOptimize(g.signature());
  set_counters(state, g.size());
}
BENCHMARK(BM_GraphSignatureMemo)->Unit(benchmark::kMicrosecond);

// One decode step through the executor with empty kernels: bindings, segments, transfers,
// events. Arg: record events (1) or not (0).
void BM_ExecutorRun(benchmark::State& state) {
  Graph g = llama_like(1000, 1);
  auto sched = make_scheduler(Strategy::gpu_preferred());
  ExecutorOptions opts;
  opts.record_events = state.range(0) != 0;
  opts.max_events = size_t(1) << 16;
  HybridExecutor exec(sched, opts);
  std::vector<std::vector<uint8_t>> weights;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::Weight) continue;
    weights.emplace_back(g.tensor(n.id).bytes());
    exec.bind_weight(g.tensor(n.id).name, weights.back().data(), weights.back().size());
  }
  int32_t token = 1, position = 0;
  std::vector<float> logits(1000);
  Bindings b;
  b.input("tokens", &token, 4)
      .input("positions", &position, 4)
      .output("logits", logits.data(), 4 * logits.size());
  auto placement = sched.plan(g, exec.residency());
  exec.run(g, *placement, b);
  placement = sched.plan(g, exec.residency());
  for (auto _ : state) {
    exec.run(g, *placement, b);
    if (opts.record_events) exec.telemetry().clear_telemetry();
  }
  set_counters(state, g.size());
  state.counters["transfers"] = double(placement->planned_transfers);
  state.SetLabel(opts.record_events ? "events on" : "events off");
}
BENCHMARK(BM_ExecutorRun)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
