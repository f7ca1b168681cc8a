#include "allocator.h"

#include <bit>
#include <string>

#include "tandem/bytes.h"
#include "tandem/error.h"

namespace tandem::cuda {

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
  // Buffers still alive belong to their owners; the backend outlives them by contract.
}

size_t CachingAllocator::size_class(size_t bytes) {
  constexpr size_t kMin = 512;
  if (bytes <= kMin) return kMin;
  const size_t top = std::bit_floor(bytes);
  if (top < 4 * kMin) return align_up(bytes, kMin);
  const size_t step = top / 4;
  return align_up(bytes, step);
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t cls = size_class(bytes);
  std::lock_guard lock(mutex_);
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= cls;
    live_[p] = cls;
    live_bytes_ += cls;
    return p;
  }
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, cls);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    release_cached_locked();  // the cache may hold what we need, in other size classes
    err = cudaMalloc(&p, cls);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    throw_error(ErrorCode::OutOfMemory, state_.id + " allocate",
                "out of memory (need " + format_bytes(bytes) + ", free " +
                    format_bytes(free_bytes) + " of " + format_bytes(total_bytes) + ")");
  }
  check_cuda(state_, err, "allocate", "cudaMalloc");
  live_[p] = cls;
  live_bytes_ += cls;
  return p;
}

void CachingAllocator::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours; ignoring beats corrupting the cache
  const size_t cls = it->second;
  live_.erase(it);
  live_bytes_ -= cls;
  free_[cls].push_back(ptr);
  cached_bytes_ += cls;
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  // Cached blocks may still be read by queued work: wait for the device before freeing.
  if (cached_bytes_ > 0 && !state_.lost) (void)cudaDeviceSynchronize();
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) (void)cudaFree(p);
  }
  free_.clear();
  cached_bytes_ = 0;
}

size_t CachingAllocator::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return cached_bytes_;
}

size_t CachingAllocator::live_bytes() const {
  std::lock_guard lock(mutex_);
  return live_bytes_;
}

}  // namespace tandem::cuda
