// Copies from page-locked host memory into device memory by a kernel that reads the host memory
// over the bus (zero-copy), on the execution stream. Host-to-device copies on the copy engine
// run one after another in the order issued, whatever their stream: an activation copied there
// would wait behind every streamed weight queued before it. A kernel reading mapped memory
// shares the link but not that queue.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

// dst: device memory; src: page-locked host memory (cudaHostAlloc / cudaMallocHost, which
// kernels may read through the same pointer under unified addressing). Asynchronous on `stream`.
cudaError_t copy_from_mapped_host(void* dst, const void* src, size_t bytes, int sm_count,
                                  cudaStream_t stream);

// Up to kInlineBytes from any host memory into device memory, carried by the launch's own
// parameters: no staging buffer to fill and guard with an event (a decode step's token id and
// position, 4 bytes each). The host may reuse src at once. Asynchronous on `stream`.
inline constexpr size_t kInlineBytes = 256;
cudaError_t copy_inline(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// The experts of a stacked expert tensor (n_expert of expert_bytes each; src page-locked host
// memory) that `ids` (n_ids values in device memory) names and used[e] == 0 marks as not copied
// yet; then sets used[e] to 0 (not named), 1 (named, copied before) or 2 (named, copied here).
// `used`: n_expert bytes the device may write (mapped page-locked host memory). Two launches on
// `stream`; n_expert at most kMaxRoutedExperts.
inline constexpr int kMaxRoutedExperts = 4096;
cudaError_t copy_routed_experts_from_mapped_host(void* dst, const void* src, size_t expert_bytes,
                                                 int n_expert, const int32_t* ids, size_t n_ids,
                                                 uint8_t* used, int sm_count, cudaStream_t stream);

}  // namespace tandem::cuda
