// Leaves: data bound at run time, model weights, and the KV cache. The graph adds them
// through Graph::leaf; they have no shape rule and no work.
#include "families.h"

namespace tandem::ops {

namespace {

constexpr OpDescriptor kOps[] = {
    {.op = OpKind::Input,
     .name = "input",
     .doc = "data bound at run time",
     .op_class = OpClass::Leaf},
    {.op = OpKind::Weight,
     .name = "weight",
     .doc = "constant data, persistent across runs",
     .op_class = OpClass::Leaf},
    {.op = OpKind::KvCache,
     .name = "kv_cache",
     .doc = "persistent state written by kv_write",
     .op_class = OpClass::Leaf},
};

}  // namespace

std::span<const OpDescriptor> leaf_ops() {
  return kOps;
}

}  // namespace tandem::ops
