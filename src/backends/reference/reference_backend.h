// The reference backend: plain C++ for every op and dtype it declares, accumulating in
// float64 where cheap. It is the oracle every other backend is checked against.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/backend.h"
#include "tandem/kernel_table.h"

namespace tandem {

// A host backend with the plain buffer handling shared by the reference and test backends.
class HostBackend : public Backend {
 public:
  explicit HostBackend(std::string id) : id_(std::move(id)) {}
  const std::string& backend_id() const override { return id_; }
  BackendKind kind() const override { return BackendKind::Cpu; }
  MemoryInfo memory() const override;
  const std::vector<std::string>& features() const override { return features_; }
  bool host_accessible() const override { return true; }
  Buffer allocate(size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_within(void* dst, const void* src, size_t bytes) override;
  void synchronize() override {}

 protected:
  void free_buffer(void* data, size_t bytes) override;
  std::vector<std::string> features_;

 private:
  std::string id_;
};

// A reference kernel: plain C++ over host pointers, parameters read from exec.node->params.
using ReferenceKernel = void (*)(const NodeExecution& exec);
// The reference's rows: every compute op and dtype it runs. Add rows (an op registered
// outside the library) before creating backends: each backend copies the rows it starts with.
KernelTable<ReferenceKernel>& reference_kernels();

class ReferenceBackend : public HostBackend {
 public:
  ReferenceBackend();
  const std::vector<OpCapability>& capabilities() const override { return kernels_.capabilities(); }
  void execute(const Graph& graph, const NodeExecution& exec) override;

  // The full reference table, for test backends that restrict or extend it.
  static std::vector<OpCapability> reference_capabilities();

 private:
  KernelTable<ReferenceKernel> kernels_;
};

// Runs one node with the reference kernels, whatever backend asks (test backends use it).
void reference_execute(const Graph& graph, const NodeExecution& exec);

}  // namespace tandem
