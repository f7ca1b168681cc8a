// tandem-demo: builds one transformer block (rms_norm, q4_0 and f32 matmuls, rope, kv_write,
// grouped-query attention, swiglu) for a prefill chunk, runs it node by node on every
// available backend through the Backend API, and checks each result against the reference.
// It is the main job until `tandem bench` lands.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tandem/error.h"
#include "tandem/registry.h"

namespace {

using namespace tandem;

struct Options {
  int64_t embd = 1024, heads = 8, kv_heads = 2, ffn = 2816, tokens = 8, context = 64;
  int repeats = 3;
  uint64_t seed = 0;
};

struct Block {
  Graph graph;
  TensorId out = kNoTensor;
};

// One LLaMA-style block over a chunk of `tokens` tokens at positions context/2 ...
Block build_block(const Options& o) {
  const int64_t head_dim = o.embd / o.heads;
  Block b;
  Graph& g = b.graph;
  TensorId x = g.input("x", DType::F32, {o.embd, o.tokens});
  TensorId pos = g.input("pos", DType::I32, {o.tokens});
  TensorId attn_norm = g.weight("attn_norm", DType::F32, {o.embd});
  TensorId wq = g.weight("wq", DType::Q4_0, {o.embd, o.embd});
  TensorId wk = g.weight("wk", DType::F32, {o.embd, o.kv_heads * head_dim});
  TensorId wv = g.weight("wv", DType::Q4_0, {o.embd, o.kv_heads * head_dim});
  TensorId wo = g.weight("wo", DType::Q4_0, {o.embd, o.embd});
  TensorId ffn_norm = g.weight("ffn_norm", DType::F32, {o.embd});
  TensorId w_gate = g.weight("w_gate", DType::Q4_0, {o.embd, o.ffn});
  TensorId w_up = g.weight("w_up", DType::Q4_0, {o.embd, o.ffn});
  TensorId w_down = g.weight("w_down", DType::F32, {o.ffn, o.embd});
  TensorId k_cache = g.kv_cache("k_cache", DType::F16, {head_dim, o.kv_heads, o.context});
  TensorId v_cache = g.kv_cache("v_cache", DType::F16, {head_dim, o.kv_heads, o.context});

  TensorId h = g.rms_norm(x, attn_norm, 1e-5f);
  TensorId q = g.reshape(g.matmul(wq, h), {head_dim, o.heads, o.tokens});
  TensorId k = g.reshape(g.matmul(wk, h), {head_dim, o.kv_heads, o.tokens});
  TensorId v = g.reshape(g.matmul(wv, h), {head_dim, o.kv_heads, o.tokens});
  q = g.rope(q, pos, int32_t(head_dim), 500000.0f);
  k = g.rope(k, pos, int32_t(head_dim), 500000.0f);
  TensorId kw = g.kv_write(k_cache, k, pos);
  TensorId vw = g.kv_write(v_cache, v, pos);
  TensorId att = g.attention(q, kw, vw, pos, float(1.0 / std::sqrt(double(head_dim))));
  TensorId x2 = g.add(x, g.matmul(wo, g.reshape(att, {o.embd, o.tokens})));
  TensorId h2 = g.rms_norm(x2, ffn_norm, 1e-5f);
  TensorId ff = g.swiglu(g.matmul(w_gate, h2), g.matmul(w_up, h2));
  b.out = g.add(x2, g.matmul(w_down, ff));
  g.mark_output(b.out);
  return b;
}

// Leaf contents: uniform [-1, 1] weights and activations (stored in each leaf's dtype),
// positions context/2 + t. Weights are scaled by 1/sqrt(fan-in) so activations stay O(1).
std::map<TensorId, std::vector<uint8_t>> make_inputs(const Graph& g, const Options& o) {
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::map<TensorId, std::vector<uint8_t>> data;
  for (const Node& n : g.nodes()) {
    if (!is_leaf(n.op)) continue;
    const TensorDesc& d = g.tensor(n.id);
    std::vector<uint8_t> bytes(d.bytes());
    if (d.dtype == DType::I32) {
      auto* p = reinterpret_cast<int32_t*>(bytes.data());
      for (int64_t t = 0; t < d.elements(); ++t) p[t] = int32_t(o.context / 2 + t);
    } else {
      const float scale =
          n.op == OpKind::Weight && d.n_dims == 2 ? 1.0f / std::sqrt(float(d.ne[0])) : 1.0f;
      std::vector<float> v(static_cast<size_t>(d.elements()));
      for (float& x : v) x = dist(rng) * scale;
      from_f32(d.dtype, v.data(), bytes.data(), d.elements());
    }
    data[n.id] = std::move(bytes);
  }
  return data;
}

struct RunResult {
  std::vector<float> output;
  double best_us = 0.0;
  std::string refused;  // why the backend cannot run the block, if it cannot
};

// Node by node on one backend: a buffer per storage tensor, leaves uploaded once, every
// compute node executed in order (metadata nodes only alias), the output copied back.
RunResult run_block(Backend& backend, const Block& block,
                    const std::map<TensorId, std::vector<uint8_t>>& inputs, int repeats) {
  const Graph& g = block.graph;
  RunResult r;
  for (const Node& n : g.nodes()) {
    if (!is_compute(n.op)) continue;
    const CapabilityCheck c = backend.check(g, n);
    if (!c.ok()) {
      r.refused = std::string(op_name(n.op)) + ": " + c.detail;
      return r;
    }
  }
  std::map<TensorId, Buffer> buffers;
  for (const Node& n : g.nodes()) {
    if (g.storage_of(n.id) != n.id) continue;
    buffers[n.id] = backend.allocate(g.tensor(n.id).bytes());
  }
  auto pointer = [&](TensorId id) {
    return static_cast<uint8_t*>(buffers.at(g.storage_of(id)).data()) + g.tensor(id).view_offset;
  };
  std::vector<NodeExecution> execs;
  for (const Node& n : g.nodes()) {
    if (!is_compute(n.op)) continue;
    NodeExecution e;
    e.node = &n;
    for (TensorId in : n.inputs) e.inputs.push_back({&g.tensor(in), pointer(in)});
    e.output = {&g.tensor(n.id), pointer(n.id)};
    execs.push_back(std::move(e));
  }
  for (int rep = 0; rep < repeats; ++rep) {
    // Fresh leaves every repeat: kv_write changes the caches.
    for (const auto& [id, bytes] : inputs) {
      backend.copy_from_host(buffers.at(id).data(), bytes.data(), bytes.size());
    }
    backend.timer_start();
    for (const NodeExecution& e : execs) backend.execute(g, e);
    const double us = backend.timer_stop_us();
    r.best_us = rep == 0 ? us : std::min(r.best_us, us);
  }
  const TensorDesc& out = g.tensor(block.out);
  std::vector<uint8_t> host(out.bytes());
  backend.copy_to_host(host.data(), pointer(block.out), host.size());
  r.output.resize(static_cast<size_t>(out.elements()));
  to_f32(out.dtype, host.data(), r.output.data(), out.elements());
  return r;
}

double nmse(const std::vector<float>& expected, const std::vector<float>& actual) {
  double num = 0, den = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    num += (double(expected[i]) - actual[i]) * (double(expected[i]) - actual[i]);
    den += double(expected[i]) * expected[i];
  }
  return den > 0 ? num / den : (num == 0 ? 0.0 : INFINITY);
}

int64_t parse_int(const char* flag, const char* value) {
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (!*value || *end || v <= 0) {
    throw_error(
        ErrorCode::InvalidArgument, "tandem-demo",
        std::string("bad value for ") + flag + " ('" + value + "', want a positive integer)");
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  std::random_device rd;
  o.seed = (uint64_t(rd()) << 32) | rd();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: tandem-demo [--tokens N] [--embd N] [--heads N] [--kv-heads N] [--ffn N]\n"
          "                   [--context N] [--repeats N] [--seed N]\n"
          "Runs one transformer block on every available backend and checks it against the\n"
          "reference (NMSE threshold 5e-4). Exit status 1 if any backend fails the check.\n");
      std::exit(0);
    }
    if (i + 1 >= argc) {
      throw_error(ErrorCode::InvalidArgument, "tandem-demo", "missing value for " + a);
    }
    const char* v = argv[++i];
    if (a == "--tokens")
      o.tokens = parse_int("--tokens", v);
    else if (a == "--embd")
      o.embd = parse_int("--embd", v);
    else if (a == "--heads")
      o.heads = parse_int("--heads", v);
    else if (a == "--kv-heads")
      o.kv_heads = parse_int("--kv-heads", v);
    else if (a == "--ffn")
      o.ffn = parse_int("--ffn", v);
    else if (a == "--context")
      o.context = parse_int("--context", v);
    else if (a == "--repeats")
      o.repeats = int(parse_int("--repeats", v));
    else if (a == "--seed")
      o.seed = uint64_t(parse_int("--seed", v));
    else
      throw_error(ErrorCode::InvalidArgument, "tandem-demo", "unknown option " + a);
  }
  if (o.embd % o.heads != 0 || (o.embd / o.heads) % 2 != 0) {
    throw_error(ErrorCode::InvalidArgument, "tandem-demo",
                "embd must split into heads of even size (embd " + std::to_string(o.embd) +
                    ", heads " + std::to_string(o.heads) + ")");
  }
  if (o.context / 2 + o.tokens > o.context) {
    throw_error(ErrorCode::InvalidArgument, "tandem-demo",
                "context " + std::to_string(o.context) + " too small for " +
                    std::to_string(o.tokens) + " tokens at position context/2");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const Block block = build_block(o);
    const auto inputs = make_inputs(block.graph, o);
    int compute_nodes = 0;
    for (const Node& n : block.graph.nodes()) compute_nodes += is_compute(n.op) ? 1 : 0;
    std::printf(
        "tandem-demo: one transformer block, embd %lld, heads %lld/%lld, ffn %lld, "
        "%lld tokens at position %lld, %d compute nodes, seed %llu\n",
        (long long)o.embd, (long long)o.heads, (long long)o.kv_heads, (long long)o.ffn,
        (long long)o.tokens, (long long)(o.context / 2), compute_nodes, (unsigned long long)o.seed);

    auto reference = create_backend("reference");
    const RunResult expected = run_block(*reference, block, inputs, o.repeats);
    std::vector<std::shared_ptr<Backend>> backends{reference};
    for (auto& b : available_backends()) backends.push_back(b);

    constexpr double kThreshold = 5e-4;
    bool all_ok = true;
    std::printf("\n%-12s %-8s %14s %12s  %s\n", "backend", "kind", "nmse", "best ms", "result");
    for (auto& b : backends) {
      RunResult r = b.get() == reference.get() ? expected : RunResult{};
      if (b.get() != reference.get()) {
        try {
          r = run_block(*b, block, inputs, o.repeats);
        } catch (const Error& e) {
          r.refused = e.what();
        }
      }
      if (!r.refused.empty()) {
        std::printf("%-12s %-8s %14s %12s  cannot run (%s)\n", b->backend_id().c_str(),
                    std::string(backend_kind_name(b->kind())).c_str(), "-", "-", r.refused.c_str());
        continue;  // a capability gap, not a wrong result: the scheduler handles those
      }
      const double err = nmse(expected.output, r.output);
      const bool ok = err <= kThreshold;  // false for NaN too
      all_ok &= ok;
      std::printf("%-12s %-8s %14.3e %12.3f  %s\n", b->backend_id().c_str(),
                  std::string(backend_kind_name(b->kind())).c_str(), err, r.best_us / 1000.0,
                  b.get() == reference.get() ? "oracle" : (ok ? "ok" : "MISMATCH"));
    }
    if (backends.size() == 1) {
      std::printf(
          "\nno backend other than the reference is available (cpu and cuda backends "
          "not built, or no GPU): only the oracle ran\n");
    }
    double sum = 0;
    for (float v : expected.output) sum += double(v) * v;
    if (!std::isfinite(sum) || sum == 0.0) {
      std::printf("the reference output is not finite and non-zero: the block is broken\n");
      all_ok = false;
    }
    std::printf("\noutput rms %.4f over %zu values; threshold nmse <= %.0e\n",
                std::sqrt(sum / double(expected.output.size())), expected.output.size(),
                kThreshold);
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-demo: %s\n", e.what());
    return 2;
  }
}
