#include "harness.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>

#include "reference_backend.h"
#include "tandem/error.h"
#include "tandem/hash.h"

namespace tandem::conformance {

namespace {

// splitmix64: fast enough to fill 16M-element weights, and seeded per case.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_{seed} {}
  uint64_t next() { return state_.next(); }
  // Uniform in [-1, 1], never zero (and never so small that it is a zero in disguise).
  float unit() {
    for (;;) {
      float v = float(double(next() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
      if (std::fabs(v) >= 1e-6f) return v;
    }
  }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }

 private:
  SplitMix64 state_;
};

std::vector<uint8_t> make_leaf_data(const TensorDesc& d, const LeafFill& f, Rng& rng) {
  std::vector<uint8_t> bytes(d.bytes());
  const int64_t n = d.elements();
  if (d.dtype == DType::I32) {
    auto* p = reinterpret_cast<int32_t*>(bytes.data());
    const int64_t count = d.ne[0];
    const int64_t start = f.fill == Fill::SequentialPositions
                              ? rng.below(std::max<int64_t>(1, f.limit - count + 1))
                              : 0;
    for (int64_t i = 0; i < n; ++i) {
      switch (f.fill) {
        case Fill::RowIds:
        case Fill::RandomPositions:
          p[i] = int32_t(rng.below(f.limit));
          break;
        case Fill::SequentialPositions:
          p[i] = int32_t(start + i);
          break;
        case Fill::ExpertMap:
          p[i] = int32_t(rng.below(uint64_t(f.limit) + 1)) - 1;
          break;
        default:
          p[i] = int32_t(rng.below(2001)) - 1000;
      }
    }
    return bytes;
  }
  if (d.dtype == DType::I8) {
    for (auto& b : bytes) b = uint8_t(rng.next());
    return bytes;
  }
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = rng.unit();
  if (f.fill == Fill::CausalMask) {
    const int64_t n_kv = d.ne[0], n_q = d.ne[1];
    for (int64_t r = 0; r < d.rows(); ++r) {
      for (int64_t i = 0; i < n_kv; ++i) {
        if (i > (r % n_q) + (n_kv - n_q)) values[size_t(r * n_kv + i)] = -INFINITY;
      }
    }
  }
  from_f32(d.dtype, values.data(), bytes.data(), n);
  return bytes;
}

// Buffers of one run: one per storage tensor (leaves and the node's own output), each
// followed by a guard region.
struct Storage {
  TensorId tensor = kNoTensor;
  size_t bytes = 0;
  bool is_output = false;
  Buffer buffer;
};

struct RunOutput {
  std::map<TensorId, std::vector<uint8_t>> host;  // bytes + guard, copied back
  std::map<TensorId, size_t> sizes;
  std::string error;
};

RunOutput run_on(Backend& backend, const Case& c,
                 const std::map<TensorId, std::vector<uint8_t>>& leaf_data) {
  const Graph& g = c.graph;
  const Node& node = c.node();
  const TensorId out_storage = g.storage_of(node.id);
  RunOutput result;
  std::vector<Storage> storages;
  std::map<TensorId, size_t> index_of;
  try {
    for (const Node& n : g.nodes()) {
      const bool own_output = n.id == node.id && out_storage == node.id;
      if (!is_leaf(n.op) && !own_output) continue;
      Storage s;
      s.tensor = n.id;
      s.bytes = g.tensor(n.id).bytes();
      s.is_output = n.id == out_storage;
      s.buffer = backend.allocate(s.bytes + kGuardBytes);
      std::vector<uint8_t> init(s.bytes + kGuardBytes, kGuardPattern);
      if (is_leaf(n.op)) {
        const auto& data = leaf_data.at(n.id);
        std::copy(data.begin(), data.end(), init.begin());
      } else {
        std::fill(init.begin(), init.begin() + ptrdiff_t(s.bytes), uint8_t(0xff));  // NaN
      }
      backend.copy_from_host(s.buffer.data(), init.data(), init.size());
      index_of[n.id] = storages.size();
      storages.push_back(std::move(s));
    }
    auto ref = [&](TensorId id) {
      const TensorDesc& d = g.tensor(id);
      auto* base = static_cast<uint8_t*>(storages[index_of.at(g.storage_of(id))].buffer.data());
      return TensorRef{&d, base + d.view_offset};
    };
    NodeExecution exec;
    exec.node = &node;
    for (TensorId in : node.inputs) exec.inputs.push_back(ref(in));
    exec.output = ref(node.id);
    backend.execute(g, exec);
    backend.synchronize();
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  for (Storage& s : storages) {
    if (!s.buffer) continue;
    std::vector<uint8_t> host(s.bytes + kGuardBytes);
    try {
      backend.copy_to_host(host.data(), s.buffer.data(), host.size());
    } catch (const std::exception& e) {
      if (result.error.empty()) result.error = std::string("copy_to_host: ") + e.what();
    }
    result.sizes[s.tensor] = s.bytes;
    result.host[s.tensor] = std::move(host);
  }
  return result;
}

std::vector<float> output_values(const Graph& g, const Node& node, const RunOutput& run) {
  const TensorDesc& d = g.tensor(node.id);
  const auto it = run.host.find(g.storage_of(node.id));
  std::vector<float> out(static_cast<size_t>(d.elements()));
  if (it == run.host.end()) return out;
  to_f32(d.dtype, it->second.data() + d.view_offset, out.data(), d.elements());
  return out;
}

std::string hex_byte(uint8_t b) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

void check_guards(const Graph& g, const RunOutput& run, std::vector<std::string>& problems) {
  for (const auto& [tensor, host] : run.host) {
    const size_t size = run.sizes.at(tensor);
    size_t first = host.size(), changed = 0;
    for (size_t i = size; i < host.size(); ++i) {
      if (host[i] != kGuardPattern) {
        first = std::min(first, i);
        ++changed;
      }
    }
    if (changed) {
      problems.push_back("'" + g.tensor(tensor).name + "': " + std::to_string(changed) +
                         " guard byte(s) changed, first at guard offset " +
                         std::to_string(first - size) + " (now " + hex_byte(host[first]) +
                         ", expected " + hex_byte(kGuardPattern) + ")");
    }
  }
}

}  // namespace

double nmse(std::span<const float> expected, std::span<const float> actual) {
  if (expected.size() != actual.size()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i], a = actual[i];
    // -inf == -inf (a fully masked softmax input never reaches an output, but be exact).
    if (e == a) {
      den += std::isfinite(e) ? e * e : 0.0;
      continue;
    }
    num += (e - a) * (e - a);
    den += e * e;
  }
  if (std::isnan(num)) return NAN;
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return num / den;
}

double threshold_for(const Graph& graph, const Node& node) {
  switch (node.op) {
    case OpKind::MatMul:
    case OpKind::QuantizedMatMul:
    case OpKind::ExpertMatMul:
      return kMatMulThreshold;
    case OpKind::Attention:
      return kAttentionThreshold;
    case OpKind::Softmax:
    case OpKind::MoeWeights:
      return kSoftmaxThreshold;
    case OpKind::Rope:
    case OpKind::RopeNeox:
      return kRopeThreshold;
    case OpKind::Copy:
      return dtype_traits(graph.tensor(node.id).dtype).is_quantized ? kQuantizeThreshold
                                                                    : kExactThreshold;
    default:
      return kExactThreshold;
  }
}

std::string test_name(const std::string& backend_id, const std::string& case_name) {
  std::string s;
  for (char ch : backend_id + "_" + case_name) {
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      s += ch;
    } else if (ch != ':' && (s.empty() || s.back() != '_')) {
      s += '_';
    }
  }
  return s;
}

std::string CaseResult::describe() const {
  std::ostringstream os;
  os << "[" << backend_id << " " << case_name << "] seed " << seed
     << " (replay with TANDEM_TEST_SEED=" << seed << ")";
  if (!declared) {
    os << ": not declared by the backend, not run";
    return os.str();
  }
  os << ": nmse " << nmse << " (threshold " << threshold << ", " << compared << " elements)";
  if (non_finite) os << "; " << non_finite << " NaN/inf output element(s)";
  if (!error.empty()) os << "; error: " << error;
  for (const auto& g : guard_violations) os << "; out-of-bounds write: " << g;
  for (const auto& m : modified_inputs) os << "; input modified: " << m;
  os << (passed() ? " -> pass" : " -> FAIL");
  return os.str();
}

std::map<TensorId, std::vector<uint8_t>> make_inputs(const Case& c, uint64_t seed) {
  // Each leaf from its own stream, so adding a leaf does not change the others.
  std::map<TensorId, std::vector<uint8_t>> leaf_data;
  for (const Node& n : c.graph.nodes()) {
    if (!is_leaf(n.op)) continue;
    LeafFill fill{n.id, Fill::Random, 0};
    for (const LeafFill& f : c.fills) {
      if (f.tensor == n.id) fill = f;
    }
    Rng rng(hash_combine(seed, uint64_t(n.id)));
    leaf_data[n.id] = make_leaf_data(c.graph.tensor(n.id), fill, rng);
  }
  return leaf_data;
}

CaseResult run_case(Backend& backend, const Case& c, uint64_t seed) {
  CaseResult r;
  r.backend_id = backend.backend_id();
  r.case_name = c.name;
  r.seed = seed;
  r.threshold = c.threshold;
  const Graph& g = c.graph;
  const Node& node = c.node();
  if (!backend.check(g, node).ok()) {
    r.declared = false;
    return r;
  }

  const std::map<TensorId, std::vector<uint8_t>> leaf_data = make_inputs(c, seed);

  ReferenceBackend reference;
  RunOutput expected_run = run_on(reference, c, leaf_data);
  if (!expected_run.error.empty()) {
    r.error = "the reference failed: " + expected_run.error;
    return r;
  }
  RunOutput actual_run = run_on(backend, c, leaf_data);
  r.error = actual_run.error;

  const std::vector<float> expected = output_values(g, node, expected_run);
  const std::vector<float> actual = output_values(g, node, actual_run);
  r.compared = int64_t(actual.size());
  // NaN never passes; an infinity passes only where the reference has the same one.
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!std::isfinite(actual[i]) && !(i < expected.size() && actual[i] == expected[i])) {
      ++r.non_finite;
    }
  }
  r.nmse = nmse(expected, actual);
  if (std::isnan(r.nmse)) r.nmse = INFINITY;

  check_guards(g, actual_run, r.guard_violations);
  const TensorId out_storage = g.storage_of(node.id);
  for (const auto& [tensor, data] : leaf_data) {
    if (tensor == out_storage) continue;
    const std::vector<uint8_t>& host = actual_run.host[tensor];
    if (host.size() < data.size() || !std::equal(data.begin(), data.end(), host.begin())) {
      r.modified_inputs.push_back("'" + g.tensor(tensor).name + "'");
    }
  }
  return r;
}

std::vector<CaseResult> run_cases(Backend& backend, const std::vector<Case>& cases, uint64_t seed) {
  std::vector<CaseResult> results;
  for (size_t i = 0; i < cases.size(); ++i) {
    results.push_back(run_case(backend, cases[i], seed + i));
  }
  return results;
}

RejectReason expected_reject_reason(const Backend& backend, const Graph& graph, const Node& node) {
  if (backend.lost()) return RejectReason::DeviceLost;
  std::vector<DType> used{graph.tensor(node.id).dtype};
  for (TensorId in : node.inputs) used.push_back(graph.tensor(in).dtype);
  int64_t largest = 0;
  for (TensorId t : node.inputs) largest = std::max(largest, graph.tensor(t).elements());
  largest = std::max(largest, graph.tensor(node.id).elements());

  bool op_rows = false;
  const OpCapability* first_dtype_row = nullptr;
  for (const OpCapability& row : backend.capabilities()) {
    if (row.op != node.op) continue;
    op_rows = true;
    bool all_in = std::all_of(used.begin(), used.end(), [&](DType d) {
      return std::find(row.dtypes.begin(), row.dtypes.end(), d) != row.dtypes.end();
    });
    if (!all_in) continue;
    const bool feature_ok =
        row.required_feature.empty() || backend.has_feature(row.required_feature);
    const bool size_ok = row.max_elements == 0 || largest <= row.max_elements;
    if (feature_ok && size_ok) return RejectReason::None;
    if (!first_dtype_row) first_dtype_row = &row;
  }
  if (!op_rows) return RejectReason::UnsupportedOp;
  if (!first_dtype_row) return RejectReason::UnsupportedDType;
  const bool feature_ok = first_dtype_row->required_feature.empty() ||
                          backend.has_feature(first_dtype_row->required_feature);
  return feature_ok ? RejectReason::TooLarge : RejectReason::MissingFeature;
}

uint64_t fresh_seed() {
  if (const char* s = std::getenv("TANDEM_TEST_SEED"); s && *s) {
    return std::strtoull(s, nullptr, 10);
  }
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

}  // namespace tandem::conformance
