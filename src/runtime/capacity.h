// Whether a model fits before anything is loaded: its weights and the KV caches for the asked
// context against what the GPUs it may use can hold plus the host's available memory.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu_setup.h"
#include "tandem/dtype.h"
#include "tandem/model/llama_config.h"
#include "tandem/scheduler.h"

namespace tandem {

// Bytes as doubles: a context of 10^12 positions must be refused, not overflow.
struct Capacity {
  double weights_bytes = 0.0;
  double kv_bytes = 0.0;
  int64_t n_ctx = 0;
  DType kv_dtype = DType::F16;
  double gpu_bytes = 0.0;  // the budgets of the GPUs the strategy may place weights on
  int gpus = 0;
  double host_bytes = 0.0;

  bool fits() const { return weights_bytes + kv_bytes <= gpu_bytes + host_bytes; }
};

// K and V of every layer for n_ctx positions.
double kv_cache_bytes(const LlamaConfig& config, int64_t n_ctx, DType kv_dtype);
// Adds the budget (--gpu-mem, else the free memory) of each GPU the strategy may place weights on:
// none under cpu, the one named by only:BACKEND.
void add_gpu_budgets(Capacity& capacity, const std::vector<std::shared_ptr<Backend>>& backends,
                     const GpuSetup& gpus, const Strategy& strategy);
// MemAvailable (free plus reclaimable caches), or the free pages where /proc/meminfo is missing.
uint64_t host_available_bytes();
// Throws OutOfMemory with every number when the model does not fit.
void check_capacity(const Capacity& capacity);

}  // namespace tandem
