// Calibration's decode layer: timed in place, a one-token op of a few microseconds sees what it
// sees in a graph (inputs written by other threads, code and pages cold after a product, small
// weights still in a large L3, its output written over memory an earlier op just used), which
// timed alone it misses either way by up to 3x.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "arena.h"
#include "calibration_measure.h"
#include "tandem/bytes.h"
#include "tandem/error.h"

namespace tandem::detail {

std::vector<std::pair<OpKey, OpSample>> measure_decode_layer(Backend& b, const DecodeLayerShape& d,
                                                             const DecodeLayerPasses& passes,
                                                             const std::function<void()>& lead_in,
                                                             SplitMix64& rng,
                                                             CalibrationSpent& spent) {
  using Clock = std::chrono::steady_clock;
  Graph g;
  const int64_t q_rows = d.heads * d.head_dim, kv_rows = d.kv_heads * d.head_dim;
  TensorId x = g.input("x", DType::F32, {d.embd, 1});
  TensorId pos = g.input("pos", DType::I32, {1});
  TensorId kc = g.kv_cache("k", DType::F16, {d.head_dim, d.kv_heads, d.cache});
  TensorId vc = g.kv_cache("v", DType::F16, {d.head_dim, d.kv_heads, d.cache});
  auto weight = [&](const char* name, int64_t k, int64_t m) {
    return g.weight(name, DType::Q4_0, {k, m});
  };
  TensorId h = g.rms_norm(x, g.weight("attn_norm", DType::F32, {d.embd}), 1e-5f);
  TensorId q = g.reshape(g.matmul(weight("wq", d.embd, q_rows), h), {d.head_dim, d.heads, 1});
  TensorId k = g.reshape(g.matmul(weight("wk", d.embd, kv_rows), h), {d.head_dim, d.kv_heads, 1});
  TensorId v = g.reshape(g.matmul(weight("wv", d.embd, kv_rows), h), {d.head_dim, d.kv_heads, 1});
  const int32_t n_rot = int32_t(d.head_dim);
  q = g.rope(q, pos, n_rot, 500000.0f);
  k = g.rope(k, pos, n_rot, 500000.0f);
  TensorId kw = g.kv_write(kc, k, pos), vw = g.kv_write(vc, v, pos);
  TensorId a =
      g.reshape(g.attention(q, kw, vw, pos, 1.0f / std::sqrt(float(d.head_dim))), {q_rows, 1});
  TensorId r = g.add(x, g.matmul(weight("wo", q_rows, d.embd), a));
  TensorId f = g.rms_norm(r, g.weight("ffn_norm", DType::F32, {d.embd}), 1e-5f);
  TensorId s = g.swiglu(g.matmul(weight("gate", d.embd, d.ffn), f),
                        g.matmul(weight("up", d.embd, d.ffn), f));
  // The layer's output is the next one's input: the last add writes x, as in a model.
  const TensorId out = g.add(r, g.matmul(weight("down", d.ffn, d.embd), s));

  const Clock::time_point setup = Clock::now();
  std::map<TensorId, Buffer> buffers;
  // The ops' outputs share one arena laid out as the executor lays out a run's (assign_offsets):
  // an op writes memory that an op a few nodes earlier used, which the caches still hold, not a
  // buffer of its own last written a pass (a layer's weights and a flush) ago.
  std::vector<Slot> slots;
  std::map<TensorId, size_t> slot_of;
  const std::vector<int> last = last_readers(g);
  Buffer arena;
  // Flushed before every pass: in a model the other layers' weights stream through the caches
  // between two uses of this layer's, so its products' weights and its KV caches come from
  // memory (a step writes a row of the cache not touched since, and attention reads the rows
  // of earlier steps); the small norm weights stay wherever the caches kept them.
  std::vector<TensorId> flushed;
  try {
    for (const Node& n : g.nodes()) {
      const TensorDesc& t = g.tensor(n.id);
      if (t.is_view() || n.id == out) continue;
      if (is_compute(n.op)) {
        // A backend that cannot run the layer keeps the isolated measurements alone.
        if (!b.can_execute(g, n)) return {};
        slot_of[n.id] = slots.size();
        slots.push_back({0, t.bytes(), int(n.id), std::max(int(n.id), last[size_t(n.id)]), 0});
        continue;
      }
      buffers[n.id] = buffer_with_data(b, t, d.cache, 0, rng);
      if ((n.op == OpKind::Weight && dtype_traits(t.dtype).is_quantized) || n.op == OpKind::KvCache)
        flushed.push_back(n.id);
    }
    size_t arena_bytes = assign_offsets(slots, 1)[0];
    // x, written by the last add and read by the next pass's first ops, is one slot live across
    // the pass boundary, as a layer's output is in a model (there it reuses the memory of the
    // feed-forward block's products).
    const std::pair<int, int> x_live[] = {{0, last[size_t(x)]}, {int(out), int(out)}};
    const size_t x_bytes = g.tensor(x).bytes();
    Slot x_slot{0, x_bytes, 0, int(out), first_fit(slots, 0, x_bytes, x_live)};
    arena_bytes = std::max(arena_bytes, x_slot.offset + align_up(x_bytes, kSlotAlignment));
    arena = b.allocate(std::max<size_t>(arena_bytes, 1));
    b.copy_within(static_cast<uint8_t*>(arena.data()) + x_slot.offset, buffers.at(x).data(),
                  x_bytes);
    buffers.erase(x);
    slot_of[x] = slots.size();
    slots.push_back(x_slot);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::OutOfMemory) throw;
    return {};
  }
  auto data_of = [&](TensorId id) {
    const TensorDesc& t = g.tensor(id);
    const TensorId storage = id == out ? x : g.storage_of(id);
    const auto slot = slot_of.find(storage);
    auto* base = slot == slot_of.end()
                     ? static_cast<uint8_t*>(buffers.at(storage).data())
                     : static_cast<uint8_t*>(arena.data()) + slots[slot->second].offset;
    return static_cast<void*>(base + (t.is_view() ? t.view_offset : 0));
  };
  std::vector<NodeExecution> execs;
  for (const Node& n : g.nodes()) {
    if (is_compute(n.op)) execs.push_back(execution_of(g, n, data_of));
  }
  spent.setup += seconds_since(setup);
  std::vector<std::vector<double>> times(execs.size());
  double timed_us = 0.0;
  auto run_pass = [&](bool timed) {
    const Clock::time_point flush = Clock::now();
    for (TensorId id : flushed) flush_from_caches(buffers[id].data(), buffers[id].bytes());
    spent.flush += seconds_since(flush);
    const Clock::time_point run = Clock::now();
    do {
      lead_in();  // wakes the pool after the flush
    } while (seconds_since(run) < passes.lead_in_s);
    for (size_t i = 0; i < execs.size(); ++i) {
      b.timer_start();
      b.execute(g, execs[i]);
      const double us = b.timer_stop_us();
      if (!timed) continue;
      times[i].push_back(us);
      timed_us += us;
    }
    spent.runs += seconds_since(run);
  };
  const Clock::time_point warm_up = Clock::now();
  do {
    run_pass(false);
  } while (seconds_since(warm_up) < passes.warm_up_s);
  for (int pass = 1; pass <= passes.max && (pass <= passes.min || timed_us < passes.max_us);
       ++pass) {
    run_pass(true);
  }
  // Ops of the same key and work make one sample (the two adds, both after a product); the K and
  // V cache writes are apart by the op before each (OpKey::after).
  std::map<std::tuple<OpKey, double, double>, std::vector<double>> pooled;
  for (size_t i = 0; i < execs.size(); ++i) {
    const Node& n = *execs[i].node;
    // The first norm follows the flush and the lead-in, not an add as in a model: the second
    // norm stands for both.
    if (i == 0) continue;
    const OpWork w = op_work(g, n);
    auto& t = pooled[{op_key(g, n), w.flops, w.bytes}];
    t.insert(t.end(), times[i].begin(), times[i].end());
  }
  std::vector<std::pair<OpKey, OpSample>> samples;
  for (auto& [what, t] : pooled) {
    const auto& [key, flops, bytes] = what;
    if (d.attention_only && key.op != OpKind::Attention) continue;
    samples.push_back({key, OpSample{flops, bytes, median(std::move(t))}});
  }
  return samples;
}

}  // namespace tandem::detail
