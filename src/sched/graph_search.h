// Whole-graph placement for the Automatic strategy, in two levels:
//
//   residency  which weights and KV caches live on which device, decided once for every phase
//              the model runs (prefill and decode graphs share it): a family of candidates
//              (layer ranges from either end, the output layer first or last, KV caches with
//              their layers or all on the device, everything) under each device's budget, each
//              scored by the execution search below on every phase.
//   execution  where each op of one graph runs, given the residency: a dynamic program over
//              the ops in order whose state is where each live activation has a valid copy, so
//              every transfer is counted once, a weight not resident on the chosen device is
//              streamed, and the result is the optimum of the cost model (brute force over
//              every assignment agrees; tests check it).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner.h"

namespace tandem {

// At most this many DP states per op (where each live activation has a copy). LLaMA graphs
// keep 5 or fewer activations live, i.e. at most 3^5 states with one device; beyond the cap the
// cheapest states are kept and the result is no longer guaranteed optimal.
inline constexpr size_t kMaxSearchStates = 4096;

// Where persistent tensors live, by name: backend index (a device), absent for host memory.
using ResidencyHomes = std::unordered_map<std::string, int>;

// The execution search's answer for one graph.
struct ExecutionChoice {
  std::vector<int> backend;  // per node: the backend that runs it (kNoBackend: leaf, metadata)
  double cost_us = 0.0;      // the objective: per-op costs summed (what the search minimizes)
  // The same assignment on a timeline: streamed copies run ahead on the copy queue from the
  // start of the step, and an op that reads one waits for it; what residency candidates are
  // scored by (a host layer at the start of a prefill stalls it, one at the end does not).
  double timeline_us = 0.0;
  bool ok = false;
  bool exact = true;    // false when the state cap pruned states
  std::string failure;  // !ok: the first node no candidate could run, and why
};

// The execution search. A node with a KV cache runs where the cache lives (its home, else the
// first host backend); a weight pin or an op pin in the config forces its node.
// The budgets bound residency (decided before): activations and staging are not checked.
ExecutionChoice search_execution(const PlannerConfig& config, const Graph& graph,
                                 const ResidencyHomes& homes);

// The cost model's step time of one given assignment (per node, as ExecutionChoice::backend),
// or +infinity when a node is on a backend that cannot run it or away from its cache. Shares
// its per-op costs with the search; the oracle the tests compare the search against.
// check_memory: true also refuses a device op whose activations (and staging, for a streamed
// weight) exceed what the budget leaves beside the resident tensors.
double evaluate_execution(const PlannerConfig& config, const Graph& graph,
                          const ResidencyHomes& homes, std::span<const int> backend,
                          bool check_memory = false);

// The same assignment's timeline (ExecutionChoice::timeline_us): what plan and tune predict.
double timeline_execution(const PlannerConfig& config, const Graph& graph,
                          const ResidencyHomes& homes, std::span<const int> backend);

// The residency search over `phases` (graphs over the same weights and caches).
ResidencyPlan search_residency(const PlannerConfig& config, std::span<const Graph* const> phases,
                               const Residency& residency);

// The homes a plan names, as backend indices for the config.
ResidencyHomes homes_of(const PlannerConfig& config, const ResidencyPlan& plan);

}  // namespace tandem
