// ISA detection and dispatch: the chosen kernel table matches the CPU, ISAs the CPU lacks are
// refused with a clear error, and features are reported.
#include <gtest/gtest.h>

#include <cstdlib>

#include "cpu_backend.h"
#include "cpu_features.h"
#include "tandem/error.h"
#include "tandem/registry.h"

namespace tandem::cpu {
namespace {

TEST(CpuIsa, BestIsaMatchesFeatures) {
  const CpuFeatures& f = cpu_features();
  const Isa best = best_isa();
  if (best >= Isa::Avx2) {
    EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
  }
  if (best >= Isa::Avx512) {
    EXPECT_TRUE(f.avx512f && f.avx512bw && f.avx512vl);
  }
  if (best == Isa::Avx512Vnni) {
    EXPECT_TRUE(f.avx512_vnni);
  }
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c) {
    EXPECT_GE(int(best), int(Isa::Avx512));
  }
}

TEST(CpuIsa, TablesReportTheirIsa) {
  for (int i = 0; i <= int(best_isa()); ++i) {
    EXPECT_EQ(int(kernels_for(Isa(i)).isa), i) << isa_name(Isa(i));
  }
}

TEST(CpuIsa, RefusesIsaBeyondTheCpu) {
  if (best_isa() == Isa::Avx512Vnni) GTEST_SKIP() << "this CPU runs every kernel set";
  EXPECT_THROW(kernels_for(Isa::Avx512Vnni), Error);
}

TEST(CpuIsa, NamesRoundTrip) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni}) {
    Isa back;
    ASSERT_TRUE(isa_from_name(isa_name(isa), &back));
    EXPECT_EQ(back, isa);
  }
  Isa dummy;
  EXPECT_FALSE(isa_from_name("sse9", &dummy));
}

TEST(CpuBackendInfo, ReportsFeaturesThreadsAndKind) {
  CpuBackend backend(3, Isa::Scalar);
  EXPECT_EQ(backend.backend_id(), "cpu");
  EXPECT_EQ(backend.kind(), BackendKind::Cpu);
  EXPECT_EQ(backend.threads(), 3);
  EXPECT_EQ(backend.isa(), Isa::Scalar);
  EXPECT_TRUE(backend.has_feature("kernels_scalar"));
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(backend.has_feature("avx2"), f.avx2);
  EXPECT_EQ(backend.has_feature("avx512_vnni"), f.avx512_vnni);
  EXPECT_EQ(backend.has_feature("amx"), f.amx_tile && f.amx_int8 && f.amx_enabled);
  EXPECT_GE(physical_core_count(), 1);
}

TEST(CpuBackendInfo, DefaultThreadsArePhysicalCores) {
  CpuBackend backend;
  EXPECT_EQ(backend.threads(), physical_core_count());
  EXPECT_EQ(backend.isa(), best_isa());
}

TEST(CpuBackendInfo, RegisteredInRegistry) {
  auto backends = available_backends(BackendOptions{2});
  ASSERT_FALSE(backends.empty());
  EXPECT_EQ(backends[0]->backend_id(), "cpu");
  EXPECT_EQ(static_cast<CpuBackend&>(*backends[0]).threads(), 2);
}

TEST(CpuBackendInfo, EnvironmentPicksIsa) {
  ::setenv("TANDEM_CPU_ISA", "scalar", 1);
  CpuBackend scalar(1);
  ::setenv("TANDEM_CPU_ISA", "bogus", 1);
  EXPECT_THROW(CpuBackend(1), Error);
  ::unsetenv("TANDEM_CPU_ISA");
  EXPECT_EQ(scalar.isa(), Isa::Scalar);
}

}  // namespace
}  // namespace tandem::cpu
