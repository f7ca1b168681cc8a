#include <cstdint>

#include "mapped_copy.h"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;

// 16 bytes per load where both sides are aligned to 16 (arena slots and staging buffers are).
__global__ void copy16_kernel(uint4* dst, const uint4* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

__global__ void copy1_kernel(uint8_t* dst, const uint8_t* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

int blocks_for(size_t n, int sm_count) {
  // Enough loads in flight to cover the bus's latency; more blocks only queue.
  const size_t want = (n + kThreads - 1) / kThreads;
  const size_t cap = size_t(sm_count > 0 ? sm_count : 1) * 4;
  return int(want < cap ? want : cap);
}

}  // namespace

cudaError_t copy_from_mapped_host(void* dst, const void* src, size_t bytes, int sm_count,
                                  cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t done = 0;
  if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) & 15) == 0) {
    const size_t n16 = bytes / 16;
    if (n16 > 0) {
      copy16_kernel<<<blocks_for(n16, sm_count), kThreads, 0, stream>>>(
          reinterpret_cast<uint4*>(d), reinterpret_cast<const uint4*>(s), n16);
      done = n16 * 16;
    }
  }
  if (done < bytes) {
    const size_t rest = bytes - done;
    copy1_kernel<<<blocks_for(rest, sm_count), kThreads, 0, stream>>>(d + done, s + done, rest);
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda
