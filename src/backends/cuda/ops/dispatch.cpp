// The CUDA backend's kernel rows: its capability table and its dispatch, in one list.
#include "ops.h"
#include "tandem/error.h"

namespace tandem::cuda {

namespace {

// Kernels take rows and grid dims as 32-bit values; element offsets are 64-bit.
constexpr int64_t kMaxKernelElements = (int64_t(1) << 31) - 1;

KernelTable<Kernel> builtin_kernels() {
  const std::vector<DType> convertible{DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                                       DType::Q4_0};
  KernelTable<Kernel> t;
  auto add = [&t](OpKind op, std::vector<DType> dtypes, Kernel kernel, std::string feature = {}) {
    t.add(op, std::move(dtypes), kernel, kMaxKernelElements, std::move(feature));
  };
  add(OpKind::Copy, convertible, {run_copy});
  add(OpKind::Copy, {DType::I32}, {run_copy});
  add(OpKind::Copy, {DType::I8}, {run_copy});
  for (DType d : convertible) add(OpKind::GetRows, {d, DType::I32, DType::F32}, {run_get_rows});
  const Kernel matmul{run_matmul, matmul_scratch_bytes};
  add(OpKind::MatMul, {DType::F32}, matmul, "tensor_cores");
  add(OpKind::MatMul, {DType::F16, DType::F32}, matmul, "tensor_cores");
  add(OpKind::MatMul, {DType::BF16, DType::F32}, matmul, "bf16");
  const Kernel quantized{run_quantized_matmul, quantized_matmul_scratch_bytes};
  add(OpKind::QuantizedMatMul, {DType::Q8_0, DType::F32}, quantized, "tensor_cores");
  add(OpKind::QuantizedMatMul, {DType::Q4_0, DType::F32}, quantized, "tensor_cores");
  add(OpKind::Add, {DType::F32}, {run_binary});
  add(OpKind::Mul, {DType::F32}, {run_binary});
  add(OpKind::Scale, {DType::F32}, {run_unary});
  add(OpKind::Softmax, {DType::F32}, {run_softmax});
  add(OpKind::RmsNorm, {DType::F32}, {run_norm});
  add(OpKind::LayerNorm, {DType::F32}, {run_norm});
  add(OpKind::Silu, {DType::F32}, {run_unary});
  add(OpKind::Gelu, {DType::F32}, {run_unary});
  add(OpKind::SwiGlu, {DType::F32}, {run_swiglu});
  add(OpKind::Rope, {DType::F32, DType::I32}, {run_rope});
  const Kernel attention{run_attention, attention_scratch_bytes};
  add(OpKind::Attention, {DType::F32, DType::I32}, attention);
  add(OpKind::Attention, {DType::F32, DType::F16, DType::I32}, attention);
  for (DType d : {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16}) {
    add(OpKind::Dequantize, {d, DType::F32}, {run_copy});
  }
  add(OpKind::KvWrite, {DType::F32, DType::I32}, {run_kv_write});
  add(OpKind::KvWrite, {DType::F16, DType::F32, DType::I32}, {run_kv_write});
  return t;
}

const Kernel& kernel_for(const OpContext& ctx, const NodeExecution& e) {
  static const std::vector<std::string> kNoFeatures;
  const Kernel* k = kernel_table().find(e, ctx.features ? *ctx.features : kNoFeatures);
  if (!k) {
    throw_error(ErrorCode::Unsupported, ctx.state->id + " " + std::string(op_name(e.node->op)),
                "no kernel row covers the node");
  }
  return *k;
}

}  // namespace

KernelTable<Kernel>& kernel_table() {
  static KernelTable<Kernel> table = builtin_kernels();
  return table;
}

size_t op_scratch_bytes(const OpContext& ctx, const NodeExecution& e) {
  const Kernel& k = kernel_for(ctx, e);
  return k.scratch_bytes ? k.scratch_bytes(e, ctx.sm_count) : 0;
}

void run_op(const OpContext& ctx, const NodeExecution& e) {
  kernel_for(ctx, e).run(ctx, e);
}

}  // namespace tandem::cuda
