// The one place that maps a node to its CUDA launcher.
#include "ops.h"
#include "tandem/error.h"

namespace tandem::cuda {

size_t op_scratch_bytes(const NodeExecution& e, int sm_count) {
  switch (e.node->op) {
    case OpKind::MatMul:
      return matmul_scratch_bytes(e);
    case OpKind::QuantizedMatMul:
      return quantized_matmul_scratch_bytes(e);
    case OpKind::Attention:
      return attention_scratch_bytes(e, sm_count);
    default:
      return 0;
  }
}

void run_op(const OpContext& ctx, const NodeExecution& e) {
  switch (e.node->op) {
    case OpKind::Copy:
    case OpKind::Dequantize:
      return run_copy(ctx, e);
    case OpKind::GetRows:
      return run_get_rows(ctx, e);
    case OpKind::MatMul:
      return run_matmul(ctx, e);
    case OpKind::QuantizedMatMul:
      return run_quantized_matmul(ctx, e);
    case OpKind::Add:
    case OpKind::Mul:
      return run_binary(ctx, e);
    case OpKind::Scale:
    case OpKind::Silu:
    case OpKind::Gelu:
      return run_unary(ctx, e);
    case OpKind::SwiGlu:
      return run_swiglu(ctx, e);
    case OpKind::Softmax:
      return run_softmax(ctx, e);
    case OpKind::RmsNorm:
    case OpKind::LayerNorm:
      return run_norm(ctx, e);
    case OpKind::Rope:
      return run_rope(ctx, e);
    case OpKind::Attention:
      return run_attention(ctx, e);
    case OpKind::KvWrite:
      return run_kv_write(ctx, e);
    default:
      throw_error(ErrorCode::Unsupported, ctx.state->id + " " + std::string(op_name(e.node->op)),
                  "op is not executable on a backend");
  }
}

}  // namespace tandem::cuda
