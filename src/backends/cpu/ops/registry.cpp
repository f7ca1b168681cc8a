// The CPU backend's kernel rows: its capability table and its dispatch, in one list.
#include "ops.h"

namespace tandem::cpu {

namespace {

KernelTable<Kernel> builtin_kernels() {
  const std::vector<DType> floats{DType::F32, DType::F16, DType::BF16};
  const std::vector<DType> convertible{DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                                       DType::Q4_0};
  KernelTable<Kernel> t;
  t.add(OpKind::Copy, convertible, run_copy);
  t.add(OpKind::Copy, {DType::I32}, run_copy);
  t.add(OpKind::Copy, {DType::I8}, run_copy);
  for (DType d : convertible) t.add(OpKind::GetRows, {d, DType::I32, DType::F32}, run_get_rows);
  for (DType d : floats) t.add(OpKind::MatMul, {d, DType::F32}, run_matmul);
  t.add(OpKind::QuantizedMatMul, {DType::Q8_0, DType::F32}, run_quantized_matmul);
  t.add(OpKind::QuantizedMatMul, {DType::Q4_0, DType::F32}, run_quantized_matmul);
  t.add(OpKind::Add, {DType::F32}, run_binary);
  t.add(OpKind::Mul, {DType::F32}, run_binary);
  t.add(OpKind::Scale, {DType::F32}, run_unary);
  t.add(OpKind::Softmax, {DType::F32}, run_softmax);
  t.add(OpKind::RmsNorm, {DType::F32}, run_norm);
  t.add(OpKind::LayerNorm, {DType::F32}, run_norm);
  t.add(OpKind::Silu, {DType::F32}, run_unary);
  t.add(OpKind::Gelu, {DType::F32}, run_unary);
  t.add(OpKind::SwiGlu, {DType::F32}, run_unary);
  t.add(OpKind::Rope, {DType::F32, DType::I32}, run_rope);
  t.add(OpKind::Attention, {DType::F32, DType::I32}, run_attention);
  t.add(OpKind::Attention, {DType::F32, DType::F16, DType::I32}, run_attention);
  for (DType d : {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16}) {
    t.add(OpKind::Dequantize, {d, DType::F32}, run_copy);
  }
  t.add(OpKind::KvWrite, {DType::F32, DType::I32}, run_kv_write);
  t.add(OpKind::KvWrite, {DType::F16, DType::F32, DType::I32}, run_kv_write);
  return t;
}

}  // namespace

KernelTable<Kernel>& kernel_table() {
  static KernelTable<Kernel> table = builtin_kernels();
  return table;
}

}  // namespace tandem::cpu
