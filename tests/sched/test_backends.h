// Test backends for the scheduler: host memory and reference kernels, with a chosen id, kind,
// capability table, features, memory and (for "devices") memory the executor may not touch
// directly. They count buffers and bytes so tests can prove nothing leaks, and fail on demand:
// an op kind, every allocation, allocations past a byte limit, or the k-th execution (the
// device is lost from then on, as a CUDA device with a poisoned context).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "reference_backend.h"
#include "tandem/error.h"

namespace tandem::test {

class TestBackend : public HostBackend {
 public:
  struct Config {
    std::string id = "test";
    BackendKind kind = BackendKind::Cpu;
    bool host_accessible = true;
    std::vector<std::string> features;
    std::vector<OpCapability> capabilities = ReferenceBackend::reference_capabilities();
    size_t free_bytes = size_t(64) << 30;
    // Devices with the same non-empty peer group copy to each other directly (copy_to_peer
    // without host memory), as GPUs with peer access do.
    std::string peer_group;
    // What fused_nodes() declares (the executor's memory plan keeps such windows apart).
    int fused_nodes = 1;
  };
  explicit TestBackend(Config c) : HostBackend(c.id), config_(std::move(c)) {
    features_ = config_.features;
  }
  BackendKind kind() const override { return config_.kind; }
  bool host_accessible() const override { return config_.host_accessible; }
  MemoryInfo memory() const override { return {config_.free_bytes * 2, config_.free_bytes}; }
  bool lost() const override { return lost_; }
  const std::vector<OpCapability>& capabilities() const override { return config_.capabilities; }
  int fused_nodes() const override { return config_.fused_nodes; }

  void execute(const Graph& graph, const NodeExecution& exec) override {
    if (on_execute) on_execute(graph, *exec.node);
    if (lost_) throw_error(ErrorCode::DeviceLost, backend_id(), "the device is lost");
    if (lose_at_execution > 0 && executed + 1 == lose_at_execution) {
      lost_ = true;
      throw_error(ErrorCode::DeviceLost, backend_id() + " " + std::string(op_name(exec.node->op)),
                  "injected device loss");
    }
    CapabilityCheck c = check(graph, *exec.node);
    if (!c.ok()) throw_error(ErrorCode::Unsupported, backend_id(), c.detail);
    if (fail_on_op >= 0 && int(exec.node->op) == fail_on_op) {
      throw_error(ErrorCode::DeviceLost, backend_id(), "injected failure");
    }
    ++executed;
    reference_execute(graph, exec);
  }
  void execute_segment(const Graph& graph, std::span<const NodeExecution> segment,
                       uint64_t signature) override {
    segment_signatures.push_back(signature);
    std::vector<const void*> ptrs;
    for (const NodeExecution& e : segment) {
      ptrs.push_back(e.output.data);
      for (const TensorRef& r : e.inputs) ptrs.push_back(r.data);
    }
    segment_pointers.push_back(std::move(ptrs));
    count_window_overlaps(segment);
    Backend::execute_segment(graph, segment, signature);
  }
  Buffer allocate(size_t bytes) override {
    if (fail_allocations) {
      throw_error(ErrorCode::OutOfMemory, backend_id() + " allocate", "injected");
    }
    if (bytes > allocation_limit || allocated_bytes > allocation_limit - bytes) {
      throw_error(
          ErrorCode::OutOfMemory, backend_id() + " allocate",
          "out of memory (need " + std::to_string(bytes) + " bytes, " +
              std::to_string(allocation_limit > allocated_bytes ? allocation_limit - allocated_bytes
                                                                : 0) +
              " free)");
    }
    Buffer b = HostBackend::allocate(bytes);
    ++live_buffers;
    allocated_bytes += bytes;
    return b;
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (lost_) throw_error(ErrorCode::DeviceLost, backend_id(), "the device is lost");
    ++copies_in;
    HostBackend::copy_from_host(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (lost_) throw_error(ErrorCode::DeviceLost, backend_id(), "the device is lost");
    ++copies_out;
    HostBackend::copy_to_host(dst, src, bytes);
  }
  bool peer_copy_direct(const Backend& peer) const override {
    const auto* other = dynamic_cast<const TestBackend*>(&peer);
    return other && !config_.peer_group.empty() && other->config_.peer_group == config_.peer_group;
  }
  void copy_to_peer(Backend& peer, void* peer_dst, const void* src, size_t bytes) override {
    ++peer_copies_out;
    if (!peer_copy_direct(peer)) {
      Backend::copy_to_peer(peer, peer_dst, src, bytes);
      return;
    }
    ++direct_copies_out;
    std::memcpy(peer_dst, src, bytes);
  }

  void count_window_overlaps(std::span<const NodeExecution> segment) {
    auto extent = [](const TensorDesc& d) {
      if (d.is_contiguous()) return d.bytes();
      size_t last = 0;
      for (int i = 1; i < 4; ++i)
        last += size_t(std::max<int64_t>(d.ne[i] - 1, 0)) * size_t(d.nb[i]);
      return last + size_t(d.nb[1]);
    };
    auto overlap = [&](const TensorRef& a, const TensorRef& b) {
      const auto *pa = static_cast<const uint8_t*>(a.data),
                 *pb = static_cast<const uint8_t*>(b.data);
      return pa < pb + extent(*b.desc) && pb < pa + extent(*a.desc);
    };
    for (size_t k = 0; window > 1 && k < segment.size(); ++k) {
      const size_t end = std::min(segment.size(), k + window);
      bool found = false;
      for (size_t n = k; n < end && !found; ++n) {
        for (size_t j = k; j < end && !found; ++j) {
          if (j == n) continue;
          for (const TensorRef& in : segment[j].inputs) {
            bool produced = false;
            for (size_t p = k; p < j; ++p) produced = produced || segment[p].output.data == in.data;
            found = found || (!produced && overlap(segment[n].output, in));
          }
        }
      }
      window_overlaps += found ? 1 : 0;
    }
  }

  void set_lost(bool lost) { lost_ = lost; }
  int fail_on_op = -1;                                        // an OpKind that throws when executed
  std::function<void(const Graph&, const Node&)> on_execute;  // before each node runs
  bool fail_allocations = false;
  // Allocations that would take the bytes held past this throw OutOfMemory.
  size_t allocation_limit = SIZE_MAX;
  size_t allocated_bytes = 0;  // held in live buffers
  // The execution with this number (1: the first) throws DeviceLost and the device is lost.
  int lose_at_execution = -1;
  int executed = 0;
  int copies_in = 0;
  int copies_out = 0;
  int peer_copies_out = 0;    // copy_to_peer calls with this backend as the source
  int direct_copies_out = 0;  // ... of which went directly, without host memory
  // Windows of `window` consecutive nodes of a segment (as one fused launch would run them) in
  // which a node's output overlaps memory another node of the window reads from outside it.
  size_t window = 0;
  int window_overlaps = 0;
  std::vector<uint64_t> segment_signatures;
  std::vector<std::vector<const void*>> segment_pointers;
  static inline std::atomic<int> live_buffers{0};

 protected:
  void free_buffer(void* data, size_t bytes) override {
    --live_buffers;
    allocated_bytes -= bytes;
    HostBackend::free_buffer(data, bytes);
  }

 private:
  Config config_;
  bool lost_ = false;
};

inline std::shared_ptr<TestBackend> make_cpu(
    std::string id = "cpu",
    std::vector<OpCapability> caps = ReferenceBackend::reference_capabilities()) {
  TestBackend::Config c;
  c.id = std::move(id);
  c.capabilities = std::move(caps);
  return std::make_shared<TestBackend>(c);
}

// A "GPU": kind Gpu, its memory is off limits to the executor (copies go through the API).
inline std::shared_ptr<TestBackend> make_gpu(
    std::string id = "gpu",
    std::vector<OpCapability> caps = ReferenceBackend::reference_capabilities(),
    std::string peer_group = "") {
  TestBackend::Config c;
  c.id = std::move(id);
  c.kind = BackendKind::Gpu;
  c.host_accessible = false;
  c.capabilities = std::move(caps);
  c.peer_group = std::move(peer_group);
  return std::make_shared<TestBackend>(c);
}

// The reference table without some ops.
inline std::vector<OpCapability> caps_without(std::initializer_list<OpKind> ops) {
  std::vector<OpCapability> out;
  for (const OpCapability& c : ReferenceBackend::reference_capabilities()) {
    bool drop = false;
    for (OpKind op : ops) drop = drop || c.op == op;
    if (!drop) out.push_back(c);
  }
  return out;
}

inline uint32_t test_seed() {
  static const uint32_t seed = std::random_device{}();
  return seed;
}

// Random values in [-1, 1], never all zero.
inline std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace tandem::test
