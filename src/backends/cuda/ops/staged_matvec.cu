// The staged matrix-vector kernel for Q4_0 and Q8_0 weights, and the dispatch by dtype (the
// kernel itself: staged_matvec.cuh).
#include "staged_launch.cuh"

namespace tandem::cuda {

// The K-quants' instances (staged_matvec_k.cu).
bool launch_staged_k_quant_matvec(const OpContext& ctx, std::span<const NodeExecution> execs,
                                  const NormedB* norm, float* glu, const RopeTail* rope);

bool launch_staged_matvec(const OpContext& ctx, std::span<const NodeExecution> execs,
                          const NormedB* norm, float* glu, const RopeTail* rope) {
  const DType dtype = execs.front().inputs[0].desc->dtype;
  if (is_k_quant(dtype)) return launch_staged_k_quant_matvec(ctx, execs, norm, glu, rope);
  return with_columns(execs.front().inputs[1].desc->ne[1], [&](auto cols) {
    return dtype == DType::Q4_0
               ? staged::launch_staged<DType::Q4_0, cols()>(ctx, execs, norm, glu, rope)
               : staged::launch_staged<DType::Q8_0, cols()>(ctx, execs, norm, glu, rope);
  });
}

}  // namespace tandem::cuda
