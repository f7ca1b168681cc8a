#include "cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "mapped_copy.h"
#include "tandem/bytes.h"
#include "tandem/error.h"
#include "tandem/hash.h"

namespace tandem {

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
constexpr size_t kCounterCount = size_t(1) << 16;
constexpr size_t kMaxCachedGraphs = 256;

// Page-locked host ranges from any CudaBackend's allocate_host, by start address: a host arena
// allocated through one GPU is copied to and from by every GPU (the memory is portable).
struct HostRanges {
  struct Range {
    size_t bytes = 0;
    uintptr_t device = 0;  // the range's address in device code (cudaHostGetDevicePointer)
  };
  std::mutex mutex;
  std::map<uintptr_t, Range> ranges;

  // The device address of [data, data + bytes), or 0 where it is not in one range.
  uintptr_t device_view(const void* data, size_t bytes) {
    const auto p = reinterpret_cast<uintptr_t>(data);
    std::lock_guard lock(mutex);
    auto it = ranges.upper_bound(p);
    if (it == ranges.begin()) return 0;
    --it;
    if (p + bytes > it->first + it->second.bytes) return 0;
    return it->second.device + (p - it->first);
  }
  bool contains(const void* data, size_t bytes) { return device_view(data, bytes) != 0; }
};

HostRanges& host_ranges() {
  static HostRanges r;
  return r;
}

}  // namespace

std::vector<OpCapability> CudaBackend::cuda_capabilities() {
  return cuda::kernel_table().capabilities();
}

CudaBackend::CudaBackend(int device) : allocator_(state_) {
  state_.id = "cuda:" + std::to_string(device);
  state_.device = device;
  auto& s = state_;
  TANDEM_CUDA_CHECK(s, "init", cudaSetDevice(device));
  cudaDeviceProp prop{};
  TANDEM_CUDA_CHECK(s, "init", cudaGetDeviceProperties(&prop, device));
  sm_count_ = prop.multiProcessorCount;
  if (const char* env = std::getenv("TANDEM_CUDA_FUSION"); env && *env) {
    const std::string_view v(env);
    fusion_ = v == "0" || v == "off" ? cuda::Fusion::None
              : v == "matvec"        ? cuda::Fusion::Matvec
                                     : cuda::Fusion::All;
  }
  smem_optin_ = prop.sharedMemPerBlockOptin;
  smem_pair_ =
      std::min(smem_optin_, prop.sharedMemPerMultiprocessor / 2 - prop.reservedSharedMemPerBlock);
  const int cc = prop.major * 10 + prop.minor;
  features_.push_back("sm_" + std::to_string(cc));
  if (cc >= 53) features_.push_back("f16");
  if (cc >= 70) features_.push_back("tensor_cores");
  if (cc >= 80) features_.push_back("bf16");
  features_.push_back("cuda_graphs");
  capabilities_ = cuda_capabilities();
  try {
    TANDEM_CUDA_CHECK(s, "init", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TANDEM_CUBLAS_CHECK(s, "init", cublasCreate(&cublas_));
    TANDEM_CUBLAS_CHECK(s, "init", cublasSetStream(cublas_, stream_));
    // A workspace of our own keeps cuBLAS from allocating inside captured graphs.
    cublas_workspace_ = allocator_.allocate(kCublasWorkspaceBytes);
    TANDEM_CUBLAS_CHECK(s, "init",
                        cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
    counters_ = static_cast<uint32_t*>(allocator_.allocate(kCounterCount * sizeof(uint32_t)));
    TANDEM_CUDA_CHECK(s, "init", cudaMemset(counters_, 0, kCounterCount * sizeof(uint32_t)));
    void* flag = nullptr;
    TANDEM_CUDA_CHECK(s, "init", cudaHostAlloc(&flag, sizeof(int32_t), cudaHostAllocMapped));
    error_flag_host_ = static_cast<int32_t*>(flag);
    *error_flag_host_ = cuda::kDeviceOk;
    void* flag_device = nullptr;
    TANDEM_CUDA_CHECK(s, "init", cudaHostGetDevicePointer(&flag_device, flag, 0));
    error_flag_device_ = static_cast<int32_t*>(flag_device);
    TANDEM_CUDA_CHECK(s, "init", cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(s, "init", cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
    for (cudaEvent_t& e : stream_events_) {
      TANDEM_CUDA_CHECK(s, "init", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    TANDEM_CUDA_CHECK(s, "init", cudaStreamCreateWithFlags(&peer_stream_, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(s, "init", cudaEventCreateWithFlags(&peer_ready_, cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(s, "init", cudaEventCreateWithFlags(&peer_done_, cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(s, "init", cudaEventCreateWithFlags(&uploads_read_, cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(s, "init", cudaEventCreate(&timer_begin_));
    TANDEM_CUDA_CHECK(s, "init", cudaEventCreate(&timer_end_));
  } catch (...) {
    release();
    throw;
  }
}

CudaBackend::~CudaBackend() {
  release();
}

void CudaBackend::release() {
  (void)cudaSetDevice(state_.device);
  if (stream_ && !state_.lost) (void)cudaStreamSynchronize(stream_);
  if (copy_stream_ && !state_.lost) (void)cudaStreamSynchronize(copy_stream_);
  if (peer_stream_ && !state_.lost) (void)cudaStreamSynchronize(peer_stream_);
  clear_graphs();
  if (peer_ready_) (void)cudaEventDestroy(std::exchange(peer_ready_, nullptr));
  if (peer_done_) (void)cudaEventDestroy(std::exchange(peer_done_, nullptr));
  if (uploads_read_) (void)cudaEventDestroy(std::exchange(uploads_read_, nullptr));
  if (peer_stream_) (void)cudaStreamDestroy(std::exchange(peer_stream_, nullptr));
  free_ring(bounce_);
  for (cudaEvent_t& e : stream_events_) {
    if (e) (void)cudaEventDestroy(std::exchange(e, nullptr));
  }
  if (compute_mark_) (void)cudaEventDestroy(std::exchange(compute_mark_, nullptr));
  for (auto& [src, copy] : pinned_) (void)cudaFreeHost(copy.data);
  pinned_.clear();
  free_ring(staging_);
  for (cudaEvent_t e : timeline_) (void)cudaEventDestroy(e);
  timeline_.clear();
  if (timer_begin_) (void)cudaEventDestroy(std::exchange(timer_begin_, nullptr));
  if (timer_end_) (void)cudaEventDestroy(std::exchange(timer_end_, nullptr));
  if (error_flag_host_) (void)cudaFreeHost(std::exchange(error_flag_host_, nullptr));
  if (cublas_) (void)cublasDestroy(std::exchange(cublas_, nullptr));
  if (scratch_) allocator_.free(std::exchange(scratch_, nullptr));
  if (counters_) allocator_.free(std::exchange(counters_, nullptr));
  if (cublas_workspace_) allocator_.free(std::exchange(cublas_workspace_, nullptr));
  if (copy_stream_) (void)cudaStreamDestroy(std::exchange(copy_stream_, nullptr));
  if (stream_) (void)cudaStreamDestroy(std::exchange(stream_, nullptr));
  (void)cudaGetLastError();
}

void CudaBackend::activate() const {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != state_.device) {
    (void)cudaSetDevice(state_.device);
  }
}

void CudaBackend::check_alive(const char* op) const {
  if (state_.lost) {
    throw_error(ErrorCode::DeviceLost, state_.id + " " + op,
                "device is lost (an earlier error poisoned its context)");
  }
  activate();
}

MemoryInfo CudaBackend::memory() const {
  if (state_.lost) return {};
  activate();
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  // Cached blocks are ours to hand out again, so they count as free.
  return {total_bytes, free_bytes + allocator_.cached_bytes()};
}

Buffer CudaBackend::allocate(size_t bytes) {
  std::lock_guard lock(mutex_);
  check_alive("allocate");
  return Buffer(this, allocator_.allocate(std::max<size_t>(bytes, 1)), bytes);
}

void CudaBackend::free_buffer(void* data, size_t /*bytes*/) {
  std::lock_guard lock(mutex_);
  if (auto it = host_buffers_.find(data); it != host_buffers_.end()) {
    {
      HostRanges& r = host_ranges();
      std::lock_guard ranges_lock(r.mutex);
      r.ranges.erase(reinterpret_cast<uintptr_t>(data));
    }
    host_buffers_.erase(it);
    // Copies still reading or writing it have been waited for by its user (wait_host_copies).
    (void)cudaFreeHost(data);
    return;
  }
  allocator_.free(data);
}

void CudaBackend::copy_from_host(void* device_dst, const void* host_src, size_t bytes) {
  std::lock_guard lock(mutex_);
  check_alive("copy_from_host");
  auto* dst = static_cast<uint8_t*>(device_dst);
  const auto* src = static_cast<const uint8_t*>(host_src);
  if (bytes > 2 * kStagingBytes) {
    // Large copies (weights): the driver stages pageable memory itself and returns once the
    // source has been read, so the caller may reuse it.
    TANDEM_CUDA_CHECK(state_, "copy_from_host",
                      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    return;
  }
  if (bytes <= cuda::kInlineBytes) {
    // A decode step's inputs: one launch, where staging took a copy, a launch and an event
    // record (12 us of host time each on the H100 host, bench/NOTES.md).
    TANDEM_CUDA_CHECK(state_, "copy_from_host", cuda::copy_inline(dst, src, bytes, stream_));
    return;
  }
  copy_through(staging_, stream_, dst, src, bytes, "copy_from_host");
}

int CudaBackend::take_staging(StagingRing& ring, const char* op) {
  const int i = ring.next;
  ring.next = (ring.next + 1) % StagingRing::kBuffers;
  if (!ring.buffer[i]) {
    // Mapped, so a kernel may read it (copy_through on the execution stream).
    TANDEM_CUDA_CHECK(
        state_, op,
        cudaHostAlloc(&ring.buffer[i], kStagingBytes, cudaHostAllocMapped | cudaHostAllocPortable));
    TANDEM_CUDA_CHECK(state_, op,
                      cudaHostGetDevicePointer(&ring.device_view[i], ring.buffer[i], 0));
    TANDEM_CUDA_CHECK(state_, op, cudaEventCreateWithFlags(&ring.done[i], cudaEventDisableTiming));
  } else {
    TANDEM_CUDA_CHECK(state_, op, cudaEventSynchronize(ring.done[i]));
  }
  return i;
}

void CudaBackend::copy_through(StagingRing& ring, cudaStream_t stream, uint8_t* dst,
                               const uint8_t* src, size_t bytes, const char* op) {
  for (size_t off = 0; off < bytes; off += kStagingBytes) {
    const size_t n = std::min(kStagingBytes, bytes - off);
    const int i = take_staging(ring, op);
    std::memcpy(ring.buffer[i], src + off, n);
    if (stream == stream_) {
      // On the execution stream a kernel reads the staging buffer: it does not queue behind
      // streamed weights on the copy engine (mapped_copy.h).
      TANDEM_CUDA_CHECK(
          state_, op,
          cuda::copy_from_mapped_host(dst + off, ring.device_view[i], n, sm_count_, stream));
    } else {
      TANDEM_CUDA_CHECK(
          state_, op,
          cudaMemcpyAsync(dst + off, ring.buffer[i], n, cudaMemcpyHostToDevice, stream));
    }
    TANDEM_CUDA_CHECK(state_, op, cudaEventRecord(ring.done[i], stream));
  }
}

void CudaBackend::free_ring(StagingRing& ring) {
  for (int i = 0; i < StagingRing::kBuffers; ++i) {
    if (ring.done[i]) (void)cudaEventDestroy(std::exchange(ring.done[i], nullptr));
    if (ring.buffer[i]) (void)cudaFreeHost(std::exchange(ring.buffer[i], nullptr));
    ring.device_view[i] = nullptr;
  }
}

void CudaBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  std::lock_guard lock(mutex_);
  check_alive("copy_to_host");
  auto* dst = static_cast<uint8_t*>(host_dst);
  const auto* src = static_cast<const uint8_t*>(device_src);
  if (bytes > kStagingBytes) {
    TANDEM_CUDA_CHECK(state_, "copy_to_host",
                      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    TANDEM_CUDA_CHECK(state_, "copy_to_host", cudaStreamSynchronize(stream_));
  } else if (bytes > 0) {
    const int i = take_staging(staging_, "copy_to_host");
    TANDEM_CUDA_CHECK(
        state_, "copy_to_host",
        cudaMemcpyAsync(staging_.buffer[i], src, bytes, cudaMemcpyDeviceToHost, stream_));
    TANDEM_CUDA_CHECK(state_, "copy_to_host", cudaEventRecord(staging_.done[i], stream_));
    TANDEM_CUDA_CHECK(state_, "copy_to_host", cudaStreamSynchronize(stream_));
    std::memcpy(dst, staging_.buffer[i], bytes);
  } else {
    TANDEM_CUDA_CHECK(state_, "copy_to_host", cudaStreamSynchronize(stream_));
  }
  check_device_errors();
}

void CudaBackend::copy_within(void* device_dst, const void* device_src, size_t bytes) {
  std::lock_guard lock(mutex_);
  check_alive("copy_within");
  if (bytes == 0) return;
  TANDEM_CUDA_CHECK(
      state_, "copy_within",
      cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

bool CudaBackend::peer_copy_direct(const Backend& peer) const {
  const auto* other = dynamic_cast<const CudaBackend*>(&peer);
  if (!other || state_.lost || other->lost()) return false;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, state_.device, other->device()) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return can != 0;
}

void CudaBackend::enable_peer_access(const CudaBackend& peer) {
  int n = 0;
  TANDEM_CUDA_CHECK(state_, "copy_to_peer", cudaGetDeviceCount(&n));
  peer_access_.resize(size_t(n), -1);
  int8_t& access = peer_access_.at(size_t(peer.device()));
  if (access >= 0) return;
  access = 0;
  if (!peer_copy_direct(peer)) return;
  for (auto [from, to] :
       {std::pair{state_.device, peer.device()}, {peer.device(), state_.device}}) {
    TANDEM_CUDA_CHECK(state_, "copy_to_peer", cudaSetDevice(from));
    const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      TANDEM_CUDA_CHECK(state_, "copy_to_peer", err);
    }
  }
  TANDEM_CUDA_CHECK(state_, "copy_to_peer", cudaSetDevice(state_.device));
  access = 1;
}

void CudaBackend::copy_to_peer(Backend& peer, void* peer_dst, const void* src, size_t bytes) {
  auto* other = dynamic_cast<CudaBackend*>(&peer);
  if (!other) {
    Backend::copy_to_peer(peer, peer_dst, src, bytes);
    return;
  }
  std::scoped_lock lock(mutex_, other->mutex_);
  other->check_alive("copy_to_peer");
  check_alive("copy_to_peer");
  if (bytes == 0) return;
  enable_peer_access(*other);
  // The copy waits for the source's producers and the destination's previous readers, both
  // queued on the execution streams; the destination's later work waits for the copy.
  TANDEM_CUDA_CHECK(other->state_, "copy_to_peer", cudaSetDevice(other->state_.device));
  TANDEM_CUDA_CHECK(other->state_, "copy_to_peer",
                    cudaEventRecord(other->peer_ready_, other->stream_));
  activate();
  TANDEM_CUDA_CHECK(state_, "copy_to_peer", cudaEventRecord(peer_ready_, stream_));
  TANDEM_CUDA_CHECK(state_, "copy_to_peer", cudaStreamWaitEvent(peer_stream_, peer_ready_));
  TANDEM_CUDA_CHECK(state_, "copy_to_peer", cudaStreamWaitEvent(peer_stream_, other->peer_ready_));
  TANDEM_CUDA_CHECK(
      state_, "copy_to_peer",
      cudaMemcpyPeerAsync(peer_dst, other->state_.device, src, state_.device, bytes, peer_stream_));
  TANDEM_CUDA_CHECK(state_, "copy_to_peer", cudaEventRecord(peer_done_, peer_stream_));
  // Later work here may overwrite the source (arena reuse): it waits for the copy too.
  TANDEM_CUDA_CHECK(state_, "copy_to_peer", cudaStreamWaitEvent(stream_, peer_done_));
  TANDEM_CUDA_CHECK(other->state_, "copy_to_peer", cudaSetDevice(other->state_.device));
  TANDEM_CUDA_CHECK(other->state_, "copy_to_peer", cudaStreamWaitEvent(other->stream_, peer_done_));
  activate();
}

Buffer CudaBackend::allocate_host(size_t bytes) {
  std::lock_guard lock(mutex_);
  check_alive("allocate_host");
  bytes = std::max<size_t>(bytes, 1);
  void* data = nullptr;
  void* device_view = nullptr;
  cudaError_t err = cudaHostAlloc(&data, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (err == cudaSuccess) {
    err = cudaHostGetDevicePointer(&device_view, data, 0);
    if (err != cudaSuccess) (void)cudaFreeHost(std::exchange(data, nullptr));
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw_error(
        ErrorCode::OutOfMemory, state_.id + " allocate_host",
        "cannot page-lock " + format_bytes(bytes) + " of host memory: " + cudaGetErrorString(err));
  }
  host_buffers_[data] = bytes;
  {
    HostRanges& r = host_ranges();
    std::lock_guard ranges_lock(r.mutex);
    r.ranges[reinterpret_cast<uintptr_t>(data)] = {bytes, reinterpret_cast<uintptr_t>(device_view)};
  }
  return Buffer(this, data, bytes);
}

bool CudaBackend::upload_async(void* device_dst, const void* host_src, size_t bytes) {
  const uintptr_t view = host_ranges().device_view(host_src, bytes);
  if (view == 0) {
    copy_from_host(device_dst, host_src, bytes);
    return false;
  }
  std::lock_guard lock(mutex_);
  check_alive("upload_async");
  if (bytes == 0) return false;
  // A kernel on the execution stream reads the mapped host memory: in order with the
  // destination's previous readers and later work, and not behind streamed weights queued on
  // the copy engine (mapped_copy.h).
  TANDEM_CUDA_CHECK(state_, "upload_async",
                    cuda::copy_from_mapped_host(device_dst, reinterpret_cast<const void*>(view),
                                                bytes, sm_count_, stream_));
  TANDEM_CUDA_CHECK(state_, "upload_async", cudaEventRecord(uploads_read_, stream_));
  return true;
}

bool CudaBackend::host_is_page_locked(const void* p, size_t bytes) const {
  return host_ranges().contains(p, bytes);
}

bool CudaBackend::download_async(void* host_dst, const void* device_src, size_t bytes) {
  if (!host_ranges().contains(host_dst, bytes)) {
    copy_to_host(host_dst, device_src, bytes);
    return false;
  }
  std::lock_guard lock(mutex_);
  check_alive("download_async");
  if (bytes == 0) return false;
  // After the source's producers; later work that may overwrite the source (arena reuse)
  // waits for the copy on the device, not on the host.
  TANDEM_CUDA_CHECK(state_, "download_async", cudaEventRecord(peer_ready_, stream_));
  TANDEM_CUDA_CHECK(state_, "download_async", cudaStreamWaitEvent(peer_stream_, peer_ready_));
  TANDEM_CUDA_CHECK(
      state_, "download_async",
      cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, peer_stream_));
  TANDEM_CUDA_CHECK(state_, "download_async", cudaEventRecord(peer_done_, peer_stream_));
  TANDEM_CUDA_CHECK(state_, "download_async", cudaStreamWaitEvent(stream_, peer_done_));
  return true;
}

void CudaBackend::wait_host_copies() {
  std::lock_guard lock(mutex_);
  check_alive("wait_host_copies");
  TANDEM_CUDA_CHECK(state_, "wait_host_copies", cudaEventSynchronize(uploads_read_));
  TANDEM_CUDA_CHECK(state_, "wait_host_copies", cudaStreamSynchronize(peer_stream_));
  check_device_errors();
}

cuda::OpContext CudaBackend::op_context() const {
  cuda::OpContext ctx;
  ctx.state = const_cast<cuda::DeviceState*>(&state_);
  ctx.stream = stream_;
  ctx.cublas = cublas_;
  ctx.sm_count = sm_count_;
  ctx.smem_optin = smem_optin_;
  ctx.smem_pair = smem_pair_;
  ctx.scratch = scratch_;
  ctx.scratch_bytes = scratch_bytes_;
  ctx.features = &features_;
  ctx.error_flag = error_flag_device_;
  ctx.counters = counters_;
  ctx.counter_count = kCounterCount;
  return ctx;
}

void CudaBackend::ensure_scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return;
  // Work already queued may still read the old scratch; the stream orders the reuse.
  if (scratch_) allocator_.free(std::exchange(scratch_, nullptr));
  scratch_bytes_ = 0;
  const size_t grown = std::max(bytes, size_t(1) << 20);
  scratch_ = allocator_.allocate(grown);
  scratch_bytes_ = grown;
}

void CudaBackend::validate(const Graph& graph, const NodeExecution& exec) const {
  const std::string op(op_name(exec.node->op));
  CapabilityCheck c = check(graph, *exec.node);
  if (!c.ok()) throw_error(ErrorCode::Unsupported, state_.id + " " + op, c.detail);
  if (exec.inputs.size() != exec.node->inputs.size() || !exec.output.desc || !exec.output.data) {
    throw_error(ErrorCode::InvalidArgument, state_.id + " " + op,
                "execution has " + std::to_string(exec.inputs.size()) + " inputs for " +
                    std::to_string(exec.node->inputs.size()) + " or no output");
  }
  for (const TensorRef& in : exec.inputs) {
    if (!in.desc || !in.data) {
      throw_error(ErrorCode::InvalidArgument, state_.id + " " + op, "input without data");
    }
  }
}

int CudaBackend::fused_nodes() const {
  return fusion_ == cuda::Fusion::None ? 1 : int(cuda::kMaxFusedNodes);
}

void CudaBackend::execute(const Graph& graph, const NodeExecution& exec) {
  std::lock_guard lock(mutex_);
  check_alive(std::string(op_name(exec.node->op)).c_str());
  validate(graph, exec);
  ensure_scratch(cuda::op_scratch_bytes(op_context(), exec));
  cuda::run_op(op_context(), exec);
}

void CudaBackend::execute_segment(const Graph& graph, std::span<const NodeExecution> segment,
                                  uint64_t signature) {
  std::lock_guard lock(mutex_);
  check_alive("segment");
  if (segment.empty()) return;
  auto pointer_hash = [&] {
    uint64_t h = hash_combine(0, reinterpret_cast<uintptr_t>(scratch_));
    for (const NodeExecution& e : segment) {
      h = hash_combine(h, reinterpret_cast<uintptr_t>(e.output.data));
      for (const TensorRef& in : e.inputs)
        h = hash_combine(h, reinterpret_cast<uintptr_t>(in.data));
    }
    return h;
  };
  // A graph captured with this scratch buffer found it large enough, and the buffer only grows
  // by being replaced: a replay needs no scratch sizes (looking up every op's kernel for them
  // took ~100 us of a 1B decode step's 1.4 ms).
  uint64_t pointers = pointer_hash();
  auto it = graphs_.find(signature);
  if (it == graphs_.end() || it->second.pointer_hash != pointers) {
    size_t scratch = 0;
    for (const NodeExecution& e : segment) {
      scratch = std::max(scratch, cuda::op_scratch_bytes(op_context(), e));
    }
    if (scratch > scratch_bytes_) {
      ensure_scratch(scratch);
      pointers = pointer_hash();
    }
  }
  if (it != graphs_.end() && it->second.pointer_hash == pointers) {
    TANDEM_CUDA_CHECK(state_, "graph replay", cudaGraphLaunch(it->second.exec, stream_));
    ++graph_stats_.replays;
    return;
  }
  for (const NodeExecution& e : segment) validate(graph, e);

  const cuda::OpContext ctx = op_context();
  TANDEM_CUDA_CHECK(state_, "graph capture",
                    cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    for (size_t i = 0; i < segment.size();) {
      const size_t fused = cuda::run_fused(ctx, segment.subspan(i), fusion_);
      if (fused == 0) cuda::run_op(ctx, segment[i]);
      if (fused > 0) {
        graph_stats_.fused_nodes += int64_t(fused);
        ++graph_stats_.fused_launches;
      }
      i += std::max<size_t>(fused, 1);
    }
  } catch (...) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(stream_, &partial);
    if (partial) (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t captured = nullptr;
  TANDEM_CUDA_CHECK(state_, "graph capture", cudaStreamEndCapture(stream_, &captured));
  cudaGraphExec_t exec = nullptr;
  if (it != graphs_.end()) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(it->second.exec, captured, &info) == cudaSuccess) {
      exec = it->second.exec;
      ++graph_stats_.updates;
    } else {
      (void)cudaGetLastError();
      (void)cudaGraphExecDestroy(it->second.exec);
    }
    graphs_.erase(it);
  }
  if (!exec) {
    const cudaError_t err = cudaGraphInstantiate(&exec, captured, 0);
    (void)cudaGraphDestroy(captured);
    captured = nullptr;
    TANDEM_CUDA_CHECK(state_, "graph instantiate", err);
    ++graph_stats_.captures;
  }
  if (captured) (void)cudaGraphDestroy(captured);
  if (graphs_.size() >= kMaxCachedGraphs) clear_graphs();
  graphs_[signature] = CachedGraph{pointers, exec};
  TANDEM_CUDA_CHECK(state_, "graph replay", cudaGraphLaunch(exec, stream_));
}

void CudaBackend::clear_graphs() {
  for (auto& [sig, g] : graphs_) {
    if (g.exec) (void)cudaGraphExecDestroy(g.exec);
  }
  graphs_.clear();
}

void CudaBackend::check_device_errors() {
  const int32_t code = *reinterpret_cast<volatile int32_t*>(error_flag_host_);
  if (code == cuda::kDeviceOk) return;
  *reinterpret_cast<volatile int32_t*>(error_flag_host_) = cuda::kDeviceOk;
  if (code == cuda::kRowIdOutOfRange) {
    throw_error(ErrorCode::InvalidArgument, state_.id + " get_rows",
                "a row id was outside the table (rows left as zeros)");
  }
  if (code == cuda::kExpertIdOutOfRange) {
    throw_error(ErrorCode::InvalidArgument, state_.id + " moe_weights/expert_matmul",
                "an expert id was outside [0, n_expert) (its rows left as zeros)");
  }
  throw_error(ErrorCode::InvalidArgument, state_.id + " attention/kv_write",
              "a position was outside the KV cache (the token was skipped)");
}

void CudaBackend::synchronize() {
  std::lock_guard lock(mutex_);
  check_alive("synchronize");
  TANDEM_CUDA_CHECK(state_, "synchronize", cudaStreamSynchronize(stream_));
  TANDEM_CUDA_CHECK(state_, "synchronize", cudaStreamSynchronize(copy_stream_));
  TANDEM_CUDA_CHECK(state_, "synchronize", cudaStreamSynchronize(peer_stream_));
  check_device_errors();
}

void CudaBackend::stream_from_host(void* device_dst, const void* host_src, size_t bytes,
                                   int event) {
  std::lock_guard lock(mutex_);
  check_alive("stream_from_host");
  TANDEM_CHECK_ARG(event >= 0 && event < kStreamEvents, state_.id + " stream_from_host",
                   "event " + std::to_string(event) + " out of range");
  // The destination's previous readers are the execution work submitted so far.
  TANDEM_CUDA_CHECK(state_, "stream_from_host", cudaEventRecord(compute_mark_, stream_));
  TANDEM_CUDA_CHECK(state_, "stream_from_host", cudaStreamWaitEvent(copy_stream_, compute_mark_));
  auto* dst = static_cast<uint8_t*>(device_dst);
  const auto* src = static_cast<const uint8_t*>(host_src);
  if (const void* pinned = pinned_source(src, bytes)) {
    TANDEM_CUDA_CHECK(state_, "stream_from_host",
                      cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, copy_stream_));
  } else {
    copy_through(bounce_, copy_stream_, dst, src, bytes, "stream_from_host");
  }
  TANDEM_CUDA_CHECK(state_, "stream_from_host",
                    cudaEventRecord(stream_events_[event], copy_stream_));
}

void CudaBackend::wait_stream_event(int event) {
  std::lock_guard lock(mutex_);
  check_alive("wait_stream_event");
  TANDEM_CHECK_ARG(event >= 0 && event < kStreamEvents, state_.id + " wait_stream_event",
                   "event " + std::to_string(event) + " out of range");
  TANDEM_CUDA_CHECK(state_, "wait_stream_event",
                    cudaStreamWaitEvent(stream_, stream_events_[event]));
}

void CudaBackend::stream_routed_experts(void* device_dst, const void* host_src, size_t expert_bytes,
                                        int n_expert, const int32_t* ids, size_t n_ids,
                                        uint8_t* used, int event) {
  std::lock_guard lock(mutex_);
  check_alive("stream_routed_experts");
  TANDEM_CHECK_ARG(event >= 0 && event < kStreamEvents, state_.id + " stream_routed_experts",
                   "event " + std::to_string(event) + " out of range");
  const size_t bytes = expert_bytes * size_t(std::max(n_expert, 0));
  const void* pinned = pinned_source(host_src, bytes);
  const uintptr_t used_view = host_ranges().device_view(used, size_t(std::max(n_expert, 0)));
  if (!pinned || used_view == 0 || n_expert > cuda::kMaxRoutedExperts) {
    // No page-locked source or flags: the host reads the ids and copies.
    Backend::stream_routed_experts(device_dst, host_src, expert_bytes, n_expert, ids, n_ids, used,
                                   event);
    return;
  }
  // The ids' producers are the execution work submitted so far.
  TANDEM_CUDA_CHECK(state_, "stream_routed_experts", cudaEventRecord(compute_mark_, stream_));
  TANDEM_CUDA_CHECK(state_, "stream_routed_experts",
                    cudaStreamWaitEvent(copy_stream_, compute_mark_));
  TANDEM_CUDA_CHECK(state_, "stream_routed_experts",
                    cuda::copy_routed_experts_from_mapped_host(
                        device_dst, pinned, expert_bytes, n_expert, ids, n_ids,
                        reinterpret_cast<uint8_t*>(used_view), sm_count_, copy_stream_));
  TANDEM_CUDA_CHECK(state_, "stream_routed_experts",
                    cudaEventRecord(stream_events_[event], copy_stream_));
}

const void* CudaBackend::pinned_source(const void* data, size_t bytes) {
  // A range inside a page-locked copy (part of a streamed expert tensor) reads that copy.
  const auto* p = static_cast<const uint8_t*>(data);
  auto it = pinned_.upper_bound(p);
  if (it != pinned_.begin()) {
    --it;
    const size_t offset = size_t(p - it->first);  // the key is at or before p
    if (offset < it->second.bytes && bytes <= it->second.bytes - offset) {
      return static_cast<const uint8_t*>(it->second.data) + offset;
    }
  }
  if (!prepare_stream_source(data, bytes)) return nullptr;
  return pinned_.at(p).data;
}

void CudaBackend::release_stream_source(const void* data) {
  std::lock_guard lock(mutex_);
  auto it = pinned_.find(static_cast<const uint8_t*>(data));
  if (it == pinned_.end()) return;
  if (!state_.lost) (void)cudaStreamSynchronize(copy_stream_);  // queued copies may read it
  (void)cudaFreeHost(it->second.data);
  pinned_.erase(it);
}

bool CudaBackend::prepare_stream_source(const void* data, size_t bytes) {
  std::lock_guard lock(mutex_);
  check_alive("prepare_stream_source");
  auto it = pinned_.find(static_cast<const uint8_t*>(data));
  if (it != pinned_.end()) {
    if (it->second.bytes == bytes) return true;
    // Rebound to other bytes: the copy may still feed queued work.
    TANDEM_CUDA_CHECK(state_, "prepare_stream_source", cudaStreamSynchronize(copy_stream_));
    (void)cudaFreeHost(it->second.data);
    pinned_.erase(it);
  }
  void* copy = nullptr;
  if (cudaMallocHost(&copy, bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // out of page-locked memory: stream through bounce buffers
    return false;
  }
  std::memcpy(copy, data, bytes);
  pinned_.emplace(static_cast<const uint8_t*>(data), PinnedCopy{copy, bytes});
  return true;
}

void CudaBackend::timeline_reset() {
  timeline_used_ = 0;
}

int CudaBackend::timeline_mark(bool copy_queue) {
  std::lock_guard lock(mutex_);
  check_alive("timeline");
  if (timeline_used_ == timeline_.size()) {
    cudaEvent_t e = nullptr;
    TANDEM_CUDA_CHECK(state_, "timeline", cudaEventCreate(&e));
    timeline_.push_back(e);
  }
  TANDEM_CUDA_CHECK(
      state_, "timeline",
      cudaEventRecord(timeline_[timeline_used_], copy_queue ? copy_stream_ : stream_));
  return int(timeline_used_++);
}

double CudaBackend::timeline_us(int mark) {
  std::lock_guard lock(mutex_);
  check_alive("timeline");
  float ms = 0.0f;
  TANDEM_CUDA_CHECK(state_, "timeline",
                    cudaEventElapsedTime(&ms, timeline_.front(), timeline_.at(size_t(mark))));
  return double(ms) * 1000.0;
}

void CudaBackend::timer_start() {
  std::lock_guard lock(mutex_);
  check_alive("timer");
  TANDEM_CUDA_CHECK(state_, "timer", cudaEventRecord(timer_begin_, stream_));
}

double CudaBackend::timer_stop_us() {
  std::lock_guard lock(mutex_);
  check_alive("timer");
  TANDEM_CUDA_CHECK(state_, "timer", cudaEventRecord(timer_end_, stream_));
  TANDEM_CUDA_CHECK(state_, "timer", cudaEventSynchronize(timer_end_));
  float ms = 0.0f;
  TANDEM_CUDA_CHECK(state_, "timer", cudaEventElapsedTime(&ms, timer_begin_, timer_end_));
  return double(ms) * 1000.0;
}

void CudaBackend::inject_fault_for_testing() {
  std::lock_guard lock(mutex_);
  check_alive("fault");
  cuda::launch_trap_kernel(stream_);
  TANDEM_CUDA_CHECK(state_, "fault", cudaStreamSynchronize(stream_));
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_absent_reason() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status == cudaSuccess) {
    return n == 0 ? "the CUDA runtime found no GPU" : "";
  }
  (void)cudaGetLastError();
  return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
}

std::shared_ptr<Backend> make_cuda_backend(int device) {
  return std::make_shared<CudaBackend>(device);
}

}  // namespace tandem
