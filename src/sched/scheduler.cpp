#include "tandem/scheduler.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "graph_search.h"
#include "planner.h"
#include "tandem/bytes.h"
#include "tandem/error.h"
#include "tandem/hash.h"

namespace tandem {

// ---- Strategy ----

Strategy Strategy::parse(std::string_view text) {
  if (text == "gpu" || text == "gpu_preferred") return gpu_preferred();
  if (text == "cpu" || text == "cpu_preferred") return cpu_preferred();
  if (text == "auto" || text == "automatic") return automatic();
  if (text.rfind("only:", 0) == 0 && text.size() > 5) {
    return backend_only(std::string(text.substr(5)));
  }
  throw_error(ErrorCode::InvalidArgument, "scheduler strategy",
              "unknown strategy '" + std::string(text) +
                  "' (expected gpu, cpu, auto or only:<backend id>)");
}

std::string Strategy::to_string() const {
  switch (kind) {
    case Kind::GpuPreferred:
      return "gpu_preferred";
    case Kind::CpuPreferred:
      return "cpu_preferred";
    case Kind::Automatic:
      return "automatic";
    case Kind::BackendOnly:
      return "backend_only(" + backend_id + ")";
  }
  return "unknown";
}

// ---- SelectionReason ----

std::string_view reason_kind_name(SelectionReason::Kind kind) {
  using K = SelectionReason::Kind;
  switch (kind) {
    case K::None:
      return "none";
    case K::FollowsSource:
      return "follows_source";
    case K::GpuAvailable:
      return "gpu_available";
    case K::GpuUnavailable:
      return "gpu_unavailable";
    case K::CpuFallback:
      return "cpu_fallback";
    case K::CostModel:
      return "cost_model";
    case K::MemoryConstraint:
      return "memory_constraint";
    case K::UserPreference:
      return "user_preference";
    case K::CpuAvailable:
      return "cpu_available";
    case K::GpuFallback:
      return "gpu_fallback";
    case K::Colocated:
      return "colocated";
    case K::Streamed:
      return "streamed";
  }
  return "unknown";
}

std::string SelectionReason::to_string() const {
  std::string s(reason_kind_name(kind));
  if (kind == Kind::MemoryConstraint) {
    s += " (needed " + std::to_string(needed_bytes) + " bytes, free " + std::to_string(free_bytes) +
         ")";
  }
  if (!costs.empty()) {
    s += " [";
    for (size_t i = 0; i < costs.size(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2f", costs[i].cost.total_us());
      s += (i ? ", " : "") + costs[i].backend_id + " " + buf + " us";
    }
    s += "]";
  }
  if (!why.empty()) s += ": " + why;
  return s;
}

// ---- Residency ----

namespace {
uint64_t entry_hash(std::string_view backend_id, std::string_view tensor) {
  uint64_t a = std::hash<std::string_view>{}(backend_id);
  uint64_t b = std::hash<std::string_view>{}(tensor);
  return hash_combine(a * kGoldenRatio64, b);
}
}  // namespace

std::string Residency::key(std::string_view backend_id, std::string_view tensor) {
  std::string k;
  k.reserve(backend_id.size() + 1 + tensor.size());
  k.append(backend_id).push_back('\0');
  k.append(tensor);
  return k;
}

void Residency::add(std::string_view backend_id, std::string_view tensor, size_t bytes) {
  if (!keys_.insert(key(backend_id, tensor)).second) return;
  entries_.push_back({std::string(backend_id), std::string(tensor), bytes});
  bytes_by_backend_[std::string(backend_id)] += bytes;
  hash_ ^= entry_hash(backend_id, tensor);
}

void Residency::remove(std::string_view backend_id, std::string_view tensor) {
  if (keys_.erase(key(backend_id, tensor)) == 0) return;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].backend_id == backend_id && entries_[i].tensor == tensor) {
      bytes_by_backend_[entries_[i].backend_id] -= entries_[i].bytes;
      hash_ ^= entry_hash(backend_id, tensor);
      entries_.erase(entries_.begin() + long(i));
      return;
    }
  }
}

bool Residency::contains(std::string_view backend_id, std::string_view tensor) const {
  return keys_.count(key(backend_id, tensor)) != 0;
}

std::vector<std::string> Residency::locations(std::string_view tensor) const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) {
    if (e.tensor == tensor) out.push_back(e.backend_id);
  }
  return out;
}

size_t Residency::resident_bytes(std::string_view backend_id) const {
  auto it = bytes_by_backend_.find(std::string(backend_id));
  return it == bytes_by_backend_.end() ? 0 : it->second;
}

// ---- Placement ----

PlannedCopy::Queue PlannedCopy::queue() const {
  switch (kind) {
    case Kind::Activation:
    case Kind::Input:
      return Queue::Transfer;
    case Kind::Streamed:
      return Queue::CopyQueue;
    case Kind::Upload:
    case Kind::CacheMove:
      break;
  }
  return Queue::Execution;
}

std::string_view copy_kind_name(PlannedCopy::Kind kind) {
  switch (kind) {
    case PlannedCopy::Kind::Activation:
      return "activation";
    case PlannedCopy::Kind::Input:
      return "input";
    case PlannedCopy::Kind::Upload:
      return "upload";
    case PlannedCopy::Kind::CacheMove:
      return "cache_move";
    case PlannedCopy::Kind::Streamed:
      return "streamed";
  }
  return "?";
}

std::vector<size_t> Placement::ops_per_backend() const {
  std::vector<size_t> n(backends.size(), 0);
  for (const BackendSelection& s : nodes) {
    if (s.backend_index >= 0 && s.reason.kind != SelectionReason::Kind::FollowsSource) {
      n[size_t(s.backend_index)]++;
    }
  }
  return n;
}

void Placement::print(std::ostream& os, const Graph& graph) const {
  char line[512];
  std::snprintf(line, sizeof line, "%5s  %-16s %-22s %-10s %10s  %s\n", "node", "op", "shape",
                "backend", "est_us", "reason");
  os << line;
  for (size_t i = 0; i < nodes.size() && i < graph.size(); ++i) {
    const Node& n = graph.nodes()[i];
    if (!is_compute(n.op)) continue;
    const BackendSelection& s = nodes[i];
    std::string shape = desc_string(graph.tensor(n.id));
    std::snprintf(line, sizeof line, "%5zu  %-16s %-22s %-10s %10.2f  ", i,
                  std::string(op_name(n.op)).c_str(), shape.c_str(),
                  s.backend ? s.backend->backend_id().c_str() : "-", s.estimated_cost.total_us());
    os << line << s.reason.to_string() << "\n";
  }
  for (const PlannedCopy& c : copies) {
    auto where = [&](int b) {
      return b < 0 ? std::string("host") : backends[size_t(b)]->backend_id();
    };
    std::snprintf(line, sizeof line, "copy   %-10s %-28s %s -> %s before node %d (%s)\n",
                  std::string(copy_kind_name(c.kind)).c_str(),
                  size_t(c.storage) < graph.size() ? graph.tensor(c.storage).name.c_str() : "?",
                  where(c.from).c_str(), where(c.to).c_str(), int(c.before),
                  format_bytes(c.bytes).c_str());
    os << line;
  }
  auto per = ops_per_backend();
  os << "ops:";
  for (size_t b = 0; b < backends.size(); ++b) {
    os << " " << backends[b]->backend_id() << "=" << per[b];
  }
  os << ", planned transfers " << planned_transfers << ", estimated " << estimated_us << " us\n";
}

// ---- HybridScheduler ----

HybridScheduler::Builder& HybridScheduler::Builder::with_backend(std::shared_ptr<Backend> b) {
  TANDEM_CHECK_ARG(b != nullptr, "scheduler builder", "with_backend got a null backend");
  backends_.push_back(std::move(b));
  return *this;
}

HybridScheduler::Builder& HybridScheduler::Builder::with_cpu_backend(std::shared_ptr<Backend> b) {
  TANDEM_CHECK_ARG(b != nullptr, "scheduler builder", "with_cpu_backend got a null backend");
  TANDEM_CHECK_ARG(b->kind() == BackendKind::Cpu, "scheduler builder",
                   "with_cpu_backend got '" + b->backend_id() + "', a gpu backend");
  return with_backend(std::move(b));
}

HybridScheduler::Builder& HybridScheduler::Builder::with_gpu_backend(std::shared_ptr<Backend> b) {
  TANDEM_CHECK_ARG(b != nullptr, "scheduler builder", "with_gpu_backend got a null backend");
  TANDEM_CHECK_ARG(b->kind() == BackendKind::Gpu, "scheduler builder",
                   "with_gpu_backend got '" + b->backend_id() + "', a cpu backend");
  return with_backend(std::move(b));
}

HybridScheduler::Builder& HybridScheduler::Builder::strategy(Strategy s) {
  strategy_ = std::move(s);
  return *this;
}
HybridScheduler::Builder& HybridScheduler::Builder::strict(bool on) {
  strict_ = on;
  return *this;
}
HybridScheduler::Builder& HybridScheduler::Builder::pin_tensor(std::string pattern,
                                                               std::string backend_id) {
  tensor_pins_.push_back({std::move(pattern), std::move(backend_id)});
  return *this;
}
HybridScheduler::Builder& HybridScheduler::Builder::pin_op(OpKind op, std::string backend_id) {
  op_pins_.emplace_back(op, std::move(backend_id));
  return *this;
}
HybridScheduler::Builder& HybridScheduler::Builder::switch_threshold(double ratio) {
  TANDEM_CHECK_ARG(ratio >= 1.0, "scheduler builder",
                   "switch_threshold must be >= 1 (got " + std::to_string(ratio) + ")");
  switch_threshold_ = ratio;
  return *this;
}
HybridScheduler::Builder& HybridScheduler::Builder::memory_budget(std::string backend_id,
                                                                  size_t bytes) {
  budgets_.emplace_back(std::move(backend_id), bytes);
  return *this;
}
HybridScheduler::Builder& HybridScheduler::Builder::cost_model(CostModel model) {
  cost_model_ = std::move(model);
  return *this;
}

HybridScheduler HybridScheduler::Builder::build() {
  const char* where = "scheduler builder";
  TANDEM_CHECK_ARG(!backends_.empty(), where, "needs at least one backend (with_backend)");
  auto impl = std::make_unique<PlannerConfig>();
  std::string known;
  for (const auto& b : backends_) {
    for (const auto& other : impl->backends) {
      TANDEM_CHECK_ARG(other->backend_id() != b->backend_id(), where,
                       "backend '" + b->backend_id() + "' added twice");
    }
    impl->backends.push_back(b);
    known += (known.empty() ? "" : ", ") + b->backend_id();
  }
  TANDEM_CHECK_ARG(impl->backends.size() <= 63, where, "at most 63 backends");
  auto index_of = [&](const std::string& id, const std::string& what) {
    for (size_t i = 0; i < impl->backends.size(); ++i) {
      if (impl->backends[i]->backend_id() == id) return int(i);
    }
    throw_error(ErrorCode::InvalidArgument, where,
                what + " names unknown backend '" + id + "' (known: " + known + ")");
  };
  // Host-accessible backends share host memory (group 0); each device is its own group.
  int next_group = 1;
  for (const auto& b : impl->backends) {
    impl->group.push_back(b->host_accessible() ? 0 : next_group++);
    impl->profiles.push_back(cost_model_.profile(*b));
    impl->budgets.push_back(b->memory().free_bytes);
    impl->budget_notes.emplace_back();
  }
  impl->n_groups = next_group;
  impl->strategy = strategy_;
  if (strategy_.kind == Strategy::Kind::BackendOnly) {
    impl->only = index_of(strategy_.backend_id, "strategy backend_only");
  }
  impl->strict = strict_;
  std::vector<std::string> patterns;
  for (const TensorPin& p : tensor_pins_) {
    impl->tensor_pin_backend.push_back(index_of(p.backend_id, "pin_tensor '" + p.pattern + "'"));
    impl->tensor_pins.push_back(p);
    patterns.push_back(p.pattern);
  }
  if (!patterns.empty()) impl->pin_matcher = std::make_unique<PinMatcher>(patterns);
  impl->op_pin.fill(kNoBackend);
  for (const auto& [op, id] : op_pins_) {
    TANDEM_CHECK_ARG(is_compute(op), where,
                     "pin_op " + std::string(op_name(op)) + ": only compute ops can be pinned");
    impl->op_pin[size_t(op)] = index_of(id, "pin_op " + std::string(op_name(op)));
  }
  impl->switch_threshold = switch_threshold_;
  for (const auto& [id, bytes] : budgets_) {
    impl->budgets[size_t(index_of(id, "memory_budget"))] = bytes;
  }
  impl->cost_model = std::move(cost_model_);
  return HybridScheduler(std::make_unique<Impl>(std::move(impl)));
}

struct HybridScheduler::Impl {
  explicit Impl(std::unique_ptr<PlannerConfig> c) : config(std::move(c)) {}
  std::unique_ptr<PlannerConfig> config;
  std::mutex mutex;
  std::unordered_map<uint64_t, std::shared_ptr<const Placement>> cache;
  std::optional<ResidencyPlan> residency_plan;  // Automatic: where persistent tensors live
  ResidencyHomes homes;                         // the same, by backend index
  uint64_t residency_key = 0;                   // changes with each new residency plan
  uint64_t residency_lost = 0;                  // the devices lost when it was made

  uint64_t lost_mask() const {
    uint64_t lost = 0;
    for (size_t b = 0; b < config->backends.size(); ++b) {
      if (config->backends[b]->lost()) lost |= 1ull << b;
    }
    return lost;
  }
};

HybridScheduler::HybridScheduler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HybridScheduler::HybridScheduler(HybridScheduler&&) noexcept = default;
HybridScheduler& HybridScheduler::operator=(HybridScheduler&&) noexcept = default;
HybridScheduler::~HybridScheduler() = default;

namespace {
constexpr size_t kMaxCachedPlans = 64;

// What an executor caches an execution plan by: the graph and every decision a run carries
// out, so a placement made again after the residency changed as the last one said (its
// weights uploaded, its KV caches created) reuses the compiled plan and its captured work.
uint64_t content_key(const Graph& graph, const Placement& p) {
  uint64_t key = graph.signature();
  for (const Node& n : graph.nodes()) {
    if (is_leaf(n.op)) key = hash_combine(key, std::hash<std::string>{}(graph.tensor(n.id).name));
  }
  for (const BackendSelection& sel : p.nodes) {
    key = hash_combine(key, uint64_t(int64_t(sel.backend_index)));
    for (TensorId w : sel.streamed) key = hash_combine(key, uint64_t(w));
  }
  for (const PlannedCopy& c : p.copies) {
    // Uploads and cache moves are made once, before the run: not part of what it executes.
    if (c.queue() == PlannedCopy::Queue::Execution) continue;
    key = hash_combine(key, uint64_t(c.kind));
    key = hash_combine(key, uint64_t(c.storage));
    key = hash_combine(key, uint64_t(c.before));
    key = hash_combine(key, uint64_t(int64_t(c.from)));
    key = hash_combine(key, uint64_t(int64_t(c.to)));
  }
  for (const auto& [cache, b] : p.kv_homes) {
    key = hash_combine(hash_combine(key, uint64_t(cache)), uint64_t(int64_t(b)));
  }
  for (size_t bytes : p.stream_staging_bytes) key = hash_combine(key, bytes);
  return key;
}
}  // namespace

std::shared_ptr<const Placement> HybridScheduler::plan(const Graph& graph,
                                                       const Residency& residency) {
  const bool automatic = impl_->config->strategy.kind == Strategy::Kind::Automatic;
  // Without phases given (plan_residency), the first graph decides where weights live; so it
  // does again when a device was lost since.
  if (automatic && (!residency_plan() || impl_->residency_lost != impl_->lost_mask())) {
    const Graph* phases[] = {&graph};
    plan_residency(phases, residency);
  }
  const uint64_t key = plan_key(graph, residency);
  {
    std::lock_guard lock(impl_->mutex);
    auto it = impl_->cache.find(key);
    if (it != impl_->cache.end()) return it->second;
  }
  std::shared_ptr<const Placement> placement = make_placement(graph, residency, key);
  // The run that carries this placement out uploads its weights and creates its caches, so
  // the next run of the graph plans again under the residency it leaves. Planned now, beside
  // those uploads, instead of in the next step: an 8B prefill's plan takes 2-5 ms, 5-15% of
  // the step that would otherwise pay it.
  const Residency after = residency_after(graph, *placement, residency);
  if (after.hash() != residency.hash()) {
    const uint64_t next = plan_key(graph, after);
    bool cached = false;
    {
      std::lock_guard lock(impl_->mutex);
      cached = impl_->cache.count(next) > 0;
    }
    try {
      if (!cached) make_placement(graph, after, next);
    } catch (const Error&) {
      // Not this run's failure: the next run plans again and reports it.
    }
  }
  return placement;
}

uint64_t HybridScheduler::plan_key(const Graph& graph, const Residency& residency) const {
  // Names are not in the signature but pins, residency and bindings key on them (both hashes
  // are kept by the graph: this runs before every step).
  uint64_t key = hash_combine(graph.signature(), graph.leaf_names_hash());
  key = hash_combine(key, residency.hash());
  // A device lost since the last plan must not be chosen again.
  key = hash_combine(key, impl_->lost_mask());
  std::lock_guard lock(impl_->mutex);
  return hash_combine(key, impl_->residency_key);
}

std::shared_ptr<const Placement> HybridScheduler::make_placement(const Graph& graph,
                                                                 const Residency& residency,
                                                                 uint64_t key) {
  std::shared_ptr<Placement> placement;
  if (impl_->config->strategy.kind == Strategy::Kind::Automatic) {
    // Whole-graph placement: the residency (once, shared by every phase), then this graph's
    // execution by the search; the walk follows it and does the bookkeeping.
    ExecutionChoice choice = search_execution(*impl_->config, graph, impl_->homes);
    // (The budget bounds residency, decided above; activations and staging come on top.)
    if (!choice.ok) throw_error(ErrorCode::Unsupported, "scheduler", choice.failure);
    SearchedPlacement sp;
    sp.backend = std::move(choice.backend);
    sp.homes = impl_->homes;
    sp.predicted_us = choice.timeline_us;
    sp.residency_why = impl_->residency_plan->why;
    placement = std::make_shared<Placement>(plan_graph(*impl_->config, graph, residency, &sp));
  } else {
    placement = std::make_shared<Placement>(plan_graph(*impl_->config, graph, residency));
  }
  placement->signature = graph.signature();
  placement->key = content_key(graph, *placement);
  std::lock_guard lock(impl_->mutex);
  if (impl_->cache.size() >= kMaxCachedPlans) impl_->cache.clear();
  impl_->cache.emplace(key, placement);
  return placement;
}

const ResidencyPlan& HybridScheduler::plan_residency(std::span<const Graph* const> phases,
                                                     const Residency& residency) {
  TANDEM_CHECK_ARG(!phases.empty(), "scheduler plan_residency", "needs at least one graph");
  const uint64_t lost = impl_->lost_mask();
  ResidencyPlan plan = search_residency(*impl_->config, phases, residency);
  std::lock_guard lock(impl_->mutex);
  impl_->residency_lost = lost;
  impl_->homes = homes_of(*impl_->config, plan);
  impl_->residency_plan = std::move(plan);
  impl_->residency_key = hash_combine(impl_->residency_key + 1, 0x5eed);
  impl_->cache.clear();
  return *impl_->residency_plan;
}

Residency residency_after(const Graph& graph, const Placement& placement, Residency before) {
  for (const Node& n : graph.nodes()) {
    const BackendSelection& sel = placement.at(n.id);
    if (!is_compute(n.op) || !sel.backend || sel.backend->host_accessible()) continue;
    const std::string& id = sel.backend->backend_id();
    for (TensorId in : n.inputs) {
      const TensorId s = graph.storage_of(in);
      const OpKind sop = graph.node(s).op;
      if (sop != OpKind::Weight && sop != OpKind::KvCache) continue;
      if (std::find(sel.streamed.begin(), sel.streamed.end(), s) != sel.streamed.end()) continue;
      const std::string& name = graph.tensor(s).name;
      if (!before.contains(id, name)) before.add(id, name, graph.tensor(s).bytes());
    }
  }
  return before;
}

double HybridScheduler::predict_us(const Graph& graph, const Placement& placement) const {
  TANDEM_CHECK_ARG(placement.nodes.size() == graph.size(), "scheduler predict_us",
                   "the placement is of another graph");
  ResidencyHomes homes;
  const Residency r = residency_after(graph, placement);
  std::vector<int> backend(graph.size(), kNoBackend);
  for (const Node& n : graph.nodes()) {
    const BackendSelection& sel = placement.at(n.id);
    if (is_compute(n.op) && sel.backend)
      backend[size_t(n.id)] = backend_index(sel.backend->backend_id());
    if (n.op != OpKind::Weight && n.op != OpKind::KvCache) continue;
    for (const std::string& id : r.locations(graph.tensor(n.id).name)) {
      homes[graph.tensor(n.id).name] = backend_index(id);
    }
  }
  return timeline_execution(*impl_->config, graph, homes, backend);
}

const ResidencyPlan* HybridScheduler::residency_plan() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->residency_plan ? &*impl_->residency_plan : nullptr;
}

BackendSelection HybridScheduler::select_backend(const Graph& graph, const Node& node,
                                                 const Residency& residency) {
  TANDEM_CHECK_ARG(node.id >= 0 && size_t(node.id) < graph.size() &&
                       graph.nodes()[size_t(node.id)].op == node.op,
                   "scheduler select_backend",
                   "node " + std::to_string(node.id) + " is not part of the graph");
  return plan(graph, residency)->at(node.id);
}

const std::vector<std::shared_ptr<Backend>>& HybridScheduler::backends() const {
  return impl_->config->backends;
}
int HybridScheduler::backend_index(std::string_view id) const {
  const auto& b = impl_->config->backends;
  for (size_t i = 0; i < b.size(); ++i) {
    if (b[i]->backend_id() == id) return int(i);
  }
  return kNoBackend;
}
const Strategy& HybridScheduler::strategy() const {
  return impl_->config->strategy;
}
bool HybridScheduler::strict() const {
  return impl_->config->strict;
}
double HybridScheduler::switch_threshold() const {
  return impl_->config->switch_threshold;
}
size_t HybridScheduler::memory_budget(std::string_view id) const {
  int i = backend_index(id);
  TANDEM_CHECK_ARG(i >= 0, "scheduler memory_budget", "unknown backend '" + std::string(id) + "'");
  return impl_->config->budgets[size_t(i)];
}
void HybridScheduler::set_memory_budget(std::string_view id, size_t bytes, std::string why) {
  const int i = backend_index(id);
  TANDEM_CHECK_ARG(i >= 0, "scheduler set_memory_budget",
                   "unknown backend '" + std::string(id) + "'");
  std::lock_guard lock(impl_->mutex);
  impl_->config->budgets[size_t(i)] = bytes;
  impl_->config->budget_notes[size_t(i)] = std::move(why);
  impl_->cache.clear();
  // Where Automatic keeps weights and caches was decided under the old budget.
  impl_->residency_plan.reset();
  impl_->homes.clear();
  impl_->residency_key = hash_combine(impl_->residency_key + 1, 0x5eed);
}

const CostModel& HybridScheduler::cost_model() const {
  return impl_->config->cost_model;
}
size_t HybridScheduler::cached_plans() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->cache.size();
}
void HybridScheduler::clear_cache() {
  std::lock_guard lock(impl_->mutex);
  impl_->cache.clear();
}

}  // namespace tandem
