#include "tandem/kernel_table.h"

#include <algorithm>

namespace tandem {

namespace {

// The row test over any node description: dtype_at(i) for i < n is every dtype the node
// involves (inputs and output).
template <class DTypeAt>
bool covers(const OpCapability& row, OpKind op, size_t n, DTypeAt&& dtype_at, int64_t elements,
            const std::vector<std::string>& features) {
  if (row.op != op) return false;
  for (size_t i = 0; i < n; ++i) {
    if (std::find(row.dtypes.begin(), row.dtypes.end(), dtype_at(i)) == row.dtypes.end()) {
      return false;
    }
  }
  if (row.max_elements > 0 && elements > row.max_elements) return false;
  return row.required_feature.empty() ||
         std::find(features.begin(), features.end(), row.required_feature) != features.end();
}

}  // namespace

bool row_covers(const OpCapability& row, const NodeExecution& exec,
                const std::vector<std::string>& features) {
  // Before counting elements: a backend's kernel lookup tests every row, once per op it runs.
  if (row.op != exec.node->op) return false;
  const size_t n = exec.inputs.size();
  int64_t elements = exec.output.desc->elements();
  for (const TensorRef& in : exec.inputs) elements = std::max(elements, in.desc->elements());
  return covers(
      row, exec.node->op, n + 1,
      [&](size_t i) { return i < n ? exec.inputs[i].desc->dtype : exec.output.desc->dtype; },
      elements, features);
}

bool row_covers(const OpCapability& row, const Graph& graph, const Node& node,
                const std::vector<std::string>& features) {
  if (row.op != node.op) return false;
  const size_t n = node.inputs.size();
  return covers(
      row, node.op, n + 1,
      [&](size_t i) { return graph.tensor(i < n ? node.inputs[i] : node.id).dtype; },
      node_max_elements(graph, node), features);
}

}  // namespace tandem
