#include "thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "tandem/error.h"

namespace tandem::cpu {

namespace {

thread_local const ThreadPool* tls_running_pool = nullptr;  // set while a task runs

using Clock = std::chrono::steady_clock;
constexpr int kCallerSpinPolls = 1 << 14;

}  // namespace

ThreadPool::ThreadPool(int threads, int spin_us) : spin_us_(std::max(0, spin_us)) {
  TANDEM_CHECK_ARG(threads >= 1, "cpu thread_pool",
                   "thread count must be >= 1 (got " + std::to_string(threads) + ")");
  workers_.reserve(size_t(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    if (gen == seen) {
      const auto spin_until = Clock::now() + std::chrono::microseconds(spin_us_);
      int polls = 0;
      while ((gen = generation_.load(std::memory_order_acquire)) == seen) {
        _mm_pause();
        if (++polls % 64 == 0 && Clock::now() >= spin_until) {
          std::unique_lock<std::mutex> lock(mutex_);
          wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        }
      }
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    tls_running_pool = this;
    try {
      (*job_)(index);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    tls_running_pool = nullptr;
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  if (workers_.empty() || tls_running_pool == this) {
    // Single thread, or a nested call from inside a task: run every part here.
    for (int t = 0; t < size(); ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  job_ = &fn;
  pending_.store(int(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);  // pairs with the predicate check of sleepers
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  std::exception_ptr caller_error;
  tls_running_pool = this;
  try {
    fn(0);
  } catch (...) {
    caller_error = std::current_exception();
  }
  tls_running_pool = nullptr;
  // Workers may be descheduled on a busy machine; stop burning the core after a while.
  for (int polls = 0; pending_.load(std::memory_order_acquire) != 0; ++polls) {
    if (polls < kCallerSpinPolls) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
  std::exception_ptr worker_error;
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    worker_error = std::exchange(error_, nullptr);
  }
  if (caller_error) std::rethrow_exception(caller_error);
  if (worker_error) std::rethrow_exception(worker_error);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  const int parts = int(std::min<int64_t>(size(), units));
  if (parts == 1 || tls_running_pool == this) {
    fn(0, n);
    return;
  }
  run([&](int t) {
    if (t >= parts) return;
    const int64_t begin = units * t / parts * grain;
    const int64_t end = std::min(n, units * (t + 1) / parts * grain);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace tandem::cpu
