// The CUDA backend's kernel rows, family by family: its capability table and its dispatch.
// A family file adds its own rows; a new family adds one line here.
#include <algorithm>

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

// The bytes a tensor's elements span from its address (rows may be strided).
size_t extent(const TensorDesc& d) {
  if (d.is_contiguous()) return d.bytes();
  size_t last = 0;
  for (int i = 1; i < 4; ++i) last += size_t(std::max<int64_t>(d.ne[i] - 1, 0)) * size_t(d.nb[i]);
  return last + size_t(d.nb[1]);
}

}  // namespace

bool overlap(const TensorRef& a, const TensorRef& b) {
  const auto *pa = static_cast<const uint8_t*>(a.data), *pb = static_cast<const uint8_t*>(b.data);
  return pa < pb + extent(*b.desc) && pb < pa + extent(*a.desc);
}

namespace {

// The longest prefix (at most kMaxFusedNodes) of the segment in which no node writes memory that
// another node of the prefix reads from outside it. A fused launch runs all of their reads and
// writes at once: an output in the buffer an earlier node read last (the K RoPE's output in the
// Q projection's buffer) moved 1B Q8_0 prefill logits by nmse 2e-4 to 5e-4 from run to run.
// The executor's memory plan never does that (Backend::fused_nodes); segments built by other
// callers may, and then run node by node. A node's own input under its output stays the
// kernel's affair, as when it runs alone.
size_t alias_free_prefix(std::span<const NodeExecution> segment) {
  const size_t most = std::min(segment.size(), kMaxFusedNodes);
  auto produced = [&](const TensorRef& in, size_t before) {
    for (size_t j = 0; j < before; ++j) {
      if (segment[j].output.data == in.data) return true;
    }
    return false;
  };
  for (size_t n = 1; n < most; ++n) {
    const NodeExecution& added = segment[n];
    for (size_t j = 0; j < n; ++j) {
      for (const TensorRef& in : segment[j].inputs) {
        if (!produced(in, j) && overlap(added.output, in)) return n;
      }
      for (const TensorRef& in : added.inputs) {
        if (!produced(in, n) && overlap(segment[j].output, in)) return n;
      }
    }
  }
  return most;
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
  const std::span<const NodeExecution> clear = segment.first(alias_free_prefix(segment));
  if (const size_t n = run_fused_matvecs(ctx, clear)) return n;
  if (const size_t n = run_fused_half_matvecs(ctx, clear)) return n;
  if (fusion == Fusion::Matvec) return 0;
  for (auto fused : {run_fused_norm_matvecs, run_fused_norm_half_matvecs, run_fused_add_rms_norm,
                     run_fused_rope_kv_write, run_fused_expert_gate_up,
                     run_fused_expert_down_combine, run_fused_moe_route_weights}) {
    if (const size_t n = fused(ctx, clear)) return n;
  }
  return 0;
}

}  // namespace tandem::cuda
