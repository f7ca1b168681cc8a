// Internal: what calibration's isolated measurements (calibration.cpp), its decode layer run in
// place (calibration_decode.cpp) and its device segments (calibration_segment.cpp) share.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "tandem/backend.h"
#include "tandem/cost_model.h"
#include "tandem/hash.h"

namespace tandem::detail {

// Where a decode step or a prompt's first token is timed: a short conversation's positions
// (RoPE's sines and cosines cost more at larger angles).
inline constexpr int64_t kFirstPosition = 20;

// A buffer on `b` holding random values in [-1, 1] (converted to t's dtype); I32 positions count
// up to `pos_end`, or row ids stay below `id_limit` where it is > 0.
Buffer buffer_with_data(Backend& b, const TensorDesc& t, int64_t pos_end, int64_t id_limit,
                        SplitMix64& rng);

// Writes `bytes` at `data` back to DRAM and drops them from every CPU cache (no-op elsewhere).
void flush_from_caches(const void* data, size_t bytes);

// Seconds spent preparing inputs, flushing them from the caches and running ops.
struct CalibrationSpent {
  double setup = 0.0, flush = 0.0, runs = 0.0;
};

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The dimensions of a LLaMA layer, the length of its KV caches (its token at the last position:
// attention reads every key) and whether only its attention's samples are wanted: the 1B's
// attention over 32 keys timed alone (caches flushed, but outside a layer) read 16 us where a
// run's over 33-48 keys took 22-31, and the estimates between them came out 1.4-1.7x short
// (bench/NOTES.md); timed in a layer, its sample replaces the lone one.
struct DecodeLayerShape {
  int64_t embd, heads, kv_heads, head_dim, ffn;
  int64_t cache = kFirstPosition + 1;
  bool attention_only = false;
};

// Timed passes of the decode layer: at least `min`, then up to `max` while the timed runs took
// less than `max_us` in all (the median of five passes of a one-token op moved by a quarter
// between two quick calibrations of a loaded 2-core host).
struct DecodeLayerPasses {
  int min = 5, max = 15;
  double max_us = 60e3;
  // Untimed passes first, for at least this long (at least one pass).
  double warm_up_s = 0.0;
  // After each pass's flush, lead_in runs again until this long has passed (at least once).
  double lead_in_s = 0.0;
};

// One decode layer of shape `d` (Q4_0 projections, an f16 KV cache) run op after op as `run
// --stats` runs a graph, its ops' outputs in one arena laid out as the executor's, after
// untimed passes (passes.warm_up_s, at least one), its products' weights and its KV caches flushed
// before each pass and `lead_in` run after the flush (for passes.lead_in_s). One sample per op key
// and work, the median of its ops' times; empty when `b` cannot run the layer or has no memory for
// it.
std::vector<std::pair<OpKey, OpSample>> measure_decode_layer(Backend& b, const DecodeLayerShape& d,
                                                             const DecodeLayerPasses& passes,
                                                             const std::function<void()>& lead_in,
                                                             SplitMix64& rng,
                                                             CalibrationSpent& spent);

// A device's ops inside one segment (execute_segment: a CUDA graph replayed, each kernel's start
// overlapping the one before), `reps` timed runs of each after two untimed ones: per_op_us, an
// op's cost among 64 chained 16-element adds; saving_us, what a one-token Q4_0 product of
// 4096 x 4096 saves there against its time alone (16 in a row, each on its own weights). 0
// where the device cannot run them or has no room.
struct SegmentFigures {
  double per_op_us = 0.0;
  double saving_us = 0.0;
};
SegmentFigures measure_segments(Backend& b, int reps, SplitMix64& rng);

}  // namespace tandem::detail
