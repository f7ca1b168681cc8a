// Flags shared by run, bench and logits: backends, placement and memory.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "engine.h"

namespace tandem::cli {

struct EngineFlags {
  std::string model;
  std::string gpu_mem;
  std::vector<std::string> overrides;  // "pattern=backend"
  std::string kv_type = "f16";
  int threads = 0;
  int n_gpu_layers = -1;  // -1: unset
  int64_t ctx = 0;
  bool strict = false;

  void add(CLI::App& cmd, bool model_required = true);
  // Options for one strategy; validates every value and names the flag at fault.
  EngineOptions to_options(const std::string& strategy) const;
};

}  // namespace tandem::cli
