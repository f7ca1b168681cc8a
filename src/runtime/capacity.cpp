#include "capacity.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "tandem/bytes.h"
#include "tandem/error.h"

namespace tandem {

namespace {

std::string bytes_text(double bytes) {
  if (bytes < 9.0e18) return format_bytes(uint64_t(bytes));
  char text[32];
  std::snprintf(text, sizeof text, "%.3g bytes", bytes);
  return text;
}

}  // namespace

double kv_cache_bytes(const LlamaConfig& config, int64_t n_ctx, DType kv_dtype) {
  return 2.0 * double(config.n_layer) * double(n_ctx) * double(config.n_head_kv) *
         double(row_bytes(kv_dtype, config.head_dim));
}

void add_gpu_budgets(Capacity& capacity, const std::vector<std::shared_ptr<Backend>>& backends,
                     const GpuSetup& gpus, const Strategy& strategy) {
  if (strategy.kind == Strategy::Kind::CpuPreferred) return;
  for (const auto& b : backends) {
    if (b->kind() != BackendKind::Gpu) continue;
    if (strategy.kind == Strategy::Kind::BackendOnly && b->backend_id() != strategy.backend_id) {
      continue;
    }
    auto it = std::find_if(gpus.budgets.begin(), gpus.budgets.end(),
                           [&](const auto& budget) { return budget.first == b->backend_id(); });
    capacity.gpu_bytes += double(it != gpus.budgets.end() ? it->second : b->memory().free_bytes);
    ++capacity.gpus;
  }
}

uint64_t host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return uint64_t(sysconf(_SC_AVPHYS_PAGES)) * uint64_t(sysconf(_SC_PAGE_SIZE));
}

void check_capacity(const Capacity& c) {
  if (c.fits()) return;
  std::string gpus;
  if (c.gpus > 0) {
    gpus = "GPU budgets " + bytes_text(c.gpu_bytes) + " (" + std::to_string(c.gpus) + " GPU" +
           (c.gpus > 1 ? "s" : "") + ") + ";
  }
  throw_error(ErrorCode::OutOfMemory, "capacity",
              "the model does not fit: weights " + bytes_text(c.weights_bytes) + " + KV cache " +
                  bytes_text(c.kv_bytes) + " (" + std::to_string(c.n_ctx) + " positions, " +
                  std::string(dtype_name(c.kv_dtype)) +
                  ") = " + bytes_text(c.weights_bytes + c.kv_bytes) + " > " + gpus +
                  "host memory available " + bytes_text(c.host_bytes) + "; lower --ctx-size (-c)" +
                  (c.gpus > 0 ? ", raise --gpu-mem" : "") + " or use a smaller model");
}

}  // namespace tandem
