// Kernels compiled for scalar (flags set per file in CMakeLists.txt).
#define TANDEM_ISA scalar
#define TANDEM_ISA_ENUM ::tandem::cpu::Isa::Scalar
#include "kernels/isa_body.inc"

namespace tandem::cpu {
const Kernels& kernels_scalar() {
  return scalar::kTable;
}
}  // namespace tandem::cpu
