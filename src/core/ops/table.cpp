// The op table: the built-in families in OpKind order, then ops registered at run time.
#include <array>
#include <atomic>
#include <deque>
#include <mutex>

#include "families.h"
#include "tandem/error.h"

namespace tandem {

namespace {

struct Registered {
  std::string name, doc;
  OpDescriptor descriptor;
};

class OpTable {
 public:
  OpTable() {
    for (auto family :
         {ops::leaf_ops, ops::layout_ops, ops::copy_ops, ops::matmul_ops, ops::elementwise_ops,
          ops::softmax_ops, ops::norm_ops, ops::rope_ops, ops::attention_ops, ops::moe_ops}) {
      for (const OpDescriptor& d : family()) slots_[size_t(d.op)].store(&d);
    }
    for (int i = 0; i < kOpKindCount; ++i) {
      if (!slots_[size_t(i)].load()) {
        throw_error(ErrorCode::InvalidArgument, "op table",
                    "built-in op " + std::to_string(i) + " has no descriptor");
      }
    }
    count_ = kOpKindCount;
  }

  const OpDescriptor* find(OpKind op) const { return slots_[size_t(op)].load(); }

  OpKind add(OpDescriptor d) {
    std::lock_guard lock(mutex_);
    const std::string where = "register_op " + std::string(d.name);
    TANDEM_CHECK_ARG(!d.name.empty() && d.infer, where, "needs a name and a shape rule");
    TANDEM_CHECK_ARG(d.min_inputs >= 0 && d.min_inputs <= d.max_inputs, where,
                     "min_inputs must be in [0, max_inputs]");
    for (int i = 0; i < count_; ++i) {
      TANDEM_CHECK_ARG(slots_[size_t(i)].load()->name != d.name, where, "the name is taken");
    }
    TANDEM_CHECK_ARG(count_ < kMaxOpKinds, where,
                     "the op table is full (" + std::to_string(kMaxOpKinds) + " ops)");
    Registered& r = registered_.emplace_back();
    r.name = std::string(d.name);
    r.doc = std::string(d.doc);
    r.descriptor = d;
    r.descriptor.op = OpKind(count_);
    r.descriptor.name = r.name;
    r.descriptor.doc = r.doc;
    slots_[size_t(count_)].store(&r.descriptor);
    ++count_;
    return r.descriptor.op;
  }

  int count() const {
    std::lock_guard lock(mutex_);
    return count_;
  }

 private:
  std::array<std::atomic<const OpDescriptor*>, kMaxOpKinds> slots_{};
  std::deque<Registered> registered_;  // stable addresses
  int count_ = 0;
  mutable std::mutex mutex_;
};

OpTable& table() {
  static OpTable t;
  return t;
}

}  // namespace

const OpDescriptor* find_op_descriptor(OpKind op) {
  return table().find(op);
}

const OpDescriptor& op_descriptor(OpKind op) {
  const OpDescriptor* d = table().find(op);
  if (!d) throw_error(ErrorCode::InvalidArgument, "graph", "unknown op " + std::to_string(int(op)));
  return *d;
}

OpKind register_op(OpDescriptor descriptor) {
  return table().add(descriptor);
}

std::vector<OpKind> registered_ops() {
  std::vector<OpKind> ops;
  for (int i = 0; i < table().count(); ++i) ops.push_back(OpKind(i));
  return ops;
}

std::string_view op_name(OpKind op) {
  const OpDescriptor* d = find_op_descriptor(op);
  return d ? d->name : std::string_view("unknown");
}

std::optional<OpKind> op_from_name(std::string_view name) {
  for (OpKind op : registered_ops()) {
    if (op_descriptor(op).name == name) return op;
  }
  return std::nullopt;
}

bool is_leaf(OpKind op) {
  const OpDescriptor* d = find_op_descriptor(op);
  return d && d->op_class == OpClass::Leaf;
}

bool is_metadata(OpKind op) {
  const OpDescriptor* d = find_op_descriptor(op);
  return d && d->op_class == OpClass::Metadata;
}

void OpInference::fail(const std::string& message) const {
  throw_error(ErrorCode::InvalidArgument, "graph " + std::string(op_name(op)), message);
}

void OpInference::expect_dtype(size_t i, std::initializer_list<DType> allowed,
                               const char* what) const {
  const TensorDesc& t = in(i);
  for (DType d : allowed) {
    if (t.dtype == d) return;
  }
  std::string list;
  for (DType d : allowed) list += (list.empty() ? "" : ", ") + std::string(dtype_name(d));
  fail(std::string(what) + " '" + t.name + "' has dtype " + std::string(dtype_name(t.dtype)) +
       " (expected " + list + ")");
}

void OpInference::expect_same_shape(size_t a, size_t b) const {
  if (!in(a).same_shape(in(b))) {
    fail("shapes differ: '" + in(a).name + "' " + shape_string(in(a)) + " vs '" + in(b).name +
         "' " + shape_string(in(b)));
  }
}

DTypeClass dtype_class(DType dtype) {
  switch (dtype) {
    case DType::F16:
    case DType::BF16:
      return DTypeClass::F16;
    case DType::I8:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return DTypeClass::Quantized;
    default:
      return DTypeClass::F32;
  }
}

std::string_view dtype_class_name(DTypeClass c) {
  switch (c) {
    case DTypeClass::F32:
      return "f32";
    case DTypeClass::F16:
      return "f16";
    case DTypeClass::Quantized:
      return "quantized";
  }
  return "unknown";
}

size_t data_bytes(const TensorDesc& desc) {
  return row_bytes(desc.dtype, desc.ne[0]) * size_t(desc.rows());
}

}  // namespace tandem
