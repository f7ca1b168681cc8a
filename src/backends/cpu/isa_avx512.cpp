// Kernels compiled for avx512 (flags set per file in CMakeLists.txt).
#define TANDEM_ISA avx512
#define TANDEM_ISA_ENUM ::tandem::cpu::Isa::Avx512
#include "kernels/isa_body.inc"

namespace tandem::cpu {
const Kernels& kernels_avx512() {
  return avx512::kTable;
}
}  // namespace tandem::cpu
