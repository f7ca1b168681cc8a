// CudaBackend: one NVIDIA GPU ("cuda:N"). Owns a stream, a cuBLAS handle, a caching allocator,
// pinned staging buffers and a cache of captured CUDA graphs keyed by segment signature.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "allocator.h"
#include "cuda_check.h"
#include "ops/ops.h"
#include "tandem/backend.h"

namespace tandem {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const std::string& backend_id() const override { return state_.id; }
  BackendKind kind() const override { return BackendKind::Gpu; }
  MemoryInfo memory() const override;
  const std::vector<std::string>& features() const override { return features_; }
  bool host_accessible() const override { return false; }
  bool lost() const override { return state_.lost.load(); }
  const std::vector<OpCapability>& capabilities() const override { return capabilities_; }
  // The same table without a device (the conformance catalog counts what a GPU would run).
  static std::vector<OpCapability> cuda_capabilities();

  Buffer allocate(size_t bytes) override;
  void copy_from_host(void* device_dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  void copy_within(void* device_dst, const void* device_src, size_t bytes) override;
  // To another CudaBackend: cudaMemcpyPeerAsync on peer_stream_, ordered by events with both
  // devices' execution streams (peer access enabled where the topology allows it; elsewhere
  // the driver stages the copy through host memory). Other backends: through host memory.
  void copy_to_peer(Backend& peer, void* peer_dst, const void* src, size_t bytes) override;
  bool peer_copy_direct(const Backend& peer) const override;
  // Page-locked host memory (cudaHostAlloc, mapped and portable to every device). An upload is
  // a kernel on stream_ reading it (not queued behind streamed weights on the copy engine); a
  // download goes on peer_stream_ ordered by events, so the host waits for it alone.
  Buffer allocate_host(size_t bytes) override;
  bool upload_async(void* device_dst, const void* host_src, size_t bytes) override;
  bool download_async(void* host_dst, const void* device_src, size_t bytes) override;
  bool host_is_page_locked(const void* p, size_t bytes) const override;
  void wait_host_copies() override;

  void execute(const Graph& graph, const NodeExecution& exec) override;
  int fused_nodes() const override;
  // Captures the segment into a CUDA graph on first sight of (signature, pointers) and replays
  // it afterwards; changed pointers update the instantiated graph in place when possible.
  void execute_segment(const Graph& graph, std::span<const NodeExecution> segment,
                       uint64_t signature) override;
  void synchronize() override;
  // Streamed weights go on a second stream (copy_stream_), ordered with stream_ by events.
  void stream_from_host(void* device_dst, const void* host_src, size_t bytes, int event) override;
  void wait_stream_event(int event) override;
  void stream_routed_experts(void* device_dst, const void* host_src, size_t expert_bytes,
                             int n_expert, const int32_t* ids, size_t n_ids, uint8_t* used,
                             int event) override;
  bool prepare_stream_source(const void* data, size_t bytes) override;
  void release_stream_source(const void* data) override;
  void timeline_reset() override;
  int timeline_mark(bool copy_queue) override;
  double timeline_us(int mark) override;
  void timer_start() override;
  double timer_stop_us() override;

  // For tests and benchmarks.
  int device() const { return state_.device; }
  cudaStream_t stream() const { return stream_; }
  int sm_count() const { return sm_count_; }
  struct GraphStats {
    int64_t captures = 0;
    int64_t updates = 0;
    int64_t replays = 0;
    int64_t fused_nodes = 0;     // nodes captured inside a fused launch (cuda::run_fused)
    int64_t fused_launches = 0;  // ... and those launches
  };
  GraphStats graph_stats() const { return graph_stats_; }
  size_t cached_bytes() const { return allocator_.cached_bytes(); }
  void release_cached_memory() { allocator_.release_cached(); }
  // Launches a trapping kernel and synchronizes: poisons this process's context.
  void inject_fault_for_testing();

 protected:
  void free_buffer(void* data, size_t bytes) override;

 private:
  struct CachedGraph {
    uint64_t pointer_hash = 0;
    cudaGraphExec_t exec = nullptr;
  };

  void release();         // frees every handle; safe on a partly built backend
  void activate() const;  // makes this device current on the calling thread
  void check_alive(const char* op) const;
  cuda::OpContext op_context() const;
  void ensure_scratch(size_t bytes);
  void validate(const Graph& graph, const NodeExecution& exec) const;
  void check_device_errors();
  void clear_graphs();
  const void* pinned_source(const void* data, size_t bytes);
  // Enables peer access both ways with `peer` once, where the devices allow it.
  void enable_peer_access(const CudaBackend& peer);

  cuda::DeviceState state_;
  int sm_count_ = 1;
  // Which fused launches captured segments use: all (default), only the matrix-vector ones
  // (TANDEM_CUDA_FUSION=matvec) or none (=0); the switch is for measuring the fusions.
  cuda::Fusion fusion_ = cuda::Fusion::All;
  size_t smem_optin_ = 0;  // shared memory a block may opt in to
  size_t smem_pair_ = 0;   // ... when two blocks share an SM
  std::vector<std::string> features_;
  std::vector<OpCapability> capabilities_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cuda::CachingAllocator allocator_;
  void* cublas_workspace_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  uint32_t* counters_ = nullptr;
  int32_t* error_flag_host_ = nullptr;    // mapped pinned word
  int32_t* error_flag_device_ = nullptr;  // its device alias
  // Pinned buffers that host copies pass through, used in turn; a buffer is reused once the copy
  // that last read it (recorded in `done`) has finished. Allocated on first use.
  static constexpr size_t kStagingBytes = size_t(8) << 20;
  struct StagingRing {
    static constexpr int kBuffers = 2;
    void* buffer[kBuffers] = {};
    void* device_view[kBuffers] = {};  // the buffer's address in device code
    cudaEvent_t done[kBuffers] = {};
    int next = 0;
  };
  // The ring's next buffer, free to overwrite.
  int take_staging(StagingRing& ring, const char* op);
  // Copies host memory to the device through the ring, on `stream`.
  void copy_through(StagingRing& ring, cudaStream_t stream, uint8_t* dst, const uint8_t* src,
                    size_t bytes, const char* op);
  static void free_ring(StagingRing& ring);
  StagingRing staging_;  // copies on stream_
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;  // recorded on stream_ before each streamed copy
  cudaEvent_t stream_events_[kStreamEvents] = {};
  // Activation copies to other GPUs and to and from page-locked host memory: their own stream,
  // so they overlap execution and streamed weights.
  cudaStream_t peer_stream_ = nullptr;
  cudaEvent_t peer_ready_ = nullptr;    // recorded on stream_: the source's producers are queued
  cudaEvent_t peer_done_ = nullptr;     // recorded on peer_stream_: the copy is queued
  cudaEvent_t uploads_read_ = nullptr;  // recorded on stream_ after the last upload_async
  std::vector<int8_t> peer_access_;     // per device: -1 not yet asked, 0 no, 1 enabled
  // Page-locked copies of host memory streamed every run, by source address (registering a
  // mapped model file in place was far slower than copying it: bench/NOTES.md).
  struct PinnedCopy {
    void* data = nullptr;
    size_t bytes = 0;
  };
  std::map<const uint8_t*, PinnedCopy> pinned_;
  std::unordered_map<void*, size_t> host_buffers_;  // allocate_host's, by address
  StagingRing bounce_;  // streamed copies on copy_stream_ that have no page-locked copy
  std::vector<cudaEvent_t> timeline_;  // timing events, reused from run to run
  size_t timeline_used_ = 0;
  cudaEvent_t timer_begin_ = nullptr;
  cudaEvent_t timer_end_ = nullptr;
  std::unordered_map<uint64_t, CachedGraph> graphs_;
  GraphStats graph_stats_;
  std::recursive_mutex mutex_;  // one submitter at a time per device
};

// The registry's entry points (src/backends/factories.h).
int cuda_device_count();
std::string cuda_absent_reason();
std::shared_ptr<Backend> make_cuda_backend(int device);

}  // namespace tandem
