// Telemetry: one ExecutionEvent per executed op and per transfer (and one per graph when
// timed per graph), summaries per backend and per op type, a readable table, and exports as
// Chrome trace JSON (Perfetto / chrome://tracing) and plain JSON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "tandem/graph.h"
#include "tandem/scheduler.h"

namespace tandem {

inline constexpr size_t kDefaultMaxEvents = size_t(1) << 20;

// Segment: consecutive ops of one backend timed as a whole (TimingMode::Timeline).
enum class EventKind : uint8_t { Op, Transfer, Graph, Segment };
std::string_view event_kind_name(EventKind kind);

struct ExecutionEvent {
  EventKind kind = EventKind::Op;
  double timestamp_us = 0.0;  // start, microseconds since the Telemetry was created
  TensorId node = kNoTensor;  // the op's node, or the tensor a transfer moved
  OpKind op = OpKind::Input;  // the op (for a transfer: the op that produced the tensor)
  int n_dims = 1;
  Dims shape{1, 1, 1, 1};
  DType dtype = DType::F32;
  std::string backend;         // where it ran; for a transfer the destination
  std::string source_backend;  // transfers only: the source ("host" for bound data)
  SelectionReason::Kind reason = SelectionReason::Kind::None;
  double estimated_us = 0.0;
  double actual_us = -1.0;  // < 0: not measured (TimingMode::Off)
  size_t transfer_bytes = 0;
  double transfer_us = 0.0;  // measured when timed, else the estimate
  bool streamed = false;     // a weight streamed on the device's copy queue
  // A streamed expert tensor copied by expert (ExecutorOptions::routed_expert_copies): 1 its
  // copy ahead of the router, 2 its copy of the experts the router named that the first missed.
  uint8_t expert_copy = 0;
  int segment_ops = 0;  // Segment events: ops in the segment (node/op: its first)
  // Ops timed alone: the share of the work its shapes bound the op did (an attention over a
  // cache longer than its positions read; CostModel::attention_work_scale), which the estimate
  // and what the model learns from the op take into account.
  double work_scale = 1.0;
};

struct BackendUsage {
  size_t ops = 0;
  double actual_us = 0.0;  // sum of measured op times
  double estimated_us = 0.0;
  size_t transfers_in = 0;  // transfers whose destination is this backend
  size_t transfer_bytes = 0;
  double transfer_us = 0.0;
};
using BackendStats = BackendUsage;  // the seed's name

struct OpTypeStats {
  size_t count = 0;
  double actual_us = 0.0;
  double estimated_us = 0.0;
};

struct ExecutionSummary {
  size_t ops = 0;
  size_t transfers = 0;
  size_t graphs = 0;
  size_t transfer_bytes = 0;
  double actual_us = 0.0;  // ops only
  double estimated_us = 0.0;
  double transfer_us = 0.0;
  double graph_us = 0.0;  // sum of per-graph wall times (TimingMode::PerGraph and PerOp)
  std::map<std::string, BackendUsage> backends;
  // Expert tensors streamed by expert: the bytes whole copies would have carried, and what the
  // copies ahead of the router and after it carried (how much of its experts a workload uses).
  size_t expert_tensor_bytes = 0;
  size_t expert_ahead_bytes = 0;
  size_t expert_routed_bytes = 0;
};

// What the op events of one untimed run (TimingMode::Off) add to the summaries. They hold no
// measurement, only the plan's placement, the same on every run of the plan: the executor stores
// them the first time a plan runs untimed, and on its later untimed runs adds their tally and
// stores the transfers alone (an 8B decode step has 547 op events; storing them every token took
// ~50 us of it).
struct RunTally {
  ExecutionSummary summary;
  std::map<std::string, OpTypeStats> op_types;  // keyed by op_name
};
RunTally tally_events(const std::vector<ExecutionEvent>& events);  // counts the Op events

// Thread-safe. Keeps at most max_events events; later ones are counted in dropped(). The tallies
// add_untimed_run adds count in the summaries (execution_summary, operations_by_type and what
// prints or exports them) but leave no events.
class Telemetry {
 public:
  explicit Telemetry(size_t max_events = kDefaultMaxEvents);

  void record_execution(ExecutionEvent event);
  void record_executions(std::vector<ExecutionEvent>& events);  // moves them out
  void add_untimed_run(const RunTally& tally);
  std::vector<ExecutionEvent> get_telemetry() const;
  void clear_telemetry();
  size_t size() const;
  size_t dropped() const;

  std::map<std::string, BackendUsage> backend_usage_stats() const;
  ExecutionSummary execution_summary() const;
  std::map<std::string, OpTypeStats> operations_by_type() const;  // keyed by op_name
  // A table per backend and per op type, then totals; says so when there is nothing yet.
  void print_debug_summary(std::ostream& os) const;

  // {"traceEvents": [...]}: one track (tid) per backend and one named "transfers".
  std::string to_chrome_trace_json() const;
  // {"events": [...], "summary": {...}}
  std::string to_json() const;
  // The "summary" object of to_json() alone: totals, per backend and per op type.
  std::string summary_json() const;

  // Microseconds since this Telemetry was created (the events' time base).
  double now_us() const;

 private:
  mutable std::mutex mutex_;
  std::vector<ExecutionEvent> events_;
  RunTally untimed_;  // the sum of the untimed runs' tallies
  size_t max_events_;
  size_t dropped_ = 0;
  int64_t epoch_ns_;
};

}  // namespace tandem
