#include "reference_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "tandem/bytes.h"
#include "tandem/error.h"

namespace tandem {

namespace reference {

// The families of reference kernels (ops/<family>.cpp), each adding its rows; a new family adds
// one line here.
void add_copy_kernels(KernelTable<ReferenceKernel>& rows);  // Copy, Dequantize
void add_get_rows_kernels(KernelTable<ReferenceKernel>& rows);
void add_matmul_kernels(KernelTable<ReferenceKernel>& rows);  // MatMul, QuantizedMatMul
void add_elementwise_kernels(KernelTable<ReferenceKernel>& rows);
void add_softmax_kernels(KernelTable<ReferenceKernel>& rows);
void add_norm_kernels(KernelTable<ReferenceKernel>& rows);  // RmsNorm, LayerNorm
void add_rope_kernels(KernelTable<ReferenceKernel>& rows);
void add_attention_kernels(KernelTable<ReferenceKernel>& rows);
void add_kv_write_kernels(KernelTable<ReferenceKernel>& rows);
void add_moe_kernels(KernelTable<ReferenceKernel>& rows);  // routing, expert products, combine

}  // namespace reference

namespace {

constexpr size_t kAlignment = 64;

}  // namespace

MemoryInfo HostBackend::memory() const {
  long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
  long page = sysconf(_SC_PAGE_SIZE);
  return {size_t(pages) * size_t(page), size_t(avail) * size_t(page)};
}

Buffer HostBackend::allocate(size_t bytes) {
  size_t rounded = align_up(std::max<size_t>(bytes, 1), kAlignment);
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) {
    throw_error(ErrorCode::OutOfMemory, backend_id() + " allocate",
                "out of memory (need " + std::to_string(bytes) + " bytes)");
  }
  return Buffer(this, p, bytes);
}

void HostBackend::free_buffer(void* data, size_t) {
  std::free(data);
}
void HostBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void HostBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void HostBackend::copy_within(void* dst, const void* src, size_t bytes) {
  std::memmove(dst, src, bytes);
}

KernelTable<ReferenceKernel>& reference_kernels() {
  using namespace reference;
  static KernelTable<ReferenceKernel> table = rows_of_families<ReferenceKernel>(
      {add_copy_kernels, add_get_rows_kernels, add_matmul_kernels, add_elementwise_kernels,
       add_softmax_kernels, add_norm_kernels, add_rope_kernels, add_attention_kernels,
       add_kv_write_kernels, add_moe_kernels});
  return table;
}

std::vector<OpCapability> ReferenceBackend::reference_capabilities() {
  return reference_kernels().capabilities();
}

ReferenceBackend::ReferenceBackend() : HostBackend("reference"), kernels_(reference_kernels()) {}

void ReferenceBackend::execute(const Graph& graph, const NodeExecution& exec) {
  CapabilityCheck c = check(graph, *exec.node);
  const ReferenceKernel* kernel = kernels_.find(exec, features());
  if (!c.ok() || !kernel) throw_error(ErrorCode::Unsupported, "reference", c.detail);
  (*kernel)(exec);
}

void reference_execute(const Graph& graph, const NodeExecution& e) {
  (void)graph;
  const ReferenceKernel* kernel = reference_kernels().find(e, {});
  if (!kernel) {
    throw_error(ErrorCode::Unsupported, "reference",
                "op " + std::string(op_name(e.node->op)) + " is not executable");
  }
  (*kernel)(e);
}

std::shared_ptr<Backend> make_reference_backend() {
  return std::make_shared<ReferenceBackend>();
}

}  // namespace tandem
