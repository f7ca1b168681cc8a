// The multi-GPU part of a session's setup: which GPUs take part (--split-mode), the budget of
// each (--gpu-mem) and, with several, the pins that split the GPU layers across them
// (--tensor-split, -ngl).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/runtime.h"

namespace tandem {

struct GpuSetup {
  std::vector<TensorPin> pins;                            // layer ranges and the output layer
  std::vector<std::pair<std::string, uint64_t>> budgets;  // per GPU id
  bool layers_split = false;  // the layers are split across GPUs (pins per range)
};

// Drops the GPUs that take no part from `backends` (--split-mode none keeps the first) and
// returns the budgets and pins for the others. Throws InvalidArgument naming the flag at fault.
GpuSetup setup_gpus(std::vector<std::shared_ptr<Backend>>& backends, const SessionOptions& options,
                    const Strategy& strategy, int n_layer);

}  // namespace tandem
