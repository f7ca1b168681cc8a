// The normalized squared error of logits against a reference: sum (ref - got)^2 / sum ref^2,
// infinite where got has a non-finite value. Shared by the llama and MoE tests.
#pragma once

#include <cmath>
#include <span>

namespace tandem::test {

inline double nmse(std::span<const float> ref, std::span<const float> got) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(ref[i]) - got[i]) * (double(ref[i]) - got[i]);
    den += double(ref[i]) * ref[i];
  }
  return num / den;
}

}  // namespace tandem::test
