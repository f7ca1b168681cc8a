// Kernels registered as rows {op, dtypes, size limit, required feature, kernel}. A backend's
// capability table is the list of its rows and its dispatch is a lookup in the same rows, so
// it cannot declare what it does not run, nor run what it does not declare.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "tandem/backend.h"
#include "tandem/capability.h"

namespace tandem {

// Whether `row` covers the node of `exec` on a backend with `features`: the op, every input
// dtype and the output dtype, the size limit and the feature (the test Backend::check applies).
bool row_covers(const OpCapability& row, const NodeExecution& exec,
                const std::vector<std::string>& features);
// The same test on a node of a graph.
bool row_covers(const OpCapability& row, const Graph& graph, const Node& node,
                const std::vector<std::string>& features);

// The dtype lists rows share across backends: the float formats (MatMul's weights), and every
// format Copy converts between and GetRows reads.
inline std::vector<DType> float_dtypes() {
  return {DType::F32, DType::F16, DType::BF16};
}
inline std::vector<DType> convertible_dtypes() {
  return {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
}

// Kernel is whatever a backend calls: a function pointer, or a struct of them.
template <class Kernel>
class KernelTable {
 public:
  // Appends a row; rows are tried in order, so the first covering row runs a node.
  void add(OpKind op, std::vector<DType> dtypes, Kernel kernel, int64_t max_elements = 0,
           std::string required_feature = {}) {
    capabilities_.push_back(
        OpCapability{op, std::move(dtypes), max_elements, std::move(required_feature)});
    kernels_.push_back(std::move(kernel));
  }

  // The capability table, one OpCapability per row, in row order.
  const std::vector<OpCapability>& capabilities() const { return capabilities_; }
  const Kernel& kernel(size_t row) const { return kernels_[row]; }
  size_t size() const { return kernels_.size(); }

  // The kernel of the first row covering exec, or nullptr.
  const Kernel* find(const NodeExecution& exec, const std::vector<std::string>& features) const {
    for (size_t i = 0; i < capabilities_.size(); ++i) {
      if (row_covers(capabilities_[i], exec, features)) return &kernels_[i];
    }
    return nullptr;
  }

 private:
  std::vector<OpCapability> capabilities_;
  std::vector<Kernel> kernels_;
};

// A backend's rows from its list of op families: each family's function adds the rows of its
// kernels (defined in the family's file), called in the order listed.
template <class Kernel>
KernelTable<Kernel> rows_of_families(
    std::initializer_list<void (*)(KernelTable<Kernel>&)> families) {
  KernelTable<Kernel> rows;
  for (auto add : families) add(rows);
  return rows;
}

}  // namespace tandem
