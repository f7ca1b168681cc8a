#include "tandem/layer_split.h"

#include <algorithm>
#include <cmath>

#include "tandem/error.h"
#include "tandem/hash.h"

namespace tandem {

int layer_of(const std::string& name) {
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('.', start);
    if (end == std::string::npos) end = name.size();
    if (end > start && end - start < 9 &&
        std::all_of(name.begin() + long(start), name.begin() + long(end),
                    [](char ch) { return ch >= '0' && ch <= '9'; })) {
      return std::stoi(name.substr(start, end - start));
    }
    start = end + 1;
  }
  return -1;
}

std::vector<LayerRange> split_layers(int n_layers, std::span<const double> proportions) {
  const char* where = "split_layers";
  TANDEM_CHECK_ARG(n_layers >= 0, where,
                   "n_layers must be >= 0 (got " + std::to_string(n_layers) + ")");
  TANDEM_CHECK_ARG(!proportions.empty(), where, "needs at least one proportion");
  double total = 0.0;
  for (double p : proportions) {
    TANDEM_CHECK_ARG(std::isfinite(p) && p >= 0.0, where,
                     "proportions must be finite and >= 0 (got " + std::to_string(p) + ")");
    total += p;
  }
  TANDEM_CHECK_ARG(total > 0.0, where, "at least one proportion must be positive");
  // Cumulative shares; the last is exactly 1 so every layer finds a device.
  std::vector<double> upto(proportions.size());
  double sum = 0.0;
  for (size_t i = 0; i < proportions.size(); ++i) upto[i] = (sum += proportions[i]) / total;
  const size_t trailing_zeros = size_t(
      std::find_if(proportions.rbegin(), proportions.rend(), [](double p) { return p > 0; }) -
      proportions.rbegin());
  std::fill(upto.end() - std::ptrdiff_t(trailing_zeros) - 1, upto.end(), 1.0);
  std::vector<LayerRange> ranges(proportions.size());
  size_t device = 0;
  int begin = 0;
  for (int l = 0; l < n_layers; ++l) {
    const double at = double(l) / double(n_layers);
    size_t d = size_t(std::upper_bound(upto.begin(), upto.end(), at) - upto.begin());
    d = std::min(d, upto.size() - 1);
    if (d != device) {
      ranges[device] = {begin, l};
      for (size_t k = device + 1; k < d; ++k) ranges[k] = {l, l};
      device = d;
      begin = l;
    }
  }
  ranges[device] = {begin, n_layers};
  for (size_t k = device + 1; k < ranges.size(); ++k) ranges[k] = {n_layers, n_layers};
  return ranges;
}

std::vector<TensorPin> layer_range_pins(std::span<const LayerRange> ranges,
                                        std::span<const std::string> backend_ids) {
  TANDEM_CHECK_ARG(ranges.size() == backend_ids.size(), "layer_range_pins",
                   std::to_string(ranges.size()) + " ranges for " +
                       std::to_string(backend_ids.size()) + " backends");
  std::vector<TensorPin> pins;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].size() <= 0) continue;
    std::string layers;
    for (int l = ranges[i].begin; l < ranges[i].end; ++l)
      layers += (layers.empty() ? "" : "|") + std::to_string(l);
    pins.push_back(
        {"^(blk\\.(" + layers + ")\\..*|cache_[kv]\\.(" + layers + "))$", backend_ids[i]});
  }
  return pins;
}

}  // namespace tandem
