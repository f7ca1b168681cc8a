// A session's mixture of experts: the routers' choices counted per step (routing statistics,
// Session::routing) and the hot experts chosen from them (SessionOptions::hot_experts): the
// policy, the slabs gathered from the file and bound as weights, the reviews.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <utility>

#include "tandem/error.h"
#include "tandem/model/llama_config.h"
#include "tandem/runtime.h"

namespace tandem {

void Session::count_routing(const LlamaGraph& lg) {
  // The hot experts serve the small steps (decode), whose routing a prompt's does not show: only
  // those steps count for them.
  const bool hot = hot_enabled_ && lg.graph.tensor(lg.positions).elements() <= kHotMaxTokens;
  if (!hot && !routing_stats_) return;
  RoutingStats& r = routing_;
  hot_steps_ += hot;
  r.steps += routing_stats_;
  const size_t n_expert = size_t(config_.n_expert);
  size_t at = 0;
  for (size_t i = 0; i < lg.routes.size(); ++i) {
    if (hot && hot_counts_.size() == i) {
      hot_count_layers_.push_back(lg.routes[i].layer);
      hot_counts_.emplace_back(n_expert, 0.0);
    }
    if (routing_stats_ && r.layers.size() == i) {
      r.layers.push_back(lg.routes[i].layer);
      r.chosen.emplace_back(n_expert, 0);
      r.choices.push_back(0);
    }
    const size_t n = size_t(lg.graph.tensor(lg.routes[i].ids).elements());
    for (size_t j = 0; j < n; ++j) {
      const int32_t e = route_ids_[at + j];
      if (e < 0 || size_t(e) >= n_expert) continue;
      if (hot) hot_counts_[i][size_t(e)] += 1.0;
      if (routing_stats_) ++r.chosen[i][size_t(e)];
    }
    if (routing_stats_) r.choices[i] += int64_t(n);
    at += n;
  }
}

std::vector<double> RoutingStats::top_share(size_t n) const {
  std::vector<double> out;
  for (size_t i = 0; i < chosen.size(); ++i) {
    std::vector<int64_t> c = chosen[i];
    std::sort(c.begin(), c.end(), std::greater<>());
    int64_t top = 0;
    for (size_t k = 0; k < std::min(n, c.size()); ++k) top += c[k];
    out.push_back(choices[i] > 0 ? double(top) / double(choices[i]) : 0.0);
  }
  return out;
}

std::vector<int64_t> RoutingStats::used() const {
  std::vector<int64_t> out;
  for (const auto& c : chosen)
    out.push_back(std::count_if(c.begin(), c.end(), [](int64_t x) { return x > 0; }));
  return out;
}

std::vector<HotExpertLayer> Session::hot_experts() const {
  std::vector<HotExpertLayer> out;
  for (const HotLayer& h : hot_) out.push_back(h.set);
  return out;
}

namespace {

const char* const kSlabs[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};

// "blk.L.<what>.weight".
std::string expert_tensor(int layer, const char* what) {
  return llama_layer_tensor(layer, std::string(what) + ".weight");
}

// The experts of `counts` by count, most chosen first (ties: the lower id).
std::vector<int32_t> by_count(std::span<const double> counts) {
  std::vector<int32_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return counts[size_t(a)] > counts[size_t(b)]; });
  return order;
}

}  // namespace

double hot_share(std::span<const double> counts, std::span<const int32_t> experts) {
  double total = 0.0, in = 0.0;
  for (double c : counts) total += c;
  for (int32_t e : experts) {
    if (e >= 0 && size_t(e) < counts.size()) in += counts[size_t(e)];
  }
  return total > 0.0 ? in / total : 0.0;
}

std::vector<int32_t> choose_hot_experts(std::span<const double> counts, double coverage,
                                        size_t least, size_t most) {
  std::vector<int32_t> top = by_count(counts);
  double total = 0.0, in = 0.0;
  for (double c : counts) total += c;
  size_t n = 0;
  while (n < top.size() && !(total > 0.0 && in >= coverage * total)) in += counts[size_t(top[n++])];
  n = std::max(n, std::min(least, top.size()));
  if (n > most || total <= 0.0) return {};
  top.resize(n);
  return top;
}

std::vector<std::pair<size_t, int32_t>> swap_hot_experts(std::span<const double> counts,
                                                         std::span<const int32_t> current,
                                                         double sigmas) {
  auto count = [&](int32_t e) {
    return e >= 0 && size_t(e) < counts.size() ? counts[size_t(e)] : 0.0;
  };
  std::vector<size_t> slots(current.size());  // least chosen first
  std::iota(slots.begin(), slots.end(), size_t(0));
  std::stable_sort(slots.begin(), slots.end(),
                   [&](size_t a, size_t b) { return count(current[a]) < count(current[b]); });
  std::vector<int32_t> others;  // most chosen first
  for (int32_t e : by_count(counts)) {
    if (std::find(current.begin(), current.end(), e) == current.end()) others.push_back(e);
  }
  std::vector<std::pair<size_t, int32_t>> swaps;
  for (size_t k = 0; k < std::min(slots.size(), others.size()); ++k) {
    const double in = count(others[k]), out = count(current[slots[k]]);
    if (in - out <= sigmas * std::sqrt(in + out)) break;
    swaps.emplace_back(slots[k], others[k]);
  }
  return swaps;
}

Session::HotLayer Session::make_hot_layer(int layer, std::vector<int32_t> experts, double share) {
  HotLayer h;
  h.set.layer = layer;
  h.set.share = share;
  std::sort(experts.begin(), experts.end());
  h.set.experts.assign(experts.size(), -1);
  h.hot_map.assign(size_t(config_.n_expert), -1);
  h.cold_map.resize(size_t(config_.n_expert));
  std::iota(h.cold_map.begin(), h.cold_map.end(), 0);
  for (int i = 0; i < 3; ++i) {
    const gguf::TensorInfo* t = file_.find_tensor(expert_tensor(layer, kSlabs[i]));
    TANDEM_CHECK_ARG(t != nullptr, "hot experts",
                     "missing tensor '" + expert_tensor(layer, kSlabs[i]) + "'");
    h.source[i] = t;
    h.slab[i].resize(t->bytes / size_t(t->ne[2]) * experts.size());
  }
  for (size_t slot = 0; slot < experts.size(); ++slot) put_hot_expert(h, slot, experts[slot]);
  return h;
}

void Session::put_hot_expert(HotLayer& h, size_t slot, int32_t e) {
  if (const int32_t old = h.set.experts[slot]; old >= 0) {
    h.hot_map[size_t(old)] = -1;
    h.cold_map[size_t(old)] = old;
  }
  h.hot_map[size_t(e)] = int32_t(slot);
  h.cold_map[size_t(e)] = -1;
  h.set.experts[slot] = e;
  for (int i = 0; i < 3; ++i) {
    const size_t per_expert = h.slab[i].size() / h.set.experts.size();
    std::memcpy(h.slab[i].data() + slot * per_expert, h.source[i]->data + size_t(e) * per_expert,
                per_expert);
  }
}

void Session::swap_hot_experts_in(HotLayer& h, std::span<const std::pair<size_t, int32_t>> swaps) {
  if (swaps.empty()) return;
  for (const auto& [slot, e] : swaps) {
    put_hot_expert(h, slot, e);
    for (int i = 0; i < 3; ++i) {
      const size_t per_expert = h.slab[i].size() / h.set.experts.size();
      executor_->refresh_weight(hot_expert_name(h.set.layer, kSlabs[i]), slot * per_expert,
                                per_expert);
    }
  }
  for (const char* map : {"hot_map", "cold_map"}) {
    executor_->refresh_weight(hot_expert_name(h.set.layer, map), 0,
                              size_t(config_.n_expert) * sizeof(int32_t));
  }
  hot_changes_ += int64_t(swaps.size());
}

void Session::retire_graphs(int64_t max_tokens) {
  // The last step's graph stays readable (last_graph) until the next step runs.
  for (auto it = graphs_.begin(); it != graphs_.end();) {
    const auto next = std::next(it);
    if (std::get<0>(it->first) <= max_tokens) retired_graphs_.push_back(graphs_.extract(it));
    it = next;
  }
}

void Session::bind_hot_layers() {
  for (const HotLayer& h : hot_) {
    for (int i = 0; i < 3; ++i) {
      executor_->bind_weight(hot_expert_name(h.set.layer, kSlabs[i]), h.slab[i].data(),
                             h.slab[i].size());
    }
    executor_->bind_weight(hot_expert_name(h.set.layer, "hot_map"), h.hot_map.data(),
                           h.hot_map.size() * sizeof(int32_t));
    executor_->bind_weight(hot_expert_name(h.set.layer, "cold_map"), h.cold_map.data(),
                           h.cold_map.size() * sizeof(int32_t));
  }
}

void Session::review_hot_experts() {
  if (!hot_enabled_ || hot_counts_.empty() || hot_steps_ < hot_review_at_) return;
  hot_review_at_ = hot_steps_ + kHotReviewSteps;
  if (!hot_split_) {
    first_hot_split();
  } else {
    // Every review window is a trial: the split stays while decode's median step in it stays
    // under the whole layers' (measured before the split).
    if (hot_timing_ && !hot_step_us_.empty()) {
      // The last review's swaps and plans, paid between steps, spread over the window's steps.
      const double now = median(hot_step_us_) + hot_review_us_ / double(hot_step_us_.size());
      hot_step_us_.clear();
      const bool keep = now < hot_before_us_;
      char buf[160];
      std::snprintf(buf, sizeof buf, "decode %.0f us a step split against %.0f us whole: %s", now,
                    hot_before_us_, keep ? "kept" : "undone, whole layers");
      hot_outcome_ = buf;
      if (!keep) {
        end_hot_split();
        return;
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    // An expert chosen clearly more lately than a hot one takes its slot, in place: the graphs
    // and the plans stay. The costs' share follows the routing; past kHotMargin from the share
    // the decode graphs were planned with, they are built and planned again.
    bool drifted = false;
    for (HotLayer& h : hot_) {
      const auto it = std::find(hot_count_layers_.begin(), hot_count_layers_.end(), h.set.layer);
      if (it == hot_count_layers_.end()) continue;
      const std::vector<double>& counts = hot_counts_[size_t(it - hot_count_layers_.begin())];
      swap_hot_experts_in(h, swap_hot_experts(counts, h.set.experts, kHotSwapSigmas));
      if (const double now = hot_share(counts, h.set.experts);
          std::abs(now - h.set.share) > kHotMargin) {
        h.set.share = now;
        drifted = true;
      }
    }
    if (drifted) {
      retire_graphs(kHotMaxTokens);
      preload_phases(false);
    }
    hot_review_us_ =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  for (auto& counts : hot_counts_) {
    for (double& c : counts) c *= 0.5;
  }
}

void Session::first_hot_split() {
  hot_split_ = true;
  // Per layer the fewest experts that took kHotCoverage of its choices so far; a layer that
  // needs more than a quarter of its experts for that is left whole.
  std::vector<HotLayer> hot;
  for (size_t i = 0; i < hot_counts_.size(); ++i) {
    const std::vector<double>& counts = hot_counts_[i];
    std::vector<int32_t> top = choose_hot_experts(
        counts, kHotCoverage, size_t(config_.n_expert_used), size_t(config_.n_expert) / 4);
    if (top.empty()) continue;
    const double share = hot_share(counts, top);
    hot.push_back(make_hot_layer(hot_count_layers_[i], std::move(top), share));
  }
  if (hot.empty()) return;
  std::swap(hot_, hot);
  bind_hot_layers();
  retire_graphs();
  // Where things live is decided again, with the hot experts as units of their own.
  std::map<std::string, std::string, std::less<>> before;
  if (const ResidencyPlan* p = scheduler_->residency_plan()) before = p->home;
  const ResidencyPlan* plan = plan_residency_again();
  if (!plan) return;
  // A layer whose whole experts stay on a device needs no hot ones.
  auto on_device = [&](const std::string& name) {
    const auto it = plan->home.find(name);
    if (it == plan->home.end()) return false;
    const int b = scheduler_->backend_index(it->second);
    return b != kNoBackend && !scheduler_->backends()[size_t(b)]->host_accessible();
  };
  const size_t split = hot_.size();
  std::erase_if(hot_, [&](const HotLayer& h) {
    return on_device(expert_tensor(h.set.layer, "ffn_gate_exps"));
  });
  if (hot_.size() != split) retire_graphs();
  apply_residency(before);
  // The trial: decode's steps before the split against those after it.
  if (!hot_.empty() && !hot_step_us_.empty()) {
    hot_before_us_ = median(hot_step_us_);
    hot_timing_ = true;
  }
  hot_step_us_.clear();
}

void Session::end_hot_split() {
  std::map<std::string, std::string, std::less<>> before;
  if (const ResidencyPlan* p = scheduler_->residency_plan()) before = p->home;
  for (const HotLayer& h : hot_) {  // their slabs and maps are freed below
    for (const char* what : {kSlabs[0], kSlabs[1], kSlabs[2], "hot_map", "cold_map"})
      executor_->unbind_weight(hot_expert_name(h.set.layer, what));
  }
  hot_.clear();
  hot_enabled_ = false;  // the routers' choices are no longer copied out (but for --routing-stats)
  hot_counts_.clear();
  hot_count_layers_.clear();
  retire_graphs();
  if (plan_residency_again()) apply_residency(before);
}

const ResidencyPlan* Session::plan_residency_again() {
  residency_planned_ = false;
  residency_stale_ = true;
  plan_residency(kPlanPrefillTokens);
  return scheduler_->residency_plan();
}

void Session::apply_residency(const std::map<std::string, std::string, std::less<>>& before) {
  const ResidencyPlan* plan = scheduler_->residency_plan();
  // What the new plan keeps elsewhere leaves each device; KV caches that moved are refilled.
  size_t moved_caches = 0;
  auto home = [](const auto& homes, const std::string& name) {
    const auto it = homes.find(name);
    return it == homes.end() ? std::string() : it->second;
  };
  std::set<std::string> caches;
  for (const auto* homes : {&before, &plan->home}) {
    for (const auto& [name, id] : *homes) {
      if (name.rfind("cache_", 0) == 0) caches.insert(name);
    }
  }
  for (const std::string& name : caches) {
    if (home(before, name) != home(plan->home, name)) ++moved_caches;
  }
  for (const auto& b : scheduler_->backends()) {
    if (b->host_accessible() || b->lost()) continue;
    Residency keep;
    for (const auto& [name, id] : plan->home) {
      if (id == b->backend_id()) keep.add(id, name, 0);
    }
    executor_->release(b->backend_id(), keep);
  }
  uploaded_for_.reset();
  if (moved_caches > 0) rebuild_caches(moved_caches);
  preload_phases();
}

void Session::preload_phases(bool prefill) {
  // The weights the next prefill and decode read from a device, uploaded now (between steps)
  // rather than in the next step.
  for (const int64_t n : {std::clamp<int64_t>(kPlanPrefillTokens, 1, n_ctx_), int64_t(1)}) {
    if (n > 1 && !prefill) continue;
    const LlamaGraph& lg = graph_for(n, false);
    auto placement = scheduler_->plan(lg.graph, executor_->residency());
    executor_->preload(lg.graph, *placement);
  }
  uploaded_for_.reset();
}

}  // namespace tandem
