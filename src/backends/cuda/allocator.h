// A caching allocator over cudaMalloc: freed blocks are kept by size class and reused, so a
// decode step allocates without touching the driver. Never managed memory.
#pragma once

#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda_check.h"

namespace tandem::cuda {

class CachingAllocator {
 public:
  explicit CachingAllocator(DeviceState& state) : state_(state) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Throws Error{OutOfMemory} "[cuda:N allocate] out of memory (need .., free ..)" when even
  // an empty cache cannot satisfy the request; the process keeps working.
  void* allocate(size_t bytes);
  void free(void* ptr);
  // Returns every cached (unused) block to the driver.
  void release_cached();
  size_t cached_bytes() const;
  size_t live_bytes() const;

  // Size class of a request: 512-byte minimum, then four classes per power of two.
  static size_t size_class(size_t bytes);

 private:
  void release_cached_locked();

  DeviceState& state_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
  std::unordered_map<void*, size_t> live_;               // block -> size class
  size_t cached_bytes_ = 0;
  size_t live_bytes_ = 0;
};

}  // namespace tandem::cuda
