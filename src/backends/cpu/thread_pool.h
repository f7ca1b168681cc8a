// A persistent pool of worker threads. run(fn) calls fn(t) once for every part t in
// [0, size()) and returns when all are done. Parts are claimed, not assigned: the caller runs
// every part that no worker has taken, so a job never waits for a worker that is not running
// (descheduled on a busy or oversubscribed machine), only for parts already in progress.
// Waiting threads poll briefly, yielding between polls, then sleep on a futex; a pool with more
// threads than the CPUs it may run on does not poll.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::cpu {

// CPUs this thread may run on (its affinity mask), at least 1.
int usable_cpu_count();

// How a waiting thread of the pool sleeps and is woken: a futex by default. Tests substitute one
// that records every sleep and wake, to check the handoff in chosen interleavings, without timing.
class Parking {
 public:
  // A worker waits for the next job; the caller waits for the parts in progress.
  enum class Waiter { Worker, Caller };
  virtual ~Parking() = default;
  // Sleeps while word == expected, compared atomically with going to sleep; may return early.
  virtual void wait(std::atomic<uint32_t>& word, uint32_t expected, Waiter who) = 0;
  // Wakes every thread sleeping on word.
  virtual void wake_all(std::atomic<uint32_t>& word) = 0;
};

// The futex parking, shared by every pool.
Parking& futex_parking();

class ThreadPool {
 public:
  // threads >= 1 (the caller counts as one); spin_us: how long a waiting thread polls before
  // it sleeps (0 when threads exceed usable_cpu_count()); parking: how it sleeps.
  explicit ThreadPool(int threads, int spin_us = kDefaultSpinUs,
                      Parking& parking = futex_parking());
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  int spin_us() const { return spin_us_; }
  // Runs fn(t) once for every part t, each on some thread of the pool (the caller included);
  // rethrows the first exception a part threw. A call from inside a part, or concurrent calls
  // from several threads, are serialized safely.
  void run(const std::function<void(int)>& fn);

  // Splits [0, n) into size() contiguous ranges aligned to `grain` and calls
  // fn(begin, end) for each non-empty one.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // Splits [0, n) into chunks of `chunk` that the threads claim one at a time, calling
  // fn(begin, end) for ranges covering [0, n) exactly once: a thread that starts late or runs
  // slower takes fewer chunks, where parallel_for's ranges are fixed per thread.
  void parallel_chunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn);

  static constexpr int kDefaultSpinUs = 200;

 private:
  void worker_loop();
  // Claims the next unrun part if job `generation` still has one; false otherwise. The part
  // claimed may be a newer job's, published since (then it is that job's to run).
  bool claim(uint32_t generation, int* part);
  void run_part(int part);

  std::vector<std::thread> workers_;
  const int spin_us_;
  Parking& parking_;
  std::mutex run_mutex_;  // one job at a time
  // Futex words, so that no lock is shared on the handoff: a worker descheduled at any point
  // (even mid-wait) cannot block the caller. generation_ bumps for every job and for stop.
  std::atomic<uint32_t> generation_{0};
  std::atomic<uint32_t> parts_done_{0};
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
  // The job's generation (high 32 bits) and its next unclaimed part (low 32 bits).
  std::atomic<uint64_t> claims_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* job_ = nullptr;  // published by claims_ (release)
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace tandem::cpu
