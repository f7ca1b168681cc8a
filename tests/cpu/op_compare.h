// Runs one node on the CPU backend and on the reference with the same random inputs and
// returns the NMSE of the outputs (infinity when a NaN appears).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cpu_backend.h"

namespace tandem::cpu::cpu_test {

struct OpCase {
  std::string name;
  std::function<TensorId(Graph&)> build;  // adds the leaves and the node, returns the node
  double threshold;                       // NMSE bound
  int32_t int_max = 1;                    // I32 inputs are drawn from [0, int_max)
  bool increasing_ints = false;           // I32 inputs as consecutive positions base + t
};

double compare_with_reference(CpuBackend& cpu, const OpCase& c, uint32_t seed);

// The NMSE of `got` against `want`, both raw f32 outputs.
double nmse_f32(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got);

}  // namespace tandem::cpu::cpu_test
