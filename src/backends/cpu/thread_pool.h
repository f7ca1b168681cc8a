// A persistent pool of worker threads. run(fn) calls fn(t) for every t in [0, size()), t = 0
// on the calling thread, and returns when all are done. Workers spin briefly between jobs
// (decode issues many small ops back to back), then sleep on a condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::cpu {

class ThreadPool {
 public:
  // threads >= 1 (the caller counts as one); spin_us: how long idle workers poll.
  explicit ThreadPool(int threads, int spin_us = kDefaultSpinUs);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Runs fn(t) on every thread t; rethrows the first exception a task threw. A call from
  // inside a task, or concurrent calls from several threads, are serialized safely.
  void run(const std::function<void(int)>& fn);

  // Splits [0, n) into size() contiguous ranges aligned to `grain` and calls
  // fn(begin, end) for each non-empty one.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  static constexpr int kDefaultSpinUs = 200;

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  const int spin_us_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;      // guards sleeping and the generation handoff
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* job_ = nullptr;  // published by generation_ (release)
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace tandem::cpu
