// Ranks as threads of one process: a queue of messages per (sender, receiver), sends that never
// wait, receives that wait on a condition variable up to the timeout.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

#include "tandem/error.h"
#include "tandem/pipeline.h"

namespace tandem {

namespace {

struct Message {
  bool broadcast = false;
  std::vector<char> bytes;
};

// What the ranks of one local pipeline share.
struct LocalHub {
  std::mutex mutex;
  std::condition_variable arrived;
  std::map<std::pair<int, int>, std::deque<Message>> queues;  // (from, to)
  std::string failure;                                        // set by the first abort
  int n_ranks = 0;
  double timeout_s = 0.0;
};

class LocalTransport final : public PipelineTransport {
 public:
  LocalTransport(std::shared_ptr<LocalHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int n_ranks() const override { return hub_->n_ranks; }

  void send(const void* data, size_t bytes, int peer) override {
    check_peer(peer, "send");
    post(data, bytes, peer, false);
  }

  void recv(void* data, size_t bytes, int peer) override {
    check_peer(peer, "recv");
    take(data, bytes, peer, false);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    TANDEM_CHECK_ARG(root >= 0 && root < n_ranks(), where(), "no root " + std::to_string(root));
    if (rank_ != root) return take(data, bytes, root, true);
    for (int r = 0; r < n_ranks(); ++r) {
      if (r != rank_) post(data, bytes, r, true);
    }
  }

  void abort(const std::string& why) noexcept override {
    std::lock_guard lock(hub_->mutex);
    if (hub_->failure.empty()) hub_->failure = why.empty() ? "aborted" : why;
    hub_->arrived.notify_all();
  }

 private:
  std::string where() const { return "pipeline rank " + std::to_string(rank_); }

  void check_peer(int peer, const char* what) const {
    TANDEM_CHECK_ARG(peer >= 0 && peer < n_ranks() && peer != rank_, where(),
                     std::string(what) + " to an invalid peer " + std::to_string(peer));
  }

  void throw_if_failed() const {
    if (!hub_->failure.empty()) throw_error(ErrorCode::Io, where(), "stopped: " + hub_->failure);
  }

  void post(const void* data, size_t bytes, int peer, bool broadcast) {
    std::lock_guard lock(hub_->mutex);
    throw_if_failed();
    Message m{broadcast, std::vector<char>(bytes)};
    if (bytes) std::memcpy(m.bytes.data(), data, bytes);
    hub_->queues[{rank_, peer}].push_back(std::move(m));
    hub_->arrived.notify_all();
  }

  void take(void* data, size_t bytes, int peer, bool broadcast) {
    std::unique_lock lock(hub_->mutex);
    auto& queue = hub_->queues[{peer, rank_}];
    const auto timeout = std::chrono::duration<double>(hub_->timeout_s);
    const bool ready = hub_->arrived.wait_for(
        lock, timeout, [&] { return !queue.empty() || !hub_->failure.empty(); });
    throw_if_failed();
    if (!ready) {
      throw_error(ErrorCode::Io, where(),
                  "no message from rank " + std::to_string(peer) + " in " +
                      std::to_string(int(hub_->timeout_s)) + " s");
    }
    Message m = std::move(queue.front());
    queue.pop_front();
    if (m.broadcast != broadcast || m.bytes.size() != bytes) {
      throw_error(ErrorCode::Internal, where(),
                  "protocol mismatch with rank " + std::to_string(peer) + ": expected a " +
                      (broadcast ? "broadcast" : "message") + " of " + std::to_string(bytes) +
                      " bytes, got a " + (m.broadcast ? "broadcast" : "message") + " of " +
                      std::to_string(m.bytes.size()));
    }
    if (bytes) std::memcpy(data, m.bytes.data(), bytes);
  }

  std::shared_ptr<LocalHub> hub_;
  int rank_;
};

}  // namespace

std::vector<std::shared_ptr<PipelineTransport>> make_local_transports(int n_ranks,
                                                                      double timeout_s) {
  TANDEM_CHECK_ARG(n_ranks >= 1, "pipeline",
                   "needs at least one rank (got " + std::to_string(n_ranks) + ")");
  TANDEM_CHECK_ARG(timeout_s > 0.0, "pipeline", "the timeout must be positive");
  auto hub = std::make_shared<LocalHub>();
  hub->n_ranks = n_ranks;
  hub->timeout_s = timeout_s;
  std::vector<std::shared_ptr<PipelineTransport>> out;
  for (int r = 0; r < n_ranks; ++r) out.push_back(std::make_shared<LocalTransport>(hub, r));
  return out;
}

}  // namespace tandem
