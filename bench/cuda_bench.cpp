// CUDA backend micro-benchmarks (Google Benchmark, times from CUDA events after warm-up).
// Each memory-bound kernel is reported against the device-to-device copy bandwidth measured
// in the same process; inputs rotate over several copies so the 50 MB L2 cannot serve them.
#include <benchmark/benchmark.h>

#include <cstring>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_backend.h"
#include "tandem/error.h"
#include "tandem/graph.h"

namespace tandem {
namespace {

// "w3"; built by append because g++ 12 misreports "literal" + std::string under -Wrestrict.
std::string indexed(const char* prefix, int i) {
  std::string s(prefix);
  s += std::to_string(i);
  return s;
}

// "matvec/4096/14336/1/4": a benchmark case's name from its first n arguments.
std::string args_key(const char* name, const benchmark::State& state, int n) {
  std::string key(name);
  for (int i = 0; i < n; ++i) {
    key += '/';
    key += std::to_string(state.range(i));
  }
  return key;
}

std::shared_ptr<CudaBackend> gpu() {
  static std::shared_ptr<CudaBackend> backend =
      cuda_device_count() > 0 ? std::make_shared<CudaBackend>(0) : nullptr;
  return backend;
}

constexpr int64_t kQuantizedTile = 65536;

// Runs a graph's compute nodes as one captured segment on the GPU.
class DeviceGraph {
 public:
  DeviceGraph(Graph graph, CudaBackend& backend) : graph_(std::move(graph)), backend_(backend) {
    std::mt19937 rng(12345);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (const Node& node : graph_.nodes()) {
      const TensorDesc& d = graph_.tensor(node.id);
      if (d.is_view()) continue;
      storage_.emplace(node.id, backend.allocate(d.bytes()));
      if (!is_leaf(node.op)) continue;
      std::vector<uint8_t> bytes(d.bytes());
      if (d.dtype == DType::I32) {
        for (int64_t i = 0; i < d.elements(); ++i) {
          reinterpret_cast<int32_t*>(bytes.data())[i] = int32_t(i);
        }
      } else if (dtype_traits(d.dtype).is_quantized && d.elements() > kQuantizedTile &&
                 d.elements() % kQuantizedTile == 0) {
        // Large quantized weights repeat one quantized tile (K-quant quantization of 8 x 58M
        // values took minutes; the products' speed does not depend on the values).
        std::vector<float> v(static_cast<size_t>(kQuantizedTile));
        for (float& x : v) x = dist(rng);
        const size_t tile = row_bytes(d.dtype, kQuantizedTile);
        from_f32(d.dtype, v.data(), bytes.data(), kQuantizedTile);
        for (size_t off = tile; off < bytes.size(); off += tile) {
          std::memcpy(bytes.data() + off, bytes.data(), tile);
        }
      } else {
        std::vector<float> v(static_cast<size_t>(d.elements()));
        for (float& x : v) x = dist(rng);
        from_f32(d.dtype, v.data(), bytes.data(), d.elements());
      }
      backend.copy_from_host(storage_.at(node.id).data(), bytes.data(), bytes.size());
    }
    for (const Node& node : graph_.nodes()) {
      if (!is_compute(node.op)) continue;
      execs_.push_back(execution_of(graph_, node, [&](TensorId id) { return pointer(id); }));
    }
    backend.synchronize();
  }
  void set_ints(TensorId id, const std::vector<int32_t>& values) {
    backend_.copy_from_host(pointer(id), values.data(), values.size() * 4);
    backend_.synchronize();
  }
  void replay() { backend_.execute_segment(graph_, execs_, graph_.signature()); }
  void eager() {
    for (const NodeExecution& e : execs_) backend_.execute(graph_, e);
  }
  size_t compute_nodes() const { return execs_.size(); }

 private:
  void* pointer(TensorId id) const {
    const TensorDesc& d = graph_.tensor(id);
    return static_cast<uint8_t*>(storage_.at(graph_.storage_of(id)).data()) +
           (d.is_view() ? d.view_offset : 0);
  }
  Graph graph_;
  CudaBackend& backend_;
  std::map<TensorId, Buffer> storage_;
  std::vector<NodeExecution> execs_;
};

// The graph of the running benchmark case, kept across the several calls Google Benchmark makes
// while it settles the iteration count (building eight weight matrices takes seconds each
// time); another case frees it first. `key` names the case.
DeviceGraph& case_graph(const std::string& key, const std::function<Graph()>& build) {
  static std::string current;
  static std::unique_ptr<DeviceGraph> graph;
  if (!graph || current != key) {
    graph.reset();
    graph = std::make_unique<DeviceGraph>(build(), *gpu());
    current = key;
  }
  return *graph;
}

// Times `fn` with CUDA events: warm-up, then one timed call per benchmark iteration.
template <typename F>
double time_us(CudaBackend& backend, F&& fn) {
  backend.timer_start();
  fn();
  return backend.timer_stop_us();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device-to-device copy bandwidth (bytes read + written per second), median of 20 copies.
double copy_bandwidth_gbs() {
  static double gbs = [] {
    auto& b = *gpu();
    const size_t bytes = size_t(1) << 30;
    Buffer src = b.allocate(bytes), dst = b.allocate(bytes);
    std::vector<double> times;
    for (int i = 0; i < 23; ++i) {
      const double us = time_us(b, [&] { b.copy_within(dst.data(), src.data(), bytes); });
      if (i >= 3) times.push_back(us);
    }
    return 2.0 * double(bytes) / (median(times) * 1e-6) / 1e9;
  }();
  return gbs;
}

void report(benchmark::State& state, const std::vector<double>& us, double bytes, double flops) {
  const double t = median(us);
  state.counters["median_us"] = t;
  if (bytes > 0) {
    const double gbs = bytes / (t * 1e-6) / 1e9;
    state.counters["GB/s"] = gbs;
    state.counters["copy_GB/s"] = copy_bandwidth_gbs();
    state.counters["pct_of_copy"] = 100.0 * gbs / copy_bandwidth_gbs();
  }
  if (flops > 0) state.counters["TFLOP/s"] = flops / (t * 1e-6) / 1e12;
}

// Runs the graph: 3 warm-up replays, then one timed replay per iteration; counters give the
// median per node.
void run_timed(benchmark::State& state, DeviceGraph& g, int nodes, double bytes_per_node,
               double flops_per_node) {
  auto& b = *gpu();
  for (int i = 0; i < 3; ++i) g.replay();
  b.synchronize();
  std::vector<double> us;
  for (auto _ : state) {
    const double t = time_us(b, [&] { g.replay(); });
    us.push_back(t / nodes);
    state.SetIterationTime(t * 1e-6);
  }
  report(state, us, bytes_per_node, flops_per_node);
}

#define REQUIRE_GPU(state)                        \
  if (!gpu()) {                                   \
    state.SkipWithError("no CUDA GPU available"); \
    return;                                       \
  }

void BM_CopyDeviceToDevice(benchmark::State& state) {
  REQUIRE_GPU(state);
  auto& b = *gpu();
  const size_t bytes = size_t(state.range(0)) << 20;
  Buffer src = b.allocate(bytes), dst = b.allocate(bytes);
  b.copy_within(dst.data(), src.data(), bytes);
  b.synchronize();
  std::vector<double> us;
  for (auto _ : state) {
    const double t = time_us(b, [&] { b.copy_within(dst.data(), src.data(), bytes); });
    us.push_back(t);
    state.SetIterationTime(t * 1e-6);
  }
  report(state, us, 2.0 * double(bytes), 0);
}
BENCHMARK(BM_CopyDeviceToDevice)
    ->Arg(1024)
    ->Arg(64)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The weight dtype a benchmark argument names: 4 Q4_0, 8 Q8_0, 40 Q4_K, 50 Q5_K, 60 Q6_K,
// 16 F16.
DType matvec_dtype(int64_t code) {
  switch (code) {
    case 4:
      return DType::Q4_0;
    case 16:
      return DType::F16;
    case 40:
      return DType::Q4_K;
    case 50:
      return DType::Q5_K;
    case 60:
      return DType::Q6_K;
    default:
      return DType::Q8_0;
  }
}

// Matrix-vector products: K = range(0), M = range(1), N = range(2) columns, dtype range(3)
// (matvec_dtype).
void BM_QuantizedMatvec(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t K = state.range(0), M = state.range(1), N = state.range(2);
  const DType dtype = matvec_dtype(state.range(3));
  constexpr int kCopies = 8;  // 8 weight matrices rotate past the L2
  // Each product gets its own vector: products of one vector would run as one launch
  // (BM_QkvMatvec measures that).
  DeviceGraph& dg = case_graph(args_key("matvec", state, 4), [&] {
    Graph g;
    for (int i = 0; i < kCopies; ++i) {
      TensorId x = g.input(indexed("x", i), DType::F32, {K, N});
      g.mark_output(g.matmul(g.weight(indexed("w", i), dtype, {K, M}), x));
    }
    return g;
  });
  const double bytes = double(row_bytes(dtype, K)) * double(M) + 4.0 * double(K * N + M * N);
  run_timed(state, dg, kCopies, bytes, 2.0 * double(K) * double(M) * double(N));
  state.SetLabel(std::string(dtype_name(dtype)));
}
BENCHMARK(BM_QuantizedMatvec)
    ->Args({4096, 14336, 1, 4})
    ->Args({14336, 4096, 1, 4})
    ->Args({4096, 14336, 1, 8})
    ->Args({14336, 4096, 1, 8})
    ->Args({4096, 14336, 8, 4})
    ->Args({4096, 4096, 1, 4})
    ->Args({4096, 14336, 1, 40})
    ->Args({14336, 4096, 1, 40})
    ->Args({4096, 14336, 1, 50})
    ->Args({14336, 4096, 1, 50})
    ->Args({4096, 14336, 1, 60})
    ->Args({14336, 4096, 1, 60})
    // Llama-3.2-1B's f16 products of one token: o, gate (or up), down.
    ->Args({2048, 2048, 1, 16})
    ->Args({2048, 8192, 1, 16})
    ->Args({8192, 2048, 1, 16})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Llama-3-8B's Q, K and V projections of one token (4096 -> 4096, 1024, 1024) as a segment:
// the backend runs each triple as one launch. Time and bytes per triple; 8 triples rotate.
void BM_QkvMatvec(benchmark::State& state) {
  REQUIRE_GPU(state);
  const DType dtype = state.range(0) == 4 ? DType::Q4_0 : DType::Q8_0;
  constexpr int kCopies = 8;
  const int64_t K = 4096, rows[3] = {4096, 1024, 1024};
  const char* names[3] = {"q", "k", "v"};
  double bytes = 4.0 * double(K);
  for (int p = 0; p < 3; ++p) {
    bytes += double(row_bytes(dtype, K)) * double(rows[p]) + 4.0 * double(rows[p]);
  }
  DeviceGraph& dg = case_graph(args_key("qkv", state, 1), [&] {
    Graph g;
    TensorId x = g.input("x", DType::F32, {K, 1});
    for (int i = 0; i < kCopies; ++i) {
      for (int p = 0; p < 3; ++p) {
        g.mark_output(g.matmul(g.weight(indexed(names[p], i), dtype, {K, rows[p]}), x));
      }
    }
    return g;
  });
  run_timed(state, dg, kCopies, bytes, 2.0 * double(K) * 6144.0);
  state.SetLabel(std::string(dtype_name(dtype)) + " per q/k/v triple");
}
BENCHMARK(BM_QkvMatvec)->Arg(4)->Arg(8)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_QuantizedMatmul(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t K = state.range(0), M = state.range(1), N = state.range(2);
  const DType dtype = state.range(3) == 4 ? DType::Q4_0 : DType::Q8_0;
  DeviceGraph& dg = case_graph(args_key("matmul", state, 4), [&] {
    Graph g;
    TensorId x = g.input("x", DType::F32, {K, N});
    g.mark_output(g.matmul(g.weight("w", dtype, {K, M}), x));
    return g;
  });
  run_timed(state, dg, 1, 0, 2.0 * double(K) * double(M) * double(N));
  state.SetLabel(std::string(dtype_name(dtype)));
}
BENCHMARK(BM_QuantizedMatmul)
    ->Args({4096, 14336, 512, 4})
    ->Args({4096, 14336, 512, 8})
    ->Args({14336, 4096, 512, 4})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_MatMulF16(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t K = state.range(0), M = state.range(1), N = state.range(2);
  DeviceGraph& dg = case_graph(args_key("f16", state, 3), [&] {
    Graph g;
    TensorId x = g.input("x", DType::F32, {K, N});
    g.mark_output(g.matmul(g.weight("w", DType::F16, {K, M}), x));
    return g;
  });
  run_timed(state, dg, 1, 0, 2.0 * double(K) * double(M) * double(N));
}
BENCHMARK(BM_MatMulF16)->Args({4096, 14336, 512})->UseManualTime()->Unit(benchmark::kMicrosecond);

// Attention over a KV cache: head dim 128, 32 query heads, 8 KV heads; T = range(1) queries
// at the end of a context of range(0) tokens; cache dtype f16 (range(2) == 16) or f32; range(3)
// launches in one graph, each over its own cache, as one token's layers do. A graph of n launches
// measured ~5.5 us + n times the kernel's rate in a long sequence (H100, 2026-11-22, 2983c92:
// 9.37 us a launch with 8, 9.06 with 16, 8.85 with 32); the 5.5 us include the host's
// submission, which follows the start event, and a first launch with no predecessor to overlap.
// 32 launches, the layers of Llama-3.1-8B, put the per-launch figure within ~0.2 us of that rate;
// 8 is kept to compare with the figures measured before 2983c92.
void BM_Attention(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int64_t C = state.range(0), T = state.range(1), D = 128, Hq = 32, Hkv = 8;
  const DType cache = state.range(2) == 16 ? DType::F16 : DType::F32;
  const int copies = int(state.range(3));
  TensorId pos = -1;  // set when the graph is built now, not taken from the last call
  DeviceGraph& dg = case_graph(args_key("attention", state, 4), [&] {
    Graph g;
    TensorId q = g.input("q", DType::F32, {D, Hq, T});
    pos = g.input("pos", DType::I32, {T});
    for (int i = 0; i < copies; ++i) {
      TensorId k = g.kv_cache(indexed("k", i), cache, {D, Hkv, C});
      TensorId v = g.kv_cache(indexed("v", i), cache, {D, Hkv, C});
      g.mark_output(g.attention(q, k, v, pos, 1.0f / std::sqrt(float(D))));
    }
    return g;
  });
  if (pos >= 0) {  // a graph just built: its positions, the last C - T .. C - 1
    std::vector<int32_t> positions(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) positions[size_t(t)] = int32_t(C - T + t);
    dg.set_ints(pos, positions);
  }
  const double kv_bytes = 2.0 * double(C * Hkv * D) * (cache == DType::F16 ? 2 : 4);
  // Causal prefill does about half the full score and value products.
  const double flops = 4.0 * double(D) * double(Hq) * double(T) * (T == 1 ? double(C) : C / 2.0);
  run_timed(state, dg, copies, T == 1 ? kv_bytes : 0, flops);
}
BENCHMARK(BM_Attention)
    ->Args({4096, 1, 16, 32})
    ->Args({4096, 1, 16, 8})
    ->Args({4096, 1, 32, 8})
    ->Args({512, 512, 16, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// 500 small ops (256 floats each) as one segment: replayed CUDA graph vs eager launches.
Graph small_ops_graph(int n) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {256});
  TensorId y = x;
  for (int i = 0; i < n; ++i) {
    y = i % 3 == 0 ? g.scale(y, 0.999f) : i % 3 == 1 ? g.silu(y) : g.add(y, x);
  }
  g.mark_output(y);
  return g;
}

void BM_SmallOpsGraphReplay(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int n = int(state.range(0));
  DeviceGraph dg(small_ops_graph(n), *gpu());
  run_timed(state, dg, n, 0, 0);
}
BENCHMARK(BM_SmallOpsGraphReplay)->Arg(500)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_SmallOpsEager(benchmark::State& state) {
  REQUIRE_GPU(state);
  const int n = int(state.range(0));
  auto& b = *gpu();
  DeviceGraph dg(small_ops_graph(n), b);
  dg.eager();
  b.synchronize();
  std::vector<double> us;
  for (auto _ : state) {
    const double t = time_us(b, [&] { dg.eager(); });
    us.push_back(t / n);
    state.SetIterationTime(t * 1e-6);
  }
  report(state, us, 0, 0);
}
BENCHMARK(BM_SmallOpsEager)->Arg(500)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
