// Calibration's device segments: ops timed alone pay their launch and the latency of their first
// loads each, which a segment replayed as one CUDA graph hides. An H100 ran the 1B's decode step
// in 854 us where its ops alone summed to 3.1 ms, and the 8B's in 2.5 ms against 6.9 ms: ~8 us
// an op (2026-11-27).
#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "calibration_measure.h"
#include "tandem/error.h"

namespace tandem::detail {

namespace {

// Every tensor of g in b's memory (inputs and weights filled, outputs allocated) and the
// executions of its ops in order; false when b cannot run one or has no room.
bool segment_in_memory(Backend& b, const Graph& g, SplitMix64& rng,
                       std::map<TensorId, Buffer>& buffers, std::vector<NodeExecution>& execs) {
  try {
    for (const Node& n : g.nodes()) {
      if (is_compute(n.op) && !b.can_execute(g, n)) return false;
      buffers[n.id] = is_compute(n.op) ? b.allocate(g.tensor(n.id).bytes())
                                       : buffer_with_data(b, g.tensor(n.id), 0, 0, rng);
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::OutOfMemory) throw;
    return false;
  }
  for (const Node& n : g.nodes()) {
    if (!is_compute(n.op)) continue;
    execs.push_back(execution_of(g, n, [&](TensorId id) { return buffers.at(id).data(); }));
  }
  return true;
}

// The median time of the whole segment, after two untimed runs (the first captures it).
double segment_median_us(Backend& b, const Graph& g, std::span<const NodeExecution> execs,
                         uint64_t signature, int reps) {
  for (int warm = 0; warm < 2; ++warm) b.execute_segment(g, execs, signature);
  b.synchronize();
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    b.timer_start();
    b.execute_segment(g, execs, signature);
    times.push_back(b.timer_stop_us());
  }
  return median(std::move(times));
}

// 64 chained 16-element adds in one segment: the least an op costs there.
double per_op_us(Backend& b, int reps, SplitMix64& rng) {
  constexpr int kOps = 64;
  Graph g;
  const TensorId y = g.input("y", DType::F32, {16});
  TensorId cur = g.input("x", DType::F32, {16});
  for (int i = 0; i < kOps; ++i) cur = g.add(cur, y);
  std::map<TensorId, Buffer> buffers;
  std::vector<NodeExecution> execs;
  if (!segment_in_memory(b, g, rng, buffers, execs)) return 0.0;
  return segment_median_us(b, g, execs, 0x5e9e5e9e5e9e5e9eull, reps) / kOps;
}

// 16 one-token Q4_0 products of 4096 x 4096 in a row, each on its own 9 MB of weights (151 MB in
// all, past a GPU's L2), timed alone in turn and then as one segment: what a product saves in it.
double product_saving_us(Backend& b, int reps, SplitMix64& rng) {
  constexpr int kProducts = 16;
  constexpr int64_t kDim = 4096;
  Graph g;
  TensorId cur = g.input("x", DType::F32, {kDim, 1});
  for (int i = 0; i < kProducts; ++i)
    cur = g.matmul(g.weight("w" + std::to_string(i), DType::Q4_0, {kDim, kDim}), cur);
  std::map<TensorId, Buffer> buffers;
  std::vector<NodeExecution> execs;
  if (!segment_in_memory(b, g, rng, buffers, execs)) return 0.0;
  for (const NodeExecution& e : execs) b.execute(g, e);  // warm-up
  std::vector<std::vector<double>> alone(execs.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < execs.size(); ++i) {
      b.timer_start();
      b.execute(g, execs[i]);
      alone[i].push_back(b.timer_stop_us());
    }
  }
  double sum_alone = 0.0;
  for (auto& t : alone) sum_alone += median(std::move(t));
  const double together = segment_median_us(b, g, execs, 0x5e9e5a7e5e9e5a7eull, reps);
  return std::max((sum_alone - together) / kProducts, 0.0);
}

}  // namespace

SegmentFigures measure_segments(Backend& b, int reps, SplitMix64& rng) {
  SegmentFigures f;
  f.per_op_us = per_op_us(b, reps, rng);
  f.saving_us = product_saving_us(b, reps, rng);
  return f;
}

}  // namespace tandem::detail
