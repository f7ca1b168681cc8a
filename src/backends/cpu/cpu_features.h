// What the host CPU offers: instruction-set extensions (detected at run time, so one binary
// runs on any x86-64), the OS permission for AMX, and the number of physical cores.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kernels.h"

namespace tandem::cpu {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx_vnni = false, avx512_bf16 = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  bool amx_enabled = false;  // the OS granted the AMX tile state (arch_prctl)
};

// Detected once (cpuid, xgetbv, arch_prctl); cheap to call again.
const CpuFeatures& cpu_features();
// The best kernel set this CPU runs.
Isa best_isa();
// Names for Backend::features(): "avx2", "fma", "f16c", "avx512", "avx512_vnni", "amx", ...
std::vector<std::string> feature_names(const CpuFeatures& f);
// Physical cores (unique (package, core) ids in sysfs or /proc/cpuinfo), at least 1.
int physical_core_count();
// "scalar", "avx2", "avx512", "avx512_vnni" -> Isa; nullopt-like false on an unknown name.
bool isa_from_name(std::string_view name, Isa* out);

}  // namespace tandem::cpu
