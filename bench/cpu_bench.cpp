// CPU backend micro-benchmarks: STREAM-style copy bandwidth, Q4_0/Q8_0/K-quant matrix-vector
// products (GB/s of weight bytes and % of the copy bandwidth of the same run), F32 1024^3 against
// OpenBLAS, mixture-of-experts products, and thread scaling of every kernel. Thread counts:
// TANDEM_BENCH_THREADS="1,2,4" (default: 1 and the physical cores). Run with
// OPENBLAS_CORETYPE=SkylakeX.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "amx.h"
#include "cpu_backend.h"
#include "cpu_features.h"
#include "tandem/hash.h"

namespace tandem::cpu {
namespace {

// Weights rotate through copies totalling at least this much, so no run is served by L3.
constexpr size_t kRotationBytes = size_t(512) << 20;
constexpr size_t kCopyBytes = size_t(256) << 20;  // per array of the copy benchmark

struct AlignedBytes {
  std::unique_ptr<uint8_t, decltype(&std::free)> ptr{nullptr, &std::free};
  size_t size = 0;
  explicit AlignedBytes(size_t n)
      : ptr(static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64)), &std::free),
        size(n) {
    if (!ptr) std::abort();
  }
  uint8_t* data() const { return ptr.get(); }
};

void fill_random(float* x, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) x[i] = dist(rng);
}

// Random quantized weights: random quants, a valid small f16 scale per block.
void fill_quantized(DType dtype, uint8_t* p, int64_t rows, int64_t k, uint64_t seed) {
  const size_t rb = row_bytes(dtype, k);
  const size_t bs = size_t(dtype_traits(dtype).block_bytes);
  uint64_t s = seed * kGoldenRatio64 + 1;
  for (size_t i = 0; i + 8 <= rb * size_t(rows); i += 8) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::memcpy(p + i, &s, 8);
  }
  const uint16_t scale = f32_to_f16(0.01f);
  for (int64_t r = 0; r < rows; ++r)
    for (size_t b = 0; b < rb / bs; ++b) std::memcpy(p + size_t(r) * rb + b * bs, &scale, 2);
}

std::vector<int> thread_counts() {
  std::vector<int> out;
  if (const char* env = std::getenv("TANDEM_BENCH_THREADS"); env && *env) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) out.push_back(std::max(1, std::atoi(item.c_str())));
    }
  }
  if (out.empty()) {
    out.push_back(1);
    if (physical_core_count() > 1) out.push_back(physical_core_count());
  }
  return out;
}

void set_rate(benchmark::State& state, const char* name, double per_iteration) {
  state.counters[name] =
      benchmark::Counter(per_iteration * double(state.iterations()), benchmark::Counter::kIsRate);
}

void bm_copy(benchmark::State& state, int threads) {
  CpuBackend cpu(threads);
  AlignedBytes src(kCopyBytes), dst(kCopyBytes);
  std::memset(src.data(), 1, kCopyBytes);
  std::memset(dst.data(), 2, kCopyBytes);
  for (auto _ : state) {
    cpu.pool().parallel_for(int64_t(kCopyBytes), 4096, [&](int64_t b, int64_t e) {
      std::memcpy(dst.data() + b, src.data() + b, size_t(e - b));
    });
    benchmark::ClobberMemory();
  }
  set_rate(state, "GBps", 2.0 * double(kCopyBytes) / 1e9);  // STREAM counts read + write
}

// One MatMul node on the backend; the weight rotates through enough copies to defeat caches.
void bm_matmul_node(benchmark::State& state, DType wtype, int64_t K, int64_t M, int64_t N,
                    int threads, BlasPolicy policy, bool rotate, bool amx = true) {
  CpuBackend cpu(threads);
  cpu.set_blas_policy(policy);
  if (!amx) cpu.set_amx(false);
  Graph g;
  const TensorId w = g.weight("w", wtype, {K, M});
  const TensorId x = g.input("x", DType::F32, {K, N});
  const TensorId y = g.matmul(w, x);
  const size_t wbytes = g.tensor(w).bytes();
  const size_t copies = rotate ? std::max<size_t>(1, (kRotationBytes + wbytes - 1) / wbytes) : 1;
  AlignedBytes weights(wbytes * copies);
  for (size_t c = 0; c < copies; ++c) {
    uint8_t* p = weights.data() + c * wbytes;
    if (dtype_traits(wtype).is_quantized) {
      fill_quantized(wtype, p, M, K, c + 1);
    } else {
      std::vector<float> f(static_cast<size_t>(K * M));
      fill_random(f.data(), K * M, uint32_t(c + 1));
      from_f32(wtype, f.data(), p, K * M);
    }
  }
  std::vector<float> xs(static_cast<size_t>(K * N)), out(static_cast<size_t>(M * N));
  fill_random(xs.data(), K * N, 7);
  NodeExecution e{&g.node(y),
                  {{&g.tensor(w), weights.data()}, {&g.tensor(x), xs.data()}},
                  {&g.tensor(y), out.data()}};
  size_t i = 0;
  for (auto _ : state) {
    e.inputs[0].data = weights.data() + (i++ % copies) * wbytes;
    cpu.execute(g, e);
    benchmark::DoNotOptimize(out.data());
  }
  set_rate(state, "GBps", double(wbytes) / 1e9);
  set_rate(state, "GFLOPs", 2.0 * double(K) * double(M) * double(N) / 1e9);
}

void bm_openblas_sgemm(benchmark::State& state, int64_t n, int threads) {
  openblas_set_num_threads(threads);
  std::vector<float> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size());
  fill_random(a.data(), n * n, 1);
  fill_random(b.data(), n * n, 2);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(n), int(n), 1.0f, b.data(),
                int(n), a.data(), int(n), 0.0f, c.data(), int(n));
    benchmark::DoNotOptimize(c.data());
  }
  openblas_set_num_threads(1);  // the backend splits work itself; keep OpenBLAS's pool idle
  set_rate(state, "GFLOPs", 2.0 * double(n) * double(n) * double(n) / 1e9);
}

void bm_attention_decode(benchmark::State& state, int threads) {
  constexpr int64_t D = 128, Hq = 32, Hkv = 8, C = 4096;
  CpuBackend cpu(threads);
  Graph g;
  const TensorId q = g.input("q", DType::F32, {D, Hq, 1});
  const TensorId k = g.kv_cache("k", DType::F16, {D, Hkv, C});
  const TensorId v = g.kv_cache("v", DType::F16, {D, Hkv, C});
  const TensorId p = g.input("p", DType::I32, {1});
  const TensorId o = g.attention(q, k, v, p, 1.0f / std::sqrt(float(D)));
  std::vector<float> qs(static_cast<size_t>(D * Hq)), out(static_cast<size_t>(D * Hq));
  std::vector<float> kf(static_cast<size_t>(D * Hkv * C));
  fill_random(qs.data(), D * Hq, 3);
  fill_random(kf.data(), D * Hkv * C, 4);
  std::vector<uint16_t> kh(kf.size());
  from_f32(DType::F16, kf.data(), kh.data(), int64_t(kf.size()));
  int32_t pos = int32_t(C - 1);
  NodeExecution e{&g.node(o),
                  {{&g.tensor(q), qs.data()},
                   {&g.tensor(k), kh.data()},
                   {&g.tensor(v), kh.data()},
                   {&g.tensor(p), &pos}},
                  {&g.tensor(o), out.data()}};
  for (auto _ : state) cpu.execute(g, e);
  set_rate(state, "GBps", 2.0 * double(kh.size()) * 2.0 / 1e9);  // K and V bytes read
}

void bm_elementwise(benchmark::State& state, OpKind op, int threads) {
  constexpr int64_t kRows = 512, kCols = 4096;
  CpuBackend cpu(threads);
  Graph g;
  const TensorId x = g.input("x", DType::F32, {kCols, kRows});
  const TensorId w = g.weight("w", DType::F32, {kCols});
  const TensorId y = op == OpKind::RmsNorm ? g.rms_norm(x, w, 1e-5f) : g.silu(x);
  std::vector<float> xs(static_cast<size_t>(kRows * kCols)), ws(static_cast<size_t>(kCols));
  std::vector<float> out(xs.size());
  fill_random(xs.data(), kRows * kCols, 5);
  fill_random(ws.data(), kCols, 6);
  NodeExecution e{&g.node(y), {{&g.tensor(x), xs.data()}}, {&g.tensor(y), out.data()}};
  if (op == OpKind::RmsNorm) e.inputs.push_back({&g.tensor(w), ws.data()});
  for (auto _ : state) cpu.execute(g, e);
  set_rate(state, "GBps", 2.0 * double(xs.size()) * 4.0 / 1e9);
}

// Collects results so the run ends with the ratios the issue asks for, from this very run.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  SummaryReporter() : ConsoleReporter(OO_Tabular) {}  // plain text: the output goes to files
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      for (const char* c : {"GBps", "GFLOPs"}) {
        auto it = r.counters.find(c);
        if (it != r.counters.end()) values_[r.benchmark_name() + "|" + c] = it->second.value;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void print_summary(const std::vector<int>& threads) const {
    std::printf("\nSummary (same run; GB/s of weight bytes; copy = STREAM copy, read+write)\n");
    std::printf("%-34s", "kernel \\ threads");
    for (int t : threads) std::printf(" %9d", t);
    std::printf("\n");
    auto row = [&](const std::string& label, const std::string& prefix, const char* counter,
                   const std::string& ref_prefix = "", const char* ref_counter = nullptr) {
      std::printf("%-34s", label.c_str());
      for (int t : threads) {
        const std::string suffix = "/t" + std::to_string(t) + "/real_time";
        auto it = values_.find(prefix + suffix + "|" + counter);
        if (it == values_.end()) {
          std::printf(" %9s", "-");
          continue;
        }
        double v = it->second;
        if (ref_counter) {
          auto ref = values_.find(ref_prefix + suffix + "|" + ref_counter);
          if (ref == values_.end() || ref->second <= 0) {
            std::printf(" %9s", "-");
            continue;
          }
          std::printf(" %8.1f%%", 100.0 * v / ref->second);
        } else {
          std::printf(" %9.1f", v);
        }
      }
      std::printf("\n");
    };
    row("copy GB/s", "copy", "GBps");
    for (const char* q : {"q4_0", "q8_0", "q4_k", "q5_k", "q6_k"})
      for (const char* shape : {"4096x14336", "14336x4096"}) {
        const std::string name = std::string("matvec_") + q + "_" + shape;
        row(name + " GB/s", name, "GBps");
        row(name + " % copy", name, "GBps", "copy", "GBps");
      }
    row("matvec_q4_0 hot (L2) GB/s", "matvec_q4_0_hot_4096x128", "GBps");
    row("matvec_q8_0 hot (L2) GB/s", "matvec_q8_0_hot_4096x128", "GBps");
    for (const char* q : {"q4_k", "q5_k", "q6_k"})
      row(std::string("matvec_") + q + " hot (L2) GB/s",
          std::string("matvec_") + q + "_hot_4096x128", "GBps");
    row("qmatmul_q4_0 4096x4096x128 GFLOP/s", "qmatmul_q4_0_4096x4096x128", "GFLOPs");
    row("  same without AMX GFLOP/s", "qmatmul_q4_0_4096x4096x128_noamx", "GFLOPs");
    row("matvec_f16 4096x4096 GB/s", "matvec_f16_4096x4096", "GBps");
    row("f32 1024^3 own GFLOP/s", "f32_1024_own", "GFLOPs");
    row("f32 1024^3 op (auto) GFLOP/s", "f32_1024_op", "GFLOPs");
    row("f32 1024^3 OpenBLAS GFLOP/s", "f32_1024_openblas", "GFLOPs");
    row("f32 own % OpenBLAS", "f32_1024_own", "GFLOPs", "f32_1024_openblas", "GFLOPs");
    row("f32 op % OpenBLAS", "f32_1024_op", "GFLOPs", "f32_1024_openblas", "GFLOPs");
    row("attention decode f16 4k GB/s", "attention_decode_f16_ctx4096", "GBps");
    row("rms_norm 512x4096 GB/s", "rms_norm_512x4096", "GBps");
    row("silu 512x4096 GB/s", "silu_512x4096", "GBps");
  }

 private:
  std::map<std::string, double> values_;
};

// One ExpertMatMul node: Qwen3-30B-A3B's ffn_up_exps (128 experts of 768 x 2048), 8 experts a
// token. The ids change every iteration (drawn once, cycled) and the tensor rotates through
// copies totalling kRotationBytes (a model's layers), so the chosen experts come from memory as
// in a model; GBps counts the distinct experts' weight bytes read.
void bm_expert_matmul_node(benchmark::State& state, DType wtype, int64_t tokens, int threads) {
  constexpr int64_t K = 2048, M = 768, kExperts = 128, kUsed = 8, kIdSets = 64;
  CpuBackend cpu(threads);
  Graph g;
  const TensorId w = g.weight("w", wtype, {K, M, kExperts});
  const TensorId x = g.input("x", DType::F32, {K, 1, tokens});
  const TensorId ids = g.input("ids", DType::I32, {kUsed, tokens});
  const TensorId y = g.expert_matmul(w, x, ids);
  const size_t wbytes = g.tensor(w).bytes();
  const size_t copies = std::max<size_t>(1, (kRotationBytes + wbytes - 1) / wbytes);
  AlignedBytes weights(wbytes * copies);
  fill_quantized(wtype, weights.data(), M * kExperts, K, 1);
  for (size_t c = 1; c < copies; ++c) {
    std::memcpy(weights.data() + c * wbytes, weights.data(), wbytes);
  }
  std::vector<float> xs(static_cast<size_t>(K * tokens)),
      out(static_cast<size_t>(M * kUsed * tokens));
  fill_random(xs.data(), K * tokens, 7);
  // Each token's experts distinct, as a router picks them.
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> id_sets(kIdSets);
  std::vector<double> distinct(kIdSets);
  for (int64_t s = 0; s < kIdSets; ++s) {
    std::vector<bool> used(kExperts);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> all(kExperts);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < kUsed; ++j) {
        id_sets[size_t(s)].push_back(all[size_t(j)]);
        used[size_t(all[size_t(j)])] = true;
      }
    }
    distinct[size_t(s)] = double(std::count(used.begin(), used.end(), true));
  }
  NodeExecution e{&g.node(y),
                  {{&g.tensor(w), weights.data()},
                   {&g.tensor(x), xs.data()},
                   {&g.tensor(ids), id_sets[0].data()}},
                  {&g.tensor(y), out.data()}};
  size_t i = 0;
  double experts_read = 0.0;
  for (auto _ : state) {
    const size_t s = i % kIdSets;
    e.inputs[0].data = weights.data() + (i++ % copies) * wbytes;
    e.inputs[2].data = id_sets[s].data();
    experts_read += distinct[s];
    cpu.execute(g, e);
    benchmark::DoNotOptimize(out.data());
  }
  const double expert_bytes = double(row_bytes(wtype, K)) * double(M);
  state.counters["GBps"] =
      benchmark::Counter(experts_read * expert_bytes / 1e9, benchmark::Counter::kIsRate);
}

// A token's expert products as decode runs them (CpuBackend::execute_segment's groups): gate and
// up of Qwen3-30B-A3B's shape (128 experts of 768 x 2048) with their SwiGLU, or down (2048 x 768)
// with MoeCombine, 8 distinct experts a token, ids cycled, the tensors rotating through copies
// totalling kRotationBytes. GBps counts the chosen experts' weight bytes read.
void bm_expert_group(benchmark::State& state, bool gate_up, int threads) {
  constexpr int64_t kEmbd = 2048, kFf = 768, kExperts = 128, kUsed = 8, kIdSets = 64;
  CpuBackend cpu(threads);
  Graph g;
  const int64_t K = gate_up ? kEmbd : kFf, M = gate_up ? kFf : kEmbd;
  const int n_weights = gate_up ? 2 : 1;
  std::vector<TensorId> w;
  for (int i = 0; i < n_weights; ++i) {
    w.push_back(g.weight("w" + std::to_string(i), DType::Q4_0, {K, M, kExperts}));
  }
  const TensorId x = g.input("x", DType::F32, {K, gate_up ? 1 : kUsed, 1});
  const TensorId ids = g.input("ids", DType::I32, {kUsed, 1});
  const TensorId route = g.input("route", DType::F32, {kUsed, 1});
  std::vector<TensorId> nodes;
  if (gate_up) {
    nodes.push_back(g.expert_matmul(w[0], x, ids));
    nodes.push_back(g.expert_matmul(w[1], x, ids));
    nodes.push_back(g.swiglu(nodes[0], nodes[1]));
  } else {
    nodes.push_back(g.expert_matmul(w[0], x, ids));
    nodes.push_back(g.moe_combine(nodes[0], route));
  }
  const size_t wbytes = g.tensor(w[0]).bytes();
  const size_t copies =
      std::max<size_t>(1, (kRotationBytes / size_t(n_weights) + wbytes - 1) / wbytes);
  std::vector<AlignedBytes> weights;
  for (int i = 0; i < n_weights; ++i) {
    weights.emplace_back(wbytes * copies);
    fill_quantized(DType::Q4_0, weights.back().data(), M * kExperts, K, uint64_t(1 + i));
    for (size_t c = 1; c < copies; ++c) {
      std::memcpy(weights.back().data() + c * wbytes, weights.back().data(), wbytes);
    }
  }
  std::vector<float> xs(size_t(g.tensor(x).elements())), routes(size_t(kUsed), 1.0f / kUsed);
  fill_random(xs.data(), int64_t(xs.size()), 7);
  std::map<TensorId, std::vector<float>> outs;
  for (TensorId n : nodes) outs[n].resize(size_t(g.tensor(n).elements()));
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> id_sets(kIdSets);
  for (auto& set : id_sets) {
    std::vector<int32_t> all(kExperts);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    set.assign(all.begin(), all.begin() + kUsed);
  }
  auto data_of = [&](TensorId id) -> void* {
    if (id == x) return xs.data();
    if (id == route) return routes.data();
    if (id == ids) return id_sets[0].data();
    for (int i = 0; i < n_weights; ++i) {
      if (id == w[size_t(i)]) return weights[size_t(i)].data();
    }
    return outs.at(id).data();
  };
  std::vector<NodeExecution> segment;
  for (TensorId n : nodes) {
    NodeExecution e{&g.node(n), {}, {&g.tensor(n), outs.at(n).data()}};
    for (TensorId in : g.node(n).inputs) e.inputs.push_back({&g.tensor(in), data_of(in)});
    segment.push_back(std::move(e));
  }
  size_t i = 0;
  for (auto _ : state) {
    const size_t c = i % copies;
    for (NodeExecution& e : segment) {
      for (TensorRef& in : e.inputs) {
        for (int k = 0; k < n_weights; ++k) {
          if (in.desc == &g.tensor(w[size_t(k)])) in.data = weights[size_t(k)].data() + c * wbytes;
        }
        if (in.desc == &g.tensor(ids)) in.data = id_sets[i % kIdSets].data();
      }
    }
    ++i;
    cpu.execute_segment(g, segment, 1);
    benchmark::DoNotOptimize(outs.at(nodes.back()).data());
  }
  const double expert_bytes = double(row_bytes(DType::Q4_0, K)) * double(M);
  state.counters["GBps"] = benchmark::Counter(double(i) * kUsed * n_weights * expert_bytes / 1e9,
                                              benchmark::Counter::kIsRate);
}

void register_all(const std::vector<int>& threads) {
  auto reg = [](const std::string& name, int t, auto fn) {
    benchmark::RegisterBenchmark((name + "/t" + std::to_string(t)).c_str(), fn)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  for (int t : threads) reg("copy", t, [t](benchmark::State& s) { bm_copy(s, t); });
  for (DType q : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const std::string qn(dtype_name(q));
    for (int t : threads) {
      reg("matvec_" + qn + "_4096x14336", t, [=](benchmark::State& s) {
        bm_matmul_node(s, q, 4096, 14336, 1, t, BlasPolicy::Auto, true);
      });
      reg("matvec_" + qn + "_14336x4096", t, [=](benchmark::State& s) {
        bm_matmul_node(s, q, 14336, 4096, 1, t, BlasPolicy::Auto, true);
      });
    }
  }
  for (int t : threads) {
    // Weights that stay in L2: the kernels' compute speed without DRAM in the way.
    reg("matvec_q4_0_hot_4096x128", t, [=](benchmark::State& s) {
      bm_matmul_node(s, DType::Q4_0, 4096, 128, 1, t, BlasPolicy::Auto, false);
    });
    reg("matvec_q8_0_hot_4096x128", t, [=](benchmark::State& s) {
      bm_matmul_node(s, DType::Q8_0, 4096, 128, 1, t, BlasPolicy::Auto, false);
    });
    for (DType q : kKQuantDTypes) {
      reg("matvec_" + std::string(dtype_name(q)) + "_hot_4096x128", t, [=](benchmark::State& s) {
        bm_matmul_node(s, q, 4096, 128, 1, t, BlasPolicy::Auto, false);
      });
    }
    reg("qmatmul_q4_0_4096x4096x128", t, [=](benchmark::State& s) {
      bm_matmul_node(s, DType::Q4_0, 4096, 4096, 128, t, BlasPolicy::Auto, false);
    });
    reg("qmatmul_q4_0_4096x4096x128_noamx", t, [=](benchmark::State& s) {
      bm_matmul_node(s, DType::Q4_0, 4096, 4096, 128, t, BlasPolicy::Auto, false, false);
    });
    reg("matvec_f16_4096x4096", t, [=](benchmark::State& s) {
      bm_matmul_node(s, DType::F16, 4096, 4096, 1, t, BlasPolicy::Auto, true);
    });
    reg("f32_1024_own", t, [=](benchmark::State& s) {
      bm_matmul_node(s, DType::F32, 1024, 1024, 1024, t, BlasPolicy::Never, false);
    });
    reg("f32_1024_op", t, [=](benchmark::State& s) {
      bm_matmul_node(s, DType::F32, 1024, 1024, 1024, t, BlasPolicy::Auto, false);
    });
    reg("f32_1024_openblas", t, [=](benchmark::State& s) { bm_openblas_sgemm(s, 1024, t); });
    reg("attention_decode_f16_ctx4096", t, [=](benchmark::State& s) { bm_attention_decode(s, t); });
    reg("rms_norm_512x4096", t,
        [=](benchmark::State& s) { bm_elementwise(s, OpKind::RmsNorm, t); });
    reg("silu_512x4096", t, [=](benchmark::State& s) { bm_elementwise(s, OpKind::Silu, t); });
    for (int64_t tokens : {1, 64}) {
      reg("expert_matmul_q4_0_2048x768x128_top8_t" + std::to_string(tokens), t,
          [=](benchmark::State& s) { bm_expert_matmul_node(s, DType::Q4_0, tokens, t); });
    }
    reg("expert_group_q4_0_gate_up_swiglu_top8", t,
        [=](benchmark::State& s) { bm_expert_group(s, true, t); });
    reg("expert_group_q4_0_down_combine_top8", t,
        [=](benchmark::State& s) { bm_expert_group(s, false, t); });
  }
}

}  // namespace
}  // namespace tandem::cpu

int main(int argc, char** argv) {
  using namespace tandem::cpu;
  benchmark::Initialize(&argc, argv);
  const std::vector<int> threads = thread_counts();
  std::string features;
  for (const auto& f : feature_names(cpu_features())) features += f + " ";
  benchmark::AddCustomContext("tandem_cpu_kernels", std::string(isa_name(best_isa())));
  benchmark::AddCustomContext("tandem_cpu_features", features);
  benchmark::AddCustomContext("tandem_cpu_amx", amx::amx_usable() ? "yes" : "no");
  benchmark::AddCustomContext("tandem_physical_cores", std::to_string(physical_core_count()));
  register_all(threads);
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_summary(threads);
  benchmark::Shutdown();
  return 0;
}
