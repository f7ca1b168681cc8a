// One descriptor per op: its arity, the parameters it reads, its shape and dtype rule, its
// work formula and its doc line, in one table indexed by OpKind (src/core/ops/, one file per
// op family). Graph inference and the cost model read it; an op registered at run time
// (register_op) is built, scheduled and costed like a built-in one.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/graph.h"

namespace tandem {

// Every OpKind value, built-in and registered, is below this.
inline constexpr int kMaxOpKinds = 256;

enum class OpClass : uint8_t {
  Leaf,      // data bound at run time or persistent; no inputs
  Metadata,  // aliases its input's storage with a new shape or strides; no backend runs it
  Compute,   // a backend runs it
};

// The OpParams fields an op reads (a bit set).
enum OpAttribute : uint32_t {
  kAttrEps = 1u << 0,
  kAttrScale = 1u << 1,
  kAttrFreqBase = 1u << 2,
  kAttrNRot = 1u << 3,
  kAttrAxes = 1u << 4,
  kAttrTopK = 1u << 5,
  kAttrNormalize = 1u << 6,
};

// Peak throughput is looked up per class: f32; f16 and bf16; int8 and block-quantized.
enum class DTypeClass : uint8_t { F32, F16, Quantized };
inline constexpr int kDTypeClassCount = 3;
DTypeClass dtype_class(DType dtype);
std::string_view dtype_class_name(DTypeClass c);

// Work of one node, counted from its shapes (formulas in docs/scheduler.md and src/core/ops/).
struct OpWork {
  double flops = 0.0;
  double bytes = 0.0;  // bytes read plus bytes written
  DTypeClass dtype_class = DTypeClass::F32;
};

// Bytes of a tensor's elements (rows * row_bytes), whatever its strides.
size_t data_bytes(const TensorDesc& desc);

// What a shape rule sees: the node's inputs, its parameters (a rule may normalize them, as
// Transpose sets its axes), the requested output dtype and, for views, the requested layout.
struct OpInference {
  const Graph& graph;
  OpKind op;
  const std::vector<TensorId>& inputs;
  OpParams& params;
  DType out_dtype = DType::F32;
  const Dims* view_ne = nullptr;
  const Dims* view_nb = nullptr;
  int64_t view_offset = 0;
  int view_dims = 0;

  const TensorDesc& in(size_t i) const { return graph.tensor(inputs[i]); }
  // The tensor owning input i's storage (for outputs that alias it).
  TensorId storage_of(size_t i) const { return graph.storage_of(inputs[i]); }
  // Throws InvalidArgument "[graph <op>] message".
  [[noreturn]] void fail(const std::string& message) const;
  // Fails unless input i's dtype is one of `allowed`; `what` names the input in the message.
  void expect_dtype(size_t i, std::initializer_list<DType> allowed, const char* what) const;
  void expect_same_shape(size_t a, size_t b) const;
};

struct OpDescriptor {
  OpKind op = OpKind::Input;
  std::string_view name;  // as printed, and as op_from_name reads it
  std::string_view doc;   // one line: what it computes
  OpClass op_class = OpClass::Compute;
  int min_inputs = 0;
  int max_inputs = 0;
  uint32_t attributes = 0;      // OpAttribute bits
  bool strided_inputs = false;  // a compute op that reads non-contiguous inputs (Copy)
  bool aliases_output = false;  // the output is input 0's storage (KvWrite)
  // Checks the inputs and returns the output's description (its name is set by the graph).
  TensorDesc (*infer)(OpInference& ctx) = nullptr;
  // Adds the op's FLOPs (and, where it reads less than every input, its bytes) to `w`, which
  // arrives with every input read once and the output written once.
  void (*work)(const Graph& graph, const Node& node, OpWork& w) = nullptr;
};

// The descriptor of an op; throws InvalidArgument for a value nobody registered.
const OpDescriptor& op_descriptor(OpKind op);
// Null for a value nobody registered.
const OpDescriptor* find_op_descriptor(OpKind op);
// Adds an op outside the built-in set and returns its OpKind (descriptor.op is ignored).
// Register before building graphs or creating backends that use it. Throws InvalidArgument
// for a name already taken, a missing shape rule, or a full table.
OpKind register_op(OpDescriptor descriptor);
// Every registered op, built-in ones first, in OpKind order.
std::vector<OpKind> registered_ops();

}  // namespace tandem
