#include "cuda_test_util.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "reference_backend.h"
#include "tandem/error.h"

namespace tandem::test {

std::shared_ptr<CudaBackend> cuda_backend_or_null() {
  static std::shared_ptr<CudaBackend> backend = [] {
    return cuda_device_count() > 0 ? std::make_shared<CudaBackend>(0) : nullptr;
  }();
  return backend;
}

// Fresh each run; TANDEM_TEST_SEED replays the seed a failure printed.
uint32_t test_seed() {
  static const uint32_t seed = [] {
    if (const char* s = std::getenv("TANDEM_TEST_SEED"); s && *s) {
      return uint32_t(std::strtoul(s, nullptr, 10));
    }
    return uint32_t(std::random_device{}());
  }();
  return seed;
}

Bytes random_leaf(const TensorDesc& desc, std::mt19937& rng, int32_t int_max) {
  const int64_t n = desc.elements();
  Bytes out(desc.bytes());
  if (desc.dtype == DType::I32) {
    std::uniform_int_distribution<int32_t> dist(0, int_max - 1);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t v = dist(rng);
      std::memcpy(out.data() + i * 4, &v, 4);
    }
    return out;
  }
  if (desc.dtype == DType::I8) {
    std::uniform_int_distribution<int> dist(-128, 127);
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = uint8_t(int8_t(dist(rng)));
    return out;
  }
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) {
    do {
      v = dist(rng);
    } while (v == 0.0f);
  }
  from_f32(desc.dtype, values.data(), out.data(), n);
  return out;
}

Bytes ints_bytes(const std::vector<int32_t>& values) {
  Bytes out(values.size() * 4);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<float> to_floats(const TensorDesc& desc, const Bytes& bytes) {
  std::vector<float> out(static_cast<size_t>(desc.elements()));
  to_f32(desc.dtype, bytes.data(), out.data(), desc.elements());
  return out;
}

GraphRunner::GraphRunner(const Graph& graph, Backend& backend) : graph_(graph), backend_(backend) {
  for (const Node& node : graph.nodes()) {
    const TensorDesc& d = graph.tensor(node.id);
    if (d.is_view()) continue;
    storage_.emplace(node.id, backend.allocate(d.bytes()));
  }
}

void* GraphRunner::pointer(TensorId id) const {
  const TensorDesc& d = graph_.tensor(id);
  const Buffer& b = storage_.at(graph_.storage_of(id));
  return static_cast<uint8_t*>(b.data()) + (d.is_view() ? d.view_offset : 0);
}

void GraphRunner::set(TensorId id, const Bytes& bytes) {
  backend_.copy_from_host(pointer(id), bytes.data(), bytes.size());
}

Bytes GraphRunner::get(TensorId id) {
  Bytes out(graph_.tensor(id).bytes());
  backend_.copy_to_host(out.data(), pointer(id), out.size());
  return out;
}

void GraphRunner::run(bool as_segment, uint64_t signature) {
  std::vector<NodeExecution> execs;
  for (const Node& node : graph_.nodes()) {
    if (!is_compute(node.op)) continue;
    execs.push_back(execution_of(graph_, node, [&](TensorId id) { return pointer(id); }));
  }
  if (as_segment) {
    backend_.execute_segment(graph_, execs, signature);
  } else {
    for (const NodeExecution& e : execs) backend_.execute(graph_, e);
  }
  backend_.synchronize();
}

double nmse(const std::vector<float>& ref, const std::vector<float>& got) {
  if (ref.size() != got.size()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i]) || std::isnan(got[i])) return INFINITY;
    const double d = double(ref[i]) - double(got[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0.0 ? num / den : (num > 0.0 ? INFINITY : 0.0);
}

Comparison compare_with_reference(const Graph& graph, Backend& cuda,
                                  const std::map<TensorId, Bytes>& fixed, bool as_segment) {
  std::mt19937 rng(test_seed());
  ReferenceBackend reference;
  GraphRunner ref_run(graph, reference), cuda_run(graph, cuda);
  for (const Node& node : graph.nodes()) {
    if (!is_leaf(node.op)) continue;
    auto it = fixed.find(node.id);
    const Bytes bytes = it != fixed.end() ? it->second : random_leaf(graph.tensor(node.id), rng);
    ref_run.set(node.id, bytes);
    cuda_run.set(node.id, bytes);
  }
  ref_run.run();
  cuda_run.run(as_segment, graph.signature());
  Comparison c;
  for (TensorId out : graph.outputs()) {
    const TensorDesc& d = graph.tensor(out);
    c.nmse.push_back(nmse(to_floats(d, ref_run.get(out)), to_floats(d, cuda_run.get(out))));
  }
  return c;
}

PositionReplay::PositionReplay(const Graph& g, Backend& cuda, TensorId pos)
    : g_(g), pos_(pos), ref_run_(g, reference_), cuda_run_(g, cuda) {
  std::mt19937 rng(test_seed());
  for (const Node& n : g.nodes()) {
    if (!is_leaf(n.op) || n.id == pos) continue;
    const Bytes bytes = random_leaf(g.tensor(n.id), rng);
    ref_run_.set(n.id, bytes);
    cuda_run_.set(n.id, bytes);
  }
}

void PositionReplay::step(int32_t p, const std::vector<TensorId>& outs, double bound) {
  ref_run_.set(pos_, ints_bytes({p}));
  cuda_run_.set(pos_, ints_bytes({p}));
  ref_run_.run();
  cuda_run_.run(true, g_.signature());
  for (TensorId out : outs) {
    const TensorDesc& desc = g_.tensor(out);
    EXPECT_LE(nmse(to_floats(desc, ref_run_.get(out)), to_floats(desc, cuda_run_.get(out))), bound)
        << "position " << p << " seed " << test_seed();
  }
}

void PositionReplay::expect_rejected(int32_t p) {
  cuda_run_.set(pos_, ints_bytes({p}));
  try {
    cuda_run_.run(true, g_.signature());
    ADD_FAILURE() << "position " << p << " past the cache was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
  }
}

}  // namespace tandem::test
