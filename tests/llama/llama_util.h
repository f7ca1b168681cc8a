// What the llama and MoE tests share: the normalized squared error of logits, the runtime's
// options over a synthetic file.
#pragma once

#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tandem/runtime.h"

namespace tandem::test {

// sum (ref - got)^2 / sum ref^2, infinite where got has a non-finite value.
inline double nmse(std::span<const float> ref, std::span<const float> got) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(ref[i]) - got[i]) * (double(ref[i]) - got[i]);
    den += double(ref[i]) * ref[i];
  }
  return num / den;
}

// `strategy` over the model at `path`: 64 positions, f32 KV caches, `pins`.
inline SessionOptions options(const std::string& path, const std::string& strategy,
                              std::vector<TensorPin> pins = {}) {
  SessionOptions o;
  o.model_path = path;
  o.strategy = strategy;
  o.n_ctx = 64;
  o.kv_dtype = DType::F32;
  o.pins = std::move(pins);
  return o;
}

}  // namespace tandem::test
