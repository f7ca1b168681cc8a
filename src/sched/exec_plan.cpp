// Compiling a Placement into an ExecPlan: where each tensor lives, which copies a run makes,
// the segments handed to backends, and arena offsets from liveness (intermediates share memory
// once their last reader has run).
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <deque>
#include <string>

#include "executor_impl.h"
#include "tandem/bytes.h"
#include "tandem/error.h"
#include "tandem/hash.h"

namespace tandem {

namespace {

// Unique across executors sharing a backend: a segment signature must never name two pointer
// sets, or a backend replaying captured work would use stale pointers.
std::atomic<uint64_t> g_plan_serial{1};

// Puts each streamed copy into the step list as early as its device's staging memory allows:
// copies issued but not yet read hold at most `staging[b]` bytes (at least kStreamAheadWeights
// copies) and fewer than Backend::kStreamEvents copies. Activation copies do not wait behind
// them: they go on the device's transfer queue (Backend::upload_async). A copy is issued after the
// segment that reads the oldest copy it displaces, so the copy queue works while execution runs;
// its slot is live from there, so it only reuses memory whose readers were submitted before it (the
// device's copy queue waits for them).
void schedule_streamed_copies(ExecPlan& plan, const std::vector<size_t>& staging) {
  if (plan.streamed.empty()) return;
  // The step where each copy is waited for and the last node submitted before each step.
  std::vector<size_t> wait_step(plan.streamed.size(), 0);
  std::vector<int> last_node(plan.steps.size() + 1, -1);
  int seen = -1;
  for (size_t j = 0; j < plan.steps.size(); ++j) {
    const Step& st = plan.steps[j];
    // A copy by expert is read from its Route step on: the Stream step goes before it.
    if (st.kind == StepKind::Route ||
        (st.kind == StepKind::Wait && plan.streamed[st.index].n_expert == 0)) {
      wait_step[st.index] = j;
    }
    if (st.kind == StepKind::Segment) {
      seen = std::max(seen, int(plan.exec_id[st.index + st.count - 1]));
    }
    last_node[j + 1] = seen;
  }
  // The step after the segment that reads copy k (it follows k's wait step).
  auto after_reader = [&](size_t k) {
    size_t j = wait_step[k];
    while (j < plan.steps.size() && plan.steps[j].kind != StepKind::Segment) ++j;
    return j + 1;
  };
  std::vector<size_t> insert(plan.streamed.size(), 0);
  struct Device {
    std::deque<size_t> in_flight;  // issued, reader not yet submitted, oldest first
    size_t bytes = 0;
    size_t issued = 0;
    size_t point = 0;  // copies are issued in order: none before the previous one
  };
  std::vector<Device> devices;
  for (size_t k = 0; k < plan.streamed.size(); ++k) {
    StreamedCopy& c = plan.streamed[k];
    if (size_t(c.backend) >= devices.size()) devices.resize(size_t(c.backend) + 1);
    Device& d = devices[size_t(c.backend)];
    const size_t limit = c.backend < int(staging.size()) ? staging[size_t(c.backend)] : 0;
    auto retire = [&] {
      const size_t old = d.in_flight.front();
      d.in_flight.pop_front();
      d.bytes -= plan.streamed[old].bytes;
      d.point = std::max(d.point, after_reader(old));
    };
    // Copies whose readers were submitted before this point no longer hold staging memory.
    while (!d.in_flight.empty() && after_reader(d.in_flight.front()) <= d.point) retire();
    auto full = [&] {
      const bool over =
          d.in_flight.size() >= size_t(kStreamAheadWeights) && d.bytes + c.bytes > limit;
      return over || d.in_flight.size() + 1 >= size_t(Backend::kStreamEvents);
    };
    while (!d.in_flight.empty() && full()) retire();
    insert[k] = std::min(d.point, wait_step[k]);
    d.point = insert[k];
    c.event = int(d.issued++ % size_t(Backend::kStreamEvents));
    d.in_flight.push_back(k);
    d.bytes += c.bytes;
    plan.slots[size_t(c.slot)].start = last_node[insert[k]] + 1;
  }
  std::vector<Step> steps;
  steps.reserve(plan.steps.size() + plan.streamed.size());
  size_t next = 0;
  for (size_t j = 0; j <= plan.steps.size(); ++j) {
    for (; next < plan.streamed.size() && insert[next] == j; ++next) {
      steps.push_back({StepKind::Stream, next, 0, plan.streamed[next].backend, 0});
    }
    if (j < plan.steps.size()) steps.push_back(plan.steps[j]);
  }
  plan.steps = std::move(steps);
}

}  // namespace

std::vector<int> last_readers(const Graph& graph) {
  std::vector<int> last(graph.size(), -1);
  for (size_t i = 0; i < graph.size(); ++i) {
    for (TensorId in : graph.nodes()[i].inputs) {
      const TensorId s = graph.storage_of(in);
      last[size_t(s)] = std::max(last[size_t(s)], int(i));
    }
  }
  for (TensorId o : graph.outputs()) last[size_t(graph.storage_of(o))] = INT_MAX;
  return last;
}

size_t first_fit(std::span<const Slot> placed, int group, size_t bytes,
                 std::span<const std::pair<int, int>> spans) {
  std::vector<std::pair<size_t, size_t>> busy;
  for (const Slot& o : placed) {
    const bool live = std::any_of(spans.begin(), spans.end(), [&](const auto& span) {
      return o.start <= span.second && span.first <= o.end;
    });
    if (o.group == group && live) {
      busy.emplace_back(o.offset, o.offset + align_up(o.bytes, kSlotAlignment));
    }
  }
  std::sort(busy.begin(), busy.end());
  size_t offset = 0;
  for (const auto& [lo, hi] : busy) {
    if (offset + align_up(bytes, kSlotAlignment) <= lo) break;
    offset = std::max(offset, hi);
  }
  return offset;
}

std::vector<size_t> assign_offsets(std::vector<Slot>& slots, int n_groups) {
  std::vector<size_t> arena(size_t(n_groups), 0);
  std::vector<size_t> order(slots.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return slots[a].bytes > slots[b].bytes; });
  std::vector<Slot> placed;
  for (size_t idx : order) {
    Slot& s = slots[idx];
    const std::pair<int, int> life{s.start, s.end};
    s.offset = first_fit(placed, s.group, s.bytes, {&life, 1});
    arena[size_t(s.group)] =
        std::max(arena[size_t(s.group)], s.offset + align_up(s.bytes, kSlotAlignment));
    placed.push_back(s);
  }
  return arena;
}

WeightEntry& HybridExecutor::Impl::bound_weight(const std::string& name, const TensorDesc& desc) {
  auto it = weights.find(name);
  if (it == weights.end() || !it->second.host) {
    throw_error(ErrorCode::InvalidArgument, "executor",
                "weight '" + name + "' " + desc_string(desc) +
                    " has no data (bind it with Bindings::weight or bind_weight)");
  }
  WeightEntry& w = it->second;
  if (w.bytes != desc.bytes()) {
    throw_error(ErrorCode::InvalidArgument, "executor",
                "weight '" + name + "' is bound with " + std::to_string(w.bytes) +
                    " bytes but the graph's " + desc_string(desc) + " needs " +
                    std::to_string(desc.bytes()));
  }
  return w;
}

void* HybridExecutor::Impl::weight_on(const std::string& name, const TensorDesc& desc,
                                      int backend) {
  return upload(bound_weight(name, desc), backend);
}

void* HybridExecutor::Impl::upload(WeightEntry& w, int backend) {
  const std::string& name = w.name;
  if (group[size_t(backend)] == 0) return const_cast<void*>(w.host);
  Buffer& buf = w.device[size_t(backend)];
  if (!buf) {
    Backend& b = *backends[size_t(backend)];
    Buffer fresh = on_backend(backend, [&] {
      Buffer f = b.allocate(w.bytes);
      b.copy_from_host(f.data(), w.host, w.bytes);
      return f;
    });
    buf = std::move(fresh);
    residency.add(b.backend_id(), name, w.bytes);
    stats.weight_uploads++;
  }
  return buf.data();
}

CacheEntry& HybridExecutor::Impl::cache_at(const std::string& name, const TensorDesc& desc,
                                           int backend) {
  Backend& b = *backends[size_t(backend)];
  auto it = caches.find(name);
  if (it == caches.end()) {
    CacheEntry e;
    e.name = name;
    e.bytes = desc.bytes();
    e.home = backend;
    on_backend(backend, [&] {
      e.buffer = b.allocate(e.bytes);
      zero_fill(b, e.buffer.data(), e.bytes);
    });
    residency.add(b.backend_id(), name, e.bytes);
    return caches.emplace(name, std::move(e)).first->second;
  }
  CacheEntry& e = it->second;
  if (e.bytes != desc.bytes()) {
    throw_error(ErrorCode::InvalidArgument, "executor",
                "kv cache '" + name + "' holds " + std::to_string(e.bytes) +
                    " bytes but the graph's " + desc_string(desc) + " needs " +
                    std::to_string(desc.bytes()));
  }
  if (group[size_t(e.home)] == group[size_t(backend)]) return e;
  // The placement wants the cache elsewhere: move its contents through host memory.
  Backend& old = *backends[size_t(e.home)];
  std::vector<uint8_t> host(e.bytes);
  on_backend(e.home, [&] {
    old.synchronize();
    old.copy_to_host(host.data(), e.buffer.data(), e.bytes);
  });
  Buffer fresh = on_backend(backend, [&] {
    Buffer f = b.allocate(e.bytes);
    b.copy_from_host(f.data(), host.data(), e.bytes);
    b.synchronize();
    return f;
  });
  residency.remove(old.backend_id(), name);
  residency.add(b.backend_id(), name, e.bytes);
  e.buffer = std::move(fresh);
  e.home = backend;
  generation++;
  stats.kv_migrations++;
  return e;
}

ExecPlan& HybridExecutor::Impl::plan_for(const Graph& graph, const Placement& placement) {
  auto it = plans.find(placement.key);
  if (it != plans.end() && it->second->generation == generation) {
    it->second->last_used = ++use_counter;
    return *it->second;
  }
  if (it != plans.end()) plans.erase(it);
  std::unique_ptr<ExecPlan> plan = build_plan(graph, placement);
  plan->last_used = ++use_counter;
  while (!plans.empty() && plans.size() >= std::max<size_t>(options.max_cached_plans, 1)) {
    auto victim = plans.begin();
    for (auto p = plans.begin(); p != plans.end(); ++p) {
      if (p->second->last_used < victim->second->last_used) victim = p;
    }
    plans.erase(victim);
  }
  stats.plans_built++;
  return *plans.emplace(placement.key, std::move(plan)).first->second;
}

std::unique_ptr<ExecPlan> HybridExecutor::Impl::build_plan(const Graph& graph,
                                                           const Placement& placement) {
  const char* where = "executor";
  if (placement.nodes.size() != graph.size() || placement.signature != graph.signature()) {
    throw_error(ErrorCode::InvalidArgument, where,
                "the placement was made for another graph (" +
                    std::to_string(placement.nodes.size()) + " nodes vs " +
                    std::to_string(graph.size()) + ")");
  }
  bool same_backends = placement.backends.size() == backends.size();
  for (size_t b = 0; same_backends && b < backends.size(); ++b) {
    same_backends = placement.backends[b].get() == backends[b].get();
  }
  if (!same_backends) {
    throw_error(ErrorCode::InvalidArgument, where,
                "the placement comes from a scheduler with other backends than this executor's");
  }
  auto plan = std::make_unique<ExecPlan>();
  plan->key = placement.key;
  plan->backend_used.assign(backends.size(), false);
  const size_t n = graph.size();
  const size_t G = size_t(n_groups);

  std::vector<int> last = last_readers(graph);

  for (const Node& node : graph.nodes()) {
    if (!is_compute(node.op)) continue;
    int b = placement.backend_index(node.id);
    if (b < 0 || size_t(b) >= backends.size()) {
      throw_error(ErrorCode::InvalidArgument, where,
                  "node " + std::to_string(node.id) + " has no backend in the placement");
    }
  }
  // A backend may run up to fused_nodes() consecutive nodes of a segment as one launch, their
  // reads and writes unordered: what a node reads, and what it writes, stays live until the last
  // node such a launch could take with it (else the K RoPE's output may land in the Q
  // projection's buffer that the Q RoPE, fused with it, still reads).
  {
    std::vector<int> order;
    for (const Node& node : graph.nodes()) {
      if (is_compute(node.op)) order.push_back(int(node.id));
    }
    for (size_t k = 0; k < order.size(); ++k) {
      const int b = placement.backend_index(TensorId(order[k]));
      const size_t width = size_t(std::max(backends[size_t(b)]->fused_nodes(), 1));
      size_t e = k;
      while (e + 1 < order.size() && e + 1 < k + width &&
             placement.backend_index(TensorId(order[e + 1])) == b) {
        ++e;
      }
      if (e == k) continue;
      const Node& node = graph.node(TensorId(order[k]));
      last[size_t(node.id)] = std::max(last[size_t(node.id)], order[e]);
      for (TensorId in : node.inputs) {
        const TensorId s = graph.storage_of(in);
        last[size_t(s)] = std::max(last[size_t(s)], order[e]);
      }
    }
  }
  // KV caches live where the placement says; a cache is written in its home's memory only.
  std::vector<int> home(n, -1);
  for (const auto& [cache, b] : placement.kv_homes) {
    if (size_t(cache) >= n || graph.node(cache).op != OpKind::KvCache || b < 0 ||
        size_t(b) >= backends.size()) {
      throw_error(ErrorCode::InvalidArgument, where,
                  "the placement gives a KV cache home the graph or executor does not have");
    }
    home[size_t(cache)] = b;
  }
  for (const Node& node : graph.nodes()) {
    if (!is_compute(node.op)) continue;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      TensorId s = graph.storage_of(node.inputs[k]);
      if (graph.node(s).op != OpKind::KvCache) continue;
      const std::string& name = graph.tensor(s).name;
      if (home[size_t(s)] < 0) {
        throw_error(ErrorCode::InvalidArgument, where,
                    "the placement gives kv cache '" + name + "' no home");
      }
      const int b = placement.backend_index(node.id);
      if (node.op == OpKind::KvWrite && k == 0 &&
          group[size_t(home[size_t(s)])] != group[size_t(b)]) {
        throw_error(ErrorCode::InvalidArgument, where,
                    "kv cache '" + name + "' lives on " +
                        backends[size_t(home[size_t(s)])]->backend_id() + " but is written on " +
                        backends[size_t(b)]->backend_id());
      }
    }
  }
  // The copies the placement states, by the op they come before.
  std::vector<std::vector<const PlannedCopy*>> copies_before(n);
  for (const PlannedCopy& c : placement.copies) {
    if (size_t(c.before) >= n || size_t(c.storage) >= n || c.to < 0 ||
        size_t(c.to) >= backends.size() || c.from >= int(backends.size()) ||
        placement.backend_index(c.before) != c.to) {
      throw_error(ErrorCode::InvalidArgument, where,
                  "the placement lists a " + std::string(copy_kind_name(c.kind)) +
                      " copy that does not match its graph");
    }
    copies_before[size_t(c.before)].push_back(&c);
  }

  std::vector<uint64_t> valid(n, 0);
  std::vector<PtrRef> ptr(n * G);
  // Persistent state first: a migration changes pointers, so none may be taken before it.
  for (const Node& node : graph.nodes()) {
    if (node.op != OpKind::KvCache || home[size_t(node.id)] < 0) continue;
    const TensorDesc& d = graph.tensor(node.id);
    CacheEntry& e = cache_at(d.name, d, home[size_t(node.id)]);
    int g = group[size_t(e.home)];
    valid[size_t(node.id)] = 1ull << g;
    ptr[size_t(node.id) * G + size_t(g)].fixed = e.buffer.data();
  }
  std::vector<size_t> input_index(n, SIZE_MAX);
  for (const Node& node : graph.nodes()) {
    if (node.op != OpKind::Input) continue;
    input_index[size_t(node.id)] = plan->inputs.size();
    plan->inputs.push_back({node.id, graph.tensor(node.id).name, graph.tensor(node.id).bytes()});
  }

  const uint64_t serial = g_plan_serial.fetch_add(1);
  size_t staging = 0;
  std::vector<size_t> pending;  // transfers of the open segment
  std::vector<size_t> waits;    // streamed copies the open segment reads first
  int seg_backend = -1, seg_start = 0;
  size_t seg_first = 0;
  auto close_segment = [&] {
    if (seg_backend < 0) return;
    for (size_t t : pending) {
      plan->steps.push_back({StepKind::Transfer, t, 0, plan->transfers[t].dst_backend, 0});
    }
    pending.clear();
    for (size_t w : waits) {
      if (plan->streamed[w].n_expert > 0) {
        plan->steps.push_back({StepKind::Route, w, 0, seg_backend, 0});
      }
      plan->steps.push_back({StepKind::Wait, w, 0, seg_backend, 0});
    }
    waits.clear();
    Step s{StepKind::Segment, seg_first, plan->execs.size() - seg_first, seg_backend, 0};
    s.signature = hash_combine(hash_combine(plan->key, serial), plan->steps.size());
    plan->steps.push_back(s);
  };
  auto new_slot = [&](int g, size_t bytes, int start, int end) {
    plan->slots.push_back({g, bytes, start, std::max(start, end), 0});
    return int(plan->slots.size() - 1);
  };
  // Makes storage s valid in backend b's memory for `reader` as the placement says: through
  // the copy it lists, else where s already is (a weight in host memory or resident on the
  // device, a bound input staged into host memory).
  auto ensure_on = [&](TensorId s, int b, TensorId reader) -> PtrRef {
    const int g = group[size_t(b)];
    PtrRef& here = ptr[size_t(s) * G + size_t(g)];
    const TensorDesc& d = graph.tensor(s);
    const OpKind op = graph.node(s).op;
    const PlannedCopy* copy = nullptr;
    for (const PlannedCopy* c : copies_before[size_t(reader)]) {
      if (c->storage == s) copy = c;
    }
    auto refuse = [&](const std::string& what) {
      throw_error(ErrorCode::InvalidArgument, where,
                  "the placement " + what + " '" + d.name + "' to " +
                      backends[size_t(b)]->backend_id() + " for node " + std::to_string(reader) +
                      " (" + std::string(op_name(graph.node(reader).op)) + ")");
    };
    // A cache moved to its home was moved when the plan was built (cache_at).
    if (copy && copy->kind == PlannedCopy::Kind::CacheMove) copy = nullptr;
    if (valid[size_t(s)] & (1ull << g)) {
      if (copy) refuse("copies again, where it already is,");
      return here;
    }
    if (op == OpKind::Weight) {
      WeightEntry& w = bound_weight(d.name, d);
      if (copy && copy->kind == PlannedCopy::Kind::Streamed && g != 0 && !w.device[size_t(b)]) {
        StreamedCopy c;
        c.storage = s;
        c.host = w.host;
        c.bytes = w.bytes;
        c.backend = b;
        c.slot = new_slot(g, w.bytes, 0, last[size_t(s)]);  // start set once steps are known
        here = PtrRef{c.slot, nullptr, 0};
        waits.push_back(plan->streamed.size());
        plan->streamed.push_back(c);
      } else if (copy || g == 0 || w.device[size_t(b)]) {
        here = PtrRef{-1, upload(w, b), 0};
      } else {
        refuse("leaves weight in host memory and copies no");
      }
      valid[size_t(s)] |= 1ull << g;
      return here;
    }
    PlannedTransfer t;
    t.storage = s;
    t.bytes = d.bytes();
    t.dst_group = g;
    t.dst_backend = b;
    if (op == OpKind::Input) {
      if (!copy && g != 0) refuse("copies no bound input");
      t.src_group = kUserInput;
      t.input_index = input_index[size_t(s)];
      plan->inputs[t.input_index].used = true;
    } else {
      if (!copy) refuse("copies no");
      const int sg = copy->from < 0 ? 0 : group[size_t(copy->from)];
      if (!(valid[size_t(s)] & (1ull << sg))) {
        refuse(valid[size_t(s)] == 0 ? "reads before it is produced" : "copies from elsewhere");
      }
      t.src_group = sg;
      t.src_backend = sg == 0 ? -1 : group_backend[size_t(sg)];
      t.src = ptr[size_t(s) * G + size_t(sg)];
    }
    // The copy runs before the segment, so the slot is live from the segment's start.
    here = PtrRef{new_slot(g, t.bytes, seg_start, last[size_t(s)]), nullptr, 0};
    t.dst = here;
    const int link_backend = g != 0 ? b : t.src_backend;
    if (link_backend >= 0) {
      // Between devices: one hop peer to peer, two through host memory.
      int hops = 1;
      if (t.src_group > 0 && g != 0) {
        hops = backends[size_t(t.src_backend)]->peer_copy_direct(*backends[size_t(b)]) ? 1 : 2;
      }
      t.estimated_us = CostModel::activation_us(t.bytes, profiles[size_t(link_backend)].link, hops);
    }
    valid[size_t(s)] |= 1ull << g;
    plan->transfers.push_back(t);
    pending.push_back(plan->transfers.size() - 1);
    return here;
  };

  std::vector<int> reads;  // per storage: its reads by nodes, counted at the first expert copy
  for (const Node& node : graph.nodes()) {
    if (!is_compute(node.op)) continue;
    const int b = placement.backend_index(node.id);
    const int g = group[size_t(b)];
    const int i = int(node.id);
    // A node that reads a streamed weight starts a segment: execution waits for its copy.
    bool new_copy = false;
    for (const PlannedCopy* c : copies_before[size_t(i)]) {
      new_copy = new_copy || c->kind == PlannedCopy::Kind::Streamed;
    }
    if (b != seg_backend || (new_copy && g != 0)) {
      close_segment();
      seg_backend = b;
      seg_first = plan->execs.size();
      seg_start = i;
    }
    NodeExecution ex;
    ex.node = &node;
    std::vector<PtrRef> ins;
    const size_t streamed_before = plan->streamed.size();
    for (TensorId in : node.inputs) {
      const TensorId s = graph.storage_of(in);
      PtrRef r = ensure_on(s, b, node.id);
      r.offset += size_t(graph.tensor(in).view_offset);
      ins.push_back(r);
      ex.inputs.push_back({&graph.tensor(in), nullptr});
    }
    if (node.op == OpKind::ExpertMatMul && node.inputs.size() == 3 &&
        options.routed_expert_copies) {
      // The expert tensor streamed for this product alone: copied by expert (the ids name its
      // experts; a product with a map copies its tensor whole).
      const TensorDesc& a = graph.tensor(node.inputs[0]);
      const TensorId s = graph.storage_of(node.inputs[0]);
      if (reads.empty()) {
        reads.assign(graph.size(), 0);
        for (const Node& reader : graph.nodes()) {
          for (TensorId in : reader.inputs) ++reads[size_t(graph.storage_of(in))];
        }
      }
      for (size_t k = streamed_before; k < plan->streamed.size(); ++k) {
        StreamedCopy& c = plan->streamed[k];
        if (c.storage != s || s != node.inputs[0] || reads[size_t(s)] != 1) continue;
        if (!a.is_contiguous() || a.ne[3] != 1 || a.ne[2] < 1 ||
            size_t(a.nb[2]) * size_t(a.ne[2]) != c.bytes) {
          continue;
        }
        c.n_expert = int(a.ne[2]);
        c.expert_bytes = size_t(a.nb[2]);
        c.ids = ins[2];
        c.n_ids = size_t(graph.tensor(node.inputs[2]).elements());
      }
    }
    PtrRef out;
    if (node.op == OpKind::KvWrite) {
      TensorId s = graph.storage_of(node.inputs[0]);
      out = ptr[size_t(s) * G + size_t(g)];
      out.offset += size_t(graph.tensor(node.id).view_offset);
      valid[size_t(s)] = 1ull << g;  // other copies are stale now
    } else {
      out = PtrRef{new_slot(g, graph.tensor(node.id).bytes(), i, last[size_t(i)]), nullptr, 0};
      ptr[size_t(i) * G + size_t(g)] = out;
      valid[size_t(i)] = 1ull << g;
    }
    ex.output = {&graph.tensor(node.id), nullptr};
    plan->execs.push_back(std::move(ex));
    plan->exec_id.push_back(node.id);
    plan->exec_op.push_back(node.op);
    plan->exec_backend.push_back(b);
    plan->exec_in.push_back(std::move(ins));
    plan->exec_out.push_back(out);
    plan->backend_used[size_t(b)] = true;
  }
  close_segment();
  schedule_streamed_copies(*plan, placement.stream_staging_bytes);

  for (TensorId o : graph.outputs()) {
    const TensorDesc& d = graph.tensor(o);
    if (!d.is_contiguous()) {
      throw_error(ErrorCode::Unsupported, where,
                  "output '" + d.name + "' " + desc_string(d) + " is not contiguous");
    }
    TensorId s = graph.storage_of(o);
    ExecPlan::Output out;
    out.id = o;
    out.name = d.name;
    out.bytes = d.bytes();
    if (valid[size_t(s)] == 0) {
      if (graph.node(s).op != OpKind::Weight) {
        throw_error(ErrorCode::Unsupported, where,
                    "output '" + d.name + "' is not computed by the graph");
      }
      auto w = weights.find(graph.tensor(s).name);
      if (w == weights.end() || !w->second.host || w->second.bytes != graph.tensor(s).bytes()) {
        throw_error(ErrorCode::InvalidArgument, where,
                    "output '" + d.name + "' is an unbound weight");
      }
      out.src = PtrRef{-1, const_cast<void*>(w->second.host), 0};
    } else {
      int sg = (valid[size_t(s)] & 1) ? 0 : __builtin_ctzll(valid[size_t(s)]);
      out.backend = sg == 0 ? -1 : group_backend[size_t(sg)];
      out.src = ptr[size_t(s) * G + size_t(sg)];
      if (sg != 0) {
        out.staging_offset = staging;
        staging += align_up(out.bytes, kSlotAlignment);
      }
    }
    out.src.offset += size_t(d.view_offset);
    plan->outputs.push_back(out);
  }

  std::vector<size_t> arena_bytes = assign_offsets(plan->slots, n_groups);
  stats.last_plan_tensor_bytes = 0;
  stats.last_plan_arena_bytes = 0;
  for (const Slot& s : plan->slots) stats.last_plan_tensor_bytes += s.bytes;
  for (size_t bytes : arena_bytes) stats.last_plan_arena_bytes += bytes;
  // Host memory that a device copies activations to or from is page-locked by that device
  // where it can, so those copies overlap other work (Backend::upload_async, download_async).
  int host_copier = -1;
  for (const PlannedTransfer& t : plan->transfers) {
    if (t.src_group == 0 && t.dst_group > 0) host_copier = t.dst_backend;
    if (t.dst_group == 0 && t.src_group > 0) host_copier = t.src_backend;
    if (host_copier >= 0) break;
  }
  plan->arenas.resize(G);
  for (size_t g = 0; g < G; ++g) {
    if (arena_bytes[g] == 0) continue;
    if (group_backend[g] < 0) {
      throw_error(ErrorCode::Internal, where,
                  "no backend allocates memory group " + std::to_string(g));
    }
    if (g == 0 && host_copier >= 0) {
      try {
        plan->arenas[g] = backends[size_t(host_copier)]->allocate_host(arena_bytes[g]);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::OutOfMemory) throw;  // pageable memory then
      }
    }
    if (!plan->arenas[g]) {
      plan->arenas[g] = on_backend(group_backend[g], [&] {
        return backends[size_t(group_backend[g])]->allocate(arena_bytes[g]);
      });
    }
  }
  auto resolve = [&](const PtrRef& r) -> void* {
    if (r.slot >= 0) {
      const Slot& s = plan->slots[size_t(r.slot)];
      return static_cast<uint8_t*>(plan->arenas[size_t(s.group)].data()) + s.offset + r.offset;
    }
    return r.fixed ? static_cast<uint8_t*>(r.fixed) + r.offset : nullptr;
  };
  for (size_t e = 0; e < plan->execs.size(); ++e) {
    for (size_t k = 0; k < plan->exec_in[e].size(); ++k) {
      plan->execs[e].inputs[k].data = resolve(plan->exec_in[e][k]);
    }
    plan->execs[e].output.data = resolve(plan->exec_out[e]);
  }
  for (PlannedTransfer& t : plan->transfers) {
    t.src_ptr = t.src_group == kUserInput ? nullptr : resolve(t.src);
    t.dst_ptr = resolve(t.dst);
  }
  // Every expert is copied ahead in a plan's first run (its flags all 1).
  size_t flags = 0;
  int flag_backend = -1;
  for (const StreamedCopy& c : plan->streamed) {
    if (c.n_expert == 0) continue;
    flags += size_t(c.n_expert);
    flag_backend = c.backend;
  }
  if (flags > 0) {
    try {
      plan->expert_flags = backends[size_t(flag_backend)]->allocate_host(flags);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::OutOfMemory) throw;
    }
    uint8_t* base = static_cast<uint8_t*>(plan->expert_flags.data());
    if (!base) {
      plan->expert_flags_plain.assign(flags, 1);
      base = plan->expert_flags_plain.data();
    }
    std::memset(base, 1, flags);
    for (StreamedCopy& c : plan->streamed) {
      if (c.n_expert == 0) continue;
      c.used = base;
      base += c.n_expert;
    }
  }
  for (StreamedCopy& c : plan->streamed) {
    c.dst_ptr = resolve(PtrRef{c.slot, nullptr, 0});
    c.ids_ptr = static_cast<const int32_t*>(resolve(c.ids));
    WeightEntry& w = weights.at(graph.tensor(c.storage).name);
    if (!w.streamed[size_t(c.backend)]) {
      w.streamed[size_t(c.backend)] = true;
      (void)backends[size_t(c.backend)]->prepare_stream_source(c.host, c.bytes);
    }
  }
  for (ExecPlan::Output& o : plan->outputs) o.src_ptr = resolve(o.src);
  // Device outputs go to page-locked memory where their device offers it: the download is
  // queued behind the step's last kernel instead of made after the step through bounce buffers
  // (1B decode, 0.5 MB of logits: 36 us after each 1.4 ms token, now ~13 us more host copy).
  for (const ExecPlan::Output& o : plan->outputs) {
    if (o.backend < 0 || staging == 0) continue;
    try {
      plan->host_staging = backends[size_t(o.backend)]->allocate_host(staging);
    } catch (const Error&) {
      // Not page-locked (the OS refused): the plain staging below serves.
    }
    break;
  }
  if (!plan->host_staging.data()) plan->staging.assign(staging, 0);
  plan->input_data.assign(plan->inputs.size(), nullptr);
  plan->output_dest.assign(plan->outputs.size(), nullptr);
  plan->output_direct.assign(plan->outputs.size(), 0);
  plan->generation = generation;
  return plan;
}

}  // namespace tandem
