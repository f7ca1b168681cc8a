#include "cpu_features.h"

#include "amx.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

namespace tandem::cpu {

namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: request an XSAVE feature
constexpr long kXfeatureXtiledata = 18;

uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  const bool avx = (c >> 28) & 1;
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;
  const bool os_amx = (xcr0 & (3u << 17)) == (3u << 17);
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool ymm_ok = avx && os_ymm;
  f.fma = f.fma && ymm_ok;
  f.f16c = f.f16c && ymm_ok;
  f.avx2 = ymm_ok && ((b >> 5) & 1);
  f.avx512f = os_zmm && ((b >> 16) & 1);
  f.avx512dq = f.avx512f && ((b >> 17) & 1);
  f.avx512bw = f.avx512f && ((b >> 30) & 1);
  f.avx512vl = f.avx512f && ((b >> 31) & 1);
  f.avx512_vnni = f.avx512f && ((c >> 11) & 1);
  f.amx_bf16 = (d >> 22) & 1;
  f.amx_tile = (d >> 24) & 1;
  f.amx_int8 = (d >> 25) & 1;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  f.avx_vnni = ymm_ok && ((a1 >> 4) & 1);
  f.avx512_bf16 = f.avx512f && ((a1 >> 5) & 1);
  // Linux hands out the AMX tile data state only on request; without it tile loads fault.
  if (f.amx_tile && os_amx) {
    f.amx_enabled = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }
  return f;
}

int cores_from_sysfs() {
  std::set<std::pair<long, long>> cores;
  int misses = 0;  // offline or absent cpus leave gaps in the numbering
  for (int cpu = 0; cpu < 8192 && misses < 64; ++cpu) {
    std::string dir = "/sys/devices/system/cpu/cpu";
    dir += std::to_string(cpu);
    dir += "/topology/";
    std::ifstream core(dir + "core_id");
    std::ifstream package(dir + "physical_package_id");
    long c = 0, p = 0;  // a missing package id counts as package 0
    if (!(core >> c)) {
      ++misses;
      continue;
    }
    misses = 0;
    package >> p;
    cores.insert({p, c});
  }
  return int(cores.size());
}

int cores_from_cpuinfo() {
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, package = "0";
  while (std::getline(in, line)) {
    auto value = [&] { return line.substr(line.find(':') + 1); };
    if (line.rfind("physical id", 0) == 0) package = value();
    if (line.rfind("core id", 0) == 0) cores.insert({package, value()});
  }
  return int(cores.size());
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

Isa best_isa() {
  const CpuFeatures& f = cpu_features();
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c;
  if (avx512 && f.avx512_vnni) return Isa::Avx512Vnni;
  if (avx512) return Isa::Avx512;
  if (f.avx2 && f.fma && f.f16c) return Isa::Avx2;
  return Isa::Scalar;
}

std::vector<std::string> feature_names(const CpuFeatures& f) {
  std::vector<std::string> names;
  auto add = [&](bool on, const char* name) {
    if (on) names.emplace_back(name);
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq, "avx512");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx_vnni, "avx_vnni");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_tile && f.amx_int8 && f.amx_enabled, "amx");
  add(f.amx_bf16 && f.amx_enabled, "amx_bf16");
  return names;
}

namespace amx {
bool amx_usable() {
  const CpuFeatures& f = cpu_features();
  return f.amx_tile && f.amx_int8 && f.amx_enabled && f.avx512f && f.avx512bw && f.f16c;
}
}  // namespace amx

int physical_core_count() {
  static const int count = [] {
    int n = cores_from_sysfs();
    if (n <= 0) n = cores_from_cpuinfo();
    if (n <= 0) n = int(std::thread::hardware_concurrency());
    return n > 0 ? n : 1;
  }();
  return count;
}

bool isa_from_name(std::string_view name, Isa* out) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni}) {
    if (isa_name(isa) == name) {
      *out = isa;
      return true;
    }
  }
  return false;
}

}  // namespace tandem::cpu
