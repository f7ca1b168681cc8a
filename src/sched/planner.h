// The planning walk behind HybridScheduler::plan: one pass over the nodes in order, tracking
// where every tensor is valid, the memory placed on each backend and where KV caches live.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "pin_matcher.h"
#include "tandem/op.h"
#include "tandem/scheduler.h"

namespace tandem {

// Everything build() validated, in the form the walk uses.
struct PlannerConfig {
  std::vector<std::shared_ptr<Backend>> backends;
  std::vector<int> group;  // memory group per backend: 0 host memory, 1.. one per device
  int n_groups = 1;
  std::vector<BackendProfile> profiles;
  std::vector<size_t> budgets;
  std::vector<std::string> budget_notes;  // per backend: why its budget changed ("": it did not)
  Strategy strategy;
  int only = kNoBackend;
  bool strict = false;
  std::vector<TensorPin> tensor_pins;
  std::vector<int> tensor_pin_backend;
  std::unique_ptr<PinMatcher> pin_matcher;
  std::array<int, kMaxOpKinds> op_pin{};  // by OpKind, registered ops included
  double switch_threshold = kDefaultSwitchThreshold;
  CostModel cost_model;
};

// What the whole-graph search decided for one graph (Automatic): the walk follows it, keeping
// its bookkeeping (copies, uploads, streamed weights, memory) and falling back to its own
// choice for a node whose searched backend has no room.
struct SearchedPlacement {
  std::vector<int> backend;                    // per node (kNoBackend: leaf, metadata)
  std::unordered_map<std::string, int> homes;  // weight or cache name -> device; absent: host
  double predicted_us = 0.0;
  std::string residency_why;
};

Placement plan_graph(const PlannerConfig& config, const Graph& graph, const Residency& residency,
                     const SearchedPlacement* searched = nullptr);

}  // namespace tandem
