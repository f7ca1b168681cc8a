// Kernels compiled for avx512_vnni (flags set per file in CMakeLists.txt).
#define TANDEM_ISA avx512_vnni
#define TANDEM_ISA_ENUM ::tandem::cpu::Isa::Avx512Vnni
#include "kernels/isa_body.inc"

namespace tandem::cpu {
const Kernels& kernels_avx512_vnni() {
  return avx512_vnni::kTable;
}
}  // namespace tandem::cpu
