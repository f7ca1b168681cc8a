// Flags shared by run, bench and logits: backends, placement and memory, spelled as llama.cpp
// spells them where it has them (-ngl, -ot, -fa, -c, -t).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "tandem/runtime.h"

namespace tandem::cli {

struct EngineFlags {
  std::string model;
  std::string gpu_mem;       // "6GiB" for every GPU, or "cuda:0=10G,cuda:1=12G"
  std::string tensor_split;  // "3,1" (or 3/1): proportions of layers per GPU
  std::string split_mode = "layer";
  std::vector<std::string> overrides;  // "pattern=backend"
  std::string kv_type = "f16";
  std::string flash_attn;  // "" (not given), on, 1, true, auto; off is refused
  int threads = 0;
  std::vector<int> n_gpu_layers;  // empty: unset; several only where lists are allowed (bench)
  std::vector<int> n_cpu_moe;  // --n-cpu-moe: the same, for the layers whose experts stay on host
  bool cpu_moe = false;        // --cpu-moe: every layer's experts on the host
  bool hot_experts = false;    // --hot-experts
  int64_t ctx = 0;
  bool strict = false;
  std::string placement;  // --placement FILE (tandem tune --save)
  std::string cost_profile;
  bool no_calibrate = false;
  bool ngl_list = false;  // set by add()
  int ranks = 0;          // --ranks (add_ranks): processes of a pipeline, one per GPU

  // ngl_list: -ngl and --n-cpu-moe take comma lists (bench runs every value).
  void add(CLI::App& cmd, bool model_required = true, bool list_of_ngl = false);
  // --ranks N (run, bench, logits): -ts then gives one proportion per rank.
  void add_ranks(CLI::App& cmd);
  // Options for one strategy, one -ngl value and one --n-cpu-moe value (indexes into
  // n_gpu_layers and n_cpu_moe); validates every value and names the flag at fault, before any
  // model is loaded.
  SessionOptions to_options(const std::string& strategy, size_t ngl_index = 0,
                            size_t moe_index = 0) const;
  // "" or, when GPU flags (--gpu-mem, -ngl above 0, -ts) are given on a machine without a GPU,
  // a warning that they change nothing, with the reason no GPU is available.
  std::string gpu_flags_warning() const;
};

// Prints flags.gpu_flags_warning() to stderr, when there is one.
void print_gpu_flags_warning(const EngineFlags& flags);

// Whether this machine has a GPU backend (a "cuda:N" among available_backend_ids()).
bool gpu_present();

}  // namespace tandem::cli
