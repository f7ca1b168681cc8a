// What the two files of the quantized matrix-vector product share: quantized_matmul.cu picks the
// path (f32 for tiny products, the staged kernel, the generic kernel, the GEMM) and
// staged_matvec.cu holds the staged kernel.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "ops.h"

namespace tandem::cuda {

// Most weight matrices (same K and dtype) one staged launch multiplies with the same b: Q, K and V.
inline constexpr int kMaxParts = 3;

// fn(std::integral_constant<int, n>) for n columns of b, 1 <= n <= kMatvecMaxColumns: the
// matrix-vector kernels are compiled per column count.
template <int kN = 1, typename Fn>
decltype(auto) with_columns(int64_t n, Fn&& fn) {
  if constexpr (kN < kMatvecMaxColumns) {
    if (n > kN) return with_columns<kN + 1>(n, fn);
  }
  return fn(std::integral_constant<int, kN>{});
}

// How many of the segment's first nodes (at most `most`) are products that `fits` accepts and
// that multiply the same b as the first (same data and shape) with weights of the first's K and,
// with same_dtype, its dtype: the run one fused launch can take.
template <typename Fits>
size_t count_same_b(std::span<const NodeExecution> segment, size_t most, Fits fits,
                    bool same_dtype = true) {
  if (segment.empty() || !fits(segment[0])) return 0;
  const NodeExecution& first = segment[0];
  size_t n = 1;
  while (n < segment.size() && n < most && fits(segment[n]) &&
         segment[n].inputs[1].data == first.inputs[1].data &&
         segment[n].inputs[1].desc->ne == first.inputs[1].desc->ne &&
         (!same_dtype || segment[n].inputs[0].desc->dtype == first.inputs[0].desc->dtype) &&
         segment[n].inputs[0].desc->ne[0] == first.inputs[0].desc->ne[0]) {
    ++n;
  }
  return n;
}

// The staged kernel for one node, or for up to kMaxParts that share b (one part each), when the
// layout allows it; false leaves them to the generic kernel (strided or unaligned weights, K not a
// multiple of 256, too little shared memory).
bool launch_staged_matvec(const OpContext& ctx, std::span<const NodeExecution> execs);

}  // namespace tandem::cuda
