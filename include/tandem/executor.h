// The hybrid executor: runs a graph under a Placement across backends. It copies each tensor
// to a backend at most once per run, keeps weights (by name) and KV caches (by name) resident
// across runs and graphs, runs consecutive ops of one backend as a segment
// (Backend::execute_segment, replayable: same signature => same pointers), frees intermediates
// after their last use (a per-plan arena, allocated once), synchronizes every backend at the
// end, and writes outputs only when the whole run succeeded.
//
//   HybridExecutor exec(sched);
//   exec.bind_weight("tok_embd.weight", mmap_ptr, bytes);       // once, persistent
//   auto placement = sched.plan(graph, exec.residency());
//   exec.run(graph, *placement, Bindings().input("tokens", ids, 4 * n).output("logits", out, n));
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/backend.h"
#include "tandem/graph.h"
#include "tandem/scheduler.h"
#include "tandem/telemetry.h"

namespace tandem {

enum class TimingMode : uint8_t {
  Off,       // no timing and no synchronization beyond the final one
  PerGraph,  // one Graph event per run with its wall time
  PerOp,     // every op alone, timed with Backend::timer_start/timer_stop_us (synchronizes)
  Timeline,  // each segment and streamed copy timed on its device's queues, nothing waited
             // for: one Segment event per segment instead of per-op events (overlap visible)
};

struct ExecutorOptions {
  TimingMode timing = TimingMode::Off;
  bool record_events = true;    // one ExecutionEvent per op and transfer (untimed when Off)
  size_t max_cached_plans = 8;  // execution plans (and their arenas) kept, least recent evicted
  size_t max_events = kDefaultMaxEvents;
  // A streamed expert tensor (an ExpertMatMul's only read of it) is copied by expert: ahead of
  // its router, the experts the previous run of the plan used; after it, those its ids name and
  // the first did not copy (Backend::stream_routed_experts). False: the whole tensor, ahead.
  // The environment's TANDEM_ROUTED_EXPERTS=0 sets it false (for measuring).
  bool routed_expert_copies = true;
};

// Host memory for one run. Inputs and outputs are per run; weights given here are registered
// with the executor as persistent host data (as HybridExecutor::bind_weight). Sizes must equal
// the tensor's bytes. Pointers must stay valid until run() returns (weights: until unbound).
class Bindings {
 public:
  Bindings& input(std::string name, const void* data, size_t bytes);
  Bindings& input(TensorId id, const void* data, size_t bytes);
  Bindings& weight(std::string name, const void* data, size_t bytes);
  // Outputs must be graph outputs (Graph::mark_output); unbound outputs are not copied.
  Bindings& output(std::string name, void* data, size_t bytes);
  Bindings& output(TensorId id, void* data, size_t bytes);

  struct Entry {
    std::string name;  // empty when bound by id
    TensorId id = kNoTensor;
    const void* data = nullptr;
    void* out = nullptr;
    size_t bytes = 0;
  };
  const std::vector<Entry>& inputs() const { return inputs_; }
  const std::vector<Entry>& weights() const { return weights_; }
  const std::vector<Entry>& outputs() const { return outputs_; }

 private:
  std::vector<Entry> inputs_, weights_, outputs_;
};

struct ExecutorStats {
  size_t runs = 0;
  size_t plans_built = 0;       // execution plans compiled (cache misses)
  size_t transfers = 0;         // tensor copies between memories, all runs
  size_t transfer_bytes = 0;    // bytes of those copies
  size_t peer_transfers = 0;    // of those, copies from one device to another (copy_to_peer)
  size_t weight_uploads = 0;    // weights copied to a device (persistent)
  size_t streamed_weights = 0;  // weight copies streamed from host memory, all runs
  size_t streamed_bytes = 0;    // bytes of those copies
  size_t kv_migrations = 0;     // KV caches moved between backends
  // The last compiled plan: bytes of all its intermediates and copies, and of the arenas that
  // hold them (smaller: memory is reused after each tensor's last reader).
  size_t last_plan_tensor_bytes = 0;
  size_t last_plan_arena_bytes = 0;
};

class HybridExecutor {
 public:
  // Runs placements made by `scheduler` (its backends, in its order).
  explicit HybridExecutor(const HybridScheduler& scheduler, ExecutorOptions options = {});
  explicit HybridExecutor(std::vector<std::shared_ptr<Backend>> backends,
                          ExecutorOptions options = {});
  ~HybridExecutor();
  HybridExecutor(const HybridExecutor&) = delete;
  HybridExecutor& operator=(const HybridExecutor&) = delete;

  // Persistent host data of a weight, by name (e.g. a pointer into an mmapped GGUF). Rebinding
  // a name to a different pointer drops its device copies.
  void bind_weight(std::string name, const void* data, size_t bytes);
  // After the caller rewrote `bytes` of a bound weight's host data from `offset` (between runs):
  // its device copies get the same bytes; its plans and their pointers stay.
  void refresh_weight(std::string_view name, size_t offset, size_t bytes);
  // Uploads a bound weight to a backend now (no-op where resident or host memory).
  void preload_weight(std::string_view name, std::string_view backend_id);
  // Uploads every weight the placement keeps on a device and allocates every KV cache it needs
  // (the first run's work), reporting uploaded bytes as it goes. Streamed weights stay in host
  // memory.
  using Progress = std::function<void(size_t done_bytes, size_t total_bytes)>;
  void preload(const Graph& graph, const Placement& placement, const Progress& progress = {});
  // Frees a weight's device copies (it stays bound).
  void evict_weight(std::string_view name);
  // Forgets a weight: its device copies freed, its host data no longer used (the caller may
  // free it). No-op for a name not bound.
  void unbind_weight(std::string_view name);
  // Frees what is held on a backend beyond `keep`: its weight copies and KV caches that `keep`
  // does not list (they leave residency()), and every compiled plan (their arenas). After a
  // failed step, `keep` = the residency before it frees what the step allocated; an empty
  // `keep` frees everything there (a lost device). Returns the names of the KV caches freed:
  // their contents are gone, and the next run that needs one creates it zero-filled.
  std::vector<std::string> release(std::string_view backend_id, const Residency& keep = {});

  // Persistent tensors on each backend: pass to HybridScheduler::plan.
  const Residency& residency() const;
  size_t resident_bytes(std::string_view backend_id) const;
  // Device memory held on a backend: its resident weights and KV caches and the arenas of the
  // cached plans there (host-accessible backends: their resident bytes only).
  size_t device_bytes(std::string_view backend_id) const;

  // Runs the graph. Throws on bad bindings (before anything runs) and on backend errors (after
  // synchronizing every backend); outputs are written only when everything succeeded.
  void run(const Graph& graph, const Placement& placement, const Bindings& bindings);

  // KV caches (zero-filled when first used, kept across runs). Reading copies to the host.
  bool has_kv_cache(std::string_view name) const;
  std::string kv_cache_backend(std::string_view name) const;  // "" when absent
  void read_kv_cache(std::string_view name, void* host, size_t bytes) const;
  void clear_kv_caches();  // zero-fills every cache in place

  Telemetry& telemetry();
  const Telemetry& telemetry() const;
  const ExecutorStats& stats() const;
  const ExecutorOptions& options() const;
  void set_timing(TimingMode timing);
  const std::vector<std::shared_ptr<Backend>>& backends() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
