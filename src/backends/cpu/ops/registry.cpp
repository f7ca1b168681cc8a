// The CPU backend's kernel rows, family by family: its capability table and its dispatch.
// A family file adds its own rows; a new family adds one line here.
#include "ops.h"

namespace tandem::cpu {

void add_copy_kernels(KernelTable<Kernel>& rows);  // Copy, Dequantize
void add_get_rows_kernels(KernelTable<Kernel>& rows);
void add_matmul_kernels(KernelTable<Kernel>& rows);
void add_quantized_matmul_kernels(KernelTable<Kernel>& rows);
void add_elementwise_kernels(KernelTable<Kernel>& rows);  // Add, Mul, Scale, Silu, Gelu, SwiGlu
void add_softmax_kernels(KernelTable<Kernel>& rows);
void add_norm_kernels(KernelTable<Kernel>& rows);  // RmsNorm, LayerNorm
void add_rope_kernels(KernelTable<Kernel>& rows);
void add_attention_kernels(KernelTable<Kernel>& rows);
void add_kv_write_kernels(KernelTable<Kernel>& rows);
void add_expert_matmul_kernels(KernelTable<Kernel>& rows);
void add_moe_kernels(KernelTable<Kernel>& rows);  // MoeRoute, MoeWeights, MoeCombine

KernelTable<Kernel>& kernel_table() {
  static KernelTable<Kernel> table = rows_of_families<Kernel>(
      {add_copy_kernels, add_get_rows_kernels, add_matmul_kernels, add_quantized_matmul_kernels,
       add_elementwise_kernels, add_softmax_kernels, add_norm_kernels, add_rope_kernels,
       add_attention_kernels, add_kv_write_kernels, add_expert_matmul_kernels, add_moe_kernels});
  return table;
}

}  // namespace tandem::cpu
