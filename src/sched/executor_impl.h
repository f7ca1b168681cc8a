// Internals of HybridExecutor: the persistent store (weights, KV caches) and the per-placement
// execution plan (segments, transfers, arena offsets), compiled once and replayed every run.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "arena.h"
#include "tandem/cost_model.h"
#include "tandem/error.h"
#include "tandem/executor.h"

namespace tandem {

inline constexpr int kUserInput = -1;  // a transfer's source group: the run's input binding

struct WeightEntry {
  std::string name;
  const void* host = nullptr;
  size_t bytes = 0;
  std::vector<Buffer> device;  // per backend index (device backends only)
  std::vector<bool> streamed;  // per backend: prepared as a stream source
};

struct CacheEntry {
  std::string name;
  size_t bytes = 0;
  int home = -1;  // backend index
  Buffer buffer;
};

// A pointer resolved once the arenas exist: an arena slot or a fixed (persistent) address.
struct PtrRef {
  int slot = -1;
  void* fixed = nullptr;
  size_t offset = 0;
};

struct PlannedTransfer {
  TensorId storage = kNoTensor;
  int src_group = kUserInput;
  int src_backend = -1;  // -1 for host memory
  int dst_group = 0;
  int dst_backend = -1;
  PtrRef src, dst;
  size_t bytes = 0;
  size_t input_index = 0;  // kUserInput: index in ExecPlan::inputs
  double estimated_us = 0.0;
  void* src_ptr = nullptr;
  void* dst_ptr = nullptr;
};

// A weight copied from host memory into device staging memory every run (a streamed weight),
// on the device's copy queue, ahead of the op that reads it.
struct StreamedCopy {
  TensorId storage = kNoTensor;
  const void* host = nullptr;
  size_t bytes = 0;
  int backend = -1;
  int slot = -1;  // its arena slot (live from the copy to its last reader)
  int event = 0;  // the copy queue's signal that the op waits for
  void* dst_ptr = nullptr;
  // A stacked expert tensor copied by expert (ExecutorOptions::routed_expert_copies): the Stream
  // step copies the experts used[e] marks (the previous run's; all before the first), the Route
  // step those its reader's ids name that the Stream step did not. 0: copied whole.
  int n_expert = 0;
  size_t expert_bytes = 0;
  PtrRef ids;
  const int32_t* ids_ptr = nullptr;
  size_t n_ids = 0;
  uint8_t* used = nullptr;  // its n_expert flags in ExecPlan::expert_flags, written by the device
};

enum class StepKind : uint8_t {
  Transfer,  // index: a PlannedTransfer
  Segment,   // index: first exec, count: execs, on one backend
  Stream,    // index: a StreamedCopy, issued on its backend's copy queue
  Wait,      // index: a StreamedCopy the next segment reads: execution waits for its copy
  Route,     // index: a StreamedCopy by expert: its routed experts, once its ids are written
};

struct Step {
  StepKind kind = StepKind::Segment;
  size_t index = 0;
  size_t count = 0;
  int backend = -1;
  uint64_t signature = 0;
};

struct ExecPlan {
  uint64_t key = 0;
  uint64_t generation = 0;
  uint64_t last_used = 0;
  std::vector<Buffer> arenas;  // per group
  // Where device outputs land before they are copied to the caller: page-locked memory from a
  // device that offers it (host_staging), else `staging`.
  std::vector<uint8_t> staging;
  Buffer host_staging;
  uint8_t* staging_data() {
    return host_staging.data() ? static_cast<uint8_t*>(host_staging.data()) : staging.data();
  }
  std::vector<NodeExecution> execs;  // compute nodes in order
  std::vector<TensorId> exec_id;
  std::vector<OpKind> exec_op;
  std::vector<int> exec_backend;
  std::vector<PtrRef> exec_out;
  std::vector<std::vector<PtrRef>> exec_in;
  std::vector<PlannedTransfer> transfers;
  std::vector<StreamedCopy> streamed;
  // The experts each copy by expert used (StreamedCopy::used): page-locked memory from the
  // copying device where it gives any (expert_flags), else expert_flags_plain.
  Buffer expert_flags;
  std::vector<uint8_t> expert_flags_plain;
  std::vector<Step> steps;
  std::vector<Slot> slots;
  struct Input {
    TensorId id = kNoTensor;
    std::string name;
    size_t bytes = 0;
    bool used = false;  // read by some op (an unused input may stay unbound)
  };
  std::vector<Input> inputs;
  struct Output {
    TensorId id = kNoTensor;
    std::string name;
    int backend = -1;  // -1: host memory
    PtrRef src;
    void* src_ptr = nullptr;
    size_t bytes = 0;
    size_t staging_offset = 0;
  };
  std::vector<Output> outputs;
  std::vector<bool> backend_used;
  // Per-run scratch, sized once.
  std::vector<const void*> input_data;
  std::vector<void*> output_dest;
  std::vector<uint8_t> output_direct;  // 1: downloaded into output_dest itself (page-locked)
  // What an untimed run of this plan adds to the telemetry, from its first untimed run.
  std::unique_ptr<RunTally> untimed;
};

struct HybridExecutor::Impl {
  std::vector<std::shared_ptr<Backend>> backends;
  std::vector<ExecutionEvent> run_events;  // a run's events before the telemetry takes them
  std::vector<int> group;                  // per backend: 0 host memory, 1.. devices
  int n_groups = 1;
  std::vector<int> group_backend;  // the backend that allocates a group's arena (-1: none)
  std::vector<BackendProfile> profiles;
  ExecutorOptions options;
  Telemetry telemetry;
  ExecutorStats stats;

  std::unordered_map<std::string, WeightEntry> weights;
  std::unordered_map<std::string, CacheEntry> caches;
  Residency residency;
  uint64_t generation = 1;  // bumped when a persistent pointer changes (migration, eviction)
  uint64_t use_counter = 0;
  std::unordered_map<uint64_t, std::unique_ptr<ExecPlan>> plans;
  std::mutex run_mutex;

  Impl(std::vector<std::shared_ptr<Backend>> b, const CostModel& model, ExecutorOptions o);

  // exec_plan.cpp
  ExecPlan& plan_for(const Graph& graph, const Placement& placement);
  std::unique_ptr<ExecPlan> build_plan(const Graph& graph, const Placement& placement);
  void* weight_on(const std::string& name, const TensorDesc& desc, int backend);
  WeightEntry& bound_weight(const std::string& name, const TensorDesc& desc);
  void* upload(WeightEntry& w, int backend);
  CacheEntry& cache_at(const std::string& name, const TensorDesc& desc, int backend);

  // Runs f, a call into backend b: an Error escaping it names b (Error::backend) unless it
  // already names a backend, so a caller can tell which device ran out of memory or was lost.
  template <typename F>
  auto on_backend(int b, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (Error& e) {
      if (e.backend().empty() && b >= 0) e.set_backend(backends[size_t(b)]->backend_id());
      throw;
    }
  }

  // executor.cpp
  void bind(const std::string& name, const void* data, size_t bytes);
  void zero_fill(Backend& b, void* ptr, size_t bytes);
  void release_stream_sources(WeightEntry& w);
};

}  // namespace tandem
