// A pipeline across processes, one per GPU or host (pipeline parallelism): rank r holds a
// contiguous range of layers, rank 0 also the token embedding and the last rank the output
// layer. Rank 0's Session leads (SessionOptions::pipeline): it splits the layers once, tells
// every rank its range, and each step sends the tokens to every rank; the hidden state goes from
// rank to rank and the logits come back to rank 0, which samples. docs/multi-gpu.md shows how to
// launch it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

struct SessionOptions;

// How long a rank waits for another before it gives up (a rank that died, a host unreachable).
inline constexpr double kDefaultPipelineTimeoutS = 300.0;

// Messages of host memory between ranks, in the order both sides call them (NCCL's rules: a
// send matches the peer's recv of the same size; every rank calls broadcast). A peer that
// fails, aborts or does not answer within the timeout makes every call throw Error (Io) naming
// it; nothing waits forever.
class PipelineTransport {
 public:
  virtual ~PipelineTransport() = default;
  virtual int rank() const = 0;
  virtual int n_ranks() const = 0;
  virtual void send(const void* data, size_t bytes, int peer) = 0;
  virtual void recv(void* data, size_t bytes, int peer) = 0;
  // root's bytes to every rank: read on root, written on the others.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // This rank failed: the other ranks' waits end with `why` rather than a timeout (where the
  // transport can tell them), and this rank's later calls throw.
  virtual void abort(const std::string& why) noexcept = 0;
};

// n_ranks transports within one process, one per thread (queues between threads): the whole
// protocol without NCCL, for tests.
std::vector<std::shared_ptr<PipelineTransport>> make_local_transports(
    int n_ranks, double timeout_s = kDefaultPipelineTimeoutS);

// NCCL (send/recv/broadcast through a staging buffer on the rank's GPU). nccl_available() is
// false in a build without NCCL, where the other two throw Unsupported.
bool nccl_available();
// Rank 0's id of a new communicator (opaque bytes, hex-encoded), for the other ranks to join.
std::string nccl_unique_id();
// Joins the communicator of `unique_id` as `rank` on CUDA device `cuda_device`; waits up to
// timeout_s for every rank to join.
std::shared_ptr<PipelineTransport> make_nccl_transport(int rank, int n_ranks,
                                                       const std::string& unique_id,
                                                       int cuda_device,
                                                       double timeout_s = kDefaultPipelineTimeoutS);

// A rank other than 0 (options.pipeline->rank() > 0): serves each session rank 0 opens, with
// rank 0's strategy, context and KV type and this rank's own backends, budgets and model file
// (the same model: refused otherwise), until rank 0 calls end_pipeline. Throws Error on a
// failure here or on another rank, after telling the others.
void serve_pipeline_rank(const SessionOptions& options);

// Rank 0, once its sessions are done: the other ranks' serve_pipeline_rank returns.
void end_pipeline(PipelineTransport& transport);

}  // namespace tandem
