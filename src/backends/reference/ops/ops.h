// The reference kernels, one op family per file (ops/<family>.cpp): plain loops over host
// pointers, accumulating in float64 where cheap. Each file adds the rows of its kernels;
// reference_backend.cpp lists the families.
#pragma once

#include <cstdint>
#include <vector>

#include "reference_backend.h"

namespace tandem::reference {

// Reads a whole tensor (contiguous or strided) as float32, in logical order (ops/copy.cpp).
std::vector<float> load_f32(const TensorRef& t);
// Writes float32 values, in logical order, into a contiguous tensor of any dtype.
void store_f32(const TensorRef& t, const std::vector<float>& values);

inline float* f32(const TensorRef& t) {
  return static_cast<float*>(t.data);
}
inline const int32_t* i32(const TensorRef& t) {
  return static_cast<const int32_t*>(t.data);
}

}  // namespace tandem::reference
