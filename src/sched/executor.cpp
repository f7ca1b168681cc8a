#include "tandem/executor.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "executor_impl.h"
#include "tandem/error.h"

namespace tandem {

// ---- Bindings ----

Bindings& Bindings::input(std::string name, const void* data, size_t bytes) {
  inputs_.push_back({std::move(name), kNoTensor, data, nullptr, bytes});
  return *this;
}
Bindings& Bindings::input(TensorId id, const void* data, size_t bytes) {
  inputs_.push_back({{}, id, data, nullptr, bytes});
  return *this;
}
Bindings& Bindings::weight(std::string name, const void* data, size_t bytes) {
  weights_.push_back({std::move(name), kNoTensor, data, nullptr, bytes});
  return *this;
}
Bindings& Bindings::output(std::string name, void* data, size_t bytes) {
  outputs_.push_back({std::move(name), kNoTensor, nullptr, data, bytes});
  return *this;
}
Bindings& Bindings::output(TensorId id, void* data, size_t bytes) {
  outputs_.push_back({{}, id, nullptr, data, bytes});
  return *this;
}

// ---- Impl ----

HybridExecutor::Impl::Impl(std::vector<std::shared_ptr<Backend>> b, const CostModel& model,
                           ExecutorOptions o)
    : backends(std::move(b)), options(o), telemetry(o.max_events) {
  if (const char* env = std::getenv("TANDEM_ROUTED_EXPERTS"); env && std::string(env) == "0") {
    options.routed_expert_copies = false;
  }
  TANDEM_CHECK_ARG(!backends.empty(), "executor", "needs at least one backend");
  TANDEM_CHECK_ARG(backends.size() <= 63, "executor", "at most 63 backends");
  group_backend.push_back(-1);
  for (size_t i = 0; i < backends.size(); ++i) {
    TANDEM_CHECK_ARG(backends[i] != nullptr, "executor", "got a null backend");
    for (size_t j = 0; j < i; ++j) {
      TANDEM_CHECK_ARG(backends[j]->backend_id() != backends[i]->backend_id(), "executor",
                       "backend '" + backends[i]->backend_id() + "' given twice");
    }
    if (backends[i]->host_accessible()) {
      group.push_back(0);
      if (group_backend[0] < 0) group_backend[0] = int(i);
    } else {
      group.push_back(n_groups++);
      group_backend.push_back(int(i));
    }
    profiles.push_back(model.profile(*backends[i]));
  }
}

void HybridExecutor::Impl::bind(const std::string& name, const void* data, size_t bytes) {
  TANDEM_CHECK_ARG(data != nullptr && bytes > 0, "executor bind_weight",
                   "weight '" + name + "' needs data and a size");
  auto it = weights.find(name);
  if (it == weights.end()) {
    WeightEntry e;
    e.name = name;
    e.host = data;
    e.bytes = bytes;
    e.device.resize(backends.size());
    e.streamed.assign(backends.size(), false);
    weights.emplace(name, std::move(e));
    return;
  }
  WeightEntry& w = it->second;
  if (w.host == data && w.bytes == bytes) return;
  for (size_t b = 0; b < backends.size(); ++b) {
    if (w.device[b]) residency.remove(backends[b]->backend_id(), name);
    w.device[b].reset();
  }
  release_stream_sources(w);
  w.host = data;
  w.bytes = bytes;
  generation++;  // plans holding the old pointers are rebuilt
}

void HybridExecutor::Impl::release_stream_sources(WeightEntry& w) {
  for (size_t b = 0; b < backends.size(); ++b) {
    if (!w.streamed[b]) continue;
    w.streamed[b] = false;
    try {
      backends[b]->release_stream_source(w.host);
    } catch (...) {
    }
  }
}

void HybridExecutor::Impl::zero_fill(Backend& b, void* ptr, size_t bytes) {
  const std::vector<uint8_t> zeros(std::min<size_t>(bytes, size_t(1) << 20), 0);
  for (size_t done = 0; done < bytes; done += zeros.size()) {
    b.copy_from_host(static_cast<uint8_t*>(ptr) + done, zeros.data(),
                     std::min(zeros.size(), bytes - done));
  }
  b.synchronize();  // the zeros die here
}

// ---- HybridExecutor ----

HybridExecutor::HybridExecutor(const HybridScheduler& scheduler, ExecutorOptions options)
    : impl_(std::make_unique<Impl>(scheduler.backends(), scheduler.cost_model(), options)) {}

HybridExecutor::HybridExecutor(std::vector<std::shared_ptr<Backend>> backends,
                               ExecutorOptions options)
    : impl_(std::make_unique<Impl>(std::move(backends), CostModel(), options)) {}

HybridExecutor::~HybridExecutor() {
  if (!impl_) return;
  for (auto& [name, w] : impl_->weights) impl_->release_stream_sources(w);
  // Plans and caches free through their backends; let in-flight work finish first.
  for (auto& b : impl_->backends) {
    try {
      b->synchronize();
    } catch (...) {
    }
  }
}

void HybridExecutor::bind_weight(std::string name, const void* data, size_t bytes) {
  std::lock_guard lock(impl_->run_mutex);
  impl_->bind(name, data, bytes);
}

void HybridExecutor::refresh_weight(std::string_view name, size_t offset, size_t bytes) {
  std::lock_guard lock(impl_->run_mutex);
  auto it = impl_->weights.find(std::string(name));
  TANDEM_CHECK_ARG(it != impl_->weights.end(), "executor refresh_weight",
                   "weight '" + std::string(name) + "' is not bound");
  WeightEntry& w = it->second;
  TANDEM_CHECK_ARG(offset <= w.bytes && bytes <= w.bytes - offset, "executor refresh_weight",
                   "bytes " + std::to_string(offset) + "+" + std::to_string(bytes) +
                       " past weight '" + w.name + "' (" + std::to_string(w.bytes) + " bytes)");
  for (size_t b = 0; b < impl_->backends.size(); ++b) {
    if (!w.device[b]) continue;
    impl_->backends[b]->copy_from_host(static_cast<uint8_t*>(w.device[b].data()) + offset,
                                       static_cast<const uint8_t*>(w.host) + offset, bytes);
  }
}

namespace {
int index_of(const std::vector<std::shared_ptr<Backend>>& backends, std::string_view id) {
  for (size_t i = 0; i < backends.size(); ++i) {
    if (backends[i]->backend_id() == id) return int(i);
  }
  return -1;
}

std::string known_ids(const std::vector<std::shared_ptr<Backend>>& backends) {
  std::string s;
  for (const auto& b : backends) s += (s.empty() ? "" : ", ") + b->backend_id();
  return s;
}
}  // namespace

void HybridExecutor::preload_weight(std::string_view name, std::string_view backend_id) {
  std::lock_guard lock(impl_->run_mutex);
  int b = index_of(impl_->backends, backend_id);
  TANDEM_CHECK_ARG(b >= 0, "executor preload_weight",
                   "unknown backend '" + std::string(backend_id) +
                       "' (known: " + known_ids(impl_->backends) + ")");
  auto it = impl_->weights.find(std::string(name));
  TANDEM_CHECK_ARG(it != impl_->weights.end(), "executor preload_weight",
                   "weight '" + std::string(name) + "' is not bound");
  impl_->upload(it->second, b);
}

void HybridExecutor::preload(const Graph& graph, const Placement& placement,
                             const Progress& progress) {
  std::lock_guard lock(impl_->run_mutex);
  Impl& m = *impl_;
  TANDEM_CHECK_ARG(placement.nodes.size() == graph.size(), "executor preload",
                   "the placement has " + std::to_string(placement.nodes.size()) +
                       " nodes, the graph " + std::to_string(graph.size()));
  // The weights each device keeps (the placement's uploads), one by one so a caller can show
  // progress.
  std::vector<std::pair<WeightEntry*, int>> pending;
  size_t total = 0;
  for (const PlannedCopy& c : placement.copies) {
    if (c.kind != PlannedCopy::Kind::Upload) continue;
    TANDEM_CHECK_ARG(
        size_t(c.storage) < graph.size() && c.to >= 0 && size_t(c.to) < m.backends.size(),
        "executor preload", "the placement lists an upload the graph does not have");
    if (m.group[size_t(c.to)] == 0) continue;
    WeightEntry& w = m.bound_weight(graph.tensor(c.storage).name, graph.tensor(c.storage));
    if (w.device[size_t(c.to)]) continue;
    pending.emplace_back(&w, c.to);
    total += w.bytes;
  }
  size_t done = 0;
  for (const auto& [w, b] : pending) {
    m.upload(*w, b);
    done += w->bytes;
    if (progress) progress(done, total);
  }
  m.plan_for(graph, placement);
}

void HybridExecutor::evict_weight(std::string_view name) {
  std::lock_guard lock(impl_->run_mutex);
  auto it = impl_->weights.find(std::string(name));
  if (it == impl_->weights.end()) return;
  bool any = false;
  for (size_t b = 0; b < impl_->backends.size(); ++b) {
    if (!it->second.device[b]) continue;
    impl_->residency.remove(impl_->backends[b]->backend_id(), name);
    it->second.device[b].reset();
    any = true;
  }
  if (any) impl_->generation++;
}

void HybridExecutor::unbind_weight(std::string_view name) {
  std::lock_guard lock(impl_->run_mutex);
  auto it = impl_->weights.find(std::string(name));
  if (it == impl_->weights.end()) return;
  for (size_t b = 0; b < impl_->backends.size(); ++b) {
    if (it->second.device[b]) impl_->residency.remove(impl_->backends[b]->backend_id(), name);
  }
  impl_->release_stream_sources(it->second);
  impl_->weights.erase(it);
  impl_->generation++;  // plans holding its pointers are rebuilt
}

std::vector<std::string> HybridExecutor::release(std::string_view backend_id,
                                                 const Residency& keep) {
  std::lock_guard lock(impl_->run_mutex);
  Impl& m = *impl_;
  const int b = index_of(m.backends, backend_id);
  TANDEM_CHECK_ARG(
      b >= 0, "executor release",
      "unknown backend '" + std::string(backend_id) + "' (known: " + known_ids(m.backends) + ")");
  Backend& backend = *m.backends[size_t(b)];
  // Plans point into the memory freed below: compiled again when next run.
  m.plans.clear();
  m.generation++;
  for (auto& [name, w] : m.weights) {
    if (backend.lost() && w.streamed[size_t(b)]) {
      w.streamed[size_t(b)] = false;
      try {
        backend.release_stream_source(w.host);
      } catch (...) {
      }
    }
    if (!w.device[size_t(b)] || keep.contains(backend_id, name)) continue;
    m.residency.remove(backend_id, name);
    w.device[size_t(b)].reset();
  }
  std::vector<std::string> freed;
  for (auto it = m.caches.begin(); it != m.caches.end();) {
    if (it->second.home != b || keep.contains(backend_id, it->first)) {
      ++it;
      continue;
    }
    m.residency.remove(backend_id, it->first);
    freed.push_back(it->first);
    it = m.caches.erase(it);
  }
  std::sort(freed.begin(), freed.end());
  return freed;
}

const Residency& HybridExecutor::residency() const {
  return impl_->residency;
}
size_t HybridExecutor::resident_bytes(std::string_view backend_id) const {
  return impl_->residency.resident_bytes(backend_id);
}

size_t HybridExecutor::device_bytes(std::string_view backend_id) const {
  const Impl& m = *impl_;
  const int b = index_of(m.backends, backend_id);
  TANDEM_CHECK_ARG(
      b >= 0, "executor device_bytes",
      "unknown backend '" + std::string(backend_id) + "' (known: " + known_ids(m.backends) + ")");
  size_t bytes = m.residency.resident_bytes(backend_id);
  const int g = m.group[size_t(b)];
  if (g == 0) return bytes;
  for (const auto& [key, plan] : m.plans) {
    if (size_t(g) < plan->arenas.size()) bytes += plan->arenas[size_t(g)].bytes();
  }
  return bytes;
}

bool HybridExecutor::has_kv_cache(std::string_view name) const {
  return impl_->caches.count(std::string(name)) > 0;
}

std::string HybridExecutor::kv_cache_backend(std::string_view name) const {
  auto it = impl_->caches.find(std::string(name));
  return it == impl_->caches.end() ? "" : impl_->backends[size_t(it->second.home)]->backend_id();
}

void HybridExecutor::read_kv_cache(std::string_view name, void* host, size_t bytes) const {
  auto it = impl_->caches.find(std::string(name));
  TANDEM_CHECK_ARG(it != impl_->caches.end(), "executor read_kv_cache",
                   "no kv cache '" + std::string(name) + "'");
  TANDEM_CHECK_ARG(bytes == it->second.bytes, "executor read_kv_cache",
                   "cache '" + std::string(name) + "' holds " + std::to_string(it->second.bytes) +
                       " bytes (asked " + std::to_string(bytes) + ")");
  Backend& b = *impl_->backends[size_t(it->second.home)];
  b.synchronize();
  b.copy_to_host(host, it->second.buffer.data(), bytes);
}

void HybridExecutor::clear_kv_caches() {
  std::lock_guard lock(impl_->run_mutex);
  for (auto& [name, c] : impl_->caches) {
    impl_->zero_fill(*impl_->backends[size_t(c.home)], c.buffer.data(), c.bytes);
  }
}

Telemetry& HybridExecutor::telemetry() {
  return impl_->telemetry;
}
const Telemetry& HybridExecutor::telemetry() const {
  return impl_->telemetry;
}
const ExecutorStats& HybridExecutor::stats() const {
  return impl_->stats;
}
const ExecutorOptions& HybridExecutor::options() const {
  return impl_->options;
}
void HybridExecutor::set_timing(TimingMode timing) {
  impl_->options.timing = timing;
}
const std::vector<std::shared_ptr<Backend>>& HybridExecutor::backends() const {
  return impl_->backends;
}

namespace {

ExecutionEvent op_event(const Graph& graph, TensorId id) {
  ExecutionEvent e;
  const TensorDesc& d = graph.tensor(id);
  e.node = id;
  e.op = graph.node(id).op;
  e.n_dims = d.n_dims;
  e.shape = d.ne;
  e.dtype = d.dtype;
  return e;
}

// Binds the run's inputs and outputs to the plan's; every problem is reported before any work.
void resolve_bindings(const Graph& graph, ExecPlan& plan, const Bindings& bindings) {
  const char* where = "executor run";
  std::fill(plan.input_data.begin(), plan.input_data.end(), nullptr);
  std::fill(plan.output_dest.begin(), plan.output_dest.end(), nullptr);
  for (const Bindings::Entry& e : bindings.inputs()) {
    size_t k = 0;
    for (; k < plan.inputs.size(); ++k) {
      if (e.id != kNoTensor ? plan.inputs[k].id == e.id : plan.inputs[k].name == e.name) break;
    }
    std::string label = e.id != kNoTensor ? "tensor " + std::to_string(e.id) : "'" + e.name + "'";
    TANDEM_CHECK_ARG(k < plan.inputs.size(), where, "input " + label + " is not a graph input");
    TANDEM_CHECK_ARG(e.data != nullptr, where, "input " + label + " has no data");
    TANDEM_CHECK_ARG(e.bytes == plan.inputs[k].bytes, where,
                     "input " + label + " is bound with " + std::to_string(e.bytes) +
                         " bytes, the graph's " + desc_string(graph.tensor(plan.inputs[k].id)) +
                         " needs " + std::to_string(plan.inputs[k].bytes));
    plan.input_data[k] = e.data;
  }
  for (size_t k = 0; k < plan.inputs.size(); ++k) {
    TANDEM_CHECK_ARG(plan.input_data[k] != nullptr || !plan.inputs[k].used, where,
                     "input '" + plan.inputs[k].name + "' is not bound");
  }
  for (const Bindings::Entry& e : bindings.outputs()) {
    size_t k = 0;
    for (; k < plan.outputs.size(); ++k) {
      if (e.id != kNoTensor ? plan.outputs[k].id == e.id : plan.outputs[k].name == e.name) break;
    }
    std::string label = e.id != kNoTensor ? "tensor " + std::to_string(e.id) : "'" + e.name + "'";
    TANDEM_CHECK_ARG(k < plan.outputs.size(), where,
                     "output " + label + " is not a graph output (Graph::mark_output)");
    TANDEM_CHECK_ARG(e.out != nullptr, where, "output " + label + " has no destination");
    TANDEM_CHECK_ARG(e.bytes == plan.outputs[k].bytes, where,
                     "output " + label + " has room for " + std::to_string(e.bytes) +
                         " bytes, the graph's " + desc_string(graph.tensor(plan.outputs[k].id)) +
                         " needs " + std::to_string(plan.outputs[k].bytes));
    plan.output_dest[k] = e.out;
  }
}

}  // namespace

void HybridExecutor::run(const Graph& graph, const Placement& placement, const Bindings& bindings) {
  Impl& m = *impl_;
  std::lock_guard lock(m.run_mutex);
  const char* where = "executor run";
  for (const Bindings::Entry& w : bindings.weights()) m.bind(w.name, w.data, w.bytes);
  TANDEM_CHECK_ARG(placement.nodes.size() == graph.size(), where,
                   "the placement has " + std::to_string(placement.nodes.size()) +
                       " nodes, the graph " + std::to_string(graph.size()));
  ExecPlan& plan = m.plan_for(graph, placement);
  resolve_bindings(graph, plan, bindings);
  // The graph object may be new (same structure): point the executions at its nodes.
  for (size_t e = 0; e < plan.execs.size(); ++e) {
    const Node& node = graph.nodes()[size_t(plan.exec_id[e])];
    TANDEM_CHECK_ARG(
        node.op == plan.exec_op[e], where,
        "the graph does not match the placement at node " + std::to_string(plan.exec_id[e]));
    NodeExecution& ex = plan.execs[e];
    ex.node = &node;
    ex.output.desc = &graph.tensor(node.id);
    for (size_t k = 0; k < node.inputs.size(); ++k)
      ex.inputs[k].desc = &graph.tensor(node.inputs[k]);
  }

  const TimingMode timing = m.options.timing;
  const bool record = m.options.record_events;
  // An untimed run of a plan that ran untimed before stores its transfers only: its op events
  // are those of the first run, whose tally it adds (RunTally).
  const bool record_ops = record && !(timing == TimingMode::Off && plan.untimed);
  // Reused from run to run (runs hold run_mutex): no allocation per decode step.
  std::vector<ExecutionEvent>& events = m.run_events;
  events.clear();
  if (record) events.reserve(plan.execs.size() + plan.transfers.size() + 1);
  const size_t nb = m.backends.size();
  std::vector<bool> dirty(nb, false);
  auto sync_host = [&](int except) {
    for (size_t b = 0; b < nb; ++b) {
      if (dirty[b] && int(b) != except && m.group[b] == 0) {
        m.backends[b]->synchronize();
        dirty[b] = false;
      }
    }
  };
  // Devices with asynchronous copies to or from host memory still in flight: host code waits
  // for them before it reads or overwrites host memory.
  std::vector<bool> host_copies(nb, false);
  auto wait_host_copies = [&] {
    for (size_t b = 0; b < nb; ++b) {
      if (host_copies[b]) m.backends[b]->wait_host_copies();
      host_copies[b] = false;
    }
  };
  const double run_start = m.telemetry.now_us();
  size_t transfer_bytes = 0, transfers = 0, peer_transfers = 0, streamed_bytes = 0;
  struct Routed {
    size_t copy = 0;
    size_t event = 0;  // SIZE_MAX: none recorded
  };
  std::vector<Routed> routed;  // the run's Route steps
  // TimingMode::Timeline: device marks around each segment and after each streamed copy, read
  // once everything has finished. `event` indexes the ExecutionEvent the marks fill in.
  const bool timeline = timing == TimingMode::Timeline && record;
  struct Marks {
    int backend = 0;
    int start = 0;  // segment: before it; copy: the execution it waited for
    int end = 0;
    size_t event = 0;
  };
  std::vector<Marks> segment_marks, copy_marks;
  std::vector<double> zero_us(nb, 0.0);
  if (timeline) {
    for (size_t b = 0; b < nb; ++b) {
      if (!plan.backend_used[b]) continue;
      m.backends[b]->timeline_reset();
      zero_us[b] = m.telemetry.now_us();
      (void)m.backends[b]->timeline_mark(false);
    }
  }
  // The backend the run is calling into: an error escaping names it (Error::backend).
  int active = -1;
  // After an error: every backend idle; outputs are untouched and all memory stays owned.
  auto idle_all = [&] {
    for (auto& b : m.backends) {
      try {
        b->synchronize();
      } catch (...) {
      }
    }
  };
  try {
    for (const Step& step : plan.steps) {
      if (step.kind == StepKind::Stream || step.kind == StepKind::Route) {
        const StreamedCopy& c = plan.streamed[step.index];
        Backend& dst = *m.backends[size_t(c.backend)];
        active = c.backend;
        const double t0 = record ? m.telemetry.now_us() : 0.0;
        const int waited = timeline ? dst.timeline_mark(false) : 0;
        size_t bytes = 0;  // a Route step's: counted once the device has written its flags
        if (step.kind == StepKind::Route) {
          dst.stream_routed_experts(c.dst_ptr, c.host, c.expert_bytes, c.n_expert, c.ids_ptr,
                                    c.n_ids, c.used, c.event);
          routed.push_back({step.index, record ? events.size() : SIZE_MAX});
        } else if (c.n_expert == 0) {
          dst.stream_from_host(c.dst_ptr, c.host, c.bytes, c.event);
          bytes = c.bytes;
        } else {
          // The experts the previous run used, in runs of neighbours; the rest once routed.
          const size_t eb = c.expert_bytes;
          for (size_t e = 0; e < size_t(c.n_expert);) {
            if (c.used[e] == 0) {
              ++e;
              continue;
            }
            size_t end = e + 1;
            while (end < size_t(c.n_expert) && c.used[end] != 0) ++end;
            dst.stream_from_host(static_cast<uint8_t*>(c.dst_ptr) + e * eb,
                                 static_cast<const uint8_t*>(c.host) + e * eb, (end - e) * eb,
                                 c.event);
            bytes += (end - e) * eb;
            e = end;
          }
        }
        if (timeline)
          copy_marks.push_back({c.backend, waited, dst.timeline_mark(true), events.size()});
        dirty[size_t(c.backend)] = true;
        streamed_bytes += bytes;
        if (record) {
          ExecutionEvent e = op_event(graph, c.storage);
          e.kind = EventKind::Transfer;
          e.streamed = true;
          e.timestamp_us = t0;
          e.backend = dst.backend_id();
          e.source_backend = "host";
          if (c.n_expert > 0) e.expert_copy = step.kind == StepKind::Route ? 2 : 1;
          e.transfer_bytes = bytes;
          e.estimated_us = CostModel::stream_us(bytes, m.profiles[size_t(c.backend)].link);
          e.transfer_us = e.estimated_us;
          events.push_back(std::move(e));
        }
        continue;
      }
      if (step.kind == StepKind::Wait) {
        const StreamedCopy& c = plan.streamed[step.index];
        active = c.backend;
        m.backends[size_t(c.backend)]->wait_stream_event(c.event);
        continue;
      }
      if (step.kind == StepKind::Transfer) {
        const PlannedTransfer& t = plan.transfers[step.index];
        const void* src = t.src_group == kUserInput ? plan.input_data[t.input_index] : t.src_ptr;
        active = t.src_group > 0 ? t.src_backend : t.dst_backend;
        // Host memory is read or overwritten: host-side work must be done.
        if (t.src_group <= 0 || t.dst_group == 0) sync_host(-1);
        const double t0 = record ? m.telemetry.now_us() : 0.0;
        if (t.dst_group == 0) {
          if (t.src_group > 0) {
            Backend& from = *m.backends[size_t(t.src_backend)];
            if (from.download_async(t.dst_ptr, src, t.bytes)) {
              host_copies[size_t(t.src_backend)] = true;
              dirty[size_t(t.src_backend)] = true;
            }
          } else {
            wait_host_copies();  // the destination may still be read by an upload
            std::memcpy(t.dst_ptr, src, t.bytes);
          }
        } else {
          Backend& dst = *m.backends[size_t(t.dst_backend)];
          if (t.src_group > 0) {
            m.backends[size_t(t.src_backend)]->copy_to_peer(dst, t.dst_ptr, src, t.bytes);
            dirty[size_t(t.src_backend)] = true;
            ++peer_transfers;
          } else {
            // A download into the source may still be in flight.
            if (t.src_group == 0) wait_host_copies();
            if (dst.upload_async(t.dst_ptr, src, t.bytes))
              host_copies[size_t(t.dst_backend)] = true;
          }
          dirty[size_t(t.dst_backend)] = true;
          if (timing == TimingMode::PerOp) dst.synchronize();
        }
        // Staging a bound input into host memory is not a crossing between memories.
        if (t.src_group == kUserInput && t.dst_group == 0) continue;
        transfer_bytes += t.bytes;
        ++transfers;
        if (record) {
          ExecutionEvent e = op_event(graph, t.storage);
          e.kind = EventKind::Transfer;
          e.timestamp_us = t0;
          e.backend = m.backends[size_t(t.dst_backend)]->backend_id();
          e.source_backend = t.src_group == kUserInput ? "host"
                             : t.src_backend < 0       ? "host"
                                                 : m.backends[size_t(t.src_backend)]->backend_id();
          e.estimated_us = t.estimated_us;
          e.transfer_bytes = t.bytes;
          e.transfer_us = timing == TimingMode::PerOp ? m.telemetry.now_us() - t0 : t.estimated_us;
          if (timing == TimingMode::PerOp) e.actual_us = e.transfer_us;
          events.push_back(std::move(e));
        }
        continue;
      }
      Backend& backend = *m.backends[size_t(step.backend)];
      active = step.backend;
      if (m.group[size_t(step.backend)] == 0) {
        sync_host(step.backend);
        wait_host_copies();
      }
      std::span<const NodeExecution> segment(plan.execs.data() + step.index, step.count);
      if (timing == TimingMode::PerOp) {
        for (size_t k = 0; k < step.count; ++k) {
          const double t0 = m.telemetry.now_us();
          const NodeExecution& exec = plan.execs[step.index + k];
          backend.timer_start();
          backend.execute(graph, exec);
          const double us = backend.timer_stop_us();
          if (record) {
            TensorId id = plan.exec_id[step.index + k];
            ExecutionEvent e = op_event(graph, id);
            e.timestamp_us = t0;
            e.backend = backend.backend_id();
            e.reason = placement.at(id).reason.kind;
            e.estimated_us = placement.at(id).estimated_cost.compute_us;
            // An attention's positions, where the host reads them, say how much of its cache
            // it read.
            if (exec.node->op == OpKind::Attention && backend.host_accessible() &&
                exec.inputs.size() > 3) {
              e.work_scale = CostModel::attention_work_scale(
                  graph, *exec.node, static_cast<const int32_t*>(exec.inputs[3].data));
              if (e.work_scale < 1.0) {
                e.estimated_us = CostModel::compute_us_at(
                    graph, *exec.node, m.profiles[size_t(step.backend)], e.work_scale);
              }
            }
            e.actual_us = us;
            events.push_back(std::move(e));
          }
        }
      } else if (timeline) {
        const int start = backend.timeline_mark(false);
        backend.execute_segment(graph, segment, step.signature);
        segment_marks.push_back({step.backend, start, backend.timeline_mark(false), events.size()});
        const TensorId first = plan.exec_id[step.index];
        ExecutionEvent e = op_event(graph, first);
        e.kind = EventKind::Segment;
        e.backend = backend.backend_id();
        e.reason = placement.at(first).reason.kind;
        e.segment_ops = int(step.count);
        for (size_t k = 0; k < step.count; ++k) {
          e.estimated_us += placement.at(plan.exec_id[step.index + k]).estimated_cost.compute_us;
        }
        events.push_back(std::move(e));
      } else {
        const double t0 = record_ops ? m.telemetry.now_us() : 0.0;
        backend.execute_segment(graph, segment, step.signature);
        if (record_ops) {
          for (size_t k = 0; k < step.count; ++k) {
            TensorId id = plan.exec_id[step.index + k];
            ExecutionEvent e = op_event(graph, id);
            e.timestamp_us = t0;
            e.backend = backend.backend_id();
            e.reason = placement.at(id).reason.kind;
            e.estimated_us = placement.at(id).estimated_cost.compute_us;
            events.push_back(std::move(e));
          }
        }
      }
      dirty[size_t(step.backend)] = true;
    }
    // Device outputs: downloads queued behind the step's work, waited for with the copies,
    // straight into the caller's memory where the device page-locked it (the session's logits:
    // no host copy of 0.5 MB after every decode step), else into the plan's staging.
    uint8_t* staging = plan.staging_data();
    for (size_t k = 0; k < plan.outputs.size(); ++k) {
      const ExecPlan::Output& o = plan.outputs[k];
      plan.output_direct[k] = 0;
      if (!plan.output_dest[k] || o.backend < 0) continue;
      Backend& from = *m.backends[size_t(o.backend)];
      active = o.backend;
      void* dst = staging + o.staging_offset;
      if (from.host_is_page_locked(plan.output_dest[k], o.bytes)) {
        dst = plan.output_dest[k];
        plan.output_direct[k] = 1;
      }
      if (from.download_async(dst, o.src_ptr, o.bytes)) host_copies[size_t(o.backend)] = true;
    }
    active = -1;
    wait_host_copies();
    for (size_t b = 0; b < nb; ++b) {
      active = int(b);
      if (plan.backend_used[b] || dirty[b]) m.backends[b]->synchronize();
    }
    active = -1;
    // What each Route step copied (2 in its flags), now that the devices are done.
    for (const Routed& r : routed) {
      const StreamedCopy& c = plan.streamed[r.copy];
      size_t n = 0;
      for (int e = 0; e < c.n_expert; ++e) n += c.used[e] == 2;
      streamed_bytes += n * c.expert_bytes;
      if (r.event == SIZE_MAX) continue;
      ExecutionEvent& e = events[r.event];
      e.transfer_bytes = n * c.expert_bytes;
      e.estimated_us = CostModel::stream_us(e.transfer_bytes, m.profiles[size_t(c.backend)].link);
      e.transfer_us = e.estimated_us;
    }
    if (timeline) {
      for (const Marks& seg : segment_marks) {
        Backend& b = *m.backends[size_t(seg.backend)];
        const double start = b.timeline_us(seg.start);
        events[seg.event].timestamp_us = zero_us[size_t(seg.backend)] + start;
        events[seg.event].actual_us = b.timeline_us(seg.end) - start;
      }
      // A copy queue runs in order: a copy starts when the one before it is done and the
      // execution it waits for has finished.
      std::vector<double> queue_free(nb, 0.0);
      for (const Marks& c : copy_marks) {
        Backend& b = *m.backends[size_t(c.backend)];
        const double end = b.timeline_us(c.end);
        const double start = std::max(queue_free[size_t(c.backend)], b.timeline_us(c.start));
        queue_free[size_t(c.backend)] = end;
        ExecutionEvent& e = events[c.event];
        e.timestamp_us = zero_us[size_t(c.backend)] + start;
        e.actual_us = e.transfer_us = std::max(0.0, end - start);
      }
    }
  } catch (Error& e) {
    idle_all();
    if (e.backend().empty() && active >= 0) e.set_backend(m.backends[size_t(active)]->backend_id());
    throw;
  } catch (...) {
    idle_all();
    throw;
  }
  for (size_t k = 0; k < plan.outputs.size(); ++k) {
    const ExecPlan::Output& o = plan.outputs[k];
    if (!plan.output_dest[k] || plan.output_direct[k]) continue;
    const void* src = o.backend >= 0 ? plan.staging_data() + o.staging_offset : o.src_ptr;
    std::memcpy(plan.output_dest[k], src, o.bytes);
  }
  m.stats.runs++;
  m.stats.transfers += transfers;
  m.stats.peer_transfers += peer_transfers;
  m.stats.transfer_bytes += transfer_bytes;
  m.stats.streamed_weights += plan.streamed.size();
  m.stats.streamed_bytes += streamed_bytes;
  if (timing != TimingMode::Off) {
    ExecutionEvent g;
    g.kind = EventKind::Graph;
    g.timestamp_us = run_start;
    g.estimated_us = placement.estimated_us;
    g.actual_us = m.telemetry.now_us() - run_start;
    g.backend = "graph";
    events.push_back(std::move(g));
  }
  if (timing == TimingMode::Off && record) {
    if (plan.untimed) {
      m.telemetry.add_untimed_run(*plan.untimed);
    } else {
      plan.untimed = std::make_unique<RunTally>(tally_events(events));
    }
  }
  if (!events.empty()) m.telemetry.record_executions(events);
}

}  // namespace tandem
