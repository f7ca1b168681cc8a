// Layers split across devices in contiguous ranges, as llama.cpp's --split-mode layer with
// --tensor-split: the hand control of a multi-GPU placement, and a building block for the
// automatic one.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "tandem/scheduler.h"

namespace tandem {

// The layer a persistent tensor belongs to: its first dot-separated component made of digits
// ("blk.12.attn_q.weight", "cache_k.12", "cache.12.k" -> 12), or -1.
int layer_of(const std::string& name);

// Layers [begin, end) of one device; empty when begin == end.
struct LayerRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
};

// Splits layers [0, n_layers) into one contiguous range per proportion, in order, as llama.cpp
// does: layer l goes to the first device whose cumulative share exceeds l / n_layers. A zero
// proportion gets an empty range. Throws InvalidArgument for a negative or non-finite
// proportion, or when none is positive.
std::vector<LayerRange> split_layers(int n_layers, std::span<const double> proportions);

// Pins that keep each range's weights ("blk.L.*") and KV caches ("cache_k.L", "cache_v.L") on
// its backend; ranges[i] goes to backend_ids[i], empty ranges give no pin.
std::vector<TensorPin> layer_range_pins(std::span<const LayerRange> ranges,
                                        std::span<const std::string> backend_ids);

}  // namespace tandem
