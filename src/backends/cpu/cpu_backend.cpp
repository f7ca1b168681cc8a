#include "cpu_backend.h"

#include <cstdlib>
#include <string>
#include <string_view>

#include "amx.h"
#include "cpu_features.h"
#include "tandem/error.h"

namespace tandem {

namespace cpu {

namespace {

Isa choose_isa(std::optional<Isa> requested) {
  if (requested) return *requested;
  if (const char* env = std::getenv("TANDEM_CPU_ISA"); env && *env) {
    Isa isa;
    TANDEM_CHECK_ARG(isa_from_name(env, &isa), "cpu",
                     std::string("unknown TANDEM_CPU_ISA '") + env +
                         "' (known: scalar, avx2, avx512, avx512_vnni)");
    return isa;
  }
  return best_isa();
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx512Vnni:
      return "avx512_vnni";
  }
  return "unknown";
}

const Kernels& kernels_for(Isa isa) {
  if (int(isa) > int(best_isa())) {
    throw_error(ErrorCode::Unsupported, "cpu",
                "this CPU cannot run the " + std::string(isa_name(isa)) +
                    " kernels (best: " + std::string(isa_name(best_isa())) + ")");
  }
  switch (isa) {
    case Isa::Scalar:
      return kernels_scalar();
    case Isa::Avx2:
      return kernels_avx2();
    case Isa::Avx512:
      return kernels_avx512();
    case Isa::Avx512Vnni:
      return kernels_avx512_vnni();
  }
  return kernels_scalar();
}

std::vector<OpCapability> CpuBackend::cpu_capabilities() {
  return kernel_table().capabilities();
}

CpuBackend::CpuBackend(int threads, std::optional<Isa> isa)
    : HostBackend("cpu"),
      pool_(threads > 0 ? threads : physical_core_count()),
      kernels_(&kernels_for(choose_isa(isa))),
      rows_(kernel_table()) {
  features_ = feature_names(cpu_features());
  features_.push_back("kernels_" + std::string(isa_name(kernels_->isa)));
  // Part of the device's identity for calibrated cost profiles: speed depends on it.
  features_.push_back("threads_" + std::to_string(pool_.size()));
  amx_ = kernels_->isa == best_isa() && amx::amx_usable();
  if (const char* env = std::getenv("TANDEM_CPU_FUSION"); env && *env) {
    const std::string_view v(env);
    groups_ = v != "0" && v != "off";
  }
}

void CpuBackend::set_amx(bool on) {
  if (on && !amx::amx_usable()) {
    throw_error(ErrorCode::Unsupported, "cpu", "AMX int8 is not available on this CPU or OS");
  }
  amx_ = on;
}

void CpuBackend::execute(const Graph& graph, const NodeExecution& e) {
  CapabilityCheck c = check(graph, *e.node);
  if (!c.ok()) throw_error(ErrorCode::Unsupported, "cpu", c.detail);
  std::lock_guard<std::mutex> lock(execute_mutex_);
  const Kernel* kernel = rows_.find(e, features());
  if (!kernel) throw_error(ErrorCode::Unsupported, "cpu", "no kernel row covers the node");
  (*kernel)(OpContext{pool_, *kernels_, blas_policy_, amx_}, e);
}

void CpuBackend::execute_segment(const Graph& graph, std::span<const NodeExecution> segment,
                                 uint64_t /*signature*/) {
  for (size_t i = 0; i < segment.size();) {
    const OpContext ctx{pool_, *kernels_, blas_policy_, amx_};
    const auto rest = segment.subspan(i);
    const size_t experts = groups_ ? expert_group_size(ctx, rest) : 1;
    const size_t n = experts > 1 ? experts : groups_ ? quantized_matmul_group_size(ctx, rest) : 1;
    if (n == 1) {
      execute(graph, segment[i++]);
      continue;
    }
    for (size_t j = i; j < i + n; ++j) {
      CapabilityCheck c = check(graph, *segment[j].node);
      if (!c.ok()) throw_error(ErrorCode::Unsupported, "cpu", c.detail);
    }
    std::lock_guard<std::mutex> lock(execute_mutex_);
    if (experts > 1) {
      expert_group(ctx, rest.first(n));
    } else {
      quantized_matmul_group(ctx, rest.first(n));
    }
    i += n;
  }
}

}  // namespace cpu

std::shared_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_shared<cpu::CpuBackend>(threads);
}

}  // namespace tandem
