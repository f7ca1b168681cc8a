#include "planner_walk.h"

namespace tandem {

namespace planner_walk {

Walk::Walk(const PlannerConfig& c, const Graph& g, const Residency& r, const SearchedPlacement* sp)
    : c_(c), g_(g), n_backends_(c.backends.size()), searched_(sp) {
  const size_t n = g.size();
  loc_.assign(n, 0);
  stream_copied_.assign(n, 0);
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

Placement Walk::run() {
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

int Walk::backend_of(const std::string& id) const {
  for (size_t b = 0; b < n_backends_; ++b) {
    if (c_.backends[b]->backend_id() == id) return int(b);
  }
  return kNoBackend;
}

int Walk::find(int x) {
  while (parent_[size_t(x)] != x) x = parent_[size_t(x)] = parent_[size_t(parent_[size_t(x)])];
  return x;
}

void Walk::init_leaves(const Residency& r) {
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

int Walk::cache_of(const Node& n) {
  TensorId s = kNoTensor;
  if (n.op == OpKind::KvWrite) s = g_.storage_of(n.inputs[0]);
  if (n.op == OpKind::Attention) s = g_.storage_of(n.inputs[1]);
  return s != kNoTensor && is_cache(s) ? find(s) : -1;
}

int Walk::hops(uint64_t m, int gb) const {
  if (m == 0 || (m & bit(gb))) return 0;
  if (m & kHostBit) return 1;
  return gb == 0 ? 1 : 2;
}

void Walk::evaluate(const Node& n) {
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
    // A host candidate pulls device data over that device's link. (The profile is not copied:
    // copying it, samples and all, for every op and backend took half of an 8B prefill's plan.)
    const BackendProfile& prof = c_.profiles[b];
    const LinkProfile& link = gb == 0 && source_device != kNoBackend
                                  ? c_.profiles[size_t(source_device)].link
                                  : prof.link;
    // A device keeps a weight it was sent: one upload serves many runs, or it would keep a
    // weight off the GPU forever.
    e.cost = CostModel::estimate(g_, n, prof, link, hops_, gb != 0 ? kWeightReuseRuns : 1.0);
    e.persistent = persistent;
    e.needed = persistent + transient;
    e.free = c_.budgets[b] > used_[b] ? c_.budgets[b] - used_[b] : 0;
    // Auto's budget bounds what stays resident (weights, KV caches); activations come on top.
    e.fits = (searched_ ? e.persistent : e.needed) <= e.free;
    const std::string& id = c_.backends[b]->backend_id();
    // An exhausted device still takes ops on weights or caches already there (preloaded)
    // that need no new memory, and ops on activations it already holds (a streamed chain);
    // other activation-only ops stay off it (no ping-pong).
    // Why the budget is what it is, where it changed after build() (set_memory_budget).
    const bool noted = b < c_.budget_notes.size() && !c_.budget_notes[b].empty();
    const std::string because = noted ? " (" + c_.budget_notes[b] + ")" : "";
    if (searched_) {
      if (!e.fits)
        e.memory_detail = id + " needs " + format_bytes(e.persistent) +
                          " resident, its budget has " + format_bytes(e.free) + " free" + because;
    } else if (exhausted_[b] && (persistent > 0 || (!persistent_here && !input_here))) {
      e.fits = false;
      e.needed = exhaust_needed_[b];
      e.free = exhaust_free_[b];
      e.memory_detail = exhaust_detail_[b];
    } else if (!e.fits) {
      e.memory_detail = id + " needs " + format_bytes(e.needed) + " (" + format_bytes(persistent) +
                        " persistent), its budget has " + format_bytes(e.free) + " free" + because;
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

bool Walk::host_homed(TensorId s, int b) const {
  const int p = weight_pin_[size_t(s)];
  if (p >= 0) {
    const int pb = c_.tensor_pin_backend[size_t(p)];
    return c_.backends[size_t(pb)]->host_accessible();
  }
  if (searched_) return searched_home_[size_t(s)] != b;
  return !evals_[size_t(b)].fits;
}

void Walk::set_backend(BackendSelection& sel, int b) const {
  sel.backend_index = b;
  sel.backend = b >= 0 ? c_.backends[size_t(b)].get() : nullptr;
}

std::string Walk::all_reasons() const {
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

int Walk::first_ok(BackendKind kind, bool same_kind) const {
  for (size_t b = 0; b < n_backends_; ++b) {
    bool k = c_.backends[b]->kind() == kind;
    if (k == same_kind && !excluded_[b] && evals_[b].ok()) return int(b);
  }
  return kNoBackend;
}

int Walk::first_of(BackendKind kind) const {
  for (size_t b = 0; b < n_backends_; ++b) {
    if (c_.backends[b]->kind() == kind) return int(b);
  }
  return kNoBackend;
}

SelectionReason Walk::memory_reason(const Eval& e) const {
  SelectionReason r;
  r.kind = Kind::MemoryConstraint;
  r.needed_bytes = e.needed;
  r.free_bytes = e.free;
  r.why = e.memory_detail;
  return r;
}

void Walk::apply(const Node& n, const BackendSelection& sel) {
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
      uint64_t& copied = stream_copied_[size_t(s)];
      if (copied & (1ull << b)) continue;
      copied |= 1ull << b;
      copies_.push_back({PlannedCopy::Kind::Streamed, s, n.id, -1, b, bytes});
      continue;
    }
    PlannedCopy copy{PlannedCopy::Kind::Activation, s, n.id, -1, b, bytes};
    if (m != 0 && !(m & kHostBit)) copy.from = group_backend_[size_t(__builtin_ctzll(m))];
    if (m == 0) {  // a cache created here
      used_[size_t(b)] += bytes;
    } else if ((sop == OpKind::Weight && gb != 0) ||
               (sop == OpKind::KvCache && n.op == OpKind::KvWrite)) {
      ++uploads_;  // persistent: a weight upload or a cache migration, once
      used_[size_t(b)] += bytes;
      copy.kind = sop == OpKind::Weight ? PlannedCopy::Kind::Upload : PlannedCopy::Kind::CacheMove;
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

void Walk::note_cache_home(TensorId s, const Node& n, size_t input, int b) {
  const bool write = n.op == OpKind::KvWrite && input == 0;
  int& home = cache_home_[size_t(s)];
  if (write && !cache_written_[size_t(s)]) {
    home = b;
    cache_written_[size_t(s)] = true;
  } else if (home == kNoBackend) {
    home = b;
  }
}

}  // namespace planner_walk

Placement plan_graph(const PlannerConfig& config, const Graph& graph, const Residency& residency,
                     const SearchedPlacement* searched) {
  planner_walk::Walk walk(config, graph, residency, searched);
  return walk.run();
}

}  // namespace tandem
