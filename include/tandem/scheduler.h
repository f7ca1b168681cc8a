// The hybrid scheduler: places every op of a graph on one of N backends by strategy, pins,
// capability, cost and memory, and says why (SelectionReason) and what it rejected.
//
//   auto sched = HybridScheduler::builder()
//                    .with_backend(create_backend("cpu"))
//                    .with_backend(create_backend("cuda:0"))
//                    .strategy(Strategy::gpu_preferred())
//                    .memory_budget("cuda:0", 6ull << 30)  // -ngl-like: early layers on the GPU
//                    .pin_tensor("output\\.weight", "cpu")
//                    .build();
//   std::shared_ptr<const Placement> p = sched.plan(graph, executor.residency());
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tandem/backend.h"
#include "tandem/capability.h"
#include "tandem/cost_model.h"
#include "tandem/graph.h"

namespace tandem {

inline constexpr double kDefaultSwitchThreshold = 2.0;
inline constexpr int kNoBackend = -1;
// Streamed weights are copied ahead of the op that reads them, as far ahead as the device's
// staging memory allows: at least this many weights (a device reserves staging memory for one
// more), at most kMaxStreamStagingBytes, and no more than its budget leaves free.
inline constexpr int kStreamAheadWeights = 2;
inline constexpr size_t kMaxStreamStagingBytes = size_t(2) << 30;

struct Strategy {
  enum class Kind : uint8_t { GpuPreferred, CpuPreferred, Automatic, BackendOnly };
  Kind kind = Kind::GpuPreferred;
  std::string backend_id;  // BackendOnly only

  static Strategy gpu_preferred() { return {Kind::GpuPreferred, {}}; }
  static Strategy cpu_preferred() { return {Kind::CpuPreferred, {}}; }
  static Strategy automatic() { return {Kind::Automatic, {}}; }
  static Strategy backend_only(std::string id) { return {Kind::BackendOnly, std::move(id)}; }
  // "gpu" | "gpu_preferred", "cpu" | "cpu_preferred", "auto" | "automatic", "only:<id>"
  // (for command lines); throws InvalidArgument listing the accepted forms.
  static Strategy parse(std::string_view text);
  std::string to_string() const;  // "gpu_preferred", ..., "backend_only(cuda:0)"
};
using ExecutionStrategy = Strategy;  // the seed's name

// One candidate's estimated cost, as listed by SelectionReason::CostModel.
struct CandidateCost {
  int backend = kNoBackend;
  std::string backend_id;
  OpCost cost;
};

// Why a node went where it did. The first six kinds are the design's; CpuAvailable and
// GpuFallback mirror them for CpuPreferred; Colocated places Attention/KvWrite where their KV
// cache lives; FollowsSource marks metadata ops (they alias their source); None marks leaves.
struct SelectionReason {
  enum class Kind : uint8_t {
    None,
    FollowsSource,
    GpuAvailable,      // GpuPreferred: a GPU runs it
    GpuUnavailable,    // GpuPreferred: there is no GPU backend (or none usable at all)
    CpuFallback,       // GpuPreferred: every GPU refused it; `why` says why the first did
    CostModel,         // Automatic: `costs` lists every candidate; `why` explains the pick
    MemoryConstraint,  // the preferred/cheapest backend had no room: needed_bytes > free_bytes
    UserPreference,    // a pin or BackendOnly; `why` names it
    CpuAvailable,      // CpuPreferred: a CPU runs it
    GpuFallback,       // CpuPreferred: no CPU could; `why` says why
    Colocated,         // runs where its KV cache lives (`why` names the cache)
    Streamed,          // a GPU runs it with its host-resident weight streamed in; `costs` lists
                       // the host candidate and the streamed one
  };
  Kind kind = Kind::None;
  std::string why;
  std::vector<CandidateCost> costs;  // CostModel (and MemoryConstraint under Automatic)
  size_t needed_bytes = 0;           // MemoryConstraint
  size_t free_bytes = 0;             // MemoryConstraint

  std::string to_string() const;  // "cpu_fallback: cuda:0 does not run rope for dtypes ..."
};
std::string_view reason_kind_name(SelectionReason::Kind kind);

struct RejectedCandidate {
  int backend = kNoBackend;
  std::string backend_id;
  RejectReason reason = RejectReason::None;
  std::string detail;
};

// The decision for one node.
struct BackendSelection {
  Backend* backend = nullptr;  // nullptr for leaves (and metadata ops of leaves)
  int backend_index = kNoBackend;
  SelectionReason reason;
  OpCost estimated_cost;
  std::vector<RejectedCandidate> rejected;
  // Weights this op reads from host memory through its device's staging memory, copied ahead
  // of use on the device's copy queue (SelectionReason::Streamed). Empty for every other op.
  std::vector<TensorId> streamed;
};

// One copy between memories that the placement decided. The executor carries each out as
// stated: it derives no copy of its own, and refuses a placement that leaves an input where
// its reader cannot reach it.
struct PlannedCopy {
  enum class Kind : uint8_t {
    Activation,  // a computed tensor (or a KV cache read away from its home), every run
    Input,       // a bound input into a device's memory, every run
    Upload,      // a weight made resident on a device, once (before the first run: preload)
    CacheMove,   // a KV cache moving to the device that writes it, once
    Streamed,    // a host weight into the device's staging memory, every run (copy queue)
  };
  // Where the executor issues it: in order with execution, on the device's queue for
  // activation copies (overlapping execution where the host side is page-locked), or on its
  // copy queue ahead of use (streamed weights).
  enum class Queue : uint8_t { Execution, Transfer, CopyQueue };
  Kind kind = Kind::Activation;
  TensorId storage = kNoTensor;  // the tensor copied (its storage)
  TensorId before = kNoTensor;   // the op that reads it: the copy lands before it runs
  int from = -1;                 // backend index holding the copy read; -1: host memory
  int to = -1;                   // backend index receiving it
  size_t bytes = 0;
  Queue queue() const;
};
std::string_view copy_kind_name(PlannedCopy::Kind kind);

// Decisions for a whole graph, one per node (indexed by TensorId).
struct Placement {
  uint64_t signature = 0;  // Graph::signature()
  uint64_t key = 0;        // signature + leaf names + residency: what executors cache by
  std::vector<std::shared_ptr<Backend>> backends;  // BackendSelection::backend_index indexes it
  std::vector<BackendSelection> nodes;
  // Every copy a run makes, in graph order (see PlannedCopy).
  std::vector<PlannedCopy> copies;
  // Per KV cache read or written (by its node id): the backend index holding it in the run.
  std::vector<std::pair<TensorId, int>> kv_homes;
  size_t planned_transfers = 0;  // copies between memories each run (inputs, activations)
  size_t planned_uploads = 0;    // persistent copies made once (weights, KV cache moves)
  size_t streamed_bytes = 0;     // weight bytes streamed from host memory each run
  // Per backend (by index): device memory its streamed weights may occupy at once (0: none).
  std::vector<size_t> stream_staging_bytes;
  double estimated_us = 0.0;  // sum of chosen compute and transfer estimates

  const BackendSelection& at(TensorId id) const { return nodes.at(size_t(id)); }
  int backend_index(TensorId id) const { return nodes.at(size_t(id)).backend_index; }
  // Compute ops per backend (by index).
  std::vector<size_t> ops_per_backend() const;
  // A readable table: node, op, shape, backend, reason, estimate.
  void print(std::ostream& os, const Graph& graph) const;
};

// Where the Automatic strategy keeps persistent tensors: decided once, for every phase the
// model runs (HybridScheduler::plan_residency with a prefill and a decode graph), and kept by
// every later plan. Each candidate the search scored is listed with its predicted step times.
struct ResidencyPlan {
  struct Candidate {
    std::string name;                  // "layers 16-31, output, KV with layers"
    std::vector<double> phase_us;      // predicted step time per phase graph (inf: cannot run)
    std::vector<size_t> device_bytes;  // per backend index: persistent bytes placed there
    double score = 0.0;  // sum over phases of phase_us / the best candidate's (lower is better)
  };
  std::vector<Candidate> candidates;
  int chosen = -1;  // index into candidates
  // Per weight or KV cache name: the backend id holding it; absent: host memory only.
  std::map<std::string, std::string, std::less<>> home;
  // Per backend index: device memory beyond the budget for the largest op's activations and
  // the minimum staging of streamed weights (the budget bounds weights and KV caches).
  std::vector<size_t> reserve_bytes;
  std::string why;  // one line: what was chosen and by how much it won

  const Candidate* best() const { return chosen >= 0 ? &candidates[size_t(chosen)] : nullptr; }
};

// Persistent tensors (weights, KV caches) already held by a backend, by name. Executors keep
// one up to date (HybridExecutor::residency()); plan() reads it for transfer costs, memory
// budgets and KV-cache colocation. Host-accessible backends share host memory: a weight bound
// as host data is resident on all of them without being listed.
class Residency {
 public:
  void add(std::string_view backend_id, std::string_view tensor, size_t bytes);
  void remove(std::string_view backend_id, std::string_view tensor);
  bool contains(std::string_view backend_id, std::string_view tensor) const;
  // Backends holding a tensor (empty when none).
  std::vector<std::string> locations(std::string_view tensor) const;
  size_t resident_bytes(std::string_view backend_id) const;
  size_t size() const { return entries_.size(); }
  // Changes with every add/remove; part of the plan cache key.
  uint64_t hash() const { return hash_; }

 private:
  struct Entry {
    std::string backend_id;
    std::string tensor;
    size_t bytes = 0;
  };
  static std::string key(std::string_view backend_id, std::string_view tensor);
  std::vector<Entry> entries_;
  std::unordered_set<std::string> keys_;  // backend id '\0' tensor name, for contains()
  std::unordered_map<std::string, size_t> bytes_by_backend_;
  uint64_t hash_ = 0;
};

// The persistent tensors a placement leaves on its devices (the weights it uploads, the KV
// caches it creates there), added to `before`: the executor's residency after running it.
Residency residency_after(const Graph& graph, const Placement& placement, Residency before = {});

// A per-tensor pin: a regex (ECMAScript) searched in weight names, first pin that matches wins,
// as llama.cpp's --override-tensor ("exps" matches "blk.3.ffn_up_exps.weight"); an op reading a
// matching weight runs on `backend_id`.
struct TensorPin {
  std::string pattern;
  std::string backend_id;
};

class HybridScheduler {
 public:
  class Builder {
   public:
    Builder& with_backend(std::shared_ptr<Backend> backend);
    // Shorthands that also check the backend's kind.
    Builder& with_cpu_backend(std::shared_ptr<Backend> backend);
    Builder& with_gpu_backend(std::shared_ptr<Backend> backend);
    Builder& strategy(Strategy strategy);
    Builder& strict(bool on = true);
    Builder& pin_tensor(std::string pattern, std::string backend_id);
    Builder& pin_op(OpKind op, std::string backend_id);
    // Hysteresis (>= 1) of the per-op choice gpu_preferred makes for activations left in host
    // memory; auto places the whole graph and ignores it.
    Builder& switch_threshold(double ratio);
    // Bytes of persistent tensors (weights, KV caches) plan() may place on a backend, counting
    // those already resident. Default: the backend's free memory when build() runs.
    Builder& memory_budget(std::string backend_id, size_t bytes);
    Builder& cost_model(CostModel model);
    // Validates everything (at least one backend, unique ids, known pin and BackendOnly ids,
    // valid patterns) and throws InvalidArgument naming what is wrong.
    HybridScheduler build();

   private:
    friend class HybridScheduler;
    std::vector<std::shared_ptr<Backend>> backends_;
    Strategy strategy_;
    bool strict_ = false;
    std::vector<TensorPin> tensor_pins_;
    std::vector<std::pair<OpKind, std::string>> op_pins_;
    double switch_threshold_ = kDefaultSwitchThreshold;
    std::vector<std::pair<std::string, size_t>> budgets_;
    CostModel cost_model_;
  };
  static Builder builder() { return {}; }

  HybridScheduler(HybridScheduler&&) noexcept;
  HybridScheduler& operator=(HybridScheduler&&) noexcept;
  ~HybridScheduler();

  // The placement of a whole graph. Cached by (signature, leaf names, residency): a repeated
  // call is a hash and a lookup. Throws InvalidArgument/Unsupported (BackendOnly, strict, an op
  // no backend runs) with the node, the op and every backend's reason.
  std::shared_ptr<const Placement> plan(const Graph& graph, const Residency& residency = {});
  // Automatic only: decides where weights and KV caches live from the graphs of the phases to
  // be run (e.g. prefill and decode) and keeps it for every later plan(); without it the first
  // plan() decides from its own graph. Clears cached plans.
  const ResidencyPlan& plan_residency(std::span<const Graph* const> phases,
                                      const Residency& residency = {});
  const ResidencyPlan* residency_plan() const;  // nullptr before one is made
  // The cost model's step time of a placement on a timeline: every op's compute, each
  // activation copy once, streamed weights copied back to back on the copy queue from the start
  // of the step (an op waits for its own). `plan` and `tune` print it beside what they measure.
  double predict_us(const Graph& graph, const Placement& placement) const;
  // The decision plan() makes for one node (in the context of the graph before it).
  BackendSelection select_backend(const Graph& graph, const Node& node,
                                  const Residency& residency = {});
  BackendSelection select_backend(const Graph& graph, TensorId node,
                                  const Residency& residency = {}) {
    return select_backend(graph, graph.node(node), residency);
  }

  const std::vector<std::shared_ptr<Backend>>& backends() const;
  int backend_index(std::string_view backend_id) const;  // kNoBackend when unknown
  const Strategy& strategy() const;
  bool strict() const;
  double switch_threshold() const;
  size_t memory_budget(std::string_view backend_id) const;
  // Changes a backend's budget after build(), e.g. lowered to what a device really holds after
  // it ran out of memory in a step; `why` is added to the detail of every MemoryConstraint the
  // budget causes. Clears cached plans and, under Automatic, the residency plan (the next plan
  // decides again). Not while plan() runs on another thread.
  void set_memory_budget(std::string_view backend_id, size_t bytes, std::string why = {});
  const CostModel& cost_model() const;
  size_t cached_plans() const;
  void clear_cache();

 private:
  struct Impl;
  explicit HybridScheduler(std::unique_ptr<Impl> impl);
  // What plan() caches a placement by: the graph, its leaf names, the residency, the devices
  // lost and the residency plan.
  uint64_t plan_key(const Graph& graph, const Residency& residency) const;
  // Plans the graph under `residency` and caches it under `key`.
  std::shared_ptr<const Placement> make_placement(const Graph& graph, const Residency& residency,
                                                  uint64_t key);
  std::unique_ptr<Impl> impl_;
};

// A backend's capability table as text (one row per line) and as JSON
// ({"backend": id, "kind", "features", "capabilities": [{"op", "dtypes", ...}]}).
std::string describe_capabilities(const Backend& backend);
std::string describe_capabilities_json(const Backend& backend);

}  // namespace tandem
