#include "tandem/telemetry.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tandem/bytes.h"
#include "tandem/dtype.h"

namespace tandem {

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

nlohmann::json shape_json(const ExecutionEvent& e) {
  nlohmann::json s = nlohmann::json::array();
  for (int i = 0; i < std::max(1, e.n_dims); ++i) s.push_back(e.shape[size_t(i)]);
  return s;
}

std::string_view event_name(const ExecutionEvent& e) {
  if (e.kind == EventKind::Graph) return "graph";
  if (e.kind == EventKind::Segment) return "segment";
  return op_name(e.op);
}
}  // namespace

std::string_view event_kind_name(EventKind kind) {
  switch (kind) {
    case EventKind::Op:
      return "op";
    case EventKind::Transfer:
      return "transfer";
    case EventKind::Graph:
      return "graph";
    case EventKind::Segment:
      return "segment";
  }
  return "unknown";
}

Telemetry::Telemetry(size_t max_events) : max_events_(max_events), epoch_ns_(steady_ns()) {}

double Telemetry::now_us() const {
  return double(steady_ns() - epoch_ns_) / 1000.0;
}

void Telemetry::record_execution(ExecutionEvent event) {
  std::lock_guard lock(mutex_);
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(event));
}

namespace {

void add_usage(BackendUsage& into, const BackendUsage& u) {
  into.ops += u.ops;
  into.actual_us += u.actual_us;
  into.estimated_us += u.estimated_us;
  into.transfers_in += u.transfers_in;
  into.transfer_bytes += u.transfer_bytes;
  into.transfer_us += u.transfer_us;
}

void add_summary(ExecutionSummary& into, const ExecutionSummary& s) {
  into.ops += s.ops;
  into.transfers += s.transfers;
  into.graphs += s.graphs;
  into.transfer_bytes += s.transfer_bytes;
  into.actual_us += s.actual_us;
  into.estimated_us += s.estimated_us;
  into.transfer_us += s.transfer_us;
  into.graph_us += s.graph_us;
  into.expert_tensor_bytes += s.expert_tensor_bytes;
  into.expert_ahead_bytes += s.expert_ahead_bytes;
  into.expert_routed_bytes += s.expert_routed_bytes;
  for (const auto& [id, u] : s.backends) add_usage(into.backends[id], u);
}

void add_op_types(std::map<std::string, OpTypeStats>& into,
                  const std::map<std::string, OpTypeStats>& m) {
  for (const auto& [op, o] : m) {
    OpTypeStats& s = into[op];
    s.count += o.count;
    s.actual_us += o.actual_us;
    s.estimated_us += o.estimated_us;
  }
}

ExecutionSummary summarize(const std::vector<ExecutionEvent>& events) {
  ExecutionSummary s;
  for (const ExecutionEvent& e : events) {
    switch (e.kind) {
      case EventKind::Op: {
        BackendUsage& u = s.backends[e.backend];
        u.ops++;
        u.actual_us += std::max(0.0, e.actual_us);
        u.estimated_us += e.estimated_us;
        s.ops++;
        s.actual_us += std::max(0.0, e.actual_us);
        s.estimated_us += e.estimated_us;
        break;
      }
      case EventKind::Transfer: {
        BackendUsage& u = s.backends[e.backend];
        u.transfers_in++;
        u.transfer_bytes += e.transfer_bytes;
        u.transfer_us += e.transfer_us;
        s.transfers++;
        s.transfer_bytes += e.transfer_bytes;
        s.transfer_us += e.transfer_us;
        if (e.expert_copy == 1) {
          Dims ne{1, 1, 1, 1};
          for (int d = 0; d < e.n_dims && d < kMaxDims; ++d) ne[size_t(d)] = e.shape[size_t(d)];
          s.expert_tensor_bytes += size_t(ne[1] * ne[2] * ne[3]) * row_bytes(e.dtype, ne[0]);
          s.expert_ahead_bytes += e.transfer_bytes;
        }
        if (e.expert_copy == 2) s.expert_routed_bytes += e.transfer_bytes;
        break;
      }
      case EventKind::Graph:
        s.graphs++;
        s.graph_us += std::max(0.0, e.actual_us);
        break;
      case EventKind::Segment:  // time on its backend; its ops are not counted one by one
        s.backends[e.backend].actual_us += std::max(0.0, e.actual_us);
        break;
    }
  }
  return s;
}

std::map<std::string, OpTypeStats> op_types_of(const std::vector<ExecutionEvent>& events) {
  std::map<std::string, OpTypeStats> m;
  for (const ExecutionEvent& e : events) {
    if (e.kind != EventKind::Op) continue;
    OpTypeStats& s = m[std::string(op_name(e.op))];
    s.count++;
    s.actual_us += std::max(0.0, e.actual_us);
    s.estimated_us += e.estimated_us;
  }
  return m;
}

}  // namespace

RunTally tally_events(const std::vector<ExecutionEvent>& events) {
  std::vector<ExecutionEvent> ops;
  for (const ExecutionEvent& e : events) {
    if (e.kind == EventKind::Op) ops.push_back(e);
  }
  return {summarize(ops), op_types_of(ops)};
}

void Telemetry::add_untimed_run(const RunTally& tally) {
  std::lock_guard lock(mutex_);
  add_summary(untimed_.summary, tally.summary);
  add_op_types(untimed_.op_types, tally.op_types);
}

void Telemetry::record_executions(std::vector<ExecutionEvent>& events) {
  std::lock_guard lock(mutex_);
  for (ExecutionEvent& e : events) {
    if (events_.size() >= max_events_) {
      ++dropped_;
      continue;
    }
    events_.push_back(std::move(e));
  }
  events.clear();
}

std::vector<ExecutionEvent> Telemetry::get_telemetry() const {
  std::lock_guard lock(mutex_);
  return events_;
}

void Telemetry::clear_telemetry() {
  std::lock_guard lock(mutex_);
  events_.clear();
  untimed_ = {};
  dropped_ = 0;
}

size_t Telemetry::size() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

size_t Telemetry::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

ExecutionSummary Telemetry::execution_summary() const {
  std::lock_guard lock(mutex_);
  ExecutionSummary s = summarize(events_);
  add_summary(s, untimed_.summary);
  return s;
}

std::map<std::string, BackendUsage> Telemetry::backend_usage_stats() const {
  return execution_summary().backends;
}

std::map<std::string, OpTypeStats> Telemetry::operations_by_type() const {
  std::lock_guard lock(mutex_);
  std::map<std::string, OpTypeStats> m = op_types_of(events_);
  add_op_types(m, untimed_.op_types);
  return m;
}

void Telemetry::print_debug_summary(std::ostream& os) const {
  ExecutionSummary s = execution_summary();
  auto by_type = operations_by_type();
  char line[256];
  os << "== tandem execution summary ==\n";
  if (s.ops == 0 && s.transfers == 0 && s.graphs == 0) {
    os << "no operations recorded\n";
  }
  std::snprintf(line, sizeof line, "%-12s %8s %12s %12s %10s %14s %12s\n", "backend", "ops",
                "actual_us", "est_us", "xfers_in", "xfer_bytes", "xfer_us");
  os << line;
  for (const auto& [id, u] : s.backends) {
    std::snprintf(line, sizeof line, "%-12s %8zu %12.1f %12.1f %10zu %14zu %12.1f\n", id.c_str(),
                  u.ops, u.actual_us, u.estimated_us, u.transfers_in, u.transfer_bytes,
                  u.transfer_us);
    os << line;
  }
  std::snprintf(line, sizeof line, "%-12s %8zu %12.1f %12.1f %10zu %14zu %12.1f\n", "total", s.ops,
                s.actual_us, s.estimated_us, s.transfers, s.transfer_bytes, s.transfer_us);
  os << line;
  if (!by_type.empty()) {
    std::snprintf(line, sizeof line, "%-18s %8s %12s %12s %8s\n", "op", "count", "actual_us",
                  "est_us", "share");
    os << line;
    for (const auto& [op, t] : by_type) {
      double share = s.actual_us > 0 ? 100.0 * t.actual_us / s.actual_us : 0.0;
      std::snprintf(line, sizeof line, "%-18s %8zu %12.1f %12.1f %7.1f%%\n", op.c_str(), t.count,
                    t.actual_us, t.estimated_us, share);
      os << line;
    }
  }
  if (s.expert_tensor_bytes > 0) {
    const double whole = double(s.expert_tensor_bytes);
    std::snprintf(line, sizeof line,
                  "expert tensors streamed by expert: %.1f%% of their %s (%.1f%% ahead of the "
                  "router, %.1f%% after it)\n",
                  100.0 * double(s.expert_ahead_bytes + s.expert_routed_bytes) / whole,
                  format_bytes(s.expert_tensor_bytes).c_str(),
                  100.0 * double(s.expert_ahead_bytes) / whole,
                  100.0 * double(s.expert_routed_bytes) / whole);
    os << line;
  }
  if (s.graphs > 0) {
    std::snprintf(line, sizeof line, "graphs: %zu, %.1f us each on average\n", s.graphs,
                  s.graph_us / double(s.graphs));
    os << line;
  }
  if (s.ops > 0 && s.actual_us == 0.0) {
    // Untimed, an op keeps the plan's estimate: an attention's is for every position of its
    // cache, not the positions it read (the executor scales it only where it times the op).
    os << "(op times not measured: timing is off; the estimates are the plan's, an attention's "
          "for its whole cache)\n";
  }
}

std::string Telemetry::to_chrome_trace_json() const {
  using nlohmann::json;
  std::vector<ExecutionEvent> events = get_telemetry();
  json trace = json::array();
  trace.push_back({{"name", "process_name"},
                   {"ph", "M"},
                   {"pid", 1},
                   {"tid", 0},
                   {"args", {{"name", "tandem"}}}});
  // One track per backend in order of appearance, one per device copy queue (streamed
  // weights), then transfers and graphs.
  std::map<std::string, int> tids;
  std::vector<std::string> names;
  auto track = [&](const std::string& name) {
    auto it = tids.find(name);
    if (it != tids.end()) return it->second;
    int tid = int(names.size()) + 1;
    tids.emplace(name, tid);
    names.push_back(name);
    return tid;
  };
  auto copy_track = [](const ExecutionEvent& e) { return e.backend + " copy queue"; };
  for (const ExecutionEvent& e : events) {
    if (e.kind == EventKind::Op || e.kind == EventKind::Segment) track(e.backend);
  }
  for (const ExecutionEvent& e : events) {
    if (e.streamed) track(copy_track(e));
  }
  const int transfers = track("transfers");
  const int graphs = track("graphs");
  for (size_t i = 0; i < names.size(); ++i) {
    trace.push_back({{"name", "thread_name"},
                     {"ph", "M"},
                     {"pid", 1},
                     {"tid", int(i) + 1},
                     {"args", {{"name", names[i]}}}});
  }
  // Untimed events share a submit time; lay them end to end so slices do not overlap.
  std::map<int, double> cursor;
  for (const ExecutionEvent& e : events) {
    int tid = e.kind == EventKind::Op || e.kind == EventKind::Segment ? track(e.backend)
              : e.streamed                                            ? track(copy_track(e))
              : e.kind == EventKind::Transfer                         ? transfers
                                                                      : graphs;
    double dur = e.actual_us >= 0                ? e.actual_us
                 : e.kind == EventKind::Transfer ? e.transfer_us
                                                 : e.estimated_us;
    double ts = std::max(e.timestamp_us, cursor[tid]);
    cursor[tid] = ts + dur;
    json args = {{"node", e.node},
                 {"shape", shape_json(e)},
                 {"dtype", std::string(dtype_name(e.dtype))},
                 {"backend", e.backend},
                 {"estimated_us", e.estimated_us},
                 {"timed", e.actual_us >= 0}};
    if (e.kind == EventKind::Op) args["reason"] = std::string(reason_kind_name(e.reason));
    if (e.kind == EventKind::Segment) args["ops"] = e.segment_ops;
    if (e.kind == EventKind::Transfer) {
      args["from"] = e.source_backend;
      args["transfer_bytes"] = e.transfer_bytes;
      args["streamed"] = e.streamed;
    }
    trace.push_back({{"name", std::string(event_name(e))},
                     {"cat", std::string(event_kind_name(e.kind))},
                     {"ph", "X"},
                     {"ts", ts},
                     {"dur", dur},
                     {"pid", 1},
                     {"tid", tid},
                     {"args", args}});
  }
  return json{{"traceEvents", trace}, {"displayTimeUnit", "ms"}}.dump();
}

namespace {

// The summary object of to_json() and summary_json(): totals, per backend, per op type.
nlohmann::json summary_object(const Telemetry& t) {
  using nlohmann::json;
  ExecutionSummary s = t.execution_summary();
  json backends = json::object();
  for (const auto& [id, u] : s.backends) {
    backends[id] = {{"ops", u.ops},
                    {"actual_us", u.actual_us},
                    {"estimated_us", u.estimated_us},
                    {"transfers_in", u.transfers_in},
                    {"transfer_bytes", u.transfer_bytes},
                    {"transfer_us", u.transfer_us}};
  }
  json ops = json::object();
  for (const auto& [op, o] : t.operations_by_type()) {
    ops[op] = {{"count", o.count}, {"actual_us", o.actual_us}, {"estimated_us", o.estimated_us}};
  }
  json summary = {{"ops", s.ops},
                  {"transfers", s.transfers},
                  {"graphs", s.graphs},
                  {"transfer_bytes", s.transfer_bytes},
                  {"actual_us", s.actual_us},
                  {"estimated_us", s.estimated_us},
                  {"transfer_us", s.transfer_us},
                  {"graph_us", s.graph_us},
                  {"backends", backends},
                  {"operations_by_type", ops}};
  return summary;
}

}  // namespace

std::string Telemetry::to_json() const {
  using nlohmann::json;
  std::vector<ExecutionEvent> events = get_telemetry();
  json list = json::array();
  for (const ExecutionEvent& e : events) {
    list.push_back({{"kind", std::string(event_kind_name(e.kind))},
                    {"timestamp_us", e.timestamp_us},
                    {"node", e.node},
                    {"op", std::string(event_name(e))},
                    {"shape", shape_json(e)},
                    {"dtype", std::string(dtype_name(e.dtype))},
                    {"backend", e.backend},
                    {"source_backend", e.source_backend},
                    {"reason", std::string(reason_kind_name(e.reason))},
                    {"estimated_us", e.estimated_us},
                    {"actual_us", e.actual_us},
                    {"transfer_bytes", e.transfer_bytes},
                    {"transfer_us", e.transfer_us},
                    {"streamed", e.streamed}});
  }
  return json{{"events", list}, {"dropped", dropped()}, {"summary", summary_object(*this)}}.dump(2);
}

std::string Telemetry::summary_json() const {
  return summary_object(*this).dump();
}

}  // namespace tandem
