// The pipeline over NCCL: one communicator of all ranks, nonblocking, so that every wait can
// give up (a rank that died, a host unreachable) and abort the communicator instead of hanging.
// Host messages go through a staging buffer on the rank's GPU, on a stream of the transport's
// own; each operation is waited for (polling, bounded) before the next starts.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <string>
#include <thread>

#include "tandem/error.h"
#include "tandem/pipeline.h"

namespace tandem {

namespace {

// A wait polls this long before it starts sleeping between polls: a decode step's messages
// take microseconds, a sleep would add its granularity to every one.
constexpr double kSpinSeconds = 2e-3;
constexpr auto kPollSleep = std::chrono::microseconds(50);

std::string hex_of(const void* data, size_t bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

ncclUniqueId id_from_hex(const std::string& hex) {
  ncclUniqueId id{};
  TANDEM_CHECK_ARG(hex.size() == 2 * sizeof id.internal, "pipeline",
                   "an NCCL id has " + std::to_string(2 * sizeof id.internal) +
                       " hex digits (got " + std::to_string(hex.size()) + ")");
  auto value = [&](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw_error(ErrorCode::InvalidArgument, "pipeline", "the NCCL id is not hex digits");
  };
  for (size_t i = 0; i < sizeof id.internal; ++i)
    id.internal[i] = char(value(hex[2 * i]) * 16 + value(hex[2 * i + 1]));
  return id;
}

void check_cuda(cudaError_t e, const std::string& where, const char* what) {
  if (e != cudaSuccess) {
    throw_error(ErrorCode::DeviceLost, where,
                std::string(what) + " failed: " + cudaGetErrorString(e));
  }
}

class NcclTransport final : public PipelineTransport {
 public:
  NcclTransport(int rank, int n_ranks, const ncclUniqueId& id, int device, double timeout_s)
      : rank_(rank), n_ranks_(n_ranks), device_(device), timeout_s_(timeout_s) {
    check_cuda(cudaSetDevice(device_), where(), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), where(),
               "cudaStreamCreate");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, n_ranks_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      cudaStreamDestroy(stream_);
      throw_error(ErrorCode::Io, where(),
                  std::string("joining the NCCL communicator failed: ") + ncclGetErrorString(r));
    }
    try {
      settle(r, "joining the other ranks");
    } catch (...) {
      cudaStreamDestroy(stream_);
      throw;
    }
  }

  ~NcclTransport() override {
    cudaSetDevice(device_);
    if (comm_) {
      if (failed_.empty()) {
        ncclCommFinalize(comm_);
        ncclResult_t state = ncclInProgress;
        const auto t0 = std::chrono::steady_clock::now();
        while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
               std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
          std::this_thread::sleep_for(kPollSleep);
        if (state == ncclSuccess) {
          ncclCommDestroy(comm_);
        } else {
          ncclCommAbort(comm_);
        }
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (staging_) cudaFree(staging_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int n_ranks() const override { return n_ranks_; }

  void send(const void* data, size_t bytes, int peer) override {
    begin(peer);
    if (bytes == 0) return;
    stage(bytes);
    check_cuda(cudaMemcpyAsync(staging_, data, bytes, cudaMemcpyHostToDevice, stream_), where(),
               "copy to the staging buffer");
    settle(ncclSend(staging_, bytes, ncclUint8, peer, comm_, stream_), "sending to " + of(peer));
    wait("sending to " + of(peer));
  }

  void recv(void* data, size_t bytes, int peer) override {
    begin(peer);
    if (bytes == 0) return;
    stage(bytes);
    settle(ncclRecv(staging_, bytes, ncclUint8, peer, comm_, stream_),
           "receiving from " + of(peer));
    wait("receiving from " + of(peer));
    unstage(data, bytes);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    begin(-1);
    TANDEM_CHECK_ARG(root >= 0 && root < n_ranks_, where(), "no root " + std::to_string(root));
    if (bytes == 0) return;
    stage(bytes);
    if (rank_ == root) {
      check_cuda(cudaMemcpyAsync(staging_, data, bytes, cudaMemcpyHostToDevice, stream_), where(),
                 "copy to the staging buffer");
    }
    settle(ncclBroadcast(staging_, staging_, bytes, ncclUint8, root, comm_, stream_),
           "broadcast from " + of(root));
    wait("broadcast from " + of(root));
    if (rank_ != root) unstage(data, bytes);
  }

  void abort(const std::string& why) noexcept override {
    if (!failed_.empty()) return;
    failed_ = why.empty() ? "aborted" : why;
    // Aborting the communicator ends this rank's pending operations; the other ranks see
    // their own waits fail or time out.
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  std::string where() const { return "pipeline rank " + std::to_string(rank_) + " (nccl)"; }
  static std::string of(int rank) { return "rank " + std::to_string(rank); }

  void begin(int peer) {
    if (!failed_.empty()) throw_error(ErrorCode::Io, where(), "stopped: " + failed_);
    if (peer != -1) {
      TANDEM_CHECK_ARG(peer >= 0 && peer < n_ranks_ && peer != rank_, where(),
                       "invalid peer " + std::to_string(peer));
    }
    check_cuda(cudaSetDevice(device_), where(), "cudaSetDevice");
  }

  void stage(size_t bytes) {
    if (bytes <= staging_bytes_) return;
    if (staging_) cudaFree(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    check_cuda(cudaMalloc(&staging_, bytes), where(), "allocating the staging buffer");
    staging_bytes_ = bytes;
  }

  // The staging buffer's bytes to host memory, once the operation that filled it is done: a
  // copy to pageable memory returns only when complete, so it must not wait on a peer.
  void unstage(void* data, size_t bytes) {
    check_cuda(cudaMemcpyAsync(data, staging_, bytes, cudaMemcpyDeviceToHost, stream_), where(),
               "copy from the staging buffer");
    wait("copy from the staging buffer");
  }

  // A nonblocking communicator's call may return before it is enqueued: waits until it is.
  void settle(ncclResult_t r, const std::string& what) {
    const auto t0 = std::chrono::steady_clock::now();
    while (r == ncclInProgress) {
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
      if (r == ncclInProgress) poll_or_give_up(t0, what);
    }
    if (r != ncclSuccess) fail(what + " failed: " + ncclGetErrorString(r));
  }

  // Until the stream has done this operation, or it fails, or the timeout passes.
  void wait(const std::string& what) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) fail(what + " failed: " + cudaGetErrorString(e));
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess ||
          (state != ncclSuccess && state != ncclInProgress))
        fail(what + " failed: " + ncclGetErrorString(state));
      poll_or_give_up(t0, what);
    }
  }

  void poll_or_give_up(std::chrono::steady_clock::time_point t0, const std::string& what) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited > timeout_s_) {
      fail(what + ": no answer in " + std::to_string(int(timeout_s_)) +
           " s (a rank died or hangs; TANDEM_PIPELINE_TIMEOUT sets the wait)");
    }
    if (waited > kSpinSeconds) std::this_thread::sleep_for(kPollSleep);
  }

  [[noreturn]] void fail(const std::string& message) {
    abort(message);
    throw_error(ErrorCode::Io, where(), message);
  }

  int rank_, n_ranks_, device_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  std::string failed_;
};

}  // namespace

bool nccl_available() {
  return true;
}

std::string nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    throw_error(ErrorCode::Io, "pipeline",
                std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
  }
  return hex_of(id.internal, sizeof id.internal);
}

std::shared_ptr<PipelineTransport> make_nccl_transport(int rank, int n_ranks,
                                                       const std::string& unique_id,
                                                       int cuda_device, double timeout_s) {
  TANDEM_CHECK_ARG(
      n_ranks >= 1 && rank >= 0 && rank < n_ranks, "pipeline",
      "rank " + std::to_string(rank) + " of " + std::to_string(n_ranks) + " ranks is out of range");
  TANDEM_CHECK_ARG(timeout_s > 0.0, "pipeline", "the timeout must be positive");
  return std::make_shared<NcclTransport>(rank, n_ranks, id_from_hex(unique_id), cuda_device,
                                         timeout_s);
}

}  // namespace tandem
