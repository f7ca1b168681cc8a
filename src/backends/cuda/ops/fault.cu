// A deliberately faulting kernel, so tests can prove that a poisoned context marks the
// device lost.
#include "ops.h"

namespace tandem::cuda {

namespace {
__global__ void trap_kernel() {
  __trap();
}
}  // namespace

void launch_trap_kernel(cudaStream_t stream) {
  trap_kernel<<<1, 1, 0, stream>>>();
}

}  // namespace tandem::cuda
