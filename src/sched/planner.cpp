#include "planner.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <set>
#include <string>

#include "tandem/bytes.h"
#include "tandem/error.h"

namespace tandem {

namespace {

using Kind = SelectionReason::Kind;
constexpr uint64_t kHostBit = 1;  // group 0: host memory
uint64_t bit(int group) {
  return 1ull << group;
}

std::string node_label(const Graph& g, const Node& n) {
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
  Walk(const PlannerConfig& c, const Graph& g, const Residency& r, const SearchedPlacement* sp)
      : c_(c), g_(g), n_backends_(c.backends.size()), searched_(sp) {
    const size_t n = g.size();
    loc_.assign(n, 0);
    stream_copied_.resize(n);
    cache_home_.assign(n, kNoBackend);
    cache_written_.assign(n, false);
    producer_.assign(n, kNoBackend);
    weight_pin_.assign(n, -1);
    parent_.resize(n);
    std::iota(parent_.begin(), parent_.end(), 0);
    home_.assign(n, kNoBackend);
    used_.resize(n_backends_);
    exhausted_.assign(n_backends_, false);
    exhaust_needed_.assign(n_backends_, 0);
    exhaust_free_.assign(n_backends_, 0);
    exhaust_detail_.resize(n_backends_);
    evals_.resize(n_backends_);
    stream_evals_.resize(n_backends_);
    ring_reserved_.assign(n_backends_, 0);
    copy_free_us_.assign(n_backends_, 0.0);
    streamed_by_.assign(n_backends_, 0);
    excluded_.assign(n_backends_, false);
    searched_home_.assign(g.size(), kNoBackend);
    group_backend_.assign(size_t(c.n_groups), kNoBackend);
    for (size_t b = 0; b < n_backends_; ++b) {
      used_[b] = r.resident_bytes(c.backends[b]->backend_id());
      if (group_backend_[size_t(c.group[b])] == kNoBackend) {
        group_backend_[size_t(c.group[b])] = int(b);
      }
    }
    init_leaves(r);
  }

  Placement run() {
    Placement p;
    p.backends = c_.backends;
    p.nodes.resize(g_.size());
    for (const Node& n : g_.nodes()) {
      BackendSelection& sel = p.nodes[size_t(n.id)];
      if (is_leaf(n.op)) continue;
      if (is_metadata(n.op)) {
        int b = producer_[size_t(g_.storage_of(n.id))];
        set_backend(sel, b);
        sel.reason.kind = Kind::FollowsSource;
        continue;
      }
      select(n, sel);
      apply(n, sel);
      p.estimated_us += sel.estimated_cost.total_us();
      now_us_ += sel.estimated_cost.total_us();
    }
    p.copies = std::move(copies_);
    for (const Node& n : g_.nodes()) {
      if (n.op == OpKind::KvCache && cache_home_[size_t(n.id)] != kNoBackend)
        p.kv_homes.emplace_back(n.id, cache_home_[size_t(n.id)]);
    }
    p.planned_transfers = transfers_;
    p.planned_uploads = uploads_;
    p.streamed_bytes = streamed_bytes_;
    p.stream_staging_bytes.assign(n_backends_, 0);
    for (size_t b = 0; b < n_backends_; ++b) {
      if (ring_reserved_[b] == 0) continue;
      // The reserved minimum plus what the budget leaves, up to the cap.
      const size_t free = c_.budgets[b] > used_[b] ? c_.budgets[b] - used_[b] : 0;
      // Auto's budget bounds weights and KV caches: its staging comes on top, as much as one
      // step streams (up to the cap), like a device planned without a budget.
      p.stream_staging_bytes[b] =
          searched_ ? std::max(ring_reserved_[b], std::min(streamed_by_[b], kMaxStreamStagingBytes))
                    : std::max(ring_reserved_[b],
                               std::min(ring_reserved_[b] + free, kMaxStreamStagingBytes));
    }
    return p;
  }

 private:
  int backend_of(const std::string& id) const {
    for (size_t b = 0; b < n_backends_; ++b) {
      if (c_.backends[b]->backend_id() == id) return int(b);
    }
    return kNoBackend;
  }

  int find(int x) {
    while (parent_[size_t(x)] != x) x = parent_[size_t(x)] = parent_[size_t(parent_[size_t(x)])];
    return x;
  }

  bool is_cache(TensorId s) const { return g_.node(s).op == OpKind::KvCache; }

  void init_leaves(const Residency& r) {
    for (const Node& n : g_.nodes()) {
      const std::string& name = g_.tensor(n.id).name;
      if (n.op == OpKind::Input) {
        loc_[size_t(n.id)] = kHostBit;
      } else if (n.op == OpKind::Weight || n.op == OpKind::KvCache) {
        // Weights are bound as host data; caches exist only where the residency lists them.
        uint64_t m = n.op == OpKind::Weight ? kHostBit : 0;
        if (r.size() > 0) {
          for (const std::string& id : r.locations(name)) {
            int b = backend_of(id);
            if (b == kNoBackend) continue;
            m |= bit(c_.group[size_t(b)]);
            if (n.op == OpKind::KvCache && home_[size_t(n.id)] == kNoBackend) {
              home_[size_t(n.id)] = b;
            }
          }
        }
        loc_[size_t(n.id)] = m;
        if (searched_) {
          auto it = searched_->homes.find(name);
          if (it != searched_->homes.end()) {
            searched_home_[size_t(n.id)] = it->second;
            if (n.op == OpKind::KvCache && home_[size_t(n.id)] == kNoBackend)
              home_[size_t(n.id)] = it->second;
          }
        }
        // Pins match weights and KV caches by name (a cache pin keeps a layer's state there).
        if (n.op == OpKind::Weight || n.op == OpKind::KvCache) {
          if (c_.pin_matcher) weight_pin_[size_t(n.id)] = c_.pin_matcher->match(name);
        }
      } else if (n.op == OpKind::Attention) {
        // K and V caches read by one attention live together.
        TensorId k = g_.storage_of(n.inputs[1]), v = g_.storage_of(n.inputs[2]);
        if (is_cache(k) && is_cache(v)) parent_[size_t(find(k))] = find(v);
      }
    }
    for (const Node& n : g_.nodes()) {
      if (n.op != OpKind::KvCache) continue;
      int rep = find(n.id);
      if (home_[size_t(rep)] == kNoBackend) home_[size_t(rep)] = home_[size_t(n.id)];
    }
  }

  // The KV cache a node is tied to (its representative), or -1.
  int cache_of(const Node& n) {
    TensorId s = kNoTensor;
    if (n.op == OpKind::KvWrite) s = g_.storage_of(n.inputs[0]);
    if (n.op == OpKind::Attention) s = g_.storage_of(n.inputs[1]);
    return s != kNoTensor && is_cache(s) ? find(s) : -1;
  }

  int hops(uint64_t m, int gb) const {
    if (m == 0 || (m & bit(gb))) return 0;
    if (m & kHostBit) return 1;
    return gb == 0 ? 1 : 2;
  }

  void evaluate(const Node& n) {
    std::fill(excluded_.begin(), excluded_.end(), false);
    hops_.assign(n.inputs.size(), 0);
    for (size_t b = 0; b < n_backends_; ++b) {
      Eval& e = evals_[b];
      e = Eval{};
      e.check = c_.backends[b]->check(g_, n);
      const int gb = c_.group[b];
      size_t persistent = 0, transient = 0;
      bool persistent_here = false;  // reads a weight or cache already in this memory
      bool input_here = false;       // reads anything already in this memory
      int source_device = kNoBackend;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        TensorId s = g_.storage_of(n.inputs[i]);
        bool dup = false;
        for (size_t j = 0; j < i; ++j) dup = dup || g_.storage_of(n.inputs[j]) == s;
        if (dup) {
          hops_[i] = 0;
          continue;
        }
        const uint64_t m = loc_[size_t(s)];
        hops_[i] = uint8_t(hops(m, gb));
        if (m != 0 && !(m & kHostBit) && !(m & bit(gb))) {
          for (int grp = 1; grp < c_.n_groups; ++grp) {
            if (m & bit(grp)) source_device = group_backend_[size_t(grp)];
          }
        }
        if (m & bit(gb)) {
          input_here = input_here || g_.node(s).op != OpKind::Input;
          OpKind sop = g_.node(s).op;
          persistent_here = persistent_here || sop == OpKind::Weight || sop == OpKind::KvCache;
          continue;
        }
        const size_t bytes = g_.tensor(s).bytes();
        OpKind sop = g_.node(s).op;
        if (sop == OpKind::Weight) {
          // Under a searched placement a weight homed elsewhere is streamed, not uploaded.
          if (gb != 0 && !(searched_ && searched_home_[size_t(s)] != int(b))) persistent += bytes;
        } else if (sop == OpKind::KvCache) {
          (m == 0 || n.op == OpKind::KvWrite ? persistent : transient) += bytes;
        } else {
          transient += bytes;
        }
      }
      if (!g_.tensor(n.id).is_view()) transient += g_.tensor(n.id).bytes();
      BackendProfile prof = c_.profiles[b];
      // A host candidate pulls device data over that device's link.
      if (gb == 0 && source_device != kNoBackend)
        prof.link = c_.profiles[size_t(source_device)].link;
      // A device keeps a weight it was sent: one upload serves many runs, or it would keep a
      // weight off the GPU forever.
      e.cost = CostModel::estimate(g_, n, prof, hops_, gb != 0 ? kWeightReuseRuns : 1.0);
      e.persistent = persistent;
      e.needed = persistent + transient;
      e.free = c_.budgets[b] > used_[b] ? c_.budgets[b] - used_[b] : 0;
      // Auto's budget bounds what stays resident (weights, KV caches); activations come on top.
      e.fits = (searched_ ? e.persistent : e.needed) <= e.free;
      const std::string& id = c_.backends[b]->backend_id();
      // An exhausted device still takes ops on weights or caches already there (preloaded)
      // that need no new memory, and ops on activations it already holds (a streamed chain);
      // other activation-only ops stay off it (no ping-pong).
      if (searched_) {
        if (!e.fits)
          e.memory_detail = id + " needs " + format_bytes(e.persistent) +
                            " resident, its budget has " + format_bytes(e.free) + " free";
      } else if (exhausted_[b] && (persistent > 0 || (!persistent_here && !input_here))) {
        e.fits = false;
        e.needed = exhaust_needed_[b];
        e.free = exhaust_free_[b];
        e.memory_detail = exhaust_detail_[b];
      } else if (!e.fits) {
        e.memory_detail = id + " needs " + format_bytes(e.needed) + " (" +
                          format_bytes(persistent) + " persistent), its budget has " +
                          format_bytes(e.free) + " free";
        // A device that refused a weight takes no later op that needs new memory or reads
        // nothing on it, as llama.cpp's -ngl: a prefix on the device, no ping-pong after.
        if (gb != 0 && persistent > 0 && e.check.ok()) {
          exhausted_[b] = true;
          exhaust_needed_[b] = e.needed;
          exhaust_free_[b] = e.free;
          exhaust_detail_[b] =
              "budget of " + id + " exhausted at " + node_label(g_, n) + ": " + e.memory_detail;
        }
      }
    }
  }

  // Whether weight storage s lives in host memory as far as device b is concerned: pinned to a
  // host backend, or (unpinned) too large for what b has left.
  bool host_homed(TensorId s, int b) const {
    const int p = weight_pin_[size_t(s)];
    if (p >= 0) {
      const int pb = c_.tensor_pin_backend[size_t(p)];
      return c_.backends[size_t(pb)]->host_accessible();
    }
    if (searched_) return searched_home_[size_t(s)] != b;
    return !evals_[size_t(b)].fits;
  }

  // For each device that can run n: the cost of running it with its host-resident weights
  // streamed in (copied each run on the copy queue, overlapped with execution).
  void evaluate_streamed(const Node& n) {
    for (size_t b = 0; b < n_backends_; ++b) {
      StreamEval& se = stream_evals_[b];
      se = StreamEval{};
      const int gb = c_.group[b];
      if (gb == 0 || !evals_[b].check.ok()) continue;
      std::vector<uint8_t> in_hops(n.inputs.size(), 0);
      size_t transient = 0, largest = 0;
      bool other_persistent = false;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        TensorId s = g_.storage_of(n.inputs[i]);
        bool dup = false;
        for (size_t j = 0; j < i; ++j) dup = dup || g_.storage_of(n.inputs[j]) == s;
        const uint64_t m = loc_[size_t(s)];
        if (dup || (m & bit(int(gb)))) continue;
        const OpKind sop = g_.node(s).op;
        const size_t bytes = g_.tensor(s).bytes();
        if (sop == OpKind::Weight) {
          if (!host_homed(s, int(b))) {
            other_persistent = true;  // uploaded as usual: not a streamed candidate
            continue;
          }
          se.weights.push_back(s);
          se.weight_bytes += bytes;
          largest = std::max(largest, bytes);
          continue;
        }
        if (sop == OpKind::KvCache) other_persistent = true;
        in_hops[i] = uint8_t(hops(m, int(gb)));
        transient += bytes;
      }
      if (se.weights.empty() || other_persistent) continue;
      if (!g_.tensor(n.id).is_view()) transient += g_.tensor(n.id).bytes();
      const BackendProfile& prof = c_.profiles[b];
      OpCost base = CostModel::estimate(g_, n, prof, in_hops);
      double weight_us = 0.0;
      for (TensorId w : se.weights) {
        weight_us += CostModel::stream_us(g_.tensor(w).bytes(), prof.link);
      }
      // On the step's timeline: the copy queue streams from the step's start, one copy after
      // another, while the ops before this one execute (on any backend); the op starts once its
      // activations are there and its weights have landed. Only the wait shows.
      se.arrival_us = copy_free_us_[b] + weight_us;
      se.cost = base;
      se.cost.transfer_us += std::max(0.0, se.arrival_us - (now_us_ + base.transfer_us));
      const size_t ring = size_t(kStreamAheadWeights + 1) * largest;
      se.ring_growth = ring > ring_reserved_[b] ? ring - ring_reserved_[b] : 0;
      const size_t needed = transient + se.ring_growth;
      const size_t free = c_.budgets[b] > used_[b] ? c_.budgets[b] - used_[b] : 0;
      se.ok = needed <= free || searched_ != nullptr;
    }
  }

  int best_streamed() const {
    int best = kNoBackend;
    for (size_t b = 0; b < n_backends_; ++b) {
      if (excluded_[b] || !stream_evals_[b].ok) continue;
      if (best < 0 ||
          stream_evals_[b].cost.total_us() < stream_evals_[size_t(best)].cost.total_us()) {
        best = int(b);
      }
    }
    return best;
  }

  // Runs n on device b with its host weights streamed; `host` is the host candidate it beat.
  void choose_streamed(BackendSelection& sel, int b, int host, const std::string& why) {
    const StreamEval& se = stream_evals_[size_t(b)];
    SelectionReason r;
    r.kind = Kind::Streamed;
    char buf[192];
    std::snprintf(buf, sizeof buf, "%s streams %s of host weights: %.1f us vs %.1f us on %s",
                  c_.backends[size_t(b)]->backend_id().c_str(),
                  format_bytes(se.weight_bytes).c_str(), se.cost.total_us(),
                  host >= 0 ? evals_[size_t(host)].cost.total_us() : 0.0,
                  host >= 0 ? c_.backends[size_t(host)]->backend_id().c_str() : "none");
    r.why = why.empty() ? std::string(buf) : why + "; " + buf;
    if (host >= 0)
      r.costs.push_back({host, c_.backends[size_t(host)]->backend_id(), evals_[size_t(host)].cost});
    r.costs.push_back({b, c_.backends[size_t(b)]->backend_id(), se.cost});
    choose(sel, b, std::move(r), RejectReason::MoreExpensive, "", &se.cost);
    sel.streamed = se.weights;
    copy_free_us_[size_t(b)] = se.arrival_us;
  }

  // Whether streaming beats running on `host` (kNoBackend: no host candidate at all).
  int streamed_over(int host) const {
    const int sb = best_streamed();
    if (sb < 0) return kNoBackend;
    if (host >= 0 && evals_[size_t(host)].ok() &&
        evals_[size_t(host)].cost.total_us() <= stream_evals_[size_t(sb)].cost.total_us()) {
      return kNoBackend;
    }
    return sb;
  }

  void set_backend(BackendSelection& sel, int b) const {
    sel.backend_index = b;
    sel.backend = b >= 0 ? c_.backends[size_t(b)].get() : nullptr;
  }

  std::string all_reasons() const {
    std::string s;
    for (size_t b = 0; b < n_backends_; ++b) {
      const Eval& e = evals_[b];
      s += (b ? "; " : "") + c_.backends[b]->backend_id() + ": " +
           (!e.check.ok() ? e.check.detail
            : !e.fits     ? e.memory_detail
                          : "ok");
    }
    return s;
  }

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

  int first_ok(BackendKind kind, bool same_kind) const {
    for (size_t b = 0; b < n_backends_; ++b) {
      bool k = c_.backends[b]->kind() == kind;
      if (k == same_kind && !excluded_[b] && evals_[b].ok()) return int(b);
    }
    return kNoBackend;
  }

  int first_of(BackendKind kind) const {
    for (size_t b = 0; b < n_backends_; ++b) {
      if (c_.backends[b]->kind() == kind) return int(b);
    }
    return kNoBackend;
  }

  SelectionReason memory_reason(const Eval& e) const {
    SelectionReason r;
    r.kind = Kind::MemoryConstraint;
    r.needed_bytes = e.needed;
    r.free_bytes = e.free;
    r.why = e.memory_detail;
    return r;
  }

  // Whether weight s stays in host memory for the whole step: pinned to a host backend, or left
  // there by the whole-graph search.
  bool lives_on_host(TensorId s) const {
    const int p = weight_pin_[size_t(s)];
    if (p >= 0) return c_.backends[size_t(c_.tensor_pin_backend[size_t(p)])]->host_accessible();
    if (!searched_) return false;
    const int h = searched_home_[size_t(s)];
    return h < 0 || c_.backends[size_t(h)]->host_accessible();
  }

  // The ops on weights in host memory (llama.cpp's -ngl and -ot ...=cpu, or auto's residency) split
  // at one point, decided at the first of them: the host computes those before it while the copy
  // queue, which streams from the step's start, brings the weights of those after it, which a
  // GPU runs as they land. The point minimizes the step's predicted end (simulated below). A
  // prefill streams them all (the host is far slower); a decode step shares them. Returns the
  // 1 where n runs on the host, 0 where it streams, -1 where it reads no such weight.
  int host_side(const Node& n, int host) {
    if (host_rank_.empty()) {
      host_rank_.assign(g_.size(), -1);
      const int gpu = first_ok(BackendKind::Gpu, true);
      if (gpu < 0) return -1;
      const BackendProfile& hp = c_.profiles[size_t(host)];
      const BackendProfile& gp = c_.profiles[size_t(gpu)];
      std::vector<double> cpu_us, gpu_us, copy_us;
      for (const Node& m : g_.nodes()) {
        if (!is_compute(m.op) || m.id < n.id) continue;
        double bytes_us = 0.0;
        for (TensorId in : m.inputs) {
          const TensorId s = g_.storage_of(in);
          if (g_.node(s).op != OpKind::Weight || !lives_on_host(s)) continue;
          bytes_us += CostModel::stream_us(g_.tensor(s).bytes(), gp.link);
        }
        if (bytes_us <= 0.0) continue;
        host_rank_[size_t(m.id)] = int(cpu_us.size());
        cpu_us.push_back(CostModel::estimate(g_, m, hp).compute_us);
        gpu_us.push_back(CostModel::estimate(g_, m, gp).compute_us);
        copy_us.push_back(bytes_us);
      }
      // The step's end for each split k: the host runs ops [0, k) one after another; the copy
      // queue streams the weights of ops [k, n) from where it stands, and the GPU runs each of
      // those once its weights have landed and the op before it is done.
      // Each change of device on the chain moves the activation once over the link.
      const size_t k_max = cpu_us.size();
      const bool on_host = current_ >= 0 && c_.group[size_t(current_)] == 0;
      const double hop_us = CostModel::transfer_us(g_.tensor(n.id).bytes(), gp.link);
      auto step_end = [&](const std::vector<bool>& host_side) {
        double t = now_us_, queue = copy_free_us_[size_t(gpu)];
        bool here = on_host;
        for (size_t i = 0; i < k_max; ++i) {
          if (host_side[i] != here) t += hop_us;
          here = host_side[i];
          if (here) {
            t += cpu_us[i];
          } else {
            queue += copy_us[i];
            t = std::max(t, queue) + gpu_us[i];
          }
        }
        return t;
      };
      // The best single split point, then single ops after it moved back to the host where
      // that ends the step sooner (the last ops of a prefill read one token: the output matrix
      // costs the host less than the queue).
      host_side_.assign(k_max, false);
      std::vector<bool> trial(k_max, false);
      double best = step_end(trial);
      size_t split = 0;
      for (size_t k = 1; k <= k_max; ++k) {
        trial[k - 1] = true;
        const double t = step_end(trial);
        if (t < best) {
          best = t;
          split = k;
        }
      }
      for (size_t i = 0; i < split; ++i) host_side_[i] = true;
      for (size_t i = k_max; i-- > split;) {
        host_side_[i] = true;
        const double t = step_end(host_side_);
        if (t < best) {
          best = t;
        } else {
          host_side_[i] = false;
        }
      }
      const size_t on_cpu = size_t(std::count(host_side_.begin(), host_side_.end(), true));
      char buf[192];
      std::snprintf(buf, sizeof buf,
                    "host weights split: %zu of %zu ops on %s (the first %zu), the rest streamed "
                    "(step end %.1f us)",
                    on_cpu, k_max, c_.backends[size_t(host)]->backend_id().c_str(), split, best);
      split_why_ = buf;
    }
    const int rank = host_rank_[size_t(n.id)];
    return rank < 0 ? -1 : host_side_[size_t(rank)] ? 1 : 0;
  }

  // The GPU that produced n's latest computed input, where n reads no weight or KV cache
  // and that GPU can run it; else kNoBackend.
  int follow_gpu(const Node& n, TensorId& latest) const {
    for (TensorId in : n.inputs) {
      const TensorId s = g_.storage_of(in);
      const OpKind op = g_.node(s).op;
      if (op == OpKind::Weight || op == OpKind::KvCache) return kNoBackend;
      if (!is_leaf(op) && (latest == kNoTensor || s > latest)) latest = s;
    }
    if (latest == kNoTensor) return kNoBackend;
    const int b = producer_[size_t(latest)];
    if (b < 0 || excluded_[size_t(b)] || !evals_[size_t(b)].ok()) return kNoBackend;
    const Backend& be = *c_.backends[size_t(b)];
    return be.kind() == BackendKind::Gpu && !be.host_accessible() ? b : kNoBackend;
  }

  // GpuPreferred and CpuPreferred: the preferred kind if one can, else the other kind.
  void preferred(const Node& n, BackendSelection& sel, BackendKind want) {
    const bool gpu = want == BackendKind::Gpu;
    const std::string want_name(backend_kind_name(want));
    const std::string pref = gpu ? "gpu_preferred" : "cpu_preferred";
    int b = first_ok(want, true);
    if (b >= 0) {
      SelectionReason r;
      r.kind = gpu ? Kind::GpuAvailable : Kind::CpuAvailable;
      if (gpu) {
        // With layers split across GPUs, an op that reads no weight or cache runs on the GPU
        // holding its latest input instead of sending the hidden state back to the first.
        TensorId latest = kNoTensor;
        const int f = follow_gpu(n, latest);
        if (f >= 0 && f != b) {
          b = f;
          r.why = "follows its input '" + g_.tensor(latest).name + "' to " +
                  c_.backends[size_t(f)]->backend_id();
        }
      }
      choose(sel, b, r, RejectReason::NotAllowed, pref + ": lower preference");
      return;
    }
    int fallback = first_ok(want, false);
    if (gpu) {
      // The GPU has no room for the weight: streaming it in may still beat the fallback.
      const int sb = streamed_over(fallback);
      if (sb >= 0) {
        choose_streamed(sel, sb, fallback, "");
        return;
      }
    }
    int first = first_of(want);
    SelectionReason r;
    if (first == kNoBackend) {
      r.kind = gpu ? Kind::GpuUnavailable : Kind::GpuFallback;
      r.why = "no " + want_name + " backend";
    } else {
      const Eval& e = evals_[size_t(first)];
      if (e.check.ok() && !e.fits) {
        r = memory_reason(e);
      } else {
        r.kind = gpu ? Kind::CpuFallback : Kind::GpuFallback;
        r.why = e.check.ok() ? "excluded by a pin" : e.check.detail;
      }
    }
    if (fallback < 0) fail(ErrorCode::Unsupported, n, "no backend can run it");
    if (c_.strict) {
      fail(r.kind == Kind::MemoryConstraint ? ErrorCode::OutOfMemory : ErrorCode::Unsupported, n,
           "strict mode refuses the fallback to " + c_.backends[size_t(fallback)]->backend_id() +
               " (" + r.to_string() + ")");
    }
    choose(sel, fallback, r, RejectReason::NotAllowed, pref + ": lower preference");
  }

  void automatic(const Node& n, BackendSelection& sel) {
    int best_fit = kNoBackend, best_any = kNoBackend;
    std::vector<CandidateCost> costs;
    for (size_t b = 0; b < n_backends_; ++b) {
      const Eval& e = evals_[b];
      if (excluded_[b] || !e.check.ok()) continue;
      costs.push_back({int(b), c_.backends[b]->backend_id(), e.cost});
      double t = e.cost.total_us();
      if (best_any < 0 || t < evals_[size_t(best_any)].cost.total_us()) best_any = int(b);
      if (e.fits && (best_fit < 0 || t < evals_[size_t(best_fit)].cost.total_us())) {
        best_fit = int(b);
      }
    }
    if (best_any < 0) fail(ErrorCode::Unsupported, n, "no backend can run it");
    {
      const int sb = streamed_over(best_fit);
      if (sb >= 0) {
        choose_streamed(sel, sb, best_fit, "");
        return;
      }
    }
    if (best_fit < 0) fail(ErrorCode::OutOfMemory, n, "no backend has room for it");
    int chosen = best_fit;
    SelectionReason r;
    r.kind = Kind::CostModel;
    const double best = evals_[size_t(best_fit)].cost.total_us();
    char buf[160];
    std::snprintf(buf, sizeof buf, "cheapest");
    if (current_ >= 0 && current_ != best_fit && !excluded_[size_t(current_)] &&
        evals_[size_t(current_)].ok()) {
      double cur = evals_[size_t(current_)].cost.total_us();
      double ratio = best > 0 ? cur / best : 1.0;
      if (ratio < c_.switch_threshold) {
        chosen = current_;
        std::snprintf(
            buf, sizeof buf, "stays on %s: %.2fx the cheapest, under switch_threshold %.2f",
            c_.backends[size_t(current_)]->backend_id().c_str(), ratio, c_.switch_threshold);
      } else {
        std::snprintf(buf, sizeof buf, "leaves %s: %.2fx the cheapest, switch_threshold %.2f",
                      c_.backends[size_t(current_)]->backend_id().c_str(), ratio,
                      c_.switch_threshold);
      }
    }
    r.why = buf;
    if (best_any != best_fit && evals_[size_t(best_any)].cost.total_us() < best) {
      // The cheapest backend had no room.
      SelectionReason m = memory_reason(evals_[size_t(best_any)]);
      if (c_.strict) {
        fail(ErrorCode::OutOfMemory, n,
             "strict mode refuses moving it off the cheapest backend (" + m.to_string() + ")");
      }
      r.kind = Kind::MemoryConstraint;
      r.needed_bytes = m.needed_bytes;
      r.free_bytes = m.free_bytes;
      r.why = m.why;
    }
    r.costs = std::move(costs);
    choose(sel, chosen, std::move(r), RejectReason::MoreExpensive, "");
  }

  void backend_only(const Node& n, BackendSelection& sel) {
    const int b = c_.only;
    const Eval& e = evals_[size_t(b)];
    const std::string& id = c_.backends[size_t(b)]->backend_id();
    if (!e.check.ok()) {
      throw_error(ErrorCode::Unsupported, "scheduler",
                  "backend_only(" + id + ") cannot run " + node_label(g_, n) + ": " +
                      e.check.detail + " (" + std::string(reject_reason_name(e.check.reason)) +
                      ")");
    }
    if (!e.fits) {
      throw_error(
          ErrorCode::OutOfMemory, "scheduler",
          "backend_only(" + id + ") has no room for " + node_label(g_, n) + ": " + e.memory_detail);
    }
    SelectionReason r;
    r.kind = Kind::UserPreference;
    r.why = "strategy backend_only(" + id + ")";
    choose(sel, b, r, RejectReason::NotAllowed, r.why);
  }

  // Follows the whole-graph search's backend for n; false when it has no room there.
  bool follow_search(const Node& n, BackendSelection& sel) {
    const int b = searched_->backend[size_t(n.id)];
    if (b < 0) return false;
    const StreamEval& se = stream_evals_[size_t(b)];
    char buf[160];
    std::snprintf(buf, sizeof buf, "whole-graph search (step predicted %.1f us)",
                  searched_->predicted_us);
    // Ops on weights the residency left in host memory share them as the gpu strategy does
    // (host_side): the search prices each op alone and cannot see the copy queue run ahead.
    int host = kNoBackend;
    for (size_t h = 0; h < n_backends_; ++h) {
      if (c_.group[h] == 0 && evals_[h].ok() &&
          (host < 0 || evals_[h].cost.total_us() < evals_[size_t(host)].cost.total_us()))
        host = int(h);
    }
    const int side = host >= 0 ? host_side(n, host) : -1;
    if (side >= 0) {
      if (side == 0) {
        const int sb = best_streamed();
        if (sb >= 0) {
          choose_streamed(sel, sb, host, std::string(buf) + "; " + split_why_);
          return true;
        }
      }
      SelectionReason r;
      r.kind = Kind::CostModel;
      r.why = std::string(buf) + "; " + split_why_;
      choose(sel, host, std::move(r), RejectReason::MoreExpensive, "");
      return true;
    }
    if (!se.weights.empty()) {
      if (!se.ok) return false;
      choose_streamed(sel, b, host, buf);
      return true;
    }
    if (!evals_[size_t(b)].ok()) return false;
    SelectionReason r;
    r.kind = Kind::CostModel;
    r.why = buf;
    int cheapest = kNoBackend;
    for (size_t i = 0; i < n_backends_; ++i) {
      if (!evals_[i].check.ok()) continue;
      r.costs.push_back({int(i), c_.backends[i]->backend_id(), evals_[i].cost});
      if (cheapest < 0 || evals_[i].cost.total_us() < evals_[size_t(cheapest)].cost.total_us())
        cheapest = int(i);
    }
    if (cheapest >= 0 && cheapest != b && !evals_[size_t(cheapest)].fits) {
      // Cheaper alone, but it has no room.
      SelectionReason m = memory_reason(evals_[size_t(cheapest)]);
      m.costs = std::move(r.costs);
      m.why = std::string(buf) + "; " + m.why;
      r = std::move(m);
    }
    choose(sel, b, std::move(r), RejectReason::MoreExpensive, "");
    return true;
  }

  void select(const Node& n, BackendSelection& sel) {
    evaluate(n);
    evaluate_streamed(n);
    if (searched_ && follow_search(n, sel)) return;
    const bool may_stream = c_.strategy.kind == Strategy::Kind::GpuPreferred ||
                            c_.strategy.kind == Strategy::Kind::Automatic;
    // 1. Pins: a weight pin, then an op pin. A pin to host memory says where the weight lives;
    // a GPU may still run the op with the weight streamed in when that is cheaper.
    int pin = kNoBackend;
    std::string why;
    bool pinned_weight = false;
    for (TensorId in : n.inputs) {
      TensorId s = g_.storage_of(in);
      int p = weight_pin_[size_t(s)];
      if (p >= 0) {
        const TensorPin& tp = c_.tensor_pins[size_t(p)];
        pin = c_.tensor_pin_backend[size_t(p)];
        why = "pin '" + tp.pattern + "' on weight '" + g_.tensor(s).name + "' -> " + tp.backend_id;
        pinned_weight = g_.node(s).op == OpKind::Weight;
        break;
      }
    }
    if (pin >= 0 && pinned_weight && may_stream && c_.backends[size_t(pin)]->host_accessible()) {
      const int side = host_side(n, pin);
      const bool cpu_side = side == 1 && evals_[size_t(pin)].ok();
      const int sb = cpu_side ? kNoBackend : side == 0 ? best_streamed() : streamed_over(pin);
      if (sb >= 0) {
        choose_streamed(sel, sb, evals_[size_t(pin)].check.ok() ? pin : kNoBackend,
                        side >= 0 ? why + "; " + split_why_ : why);
        return;
      }
      if (cpu_side) why += "; " + split_why_;
    }
    if (pin < 0 && c_.op_pin[size_t(n.op)] >= 0) {
      pin = c_.op_pin[size_t(n.op)];
      why =
          "op pin " + std::string(op_name(n.op)) + " -> " + c_.backends[size_t(pin)]->backend_id();
    }
    if (pin >= 0) {
      if (evals_[size_t(pin)].ok()) {
        SelectionReason r;
        r.kind = Kind::UserPreference;
        r.why = why;
        choose(sel, pin, r, RejectReason::NotAllowed, "pinned elsewhere (" + why + ")");
        return;
      }
      if (c_.strict) {
        fail(ErrorCode::Unsupported, n,
             "strict mode: " + why + " but " + c_.backends[size_t(pin)]->backend_id() +
                 " cannot take it");
      }
      excluded_[size_t(pin)] = true;
    }
    // 2. Attention and KvWrite run where their KV cache lives (the cache is persistent state).
    int rep = cache_of(n);
    if (rep >= 0 && home_[size_t(rep)] >= 0) {
      int h = home_[size_t(rep)];
      if (!excluded_[size_t(h)] && evals_[size_t(h)].check.ok()) {
        SelectionReason r;
        r.kind = Kind::Colocated;
        r.why = "kv cache '" + g_.tensor(TensorId(rep)).name + "' lives on " +
                c_.backends[size_t(h)]->backend_id();
        choose(sel, h, r, RejectReason::NotAllowed, r.why);
        return;
      }
    }
    // 3. The strategy.
    switch (c_.strategy.kind) {
      case Strategy::Kind::GpuPreferred:
        // Activations produced in host memory (by ops on host-resident weights) stay there
        // unless moving them pays: no round trip per small op.
        if (host_chain(n) && first_ok(BackendKind::Gpu, true) >= 0) {
          automatic(n, sel);
          break;
        }
        preferred(n, sel, BackendKind::Gpu);
        break;
      case Strategy::Kind::CpuPreferred:
        preferred(n, sel, BackendKind::Cpu);
        break;
      case Strategy::Kind::Automatic:
        automatic(n, sel);
        break;
      case Strategy::Kind::BackendOnly:
        backend_only(n, sel);
        break;
    }
  }

  // True for an op that reads no weight or cache and whose computed inputs all live in host
  // memory only.
  bool host_chain(const Node& n) const {
    bool computed = false;
    for (TensorId in : n.inputs) {
      TensorId s = g_.storage_of(in);
      const OpKind sop = g_.node(s).op;
      if (sop == OpKind::Weight || sop == OpKind::KvCache) return false;
      if (sop == OpKind::Input) continue;
      if (loc_[size_t(s)] != kHostBit) return false;
      computed = true;
    }
    return computed;
  }

  // Records the effects of running n where sel says: copies made, memory placed, outputs.
  void apply(const Node& n, const BackendSelection& sel) {
    const int b = sel.backend_index;
    const int gb = c_.group[size_t(b)];
    if (!sel.streamed.empty()) {
      const StreamEval& se = stream_evals_[size_t(b)];
      if (!searched_) used_[size_t(b)] += se.ring_growth;
      ring_reserved_[size_t(b)] += se.ring_growth;
      streamed_by_[size_t(b)] += se.weight_bytes;
      streamed_bytes_ += se.weight_bytes;
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      TensorId s = g_.storage_of(n.inputs[i]);
      const OpKind sop = g_.node(s).op;
      if (sop == OpKind::KvCache) note_cache_home(s, n, i, b);
      uint64_t& m = loc_[size_t(s)];
      if (m & bit(gb)) continue;
      const size_t bytes = g_.tensor(s).bytes();
      if (std::find(sel.streamed.begin(), sel.streamed.end(), s) != sel.streamed.end()) {
        // Copied once per run, whichever of its readers on this device comes first.
        if (!stream_copied_[size_t(s)].insert(b).second) continue;
        copies_.push_back({PlannedCopy::Kind::Streamed, s, n.id, -1, b, bytes});
        continue;
      }
      PlannedCopy copy{PlannedCopy::Kind::Activation, s, n.id, -1, b, bytes};
      copy.from = (m & kHostBit) ? -1 : group_backend_[size_t(__builtin_ctzll(m))];
      if (m == 0) {  // a cache created here
        used_[size_t(b)] += bytes;
      } else if ((sop == OpKind::Weight && gb != 0) ||
                 (sop == OpKind::KvCache && n.op == OpKind::KvWrite)) {
        ++uploads_;  // persistent: a weight upload or a cache migration, once
        used_[size_t(b)] += bytes;
        copy.kind =
            sop == OpKind::Weight ? PlannedCopy::Kind::Upload : PlannedCopy::Kind::CacheMove;
        copies_.push_back(copy);
      } else {
        ++transfers_;
        if (sop == OpKind::Input) copy.kind = PlannedCopy::Kind::Input;
        copies_.push_back(copy);
      }
      m |= bit(gb);
    }
    if (n.op == OpKind::KvWrite) {
      loc_[size_t(g_.storage_of(n.inputs[0]))] = bit(gb);  // the write invalidates other copies
    } else {
      loc_[size_t(n.id)] = bit(gb);
      producer_[size_t(n.id)] = b;
    }
    producer_[size_t(g_.storage_of(n.id))] = b;
    int rep = cache_of(n);
    if (rep >= 0) home_[size_t(rep)] = b;
    current_ = b;
  }

  // Where a KV cache lives during the run: where its first KvWrite runs, else where it is
  // first read.
  void note_cache_home(TensorId s, const Node& n, size_t input, int b) {
    const bool write = n.op == OpKind::KvWrite && input == 0;
    int& home = cache_home_[size_t(s)];
    if (write && !cache_written_[size_t(s)]) {
      home = b;
      cache_written_[size_t(s)] = true;
    } else if (home == kNoBackend) {
      home = b;
    }
  }

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
  std::vector<bool> host_side_;        // per rank: runs on the host (host_side)
  std::string split_why_;
  std::vector<double> copy_free_us_;  // per device: when its copy queue has landed what it took
  size_t streamed_bytes_ = 0;
  std::vector<bool> excluded_;
  std::vector<uint8_t> hops_;
  int current_ = kNoBackend;
  std::vector<PlannedCopy> copies_;
  std::vector<std::set<int>> stream_copied_;  // per weight: devices it was streamed to
  std::vector<int> cache_home_;               // per KV cache: its backend in this run
  std::vector<bool> cache_written_;
  size_t transfers_ = 0;
  size_t uploads_ = 0;
};

}  // namespace

Placement plan_graph(const PlannerConfig& config, const Graph& graph, const Residency& residency,
                     const SearchedPlacement* searched) {
  Walk walk(config, graph, residency, searched);
  return walk.run();
}

}  // namespace tandem
