// How the planner's walk chooses each op's backend: pins, KV-cache colocation, the strategies,
// streamed weights and the split of host weights between the host and the copy queue.
#include "planner_walk.h"

namespace tandem::planner_walk {

void Walk::evaluate_streamed(const Node& n) {
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

int Walk::best_streamed() const {
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

void Walk::choose_streamed(BackendSelection& sel, int b, int host, const std::string& why) {
  const StreamEval& se = stream_evals_[size_t(b)];
  SelectionReason r;
  r.kind = Kind::Streamed;
  char buf[192];
  std::snprintf(buf, sizeof buf, "%s streams %s of host weights: %.1f us vs %.1f us on %s",
                c_.backends[size_t(b)]->backend_id().c_str(), format_bytes(se.weight_bytes).c_str(),
                se.cost.total_us(), host >= 0 ? evals_[size_t(host)].cost.total_us() : 0.0,
                host >= 0 ? c_.backends[size_t(host)]->backend_id().c_str() : "none");
  r.why = why.empty() ? std::string(buf) : why + "; " + buf;
  if (host >= 0)
    r.costs.push_back({host, c_.backends[size_t(host)]->backend_id(), evals_[size_t(host)].cost});
  r.costs.push_back({b, c_.backends[size_t(b)]->backend_id(), se.cost});
  choose(sel, b, std::move(r), RejectReason::MoreExpensive, "", &se.cost);
  sel.streamed = se.weights;
  copy_free_us_[size_t(b)] = se.arrival_us;
}

int Walk::streamed_over(int host) const {
  const int sb = best_streamed();
  if (sb < 0) return kNoBackend;
  if (host >= 0 && evals_[size_t(host)].ok() &&
      evals_[size_t(host)].cost.total_us() <= stream_evals_[size_t(sb)].cost.total_us()) {
    return kNoBackend;
  }
  return sb;
}

bool Walk::lives_on_host(TensorId s) const {
  const int p = weight_pin_[size_t(s)];
  if (p >= 0) return c_.backends[size_t(c_.tensor_pin_backend[size_t(p)])]->host_accessible();
  if (!searched_) return false;
  const int h = searched_home_[size_t(s)];
  return h < 0 || c_.backends[size_t(h)]->host_accessible();
}

int Walk::host_side(const Node& n, int host) {
  if (host_rank_.empty()) {
    host_rank_.assign(g_.size(), -1);
    const int gpu = first_ok(BackendKind::Gpu, true);
    if (gpu < 0) return -1;
    const BackendProfile& hp = c_.profiles[size_t(host)];
    const BackendProfile& gp = c_.profiles[size_t(gpu)];
    // The rest of the step from `n` on, in order: each op on host weights (a rank: the host
    // may run it, else the GPU once the queue has streamed its weights); the ops on weights
    // resident on the GPU (the GPU runs them: the resident layers take their time on the
    // timeline too); the ops on no weight, which follow the chain: on the GPU where it is,
    // and where it is on the host, on the host unless the GPU with the hop costs less; and the
    // ops the GPU cannot run, on the host.
    enum class Runs { Either, Gpu, Follows, Host };
    struct SimOp {
      Runs runs;
      int rank;  // Either: its rank among the host-weight ops
      double cpu_us, gpu_us, copy_us;
      double gpu_start_us;  // what it adds on the GPU as a segment's first op (its launch)
      double hop_us;  // its activation input over the link (one token's, in a prefill's last ops)
    };
    std::vector<SimOp> ops;
    size_t k_max = 0;
    for (const Node& m : g_.nodes()) {
      if (!is_compute(m.op) || m.id < n.id) continue;
      double bytes_us = 0.0;
      bool weight = false;
      for (TensorId in : m.inputs) {
        const TensorId s = g_.storage_of(in);
        if (g_.node(s).op != OpKind::Weight) continue;
        weight = true;
        if (lives_on_host(s)) bytes_us += CostModel::stream_us(g_.tensor(s).bytes(), gp.link);
      }
      const double cpu_us = CostModel::estimate(g_, m, hp).compute_us;
      const double gpu_alone = CostModel::estimate(g_, m, gp).compute_us;
      const double gpu_us = CostModel::in_segment_us(gpu_alone, gp);
      size_t act_bytes = 0;
      for (TensorId in : m.inputs) {
        const OpKind op = g_.node(g_.storage_of(in)).op;
        if (op != OpKind::Weight && op != OpKind::KvCache) act_bytes += g_.tensor(in).bytes();
      }
      const double hop_us = CostModel::activation_us(act_bytes, gp.link);
      if (!c_.backends[size_t(gpu)]->can_execute(g_, m)) {
        ops.push_back({Runs::Host, -1, cpu_us, gpu_us, 0.0, gpu_alone - gpu_us, hop_us});
        continue;
      }
      if (bytes_us <= 0.0) {
        ops.push_back({weight ? Runs::Gpu : Runs::Follows, -1, cpu_us, gpu_us, 0.0,
                       gpu_alone - gpu_us, hop_us});
        continue;
      }
      host_rank_[size_t(m.id)] = int(k_max);
      ops.push_back(
          {Runs::Either, int(k_max++), cpu_us, gpu_us, bytes_us, gpu_alone - gpu_us, hop_us});
    }
    // The step's end for a choice of host ops: the host runs its ops one after another; the
    // copy queue streams the weights of the others in order from where it stands, and the GPU
    // runs each op once its weights have landed and the op before it is done. Each change of
    // device on the chain moves the activation once over the link.
    const bool on_host = current_ >= 0 && c_.group[size_t(current_)] == 0;
    auto step_end = [&](const std::vector<uint8_t>& host_side) {
      double t = now_us_, queue = copy_free_us_[size_t(gpu)];
      // The queue streams from the start of the step until it has carried every streamed
      // weight: host compute inside that span slows it.
      double queue_end = queue;
      for (const SimOp& op : ops) {
        if (op.runs != Runs::Either || !host_side[size_t(op.rank)]) queue_end += op.copy_us;
      }
      bool here = on_host;
      for (const SimOp& op : ops) {
        bool there = false;
        switch (op.runs) {
          case Runs::Either:
            there = host_side[size_t(op.rank)];
            break;
          case Runs::Gpu:
            break;
          case Runs::Follows:
            there = here && op.cpu_us <= op.hop_us + op.gpu_start_us + op.gpu_us;
            break;
          case Runs::Host:
            there = true;
            break;
        }
        if (there != here) t += op.hop_us + (there ? 0.0 : op.gpu_start_us);
        here = there;
        if (there) {
          // The host's compute shares host memory with the copy engine's reads: what of it
          // overlaps the queue's span delays every copy still to come.
          const double delay =
              kCopySlowdownUnderHostCompute * std::clamp(queue_end - t, 0.0, op.cpu_us);
          queue += delay;
          queue_end += delay;
          t += op.cpu_us;
        } else {
          queue += op.copy_us;
          t = std::max(t, op.copy_us > 0.0 ? queue : 0.0) + op.gpu_us;
        }
      }
      return t;
    };
    // The best single split point, then single ops after it moved back to the host where
    // that ends the step sooner (the last ops of a prefill read one token: the output matrix
    // costs the host less than the queue). A move must gain kMinSplitGain of the step.
    host_side_.assign(k_max, false);
    std::vector<uint8_t> trial(k_max, false);
    double best = step_end(trial);
    size_t split = 0;
    for (size_t k = 1; k <= k_max; ++k) {
      trial[k - 1] = true;
      const double t = step_end(trial);
      if (t < best * (1.0 - kMinSplitGain)) {
        best = t;
        split = k;
      }
    }
    for (size_t i = 0; i < split; ++i) host_side_[i] = true;
    for (size_t i = k_max; i-- > split;) {
      host_side_[i] = true;
      const double t = step_end(host_side_);
      if (t < best * (1.0 - kMinSplitGain)) {
        best = t;
      } else {
        host_side_[i] = false;
      }
    }
    // A streamed op must take at least kMinStreamSaving of its copy's time off the host: the
    // simulated step rests on estimates, and a copy that saves the host little (an expert
    // product of one token reads 8 of 128 experts; the copy carries all 128) turns an error
    // of a few percent in them into a step that waits for the queue.
    for (const SimOp& op : ops) {
      if (op.runs == Runs::Either && !host_side_[size_t(op.rank)] &&
          op.cpu_us < kMinStreamSaving * op.copy_us) {
        host_side_[size_t(op.rank)] = true;
      }
    }
    best = step_end(host_side_);
    const size_t on_cpu = size_t(std::count(host_side_.begin(), host_side_.end(), uint8_t(1)));
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

int Walk::follow_gpu(const Node& n, TensorId& latest) const {
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

void Walk::preferred(const Node& n, BackendSelection& sel, BackendKind want) {
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

void Walk::automatic(const Node& n, BackendSelection& sel) {
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
      std::snprintf(buf, sizeof buf, "stays on %s: %.2fx the cheapest, under switch_threshold %.2f",
                    c_.backends[size_t(current_)]->backend_id().c_str(), ratio,
                    c_.switch_threshold);
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

void Walk::backend_only(const Node& n, BackendSelection& sel) {
  const int b = c_.only;
  const Eval& e = evals_[size_t(b)];
  const std::string& id = c_.backends[size_t(b)]->backend_id();
  if (!e.check.ok()) {
    throw_error(ErrorCode::Unsupported, "scheduler",
                "backend_only(" + id + ") cannot run " + node_label(g_, n) + ": " + e.check.detail +
                    " (" + std::string(reject_reason_name(e.check.reason)) + ")");
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

bool Walk::follow_search(const Node& n, BackendSelection& sel) {
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

void Walk::select(const Node& n, BackendSelection& sel) {
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
    why = "op pin " + std::string(op_name(n.op)) + " -> " + c_.backends[size_t(pin)]->backend_id();
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

bool Walk::host_chain(const Node& n) const {
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

}  // namespace tandem::planner_walk
