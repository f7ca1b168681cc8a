// The staged matrix-vector kernel for Q4_K, Q5_K and Q6_K weights (staged_matvec.cuh): a
// super-block is the kernel's group of 256 elements, and each thread reads half of it from the
// shared-memory tile (k_half, staged_kquant.cuh).
#include "staged_launch.cuh"

namespace tandem::cuda {

bool launch_staged_k_quant_matvec(const OpContext& ctx, std::span<const NodeExecution> execs,
                                  const NormedB* norm, float* glu, const RopeTail* rope) {
  return with_columns(execs.front().inputs[1].desc->ne[1], [&](auto cols) {
    switch (execs.front().inputs[0].desc->dtype) {
      case DType::Q4_K:
        return staged::launch_staged<DType::Q4_K, cols()>(ctx, execs, norm, glu, rope);
      case DType::Q5_K:
        return staged::launch_staged<DType::Q5_K, cols()>(ctx, execs, norm, glu, rope);
      case DType::Q6_K:
        return staged::launch_staged<DType::Q6_K, cols()>(ctx, execs, norm, glu, rope);
      default:
        return false;
    }
  });
}

}  // namespace tandem::cuda
