// The CUDA op launchers: each takes the op context and one node, checks every call and
// enqueues its kernels on the context's stream (never synchronizes).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "cuda_check.h"
#include "tandem/backend.h"
#include "tandem/bytes.h"
#include "tandem/kernel_table.h"

namespace tandem::cuda {

// Device-side error codes raised by kernels for bad data the host cannot see (ids, positions).
enum DeviceErrorCode : int32_t {
  kDeviceOk = 0,
  kRowIdOutOfRange = 1,
  kPositionOutOfRange = 2,
  kExpertIdOutOfRange = 3,
};

struct OpContext {
  DeviceState* state = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  int sm_count = 1;
  size_t smem_optin = 0;    // shared memory per block a kernel may opt in to
  size_t smem_pair = 0;     // ... when two blocks are to share an SM
  void* scratch = nullptr;  // op-private memory, sized by scratch_bytes() before the op runs
  size_t scratch_bytes = 0;
  const std::vector<std::string>* features = nullptr;  // the device's, for the kernel rows
  int32_t* error_flag = nullptr;  // device-visible word, checked at synchronize()
  uint32_t* counters = nullptr;   // zeroed counters for split reductions; kernels re-zero them
  size_t counter_count = 0;

  void check(cudaError_t err, const char* op, const char* call) const {
    check_cuda(*state, err, op, call);
  }
  void check_launch(const char* op) const { check(cudaGetLastError(), op, "kernel launch"); }
  void check_blas(cublasStatus_t s, const char* op, const char* call) const {
    check_cublas(*state, s, op, call);
  }
};

// A contiguous f32 tensor (what the fused launches read and write as plain rows).
inline bool contiguous_f32(const TensorRef& t) {
  return t.desc->dtype == DType::F32 && t.desc->is_contiguous();
}

// Buffers carved out of an op's scratch start at this alignment (cuBLAS wants 256 bytes).
inline constexpr size_t kScratchAlignment = 256;

// A CUDA kernel row's functions: the launcher and, where the op needs scratch, its size.
struct Kernel {
  void (*run)(const OpContext& ctx, const NodeExecution& e) = nullptr;
  size_t (*scratch_bytes)(const NodeExecution& e, int sm_count) = nullptr;
};
// The backend's rows: its capability table and its dispatch. Each op family's file
// (ops/<family>.cu) adds the rows of its kernels; ops/dispatch.cpp lists the families.
KernelTable<Kernel>& kernel_table();

// Kernels take rows and grid dims as 32-bit values; element offsets are 64-bit.
inline constexpr int64_t kMaxKernelElements = (int64_t(1) << 31) - 1;
// Adds a row with the size limit every CUDA kernel shares.
inline void add_row(KernelTable<Kernel>& rows, OpKind op, std::vector<DType> dtypes, Kernel kernel,
                    std::string required_feature = {}) {
  rows.add(op, std::move(dtypes), kernel, kMaxKernelElements, std::move(required_feature));
}

// Scratch bytes a node needs (0 for most ops).
size_t op_scratch_bytes(const OpContext& ctx, const NodeExecution& e);
// Runs one compute node through the first row covering it; throws Unsupported where none does.
void run_op(const OpContext& ctx, const NodeExecution& e);

// Whether two tensors' bytes (rows may be strided) share any address.
bool overlap(const TensorRef& a, const TensorRef& b);

// Runs the first nodes of `segment` as one launch where they form a pattern a fused kernel
// covers; returns how many it ran (0: run the first node alone). Each fused kernel writes every
// output its nodes have, with the arithmetic of the separate kernels, so a fusion needs no
// knowledge of the outputs' other readers. The patterns (docs/cuda.md):
enum class Fusion : uint8_t { None, Matvec, All };
// Most nodes one fused launch takes (an Add, its RmsNorm, Q, K and V, the RoPE of Q and K and
// the cache writes of K and V): CudaBackend::fused_nodes().
constexpr size_t kMaxFusedNodes = 9;
size_t run_fused(const OpContext& ctx, std::span<const NodeExecution> segment,
                 Fusion fusion = Fusion::All);
// - matrix-vector products of the same b (Q, K and V; gate and up): one launch, one
//   quantization of b (quantized_matmul.cu);
size_t run_fused_matvecs(const OpContext& ctx, std::span<const NodeExecution> segment);
// - f16/bf16 matrix-vector products of the same b (Q, K and V): one launch; gate and up followed
//   by the SwiGlu of their outputs: one launch that writes all three (matmul.cu);
size_t run_fused_half_matvecs(const OpContext& ctx, std::span<const NodeExecution> segment);
// - a residual Add (or none), the RmsNorm of its sum and up to three one-column products of the
//   norm's output: one launch of the staged kernel, which makes b itself (quantized_matmul.cu);
size_t run_fused_norm_matvecs(const OpContext& ctx, std::span<const NodeExecution> segment);
// - the same for f32/f16/bf16 products: one launch of the streaming kernel, which makes b
//   itself (matmul.cu);
size_t run_fused_norm_half_matvecs(const OpContext& ctx, std::span<const NodeExecution> segment);
// - a residual Add and the RmsNorm of its sum (norm.cu);
size_t run_fused_add_rms_norm(const OpContext& ctx, std::span<const NodeExecution> segment);
// - gate and up ExpertMatMul of one b, one set of ids and one map or none (quantized weights,
//   fewer than 8 tokens) and the SwiGlu of their outputs (expert_matmul.cu);
size_t run_fused_expert_gate_up(const OpContext& ctx, std::span<const NodeExecution> segment);
// - the down ExpertMatMul (quantized weights, fewer than 8 tokens, a map or none) and the
//   MoeCombine of its output (expert_matmul.cu);
size_t run_fused_expert_down_combine(const OpContext& ctx, std::span<const NodeExecution> segment);
// - MoeRoute and the MoeWeights of its ids (moe.cu);
size_t run_fused_moe_route_weights(const OpContext& ctx, std::span<const NodeExecution> segment);
// - RoPE of Q and K and the KV-cache writes of K and V at the same positions, and with them the
//   Attention after the four nodes of one token where the general attention kernel takes all
//   five (rope.cu, attention.cu).
size_t run_fused_rope_kv_write(const OpContext& ctx, std::span<const NodeExecution> segment);
// ExpertMatMul with quantized weights through the matrix-vector kernels (b quantized to int8
// once; expert_matmul.cu): false where they do not apply (moe.cu's element-wise kernel then
// runs it), and the scratch they need.
bool launch_expert_matvec(const OpContext& ctx, const NodeExecution& e);
size_t expert_matvec_scratch_bytes(const NodeExecution& e);

// ExpertMatMul's optional map (its 4th input, [n_map] i32 on the device): choice id reads a's
// matrix map[id], or none where that is negative. Without one (map nullptr) it reads matrix id.
struct ExpertMap {
  const int32_t* map = nullptr;
  int64_t n_map = 0;
};
inline ExpertMap expert_map_of(const NodeExecution& e) {
  if (e.inputs.size() < 4) return {};
  return {static_cast<const int32_t*>(e.inputs[3].data), e.inputs[3].desc->ne[0]};
}
#ifdef __CUDACC__
// Which of a's n_expert matrices choice id reads: its index; kSkippedExpert where the map has
// none (the output column is zeros, not an error); kBadExpert where id or its map entry is out
// of range (zeros, and the kernel raises kExpertIdOutOfRange).
inline constexpr int32_t kSkippedExpert = -1, kBadExpert = -2;
__device__ __forceinline__ int32_t expert_of(int32_t id, ExpertMap m, int64_t n_expert) {
  if (m.map) {
    if (id < 0 || id >= m.n_map) return kBadExpert;
    id = m.map[id];
    if (id < 0) return kSkippedExpert;
  }
  return id >= 0 && id < n_expert ? id : kBadExpert;
}
#endif

// Largest batch (columns of b) served by the matrix-vector kernels.
inline constexpr int64_t kMatvecMaxColumns = 8;

// Device-side conversions used by several ops (copy.cu): a contiguous tensor of `dtype` to f16
// or bf16 (for cuBLAS) and quantized weights to f16.
void convert_to_half(const OpContext& ctx, DType src_dtype, const void* src, void* dst, int64_t n,
                     bool bf16, const char* op);

// Launches a kernel that traps: poisons the context (device-lost tests only).
void launch_trap_kernel(cudaStream_t stream);

}  // namespace tandem::cuda
