// A saved placement (`tandem tune --save FILE`, read by run and bench with `--placement FILE`):
// the strategy, the GPU budget and the weight pins of the placement that measured best.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/scheduler.h"

namespace tandem::cli {

struct PlacementFile {
  std::string label;     // what tune called it ("-ngl 24", "auto", ...)
  std::string model;     // the model file's name (not its folder), checked on load
  int64_t n_layer = 0;   // checked on load
  std::string strategy;  // gpu | cpu | auto | only:ID
  std::optional<uint64_t> gpu_memory;
  std::vector<TensorPin> pins;
};

std::string placement_to_json(const PlacementFile& p);
// Throws InvalidArgument naming the file and what is wrong (not JSON, not a placement, a
// missing or mistyped field).
PlacementFile placement_from_json(const std::string& text, const std::string& path);
PlacementFile load_placement(const std::string& path);

}  // namespace tandem::cli
