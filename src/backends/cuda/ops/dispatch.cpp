// The CUDA backend's kernel rows, family by family: its capability table and its dispatch.
// A family file adds its own rows; a new family adds one line here.
#include "ops.h"
#include "tandem/error.h"

namespace tandem::cuda {

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
void add_moe_kernels(KernelTable<Kernel>& rows);  // MoeRoute, MoeWeights, ExpertMatMul, MoeCombine

namespace {

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
  static KernelTable<Kernel> table = rows_of_families<Kernel>(
      {add_copy_kernels, add_get_rows_kernels, add_matmul_kernels, add_quantized_matmul_kernels,
       add_elementwise_kernels, add_softmax_kernels, add_norm_kernels, add_rope_kernels,
       add_attention_kernels, add_kv_write_kernels, add_moe_kernels});
  return table;
}

size_t op_scratch_bytes(const OpContext& ctx, const NodeExecution& e) {
  const Kernel& k = kernel_for(ctx, e);
  return k.scratch_bytes ? k.scratch_bytes(e, ctx.sm_count) : 0;
}

void run_op(const OpContext& ctx, const NodeExecution& e) {
  kernel_for(ctx, e).run(ctx, e);
}

size_t run_fused(const OpContext& ctx, std::span<const NodeExecution> segment, Fusion fusion) {
  if (fusion == Fusion::None) return 0;
  if (const size_t n = run_fused_matvecs(ctx, segment)) return n;
  if (const size_t n = run_fused_half_matvecs(ctx, segment)) return n;
  if (fusion == Fusion::Matvec) return 0;
  for (auto fused : {run_fused_add_rms_norm, run_fused_rope_kv_write, run_fused_expert_gate_up,
                     run_fused_expert_down_combine, run_fused_moe_route_weights}) {
    if (const size_t n = fused(ctx, segment)) return n;
  }
  return 0;
}

}  // namespace tandem::cuda
