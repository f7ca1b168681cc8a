// The fast CPU backend: a persistent thread pool and SIMD kernels picked at run time
// (scalar, AVX2, AVX-512, AVX-512 VNNI), over host buffers shared with the reference.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels.h"
#include "ops/ops.h"
#include "reference_backend.h"
#include "thread_pool.h"

namespace tandem::cpu {

class CpuBackend : public HostBackend {
 public:
  // threads <= 0: one per physical core. isa: the kernel set; by default the best this CPU
  // runs, or the one named by TANDEM_CPU_ISA (scalar, avx2, avx512, avx512_vnni).
  // Throws Unsupported for an ISA this CPU lacks, InvalidArgument for an unknown name.
  explicit CpuBackend(int threads = 0, std::optional<Isa> isa = std::nullopt);

  const std::vector<OpCapability>& capabilities() const override { return rows_.capabilities(); }
  void execute(const Graph& graph, const NodeExecution& exec) override;
  // As execute, node by node, except that consecutive quantized products of one input run as
  // one pool job (quantized_matmul_group), and so do a token's expert products with the SwiGLU
  // or the MoeCombine after them (expert_group). TANDEM_CPU_FUSION=0 (or off) runs every node
  // alone, to measure what the groups bring.
  void execute_segment(const Graph& graph, std::span<const NodeExecution> segment,
                       uint64_t signature) override;

  int threads() const { return pool_.size(); }
  Isa isa() const { return kernels_->isa; }
  ThreadPool& pool() { return pool_; }
  void set_blas_policy(BlasPolicy policy) { blas_policy_ = policy; }
  // AMX is on by default when the CPU and OS allow it and the best kernel set is in use.
  bool amx() const { return amx_; }
  void set_amx(bool on);

  // Every row this backend declares (ops/registry.cpp).
  static std::vector<OpCapability> cpu_capabilities();

 private:
  ThreadPool pool_;
  const Kernels* kernels_;
  KernelTable<Kernel> rows_;  // capabilities and dispatch
  BlasPolicy blas_policy_ = BlasPolicy::Auto;
  bool amx_ = false;
  bool groups_ = true;        // execute_segment's groups (TANDEM_CPU_FUSION)
  std::mutex execute_mutex_;  // kernels share per-backend scratch and the pool
};

}  // namespace tandem::cpu
