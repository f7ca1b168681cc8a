#include "tandem/backend.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "tandem/error.h"

namespace tandem {

std::string_view backend_kind_name(BackendKind kind) {
  return kind == BackendKind::Cpu ? "cpu" : "gpu";
}

std::string_view reject_reason_name(RejectReason reason) {
  switch (reason) {
    case RejectReason::None:
      return "none";
    case RejectReason::UnsupportedOp:
      return "unsupported op";
    case RejectReason::UnsupportedDType:
      return "unsupported dtype";
    case RejectReason::TooLarge:
      return "too large";
    case RejectReason::MissingFeature:
      return "missing feature";
    case RejectReason::OutOfMemory:
      return "out of memory";
    case RejectReason::MoreExpensive:
      return "more expensive";
    case RejectReason::DeviceLost:
      return "device lost";
    case RejectReason::NotAllowed:
      return "not allowed";
  }
  return "unknown";
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void Buffer::reset() {
  if (owner_ && data_) owner_->free_buffer(data_, bytes_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

bool Backend::has_feature(std::string_view feature) const {
  const auto& f = features();
  return std::find(f.begin(), f.end(), feature) != f.end();
}

int64_t node_max_elements(const Graph& graph, const Node& node) {
  int64_t m = graph.tensor(node.id).elements();
  for (TensorId in : node.inputs) m = std::max(m, graph.tensor(in).elements());
  return m;
}

namespace {
bool dtypes_match(const Graph& graph, const Node& node, const OpCapability& cap) {
  auto allowed = [&](DType d) {
    return std::find(cap.dtypes.begin(), cap.dtypes.end(), d) != cap.dtypes.end();
  };
  if (!allowed(graph.tensor(node.id).dtype)) return false;
  for (TensorId in : node.inputs) {
    if (!allowed(graph.tensor(in).dtype)) return false;
  }
  return true;
}

std::string node_dtypes(const Graph& graph, const Node& node) {
  std::string s;
  for (TensorId in : node.inputs) {
    s += (s.empty() ? "" : ", ") + std::string(dtype_name(graph.tensor(in).dtype));
  }
  return "(" + s + ") -> " + std::string(dtype_name(graph.tensor(node.id).dtype));
}
}  // namespace

const OpCapability* Backend::op_capability(const Graph& graph, const Node& node) const {
  for (const OpCapability& cap : capabilities()) {
    if (cap.op == node.op && dtypes_match(graph, node, cap)) return &cap;
  }
  return nullptr;
}

CapabilityCheck Backend::check(const Graph& graph, const Node& node) const {
  if (lost()) return {RejectReason::DeviceLost, backend_id() + " is lost"};
  bool op_known = false;
  const OpCapability* dtype_ok = nullptr;
  for (const OpCapability& cap : capabilities()) {
    if (cap.op != node.op) continue;
    op_known = true;
    if (!dtypes_match(graph, node, cap)) continue;
    dtype_ok = &cap;
    if (!cap.required_feature.empty() && !has_feature(cap.required_feature)) continue;
    int64_t n = node_max_elements(graph, node);
    if (cap.max_elements > 0 && n > cap.max_elements) continue;
    return {};
  }
  if (!op_known) {
    return {RejectReason::UnsupportedOp,
            backend_id() + " does not run " + std::string(op_name(node.op))};
  }
  if (!dtype_ok) {
    return {RejectReason::UnsupportedDType, backend_id() + " does not run " +
                                                std::string(op_name(node.op)) + " for dtypes " +
                                                node_dtypes(graph, node)};
  }
  // Some row matched the dtypes but failed on feature or size; report the first such row.
  for (const OpCapability& cap : capabilities()) {
    if (cap.op != node.op || !dtypes_match(graph, node, cap)) continue;
    if (!cap.required_feature.empty() && !has_feature(cap.required_feature)) {
      return {RejectReason::MissingFeature, backend_id() + " lacks feature '" +
                                                cap.required_feature + "' for " +
                                                std::string(op_name(node.op))};
    }
    return {RejectReason::TooLarge, std::string(op_name(node.op)) + " has " +
                                        std::to_string(node_max_elements(graph, node)) +
                                        " elements, " + backend_id() + " takes at most " +
                                        std::to_string(cap.max_elements)};
  }
  return {RejectReason::UnsupportedOp, "no capability row"};
}

void Backend::execute_segment(const Graph& graph, std::span<const NodeExecution> segment,
                              uint64_t /*signature*/) {
  for (const NodeExecution& exec : segment) execute(graph, exec);
}

void Backend::copy_to_peer(Backend& peer, void* peer_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  // copy_to_host waits for this backend's work; copy_from_host has read the source on return.
  std::vector<uint8_t> host(bytes);
  copy_to_host(host.data(), src, bytes);
  peer.copy_from_host(peer_dst, host.data(), bytes);
}

Buffer Backend::allocate_host(size_t /*bytes*/) {
  return {};
}

bool Backend::host_is_page_locked(const void* /*p*/, size_t /*bytes*/) const {
  return false;
}

bool Backend::upload_async(void* device_dst, const void* host_src, size_t bytes) {
  copy_from_host(device_dst, host_src, bytes);
  return false;
}

bool Backend::download_async(void* host_dst, const void* device_src, size_t bytes) {
  copy_to_host(host_dst, device_src, bytes);
  return false;
}

void Backend::wait_host_copies() {}

void Backend::stream_from_host(void* device_dst, const void* host_src, size_t bytes,
                               int /*event*/) {
  copy_from_host(device_dst, host_src, bytes);
}

void Backend::wait_stream_event(int /*event*/) {}

void Backend::stream_routed_experts(void* device_dst, const void* host_src, size_t expert_bytes,
                                    int n_expert, const int32_t* ids, size_t n_ids, uint8_t* used,
                                    int /*event*/) {
  synchronize();
  std::vector<int32_t> routed(n_ids);
  if (n_ids > 0) copy_to_host(routed.data(), ids, n_ids * sizeof(int32_t));
  std::vector<uint8_t> named(size_t(std::max(n_expert, 0)), 0);
  for (int32_t e : routed) {
    if (e >= 0 && e < n_expert) named[size_t(e)] = 1;
  }
  for (size_t e = 0; e < named.size(); ++e) {
    if (named[e] && used[e] == 0) {
      copy_from_host(static_cast<uint8_t*>(device_dst) + e * expert_bytes,
                     static_cast<const uint8_t*>(host_src) + e * expert_bytes, expert_bytes);
    }
    used[e] = named[e] ? (used[e] != 0 ? 1 : 2) : 0;
  }
}

bool Backend::prepare_stream_source(const void* /*data*/, size_t /*bytes*/) {
  return false;
}

void Backend::release_stream_source(const void* /*data*/) {}

void Backend::timeline_reset() {
  timeline_ns_.clear();
}

int Backend::timeline_mark(bool /*copy_queue*/) {
  timeline_ns_.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count());
  return int(timeline_ns_.size() - 1);
}

double Backend::timeline_us(int mark) {
  return double(timeline_ns_.at(size_t(mark)) - timeline_ns_.front()) / 1000.0;
}

void Backend::timer_start() {
  synchronize();
  timer_start_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count();
}

double Backend::timer_stop_us() {
  synchronize();
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  return double(now - timer_start_ns_) / 1000.0;
}

}  // namespace tandem
