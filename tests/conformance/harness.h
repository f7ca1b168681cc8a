// Conformance harness: runs one-op graphs on any Backend and on the reference, and compares
// them by NMSE with per-op thresholds. It guards every buffer, fills outputs with NaN first
// and checks that inputs come back unchanged, so wrong values, unwritten elements and
// out-of-bounds writes are all reported. Used by conformance_test and its self-test.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "tandem/backend.h"
#include "tandem/graph.h"

namespace tandem::conformance {

// NMSE thresholds (DESIGN section 10).
inline constexpr double kExactThreshold = 1e-7;
inline constexpr double kSoftmaxThreshold = 1e-6;
inline constexpr double kMatMulThreshold = 5e-4;
inline constexpr double kAttentionThreshold = 5e-4;
inline constexpr double kRopeThreshold = 1e-3;
// A quantizing copy may flip an element by one quantization step on a rounding tie; a layout
// bug (wrong nibble order, wrong scale) gives NMSE near 1.
inline constexpr double kQuantizeThreshold = 1e-3;

// Bytes after every buffer, filled with kGuardPattern and checked after the op ran.
inline constexpr size_t kGuardBytes = 4096;
inline constexpr uint8_t kGuardPattern = 0xA5;

// How a leaf is filled. Floats are uniform in [-1, 1] without zeros; integer leaves must be
// valid for the op that reads them.
enum class Fill : uint8_t {
  Random,               // floats in [-1, 1] (quantized leaves: quantized from such floats)
  RowIds,               // i32 in [0, limit)
  RandomPositions,      // i32 in [0, limit)
  SequentialPositions,  // start + t with start random and start + count <= limit
  CausalMask,           // f32 [n_kv, n_q]: random where kv <= q + (n_kv - n_q), else -inf
  ExpertMap,            // i32 in [-1, limit): an expert's slot, or -1 (skipped)
};

struct LeafFill {
  TensorId tensor = kNoTensor;
  Fill fill = Fill::Random;
  int64_t limit = 0;
};

// One (op, dtypes, shape) case: a graph of leaves, optional metadata nodes and one compute
// node (the last node), with fills for leaves that need more than Random.
struct Case {
  std::string name;  // "matmul/f16.f32/k37_m17_n5"
  Graph graph;
  std::vector<LeafFill> fills;
  double threshold = kExactThreshold;

  const Node& node() const { return graph.nodes().back(); }
};

// The full catalog: every dtype combination the Graph accepts for every compute op, at
// shapes of 1, odd sizes, sizes that are not multiples of 32 (where the dtype allows), shapes
// drawn around the kernels' block and tile edges (views among the inputs) and large sizes
// (large = false leaves the large ones out).
std::vector<Case> all_cases(bool large = true);
// A case generator adds every case of one op (large = false leaves the large ones out). The
// built-in ops' generators are in cases.cpp; an op registered outside the library adds its own.
using CaseGenerator = void (*)(std::vector<Case>& out, bool large);
void register_case_generator(OpKind op, CaseGenerator generator);
// The cases of one op: its catalog entry (empty when it has none).
std::vector<Case> cases_for(OpKind op, bool large = true);

// The row of `backend`'s capability table that runs a case's node: the first row covering it,
// as dispatch picks it (-1: no row does). Cases are enumerated per row from this, so a row
// whose kernel is wrong fails its cases and a row that no case reaches is reported.
int dispatch_row(const Backend& backend, const Case& c);

// Every backend runs at least this many catalog cases (a test fails below it).
inline constexpr size_t kMinCasesPerBackend = 1000;

// Catalog cases a capability table covers on a device with `features` (run), and the rest
// (refused).
struct CaseCount {
  size_t run = 0;
  size_t refused = 0;
};
CaseCount count_cases(const std::vector<OpCapability>& rows,
                      const std::vector<std::string>& features, const std::vector<Case>& cases);

// The threshold for a node (by op and output dtype).
double threshold_for(const Graph& graph, const Node& node);
// A name usable as a GoogleTest parameter name: "cuda:0" + "matmul/f16.f32/k37" ->
// "cuda0_matmul_f16_f32_k37".
std::string test_name(const std::string& backend_id, const std::string& case_name);

// sum((e - a)^2) / sum(e^2) in float64; 0 when both are all zeros, +inf when only e is.
double nmse(std::span<const float> expected, std::span<const float> actual);

struct CaseResult {
  std::string backend_id;
  std::string case_name;
  uint64_t seed = 0;
  bool declared = true;  // false: the backend does not declare the node; nothing ran
  double nmse = 0.0;
  double threshold = 0.0;
  int64_t non_finite = 0;                     // NaN or inf elements in the backend's output
  int64_t compared = 0;                       // elements compared
  std::vector<std::string> guard_violations;  // "output: guard byte 0 is 0x00 (expected 0xa5)"
  std::vector<std::string> modified_inputs;   // inputs the op must not have written
  std::string error;                          // what the backend threw, if anything

  bool nmse_ok() const { return non_finite == 0 && nmse <= threshold; }
  bool passed() const {
    return declared && error.empty() && nmse_ok() && guard_violations.empty() &&
           modified_inputs.empty();
  }
  // One readable paragraph: backend, case, seed, nmse vs threshold and every problem.
  std::string describe() const;
};

// The leaf data of a case for a seed: leaf id -> bytes (its storage, contiguous).
std::map<TensorId, std::vector<uint8_t>> make_inputs(const Case& c, uint64_t seed);

// Runs the case on `backend` and on the reference with inputs drawn from `seed`.
CaseResult run_case(Backend& backend, const Case& c, uint64_t seed);

// Runs every case the backend declares; cases it does not declare are returned with
// declared = false.
std::vector<CaseResult> run_cases(Backend& backend, const std::vector<Case>& cases, uint64_t seed);

// The reject reason a backend's capability table implies for a node, derived here
// independently of Backend::check.
RejectReason expected_reject_reason(const Backend& backend, const Graph& graph, const Node& node);

// A fresh seed (std::random_device) unless TANDEM_TEST_SEED is set, to replay a failure.
uint64_t fresh_seed();

}  // namespace tandem::conformance
