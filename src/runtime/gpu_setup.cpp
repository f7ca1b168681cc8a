#include "gpu_setup.h"

#include <algorithm>

#include "tandem/error.h"
#include "tandem/layer_split.h"

namespace tandem {

GpuSetup setup_gpus(std::vector<std::shared_ptr<Backend>>& backends, const SessionOptions& options,
                    const Strategy& strategy, int n_layer) {
  if (options.single_gpu) {
    bool kept = false;
    std::erase_if(backends, [&](const auto& b) {
      if (b->kind() != BackendKind::Gpu) return false;
      return std::exchange(kept, true);
    });
  }
  std::vector<std::shared_ptr<Backend>> gpus;
  for (const auto& b : backends) {
    if (b->kind() == BackendKind::Gpu) gpus.push_back(b);
  }
  GpuSetup setup;
  for (const auto& [id, bytes] : options.gpu_memory_by_id) {
    const bool present = std::any_of(gpus.begin(), gpus.end(),
                                     [&, id = id](const auto& g) { return g->backend_id() == id; });
    TANDEM_CHECK_ARG(present, "--gpu-mem",
                     "'" + id + "' takes no part (--split-mode none keeps only the first GPU)");
  }
  std::vector<double> by_budget;
  std::vector<std::string> ids;
  for (const auto& g : gpus) {
    auto it = options.gpu_memory_by_id.find(g->backend_id());
    const std::optional<uint64_t> budget =
        it != options.gpu_memory_by_id.end() ? std::optional(it->second) : options.gpu_memory;
    if (budget) setup.budgets.emplace_back(g->backend_id(), *budget);
    by_budget.push_back(double(budget.value_or(g->memory().free_bytes)));
    ids.push_back(g->backend_id());
  }
  // The layers go to the GPUs under the GPU strategy, or with -ngl under the automatic one.
  const bool gpu_layers = strategy.kind == Strategy::Kind::GpuPreferred ||
                          (strategy.kind == Strategy::Kind::Automatic && options.n_gpu_layers);
  if (gpus.size() < 2 || !gpu_layers) return setup;
  // Contiguous ranges of the GPU layers (-ngl: [0, N)), one per GPU in device order, as
  // llama.cpp's --split-mode layer; the output layer on the last GPU that has layers.
  std::vector<double> split = options.tensor_split.empty() ? by_budget : options.tensor_split;
  split.resize(gpus.size(), 0.0);
  const int wanted = options.n_gpu_layers.value_or(n_layer + 1);
  const auto ranges = split_layers(std::min(wanted, n_layer), split);
  setup.pins = layer_range_pins(ranges, ids);
  if (wanted > n_layer) {
    size_t last = ranges.size() - 1;
    while (last > 0 && ranges[last].size() == 0) --last;
    setup.pins.push_back({"^output(_norm)?\\.weight$", ids[last]});
  }
  setup.layers_split = true;
  return setup;
}

}  // namespace tandem
