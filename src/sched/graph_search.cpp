#include "graph_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "tandem/bytes.h"
#include "tandem/error.h"
#include "tandem/layer_split.h"

namespace tandem {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr uint8_t kHost = 1;  // group 0: host memory

uint8_t group_bit(int group) {
  return uint8_t(1u << group);
}

// Per-graph tables the search and the evaluator share: the compute ops in order, each one's
// distinct inputs by kind, its compute time per backend, and which activations are live
// between two ops.
class ExecutionSearch {
 public:
  ExecutionSearch(const PlannerConfig& c, const Graph& g) : c_(c), g_(g), nb_(c.backends.size()) {
    TANDEM_CHECK_ARG(c.n_groups <= 8, "execution search", "at most 7 devices");
    std::vector<int> step_of(g.size(), -1);
    for (const Node& n : g.nodes()) {
      if (!is_compute(n.op)) continue;
      step_of[size_t(n.id)] = int(steps_.size());
      Step st;
      st.node = n.id;
      for (TensorId in : n.inputs) {
        TensorId s = g.storage_of(in);
        const OpKind sop = g.node(s).op;
        if (sop == OpKind::Weight) {
          if (std::find(st.weights.begin(), st.weights.end(), s) == st.weights.end())
            st.weights.push_back(s);
        } else if (sop == OpKind::KvCache) {
          st.cache = s;
        } else if (std::find(st.acts.begin(), st.acts.end(), s) == st.acts.end()) {
          st.acts.push_back(s);
        }
      }
      const TensorId out = g.storage_of(n.id);
      if (g.node(out).op != OpKind::KvCache && g.node(out).op != OpKind::Weight) st.out = out;
      st.ok.resize(nb_);
      st.compute_us.resize(nb_);
      st.alone_us.resize(nb_);
      for (size_t b = 0; b < nb_; ++b) {
        st.ok[b] = c.backends[b]->check(g, n).ok();
        // A device runs its ops in segments, where an op's launch overlaps the op before; the
        // op that starts a segment (its input just moved there) pays its time alone.
        st.alone_us[b] = CostModel::estimate(g, n, c.profiles[b]).compute_us;
        st.compute_us[b] = c.group[b] != 0 ? CostModel::in_segment_us(st.alone_us[b], c.profiles[b])
                                           : st.alone_us[b];
      }
      // A pin to a lost device no longer holds: the op is placed as any other.
      const int pin = c.op_pin[size_t(n.op)];
      if (pin >= 0 && !c.backends[size_t(pin)]->lost()) st.forced = pin;
      for (TensorId a : st.acts) st.transient += g.tensor(a).bytes();
      if (!g.tensor(n.id).is_view()) st.transient += g.tensor(n.id).bytes();
      steps_.push_back(std::move(st));
    }
    // Liveness of activations (computed ones and inputs) between steps.
    const size_t n_steps = steps_.size();
    first_.assign(g.size(), -1);
    last_.assign(g.size(), -2);
    for (size_t k = 0; k < n_steps; ++k) {
      for (TensorId s : steps_[k].acts) last_[size_t(s)] = std::max(last_[size_t(s)], int(k));
      if (steps_[k].out != kNoTensor && first_[size_t(steps_[k].out)] < 0)
        first_[size_t(steps_[k].out)] = int(k);
    }
    // A graph output is read back to host memory once its last op ran: it leaves the live set
    // there, its copy priced at that step (retire_us). Kept live to the end, every layer's
    // router ids (outputs for the routing statistics) would multiply the search's states.
    retire_.assign(n_steps, {});
    for (TensorId o : g.outputs()) {
      const TensorId s = g.storage_of(o);
      if (first_[size_t(s)] < 0) continue;  // an input: in host memory from the start
      const int at = std::max(last_[size_t(s)], first_[size_t(s)]);
      last_[size_t(s)] = at;
      if (std::find(retire_[size_t(at)].begin(), retire_[size_t(at)].end(), s) ==
          retire_[size_t(at)].end())
        retire_[size_t(at)].push_back(s);
    }
    live_.resize(n_steps + 1);
    for (const Node& n : g.nodes()) {
      const TensorId s = n.id;
      if (g.storage_of(s) != s) continue;
      int from = n.op == OpKind::Input ? 0 : first_[size_t(s)] + 1;
      if (n.op != OpKind::Input && first_[size_t(s)] < 0) continue;
      for (int k = from; k <= last_[size_t(s)] && k <= int(n_steps); ++k)
        live_[size_t(k)].push_back(s);
    }
    for (size_t b = 0; b < nb_; ++b) {
      if (c.group[b] != 0 && device_of_group_[size_t(c.group[b])] < 0)
        device_of_group_[size_t(c.group[b])] = int(b);
    }
  }

  void set_homes(const ResidencyHomes& homes, bool check_memory) {
    weight_mask_.assign(g_.size(), kHost);
    cache_home_.assign(g_.size(), kNoBackend);
    free_.assign(nb_, 0);
    std::vector<size_t> resident(nb_, 0);
    for (const Node& n : g_.nodes()) {
      if (n.op != OpKind::Weight && n.op != OpKind::KvCache) continue;
      auto it = homes.find(g_.tensor(n.id).name);
      const int home = it == homes.end() ? kNoBackend : it->second;
      if (home >= 0) resident[size_t(home)] += g_.tensor(n.id).bytes();
      if (n.op == OpKind::Weight) {
        if (home >= 0) weight_mask_[size_t(n.id)] |= group_bit(c_.group[size_t(home)]);
      } else {
        cache_home_[size_t(n.id)] = home;
      }
    }
    for (size_t b = 0; b < nb_; ++b) {
      free_[b] = !check_memory                 ? std::numeric_limits<size_t>::max()
                 : c_.budgets[b] > resident[b] ? c_.budgets[b] - resident[b]
                                               : 0;
    }
  }

  // Cost of step k on backend b given where its activation inputs are (mask_of(s)); inf when b
  // cannot run it.
  template <class MaskOf>
  double step_cost(size_t k, size_t b, MaskOf mask_of) const {
    const Step& st = steps_[k];
    if (!st.ok[b] || (st.forced >= 0 && size_t(st.forced) != b)) return kInf;
    const int gb = c_.group[b];
    if (st.cache != kNoTensor) {
      const int home = cache_home_[size_t(st.cache)];
      if (home >= 0 ? size_t(home) != b : gb != 0) return kInf;
    }
    double cost = st.compute_us[b];
    if (gb != 0) {
      // A device's budget holds its resident tensors, the op's activations and, for a
      // streamed weight, staging memory for it and the ones copied ahead.
      if (st.transient > free_[b]) return kInf;
      double stream_us = 0.0;
      size_t largest = 0;
      for (TensorId w : st.weights) {
        if (weight_mask_[size_t(w)] & group_bit(gb)) continue;
        stream_us += CostModel::stream_us(g_.tensor(w).bytes(), c_.profiles[b].link);
        largest = std::max(largest, g_.tensor(w).bytes());
      }
      if (largest > 0 && size_t(kStreamAheadWeights + 1) * largest > free_[b] - st.transient)
        return kInf;
      // Copied on the copy queue ahead of use: only what the op does not hide shows.
      cost += std::max(0.0, stream_us - st.compute_us[b]);
    }
    cost += moves_us(k, b, mask_of) + retire_us(k, b, mask_of);
    return cost;
  }

  // The moves of step k's activations to backend b and, on a device, the launch of the
  // segment the step starts when one arrives there.
  template <class MaskOf>
  double moves_us(size_t k, size_t b, MaskOf mask_of) const {
    const auto& st = steps_[k];
    const int gb = c_.group[b];
    double t = 0.0;
    bool arrives = false;
    for (TensorId s : st.acts) {
      const double m = move_us(mask_of(s), gb, b, g_.tensor(s).bytes());
      t += m;
      arrives = arrives || m > 0.0;
    }
    if (gb != 0 && arrives) t += st.alone_us[b] - st.compute_us[b];
    return t;
  }

  // Time to make an activation valid in group gb (for backend b), given the groups holding it.
  double move_us(uint8_t m, int gb, size_t b, size_t bytes) const {
    if (m & group_bit(gb)) return 0.0;
    if (gb == 0) return CostModel::activation_us(bytes, c_.profiles[size_t(source_device(m))].link);
    double t = CostModel::activation_us(bytes, c_.profiles[b].link);
    if (!(m & kHost))
      t += CostModel::activation_us(bytes, c_.profiles[size_t(source_device(m))].link);
    return t;
  }

  int source_device(uint8_t m) const {
    for (int grp = 1; grp < c_.n_groups; ++grp) {
      if (m & group_bit(grp)) return device_of_group_[size_t(grp)];
    }
    return 0;
  }

  // The copies to host memory of the graph outputs whose last op is step k, run on b.
  template <class MaskOf>
  double retire_us(size_t k, size_t b, MaskOf mask_of) const {
    double t = 0.0;
    const uint8_t gbit = group_bit(c_.group[b]);
    for (TensorId s : retire_[k]) {
      const uint8_t m = s == steps_[k].out ? gbit : mask_of(s);
      if (!(m & kHost)) t += move_us(m, 0, 0, g_.tensor(s).bytes());
    }
    return t;
  }

  size_t index_in(size_t boundary, TensorId s) const {
    const auto& l = live_[boundary];
    return size_t(std::find(l.begin(), l.end(), s) - l.begin());
  }

  // The masks of the live set after step k ran on b, from those before it.
  void advance(size_t k, size_t b, const std::vector<uint8_t>& before,
               std::vector<uint8_t>& after) const {
    const Step& st = steps_[k];
    const uint8_t gbit = group_bit(c_.group[b]);
    const auto& lb = live_[k];
    const auto& la = live_[k + 1];
    after.assign(la.size(), 0);
    for (size_t i = 0; i < la.size(); ++i) {
      const TensorId s = la[i];
      if (s == st.out) {
        after[i] = gbit;
        continue;
      }
      uint8_t m = before[size_t(std::find(lb.begin(), lb.end(), s) - lb.begin())];
      if (std::find(st.acts.begin(), st.acts.end(), s) != st.acts.end()) m |= gbit;
      after[i] = m;
    }
  }

  std::vector<uint8_t> initial() const { return std::vector<uint8_t>(live_[0].size(), kHost); }

  ExecutionChoice run() const {
    struct Entry {
      std::vector<uint8_t> masks;
      double cost;
      int prev;
      int b;
    };
    ExecutionChoice out;
    out.backend.assign(g_.size(), kNoBackend);
    const size_t n_steps = steps_.size();
    std::vector<std::vector<Entry>> layers(n_steps + 1);
    layers[0].push_back({initial(), 0.0, -1, kNoBackend});
    std::vector<uint8_t> next;
    for (size_t k = 0; k < n_steps; ++k) {
      std::unordered_map<std::string, size_t> seen;
      auto& cur = layers[k];
      auto& nxt = layers[k + 1];
      for (size_t e = 0; e < cur.size(); ++e) {
        const auto& before = cur[e].masks;
        auto mask_of = [&](TensorId s) { return before[index_in(k, s)]; };
        for (size_t b = 0; b < nb_; ++b) {
          const double c = step_cost(k, b, mask_of);
          if (!std::isfinite(c)) continue;
          advance(k, b, before, next);
          const double total = cur[e].cost + c;
          auto [it, fresh] = seen.emplace(std::string(next.begin(), next.end()), nxt.size());
          if (fresh) {
            nxt.push_back({next, total, int(e), int(b)});
          } else if (total < nxt[it->second].cost) {
            nxt[it->second].cost = total;
            nxt[it->second].prev = int(e);
            nxt[it->second].b = int(b);
          }
        }
      }
      if (nxt.empty()) {
        const Node& n = g_.node(steps_[k].node);
        out.failure = "no backend can run node " + std::to_string(n.id) + " '" +
                      g_.tensor(n.id).name + "' (" + std::string(op_name(n.op)) +
                      ") with its inputs and KV cache where they live";
        return out;
      }
      if (nxt.size() > kMaxSearchStates) {
        // Keep the cheapest states; back pointers stay valid (they index the previous layer).
        std::nth_element(nxt.begin(), nxt.begin() + kMaxSearchStates, nxt.end(),
                         [](const Entry& a, const Entry& b) { return a.cost < b.cost; });
        nxt.resize(kMaxSearchStates);
        out.exact = false;
      }
    }
    auto& last = layers[n_steps];
    size_t best = 0;
    double best_cost = kInf;
    for (size_t e = 0; e < last.size(); ++e) {
      const double c = last[e].cost;
      if (c < best_cost) {
        best_cost = c;
        best = e;
      }
    }
    int e = int(best);
    for (size_t k = n_steps; k > 0; --k) {
      const Entry& en = layers[k][size_t(e)];
      out.backend[size_t(steps_[k - 1].node)] = en.b;
      e = en.prev;
    }
    out.cost_us = best_cost;
    out.timeline_us = timeline(out.backend);
    out.ok = true;
    return out;
  }

  // The assignment on a timeline: the copy queue streams weights back to back from the start,
  // an op starts when the previous op is done and its streamed weights have arrived.
  double timeline(std::span<const int> backend) const {
    std::vector<uint8_t> masks = initial(), next;
    double t = 0.0, queue = 0.0;
    for (size_t k = 0; k < steps_.size(); ++k) {
      const Step& st = steps_[k];
      const size_t b = size_t(backend[size_t(st.node)]);
      const int gb = c_.group[b];
      auto mask_of = [&](TensorId s) { return masks[index_in(k, s)]; };
      double work = st.compute_us[b] + moves_us(k, b, mask_of) + retire_us(k, b, mask_of);
      if (gb != 0) {
        for (TensorId w : st.weights) {
          if (weight_mask_[size_t(w)] & group_bit(gb)) continue;
          queue += CostModel::stream_us(g_.tensor(w).bytes(), c_.profiles[b].link);
          t = std::max(t, queue);
        }
      }
      t += work;
      advance(k, b, masks, next);
      masks.swap(next);
    }
    return t;
  }

  double evaluate(std::span<const int> backend) const {
    std::vector<uint8_t> masks = initial(), next;
    double total = 0.0;
    for (size_t k = 0; k < steps_.size(); ++k) {
      const int b = backend[size_t(steps_[k].node)];
      if (b < 0 || size_t(b) >= nb_) return kInf;
      auto mask_of = [&](TensorId s) { return masks[index_in(k, s)]; };
      const double c = step_cost(k, size_t(b), mask_of);
      if (!std::isfinite(c)) return kInf;
      total += c;
      advance(k, size_t(b), masks, next);
      masks.swap(next);
    }
    return total;
  }

 private:
  struct Step {
    TensorId node = kNoTensor;
    std::vector<TensorId> weights, acts;
    TensorId cache = kNoTensor;
    TensorId out = kNoTensor;
    int forced = kNoBackend;
    size_t transient = 0;  // activation bytes read and written
    std::vector<bool> ok;
    std::vector<double> compute_us;  // on a device: inside a segment
    std::vector<double> alone_us;    // the op timed alone (a device segment's first op)
  };
  const PlannerConfig& c_;
  const Graph& g_;
  const size_t nb_;
  std::vector<Step> steps_;
  std::vector<int> first_, last_;
  std::vector<std::vector<TensorId>> retire_;  // per step: the outputs read back after it
  std::vector<std::vector<TensorId>> live_;    // per boundary k (before step k): live storages
  std::array<int, 8> device_of_group_{-1, -1, -1, -1, -1, -1, -1, -1};
  std::vector<uint8_t> weight_mask_;
  std::vector<int> cache_home_;
  std::vector<size_t> free_;  // per backend: budget left beside its resident tensors
};

// ---- residency ----

struct Unit {
  std::string label;
  std::vector<std::string> names;
  size_t bytes = 0;
  bool is_layer = false;
  bool is_cache = false;
};

// The persistent tensors of the phases, grouped: one unit per layer's weights, one per layer's
// experts (the weights ExpertMatMul reads), one per layer's hot experts (the slabs a product
// with a map reads: fewer experts than its map names), one per layer's caches, the output
// layer, the rest.
struct Units {
  std::map<int, Unit> layer_weights, layer_experts, layer_hot, layer_caches;
  Unit output, rest;
  size_t largest_streamable = 0;  // largest layer weight (the ones a device streams)
  size_t transient = 0;           // largest activation bytes one op reads and writes
};

Units collect_units(const PlannerConfig& c, std::span<const Graph* const> phases) {
  Units u;
  u.output.label = "output";
  u.rest.label = "token embedding";
  std::set<std::string> experts, hot;
  for (const Graph* g : phases) {
    for (const Node& n : g->nodes()) {
      if (n.op != OpKind::ExpertMatMul) continue;
      const TensorDesc& a = g->tensor(g->storage_of(n.inputs[0]));
      const bool slab = n.inputs.size() > 3 && a.ne[2] < g->tensor(n.inputs[3]).ne[0];
      (slab ? hot : experts).insert(a.name);
    }
  }
  std::map<std::string, bool> seen;
  for (const Graph* g : phases) {
    for (const Node& n : g->nodes()) {
      if (is_compute(n.op)) {
        size_t t = 0;
        for (TensorId in : n.inputs) {
          TensorId s = g->storage_of(in);
          const OpKind sop = g->node(s).op;
          if (sop == OpKind::Weight) {
            if (n.op != OpKind::GetRows && layer_of(g->tensor(s).name) >= 0)
              u.largest_streamable = std::max(u.largest_streamable, g->tensor(s).bytes());
          } else if (sop != OpKind::KvCache) {
            t += g->tensor(s).bytes();
          }
        }
        if (!g->tensor(n.id).is_view()) t += g->tensor(n.id).bytes();
        u.transient = std::max(u.transient, t);
        continue;
      }
      if (n.op != OpKind::Weight && n.op != OpKind::KvCache) continue;
      const std::string& name = g->tensor(n.id).name;
      if (!seen.emplace(name, true).second) continue;
      // A pinned tensor's home is the pin's: not the search's to move.
      if (c.pin_matcher && c.pin_matcher->match(name) >= 0) continue;
      const size_t bytes = g->tensor(n.id).bytes();
      const int layer = layer_of(name);
      Unit* unit = &u.rest;
      if (layer >= 0) {
        auto& m = n.op == OpKind::KvCache ? u.layer_caches
                  : hot.count(name)       ? u.layer_hot
                  : experts.count(name)   ? u.layer_experts
                                          : u.layer_weights;
        unit = &m[layer];
        unit->is_layer = true;
        unit->is_cache = n.op == OpKind::KvCache;
      } else if (name.rfind("output", 0) == 0) {
        unit = &u.output;
      }
      unit->names.push_back(name);
      unit->bytes += bytes;
    }
  }
  return u;
}

std::string range_label(const std::vector<int>& layers) {
  if (layers.empty()) return "no layers";
  std::string s;
  size_t i = 0;
  while (i < layers.size()) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(layers[i]) +
         (j > i ? "-" + std::to_string(layers[j]) : "");
    i = j + 1;
  }
  return "layers " + s;
}

}  // namespace

ExecutionChoice search_execution(const PlannerConfig& config, const Graph& graph,
                                 const ResidencyHomes& homes) {
  ExecutionSearch s(config, graph);
  s.set_homes(homes, false);
  return s.run();
}

double evaluate_execution(const PlannerConfig& config, const Graph& graph,
                          const ResidencyHomes& homes, std::span<const int> backend,
                          bool check_memory) {
  TANDEM_CHECK_ARG(backend.size() == graph.size(), "evaluate_execution",
                   "needs one backend per node");
  ExecutionSearch s(config, graph);
  s.set_homes(homes, check_memory);
  return s.evaluate(backend);
}

double timeline_execution(const PlannerConfig& config, const Graph& graph,
                          const ResidencyHomes& homes, std::span<const int> backend) {
  TANDEM_CHECK_ARG(backend.size() == graph.size(), "timeline_execution",
                   "needs one backend per node");
  ExecutionSearch s(config, graph);
  s.set_homes(homes, false);
  if (!std::isfinite(s.evaluate(backend))) return kInf;
  return s.timeline(backend);
}

ResidencyHomes homes_of(const PlannerConfig& config, const ResidencyPlan& plan) {
  ResidencyHomes h;
  for (const auto& [name, id] : plan.home) {
    for (size_t b = 0; b < config.backends.size(); ++b) {
      if (config.backends[b]->backend_id() == id) h[name] = int(b);
    }
  }
  // Pinned tensors live where their pin says (a pin to a host backend: host memory).
  return h;
}

ResidencyPlan search_residency(const PlannerConfig& config, std::span<const Graph* const> phases,
                               const Residency& residency) {
  (void)residency;
  ResidencyPlan plan;
  const size_t nb = config.backends.size();
  std::vector<int> devices;
  for (size_t b = 0; b < nb; ++b) {
    if (config.group[b] != 0 && !config.backends[b]->lost()) devices.push_back(int(b));
  }
  const Units u = collect_units(config, phases);
  // Homes fixed by weight and cache pins, common to every candidate.
  ResidencyHomes pinned;
  for (const Graph* g : phases) {
    for (const Node& n : g->nodes()) {
      if ((n.op != OpKind::Weight && n.op != OpKind::KvCache) || !config.pin_matcher) continue;
      const int p = config.pin_matcher->match(g->tensor(n.id).name);
      if (p < 0) continue;
      const int pb = config.tensor_pin_backend[size_t(p)];
      // Pinned to a lost device: host memory, as a pin to a host backend.
      const Backend& pinned_to = *config.backends[size_t(pb)];
      if (!pinned_to.host_accessible() && !pinned_to.lost()) pinned[g->tensor(n.id).name] = pb;
    }
  }
  std::vector<size_t> pinned_bytes(nb, 0);
  for (const Graph* g : phases) {
    std::map<std::string, bool> counted;
    for (const Node& n : g->nodes()) {
      auto it = pinned.find(g->tensor(n.id).name);
      if (it != pinned.end() && counted.emplace(it->first, true).second)
        pinned_bytes[size_t(it->second)] += g->tensor(n.id).bytes();
    }
    break;
  }

  struct Option {
    std::string name;
    ResidencyHomes homes;
    std::vector<size_t> bytes;
  };
  std::vector<Option> options;
  auto add_option = [&](Option o) {
    for (const Option& other : options) {
      if (other.homes == o.homes) return;
    }
    options.push_back(std::move(o));
  };
  auto capacity = [&](int d, size_t reserve) {
    const size_t budget = config.budgets[size_t(d)];
    const size_t used = pinned_bytes[size_t(d)] + reserve;
    return budget > used ? budget - used : size_t(0);
  };
  plan.reserve_bytes.assign(nb, 0);
  // Everything resident: auto equals all-GPU when it fits.
  if (!devices.empty()) {
    Option all{"everything on " + config.backends[size_t(devices[0])]->backend_id(), pinned,
               std::vector<size_t>(nb, 0)};
    size_t total = 0;
    for (const auto* m : {&u.layer_weights, &u.layer_experts, &u.layer_caches}) {
      for (const auto& [l, unit] : *m) {
        total += unit.bytes;
        for (const auto& name : unit.names) all.homes[name] = devices[0];
      }
    }
    for (const Unit* unit : {&u.output, &u.rest}) {
      total += unit->bytes;
      for (const auto& name : unit->names) all.homes[name] = devices[0];
    }
    all.bytes[size_t(devices[0])] = total;
    if (devices.size() == 1 && total <= capacity(devices[0], 0)) add_option(all);
  }
  // The budget bounds what stays resident; the activations of the largest op and the minimum
  // staging of streamed weights come on top (reported in the plan).
  const size_t reserve = 0;
  for (int d : devices) {
    plan.reserve_bytes[size_t(d)] =
        size_t(kStreamAheadWeights + 1) * u.largest_streamable + u.transient;
  }
  std::set<int> layer_set;
  for (const auto* m : {&u.layer_weights, &u.layer_experts, &u.layer_caches}) {
    for (const auto& [l, unit] : *m) layer_set.insert(l);
  }
  const std::vector<int> layer_ids(layer_set.begin(), layer_set.end());
  // A MoE layer's experts are most of its bytes and a token reads top_k of n_expert of them:
  // besides whole layers, the candidates place every layer's dense part first and then the
  // experts that still fit (llama.cpp users' --n-cpu-moe), the others read in host memory.
  // With hot experts (a layer's most chosen, apart), a third: those of every layer before any
  // layer's other experts.
  const int expert_variants = u.layer_experts.empty() ? 1 : u.layer_hot.empty() ? 2 : 3;
  // The orders in which candidates fill the devices: the backends' own and, with several
  // devices, the fastest first (calibrated memory bandwidth: a token reads each resident weight
  // once). One sequence runs the layers one after another, so a layer costs least on the
  // fastest device that has room for it; the scores decide between the orders.
  std::vector<std::vector<int>> fill_orders{devices};
  if (devices.size() > 1) {
    std::vector<int> by_speed = devices;
    std::stable_sort(by_speed.begin(), by_speed.end(), [&](int a, int b) {
      return config.profiles[size_t(a)].memory_bandwidth_gbs >
             config.profiles[size_t(b)].memory_bandwidth_gbs;
    });
    if (by_speed != devices) fill_orders.push_back(std::move(by_speed));
  }
  // One candidate of whole layer ranges: the devices filled in the order `filled` (fastest first
  // or the backends'), each layer with or without its experts, the KV caches with their layers
  // or all first, the layers from the first up or the last down, the output before or after.
  auto layer_candidate = [&](const std::vector<int>& filled, bool experts_apart, bool hot_first,
                             bool kv_first, bool descending, bool out_first) {
    Option o{"", pinned, std::vector<size_t>(nb, 0)};
    std::vector<size_t> cap(nb, 0);
    for (int d : devices) cap[size_t(d)] = capacity(d, reserve);
    size_t dev = 0;
    std::vector<int> placed;
    bool kv_placed = false, out_placed = false;
    auto place_any = [&](const std::vector<const Unit*>& parts) {
      size_t bytes = 0;
      for (const Unit* p : parts) bytes += p->bytes;
      for (int d : filled) {
        if (bytes > cap[size_t(d)]) continue;
        for (const Unit* p : parts) {
          for (const auto& name : p->names) o.homes[name] = d;
        }
        cap[size_t(d)] -= bytes;
        o.bytes[size_t(d)] += bytes;
        return true;
      }
      return false;
    };
    if (kv_first) {
      std::vector<const Unit*> caches;
      for (const auto& [l, unit] : u.layer_caches) caches.push_back(&unit);
      kv_placed = place_any(caches);
    }
    if (out_first) out_placed = place_any({&u.output});
    std::vector<int> order = layer_ids;
    if (descending) std::reverse(order.begin(), order.end());
    for (int l : order) {
      std::vector<const Unit*> parts;
      if (auto it = u.layer_weights.find(l); it != u.layer_weights.end())
        parts.push_back(&it->second);
      if (auto it = u.layer_experts.find(l); !experts_apart && it != u.layer_experts.end())
        parts.push_back(&it->second);
      if (!kv_first) {
        if (auto it = u.layer_caches.find(l); it != u.layer_caches.end())
          parts.push_back(&it->second);
      }
      size_t bytes = 0;
      for (const Unit* p : parts) bytes += p->bytes;
      // Contiguous ranges: fill one device, then the next; stop at the first layer that
      // fits none.
      while (dev < filled.size() && bytes > cap[size_t(filled[dev])]) ++dev;
      if (dev == filled.size()) break;
      const int d = filled[dev];
      for (const Unit* p : parts) {
        for (const auto& name : p->names) o.homes[name] = d;
      }
      cap[size_t(d)] -= bytes;
      o.bytes[size_t(d)] += bytes;
      placed.push_back(l);
    }
    if (!out_first) out_placed = place_any({&u.output});
    // The units of the placed layers, in the layers' order, while they fit: the layers done.
    auto place_apart = [&](const std::map<int, Unit>& units) {
      std::vector<int> done;
      for (int l : order) {
        auto it = units.find(l);
        if (it == units.end() || std::find(placed.begin(), placed.end(), l) == placed.end())
          continue;
        if (place_any({&it->second})) done.push_back(l);
      }
      std::sort(done.begin(), done.end());
      return done;
    };
    const std::vector<int> hot_placed = hot_first ? place_apart(u.layer_hot) : std::vector<int>{};
    const std::vector<int> experts_placed =
        experts_apart ? place_apart(u.layer_experts) : std::vector<int>{};
    std::sort(placed.begin(), placed.end());
    o.name = range_label(placed) + (experts_apart ? " without experts" : "") +
             (out_placed ? ", output" : "") +
             (kv_first ? (kv_placed ? ", all KV" : ", KV on host") : ", KV with layers");
    if (!hot_placed.empty()) o.name += ", hot experts of " + range_label(hot_placed);
    if (experts_apart && !experts_placed.empty())
      o.name += ", experts of " + range_label(experts_placed);
    if (filled != devices) o.name += ", fastest device first";
    add_option(std::move(o));
  };
  for (const std::vector<int>& filled : fill_orders) {
    for (int variant = 0; variant < expert_variants; ++variant) {
      for (int kv_first = 0; kv_first < (devices.size() == 1 ? 2 : 1); ++kv_first) {
        for (int descending = 0; descending < (devices.empty() ? 0 : 2); ++descending) {
          for (int out_first = 0; out_first < 2; ++out_first) {
            layer_candidate(filled, variant >= 1, variant == 2, kv_first, descending, out_first);
          }
        }
      }
    }
  }
  add_option({devices.empty() ? "host memory only" : "nothing resident on a device", pinned,
              std::vector<size_t>(nb, 0)});

  // Score every option on every phase.
  std::vector<ExecutionSearch> searches;
  for (const Graph* g : phases) searches.emplace_back(config, *g);
  std::vector<double> best(phases.size(), kInf);
  for (Option& o : options) {
    ResidencyPlan::Candidate cand;
    cand.name = o.name;
    cand.device_bytes = o.bytes;
    for (size_t p = 0; p < phases.size(); ++p) {
      searches[p].set_homes(o.homes, false);
      ExecutionChoice ec = searches[p].run();
      cand.phase_us.push_back(ec.ok ? ec.timeline_us : kInf);
      best[p] = std::min(best[p], cand.phase_us.back());
    }
    plan.candidates.push_back(std::move(cand));
  }
  double best_score = kInf;
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    auto& cand = plan.candidates[i];
    cand.score = 0.0;
    for (size_t p = 0; p < phases.size(); ++p)
      cand.score += best[p] > 0 ? cand.phase_us[p] / best[p] : 1.0;
    if (cand.score < best_score) {
      best_score = cand.score;
      plan.chosen = int(i);
    }
  }
  if (plan.chosen < 0) {
    throw_error(ErrorCode::Unsupported, "scheduler",
                "no placement of the model's weights and KV caches can run every op");
  }
  for (const auto& [name, b] : options[size_t(plan.chosen)].homes)
    plan.home[name] = config.backends[size_t(b)]->backend_id();
  char buf[256];
  const auto& c = plan.candidates[size_t(plan.chosen)];
  std::string phase_text;
  for (double t : c.phase_us) {
    char one[48];
    std::snprintf(one, sizeof one, "%s%.0f us", phase_text.empty() ? "" : " / ", t);
    phase_text += one;
  }
  std::snprintf(buf, sizeof buf, "%s: predicted %s per step (score %.3f, best of %zu candidates)",
                c.name.c_str(), phase_text.c_str(), c.score, plan.candidates.size());
  plan.why = buf;
  return plan;
}

}  // namespace tandem
