// A tiny executor for CUDA tests: runs a Graph on any Backend through its public interface
// (allocate, copy, execute), so the reference and the CUDA backend share one code path.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_backend.h"
#include "reference_backend.h"
#include "tandem/backend.h"
#include "tandem/graph.h"

namespace tandem::test {

// The CUDA backend for device 0, or nullptr when there is no GPU (tests then skip).
std::shared_ptr<CudaBackend> cuda_backend_or_null();

#define TANDEM_REQUIRE_GPU(backend)                                                \
  auto backend = ::tandem::test::cuda_backend_or_null();                           \
  if (!backend) GTEST_SKIP() << "no CUDA GPU on this machine: CUDA tests skipped"; \
  static_assert(true)

// Seed printed on failure; fresh per process.
uint32_t test_seed();

using Bytes = std::vector<uint8_t>;

// Random contents for a leaf: floats in [-1, 1] in the leaf's dtype; ints in [0, int_max).
Bytes random_leaf(const TensorDesc& desc, std::mt19937& rng, int32_t int_max = 4);
Bytes ints_bytes(const std::vector<int32_t>& values);
std::vector<float> to_floats(const TensorDesc& desc, const Bytes& bytes);

class GraphRunner {
 public:
  GraphRunner(const Graph& graph, Backend& backend);
  void set(TensorId id, const Bytes& bytes);
  // Runs every compute node, node by node or as one segment (CUDA graph capture).
  void run(bool as_segment = false, uint64_t signature = 0);
  Bytes get(TensorId id);
  void* pointer(TensorId id) const;

 private:
  const Graph& graph_;
  Backend& backend_;
  std::map<TensorId, Buffer> storage_;
};

// One token's graph run on the reference and as a captured CUDA segment from the same random
// leaves, the position aside: step(p, outs, bound) replays it at position p and checks `outs`
// by NMSE.
class PositionReplay {
 public:
  PositionReplay(const Graph& g, Backend& cuda, TensorId pos);
  void step(int32_t p, const std::vector<TensorId>& outs, double bound);
  // A position past the KV caches: the step must fail with InvalidArgument (the kernels flag it;
  // the next step runs).
  void expect_rejected(int32_t p);

 private:
  const Graph& g_;
  TensorId pos_;
  ReferenceBackend reference_;
  GraphRunner ref_run_, cuda_run_;
};

// sum((a-b)^2) / sum(a^2); NaN anywhere gives +inf.
double nmse(const std::vector<float>& ref, const std::vector<float>& got);

// Runs the graph on the reference and on the CUDA backend from the same leaves and returns
// the NMSE of every marked output.
struct Comparison {
  std::vector<double> nmse;
};
Comparison compare_with_reference(const Graph& graph, Backend& cuda,
                                  const std::map<TensorId, Bytes>& fixed = {},
                                  bool as_segment = false);

}  // namespace tandem::test
