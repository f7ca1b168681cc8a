// Kernels compiled for avx2 (flags set per file in CMakeLists.txt).
#define TANDEM_ISA avx2
#define TANDEM_ISA_ENUM ::tandem::cpu::Isa::Avx2
#include "kernels/isa_body.inc"

namespace tandem::cpu {
const Kernels& kernels_avx2() {
  return avx2::kTable;
}
}  // namespace tandem::cpu
