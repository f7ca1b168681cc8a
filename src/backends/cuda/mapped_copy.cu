#include <cstdint>
#include <cstring>

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

struct InlineBytes {
  uint8_t b[kInlineBytes];
};

__global__ void inline_kernel(uint8_t* dst, const InlineBytes src, int n) {
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) dst[i] = src.b[i];
}

// One block per (chunk, expert): the block copies its chunk where the expert is named in ids
// and not copied yet (every thread of a block takes the same path).
constexpr size_t kExpertChunk = size_t(64) << 10;

template <bool kVec>
__global__ void routed_experts_kernel(uint8_t* dst, const uint8_t* src, size_t expert_bytes,
                                      const int32_t* ids, size_t n_ids, const uint8_t* used) {
  const int e = int(blockIdx.y);
  const size_t begin = blockIdx.x * kExpertChunk;
  __shared__ int copied;
  if (threadIdx.x == 0) copied = used[e];
  __syncthreads();
  if (copied != 0 || begin >= expert_bytes) return;
  int named = 0;
  for (size_t i = threadIdx.x; i < n_ids && !named; i += blockDim.x) named = ids[i] == e;
  if (!__syncthreads_or(named)) return;
  const size_t end = begin + kExpertChunk < expert_bytes ? begin + kExpertChunk : expert_bytes;
  const size_t base = size_t(e) * expert_bytes;
  if constexpr (kVec) {
    auto* d = reinterpret_cast<uint4*>(dst + base + begin);
    const auto* s = reinterpret_cast<const uint4*>(src + base + begin);
    const size_t n = (end - begin) / 16;
    // Four loads in flight per thread before their stores: the bus's latency is long.
    size_t i = threadIdx.x;
    for (; i + 3 * blockDim.x < n; i += 4 * size_t(blockDim.x)) {
      const uint4 a = s[i], b = s[i + blockDim.x], c = s[i + 2 * blockDim.x],
                  f = s[i + 3 * blockDim.x];
      d[i] = a;
      d[i + blockDim.x] = b;
      d[i + 2 * blockDim.x] = c;
      d[i + 3 * blockDim.x] = f;
    }
    for (; i < n; i += blockDim.x) d[i] = s[i];
  } else {
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) dst[base + i] = src[base + i];
  }
}

__global__ void routed_experts_mark_kernel(int n_expert, const int32_t* ids, size_t n_ids,
                                           uint8_t* used) {
  __shared__ uint8_t named[kMaxRoutedExperts];
  for (int e = int(threadIdx.x); e < n_expert; e += int(blockDim.x)) named[e] = 0;
  __syncthreads();
  for (size_t i = threadIdx.x; i < n_ids; i += blockDim.x) {
    const int32_t e = ids[i];
    if (e >= 0 && e < n_expert) named[e] = 1;
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < n_expert; e += int(blockDim.x)) {
    used[e] = named[e] ? (used[e] != 0 ? 1 : 2) : 0;
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

cudaError_t copy_routed_experts_from_mapped_host(void* dst, const void* src, size_t expert_bytes,
                                                 int n_expert, const int32_t* ids, size_t n_ids,
                                                 uint8_t* used, int /*sm_count*/,
                                                 cudaStream_t stream) {
  if (n_expert <= 0 || n_expert > kMaxRoutedExperts) return cudaErrorInvalidValue;
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (expert_bytes > 0 && n_ids > 0) {
    const dim3 grid(unsigned((expert_bytes + kExpertChunk - 1) / kExpertChunk), unsigned(n_expert));
    const bool vec =
        ((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s) | expert_bytes) & 15) ==
        0;
    if (vec) {
      routed_experts_kernel<true>
          <<<grid, kThreads, 0, stream>>>(d, s, expert_bytes, ids, n_ids, used);
    } else {
      routed_experts_kernel<false>
          <<<grid, kThreads, 0, stream>>>(d, s, expert_bytes, ids, n_ids, used);
    }
  }
  routed_experts_mark_kernel<<<1, 1024, 0, stream>>>(n_expert, ids, n_ids, used);
  return cudaGetLastError();
}

cudaError_t copy_inline(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (bytes > kInlineBytes) return cudaErrorInvalidValue;
  InlineBytes in{};
  std::memcpy(in.b, src, bytes);
  inline_kernel<<<1, 64, 0, stream>>>(static_cast<uint8_t*>(dst), in, int(bytes));
  return cudaGetLastError();
}

}  // namespace tandem::cuda
