// The backend contract: one device that answers questions before it runs anything
// (capabilities, memory, features), owns buffers, copies to and from the host, and executes
// one node at a time (or a segment of nodes, which a backend may capture and replay).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/capability.h"
#include "tandem/graph.h"

namespace tandem {

enum class BackendKind : uint8_t { Cpu, Gpu };
std::string_view backend_kind_name(BackendKind kind);

struct MemoryInfo {
  size_t total_bytes = 0;
  size_t free_bytes = 0;
};

class Backend;

// Device memory owned by one backend; freed through it when the Buffer dies.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, void* data, size_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset();
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Backend* owner() const { return owner_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// One node ready to run: its inputs and output as that backend's pointers.
struct NodeExecution {
  const Node* node = nullptr;
  std::vector<TensorRef> inputs;
  TensorRef output;
};

// The execution of `node` with every tensor at data_of(id) (a view at its own address).
template <typename DataOf>
NodeExecution execution_of(const Graph& graph, const Node& node, DataOf&& data_of) {
  NodeExecution e;
  e.node = &node;
  for (TensorId in : node.inputs) e.inputs.push_back({&graph.tensor(in), data_of(in)});
  e.output = {&graph.tensor(node.id), data_of(node.id)};
  return e;
}

class Backend {
 public:
  virtual ~Backend() = default;

  // Identity: "reference", "cpu", "cuda:0", ...
  virtual const std::string& backend_id() const = 0;
  virtual BackendKind kind() const = 0;
  virtual MemoryInfo memory() const = 0;
  // Features such as "avx2", "avx512", "amx", "sm_90", "bf16", "tensor_cores".
  virtual const std::vector<std::string>& features() const = 0;
  bool has_feature(std::string_view feature) const;
  // True when buffer pointers are ordinary host memory (the executor may read them directly).
  virtual bool host_accessible() const = 0;
  // A device whose context is poisoned reports itself lost; the scheduler stops choosing it.
  virtual bool lost() const { return false; }

  // Capabilities: the table, the row that covers a node, and the full check of a node.
  virtual const std::vector<OpCapability>& capabilities() const = 0;
  const OpCapability* op_capability(const Graph& graph, const Node& node) const;
  CapabilityCheck check(const Graph& graph, const Node& node) const;
  bool can_execute(const Graph& graph, const Node& node) const { return check(graph, node).ok(); }

  // Memory. allocate throws Error{OutOfMemory} when the device cannot satisfy it.
  virtual Buffer allocate(size_t bytes) = 0;
  virtual void copy_from_host(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual void copy_within(void* device_dst, const void* device_src, size_t bytes) = 0;
  // Copies this backend's memory into `peer`'s: after the work submitted to either so far, and
  // before the work submitted to `peer` afterwards. The default goes through host memory.
  virtual void copy_to_peer(Backend& peer, void* peer_dst, const void* src, size_t bytes);
  // True where copy_to_peer reaches `peer` directly, without passing through host memory.
  virtual bool peer_copy_direct(const Backend& /*peer*/) const { return false; }

  // Activation copies between host memory and this device that overlap other work.
  // allocate_host gives page-locked host memory the device copies to and from directly (an
  // empty Buffer where it has none; OutOfMemory as allocate): the executor's host arena comes
  // from there when a device exchanges activations with the host. upload_async and
  // download_async are ordered after the work submitted to this device before them, and the
  // work submitted after them after an upload; they return without waiting for the copy where
  // the host memory came from allocate_host (true), and copy synchronously otherwise (false).
  // Before the host reads a download's destination or overwrites an upload's source it calls
  // wait_host_copies(). The defaults copy synchronously.
  virtual Buffer allocate_host(size_t bytes);
  // True where [p, p + bytes) lies in host memory this device's allocate_host gave: a download
  // there needs no staging (the default: false).
  virtual bool host_is_page_locked(const void* p, size_t bytes) const;
  virtual bool upload_async(void* device_dst, const void* host_src, size_t bytes);
  virtual bool download_async(void* host_dst, const void* device_src, size_t bytes);
  virtual void wait_host_copies();

  // Runs one node. Inputs and output are in this backend's memory. May be asynchronous:
  // results are visible after synchronize() (or a copy_to_host, which synchronizes).
  virtual void execute(const Graph& graph, const NodeExecution& exec) = 0;
  // Runs consecutive nodes with no transfer between them. `signature` identifies the graph
  // and segment, so a backend may capture the segment once and replay it.
  virtual void execute_segment(const Graph& graph, std::span<const NodeExecution> segment,
                               uint64_t signature);
  // The most consecutive nodes of a segment this backend may run as one launch, whose reads and
  // writes are then unordered: the executor's memory plan gives no node's output memory that
  // the node up to fused_nodes() - 1 places before it reads (default 1: one node at a time).
  virtual int fused_nodes() const { return 1; }
  virtual void synchronize() = 0;

  // Streamed weights: a copy into device memory on the device's copy queue, which first waits
  // for the execution work submitted so far (the destination's previous readers) and then
  // signals `event` (0 <= event < kStreamEvents). wait_stream_event makes later execution wait
  // for that signal. The defaults copy in order with execution (copy_from_host; no wait needed).
  static constexpr int kStreamEvents = 256;
  virtual void stream_from_host(void* device_dst, const void* host_src, size_t bytes, int event);
  virtual void wait_stream_event(int event);
  // A streamed expert tensor (n_expert experts of expert_bytes each, expert e at e *
  // expert_bytes) whose reader uses only the experts named in `ids` (n_ids int32 values in this
  // device's memory, written by execution work submitted before): copies, on the copy queue
  // after that work, each named expert whose used[e] is 0 (the executor streamed those with a
  // nonzero entry ahead of the router, as stream_from_host), then sets used[e] to 0 for an expert
  // not named, 1 for one named and copied ahead, 2 for one named and copied here; signals
  // `event`. `used` (n_expert bytes) is page-locked host memory from allocate_host where this
  // device gave any: the device writes it; the host reads it once the device has synchronized.
  // The default waits for the device, reads the ids and copies with copy_from_host.
  virtual void stream_routed_experts(void* device_dst, const void* host_src, size_t expert_bytes,
                                     int n_expert, const int32_t* ids, size_t n_ids, uint8_t* used,
                                     int event);
  // Host memory this device will stream from every run (a weight in a mapped model file): the
  // device may keep it page-locked so copies run at full link speed. False where it does not;
  // streaming then still works, slower.
  virtual bool prepare_stream_source(const void* data, size_t bytes);
  // Forgets what prepare_stream_source kept for `data` (its owner rebinds or drops it).
  virtual void release_stream_source(const void* data);

  // A device timeline (TimingMode::Timeline): timeline_mark records a point on the execution
  // queue, or the copy queue, without waiting, and returns its index; after synchronize(),
  // timeline_us(i) is its time in microseconds after the first mark since timeline_reset().
  // The defaults read the host clock at the call (for backends that run synchronously).
  virtual void timeline_reset();
  virtual int timeline_mark(bool copy_queue);
  virtual double timeline_us(int mark);

  // Timing around work submitted to this backend: steady clock on CPUs, events on GPUs.
  virtual void timer_start();
  virtual double timer_stop_us();  // synchronizes

 protected:
  friend class Buffer;
  virtual void free_buffer(void* data, size_t bytes) = 0;

 private:
  int64_t timer_start_ns_ = 0;
  std::vector<int64_t> timeline_ns_;
};

// The largest tensor (in elements) among a node's inputs and output.
int64_t node_max_elements(const Graph& graph, const Node& node);

}  // namespace tandem
