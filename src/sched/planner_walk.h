// The planner's walk over one graph (plan_graph): the state it keeps per node and backend and
// its methods. Internal to src/sched: planner.cpp has the walk's bookkeeping (leaves, memory,
// the effects of each choice), planner_select.cpp how each op's backend is chosen.
#pragma once

#include "planner.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include "tandem/bytes.h"
#include "tandem/error.h"

namespace tandem::planner_walk {

using Kind = SelectionReason::Kind;
constexpr uint64_t kHostBit = 1;  // group 0: host memory
// What moving host-weight ops between the CPU and the copy queue must gain on the simulated
// step (host_side), as a fraction of it, to be made: a tiny weight taken off the queue while
// the GPU waits for it anyway gains nothing real, and each move adds hops the step pays.
constexpr double kMinSplitGain = 0.01;
// How much longer the copy queue takes for each microsecond the host computes beside it: both
// read host memory. Measured on an H100 host (16 threads, 2026-11-26): an `--ngl 0` prefill
// whose first layer's ops ran on the CPU for 36.9 ms took the queue 8.1 ms longer than the
// bytes it no longer carried saved.
constexpr double kCopySlowdownUnderHostCompute = 0.22;
// The least host time a streamed op must save, as a fraction of its copy's time (host_side).
// Measured on an H100 host (2026-11-27, Qwen3-30B-A3B shape, Q4_0, 8 GiB): a decode that
// streamed the last two layers' expert tensors (six copies of 108 MiB, each saving the CPU
// ~73 us of its ~2.2 ms) was predicted ~3% faster and ran at 76 t/s, the copy queue busy the
// whole step; with those products on the CPU, 98 t/s. A dense product of one token saves the
// host a quarter to a half of its copy.
constexpr double kMinStreamSaving = 0.1;
inline uint64_t bit(int group) {
  return 1ull << group;
}

inline std::string node_label(const Graph& g, const Node& n) {
  return "node " + std::to_string(n.id) + " '" + g.tensor(n.id).name + "' (" +
         std::string(op_name(n.op)) + " " + desc_string(g.tensor(n.id)) + ")";
}

// One backend's answer for one node.
struct Eval {
  CapabilityCheck check;
  bool fits = false;
  size_t needed = 0;
  size_t free = 0;
  size_t persistent = 0;
  std::string memory_detail;
  OpCost cost;
  bool ok() const { return check.ok() && fits; }
};

// A device's answer for running a node with its host-resident weights streamed in.
struct StreamEval {
  bool ok = false;
  OpCost cost;
  std::vector<TensorId> weights;
  size_t weight_bytes = 0;  // streamed each run
  size_t ring_growth = 0;   // staging memory the device must add for these weights
  double arrival_us = 0.0;  // when the last of them lands, on the step's timeline
};

class Walk {
 public:
  Walk(const PlannerConfig& c, const Graph& g, const Residency& r, const SearchedPlacement* sp);
  Placement run();

 private:
  int backend_of(const std::string& id) const;
  int find(int x);

  bool is_cache(TensorId s) const { return g_.node(s).op == OpKind::KvCache; }

  void init_leaves(const Residency& r);

  // The KV cache a node is tied to (its representative), or -1.
  int cache_of(const Node& n);
  int hops(uint64_t m, int gb) const;
  void evaluate(const Node& n);

  // Whether weight storage s lives in host memory as far as device b is concerned: pinned to a
  // host backend, or (unpinned) too large for what b has left.
  bool host_homed(TensorId s, int b) const;

  // For each device that can run n: the cost of running it with its host-resident weights
  // streamed in (copied each run on the copy queue, overlapped with execution).
  void evaluate_streamed(const Node& n);
  int best_streamed() const;

  // Runs n on device b with its host weights streamed; `host` is the host candidate it beat.
  void choose_streamed(BackendSelection& sel, int b, int host, const std::string& why);

  // Whether streaming beats running on `host` (kNoBackend: no host candidate at all).
  int streamed_over(int host) const;
  void set_backend(BackendSelection& sel, int b) const;
  std::string all_reasons() const;

  [[noreturn]] void fail(ErrorCode code, const Node& n, const std::string& what) const {
    throw_error(code, "scheduler", node_label(g_, n) + ": " + what + " [" + all_reasons() + "]");
  }

  // Fills the selection for backend b and lists every other backend as rejected.
  void choose(BackendSelection& sel, int b, SelectionReason reason, RejectReason other_reason,
              const std::string& other_detail, const OpCost* cost = nullptr) {
    set_backend(sel, b);
    sel.estimated_cost = cost ? *cost : evals_[size_t(b)].cost;
    sel.reason = std::move(reason);
    for (size_t i = 0; i < n_backends_; ++i) {
      if (int(i) == b) continue;
      const Eval& e = evals_[i];
      RejectedCandidate r{int(i), c_.backends[i]->backend_id(), other_reason, other_detail};
      if (!e.check.ok()) {
        r.reason = e.check.reason;
        r.detail = e.check.detail;
      } else if (!e.fits) {
        r.reason = RejectReason::OutOfMemory;
        r.detail = e.memory_detail;
      } else if (other_reason == RejectReason::MoreExpensive) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "%.3f us vs %.3f us", e.cost.total_us(),
                      sel.estimated_cost.total_us());
        r.detail = buf;
      }
      sel.rejected.push_back(std::move(r));
    }
  }

  int first_ok(BackendKind kind, bool same_kind) const;
  int first_of(BackendKind kind) const;
  SelectionReason memory_reason(const Eval& e) const;

  // Whether weight s stays in host memory for the whole step: pinned to a host backend, or left
  // there by the whole-graph search.
  bool lives_on_host(TensorId s) const;

  // The ops on weights in host memory (llama.cpp's -ngl and -ot ...=cpu, or auto's residency) split
  // at one point, decided at the first of them: the host computes those before it while the copy
  // queue, which streams from the step's start, brings the weights of those after it, which a
  // GPU runs as they land. The point minimizes the step's predicted end (simulated below). A
  // prefill streams them all (the host is far slower); a decode step shares them. Returns the
  // 1 where n runs on the host, 0 where it streams, -1 where it reads no such weight.
  int host_side(const Node& n, int host);

  // The GPU that produced n's latest computed input, where n reads no weight or KV cache
  // and that GPU can run it; else kNoBackend.
  int follow_gpu(const Node& n, TensorId& latest) const;

  // GpuPreferred and CpuPreferred: the preferred kind if one can, else the other kind.
  void preferred(const Node& n, BackendSelection& sel, BackendKind want);
  void automatic(const Node& n, BackendSelection& sel);
  void backend_only(const Node& n, BackendSelection& sel);

  // Follows the whole-graph search's backend for n; false when it has no room there.
  bool follow_search(const Node& n, BackendSelection& sel);
  void select(const Node& n, BackendSelection& sel);

  // True for an op that reads no weight or cache and whose computed inputs all live in host
  // memory only.
  bool host_chain(const Node& n) const;

  // Records the effects of running n where sel says: copies made, memory placed, outputs.
  void apply(const Node& n, const BackendSelection& sel);

  // Where a KV cache lives during the run: where its first KvWrite runs, else where it is
  // first read.
  void note_cache_home(TensorId s, const Node& n, size_t input, int b);

  const PlannerConfig& c_;
  const Graph& g_;
  const size_t n_backends_;
  const SearchedPlacement* searched_;
  std::vector<int> searched_home_;  // per weight or cache: its searched device (or none)
  std::vector<uint64_t> loc_;       // per storage: groups holding a valid copy
  std::vector<int> producer_;       // per storage: the backend that last wrote it
  std::vector<int> weight_pin_;
  std::vector<int> parent_;  // union-find over KV caches
  std::vector<int> home_;    // per cache representative: its backend
  std::vector<size_t> used_;
  std::vector<bool> exhausted_;
  std::vector<size_t> exhaust_needed_, exhaust_free_;
  std::vector<std::string> exhaust_detail_;
  std::vector<int> group_backend_;
  std::vector<Eval> evals_;
  std::vector<StreamEval> stream_evals_;
  std::vector<size_t> ring_reserved_;  // per device: staging memory reserved for streaming
  std::vector<size_t> streamed_by_;    // per device: weight bytes it streams each run
  double now_us_ = 0.0;                // the step's timeline: ops chosen so far, one after another
  std::vector<int> host_rank_;         // per node: its rank among ops on host-pinned weights, or -1
  std::vector<uint8_t> host_side_;     // per rank: runs on the host (host_side)
  std::string split_why_;
  std::vector<double> copy_free_us_;  // per device: when its copy queue has landed what it took
  size_t streamed_bytes_ = 0;
  std::vector<bool> excluded_;
  std::vector<uint8_t> hops_;
  int current_ = kNoBackend;
  std::vector<PlannedCopy> copies_;
  std::vector<uint64_t> stream_copied_;  // per weight: the backends it was streamed to (bits)
  std::vector<int> cache_home_;          // per KV cache: its backend in this run
  std::vector<bool> cache_written_;
  size_t transfers_ = 0;
  size_t uploads_ = 0;
};

}  // namespace tandem::planner_walk
