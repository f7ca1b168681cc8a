// Copies from page-locked host memory into device memory by a kernel that reads the host memory
// over the bus (zero-copy), on the execution stream. Host-to-device copies on the copy engine
// run one after another in the order issued, whatever their stream: an activation copied there
// would wait behind every streamed weight queued before it. A kernel reading mapped memory
// shares the link but not that queue.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace tandem::cuda {

// dst: device memory; src: page-locked host memory (cudaHostAlloc / cudaMallocHost, which
// kernels may read through the same pointer under unified addressing). Asynchronous on `stream`.
cudaError_t copy_from_mapped_host(void* dst, const void* src, size_t bytes, int sm_count,
                                  cudaStream_t stream);

}  // namespace tandem::cuda
