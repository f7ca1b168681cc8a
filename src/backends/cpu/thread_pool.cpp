#include "thread_pool.h"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "tandem/error.h"

namespace tandem::cpu {

namespace {

thread_local const ThreadPool* tls_running_pool = nullptr;  // set while a part runs

using Clock = std::chrono::steady_clock;
// Polls between yields: a pause is ~10-100 cycles, a yield a system call.
constexpr int kPollsPerYield = 16;

uint32_t generation_of(uint64_t claims) {
  return uint32_t(claims >> 32);
}
uint32_t next_part_of(uint64_t claims) {
  return uint32_t(claims);
}

// Polls done() for up to spin_us; true once it holds. Between bursts of polls the thread yields,
// so that a thread it waits for on the same CPU runs now rather than when the poller is
// preempted.
template <typename Done>
bool poll_until(int spin_us, Done done) {
  if (done()) return true;
  if (spin_us <= 0) return false;
  const auto deadline = Clock::now() + std::chrono::microseconds(spin_us);
  for (int polls = 1;; ++polls) {
    if (done()) return true;
    if (polls % kPollsPerYield != 0) {
      _mm_pause();
      continue;
    }
    if (Clock::now() >= deadline) return done();
    std::this_thread::yield();
  }
}

}  // namespace

int usable_cpu_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, int(std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int threads, int spin_us)
    : spin_us_(threads > usable_cpu_count() ? 0 : std::max(0, spin_us)) {
  TANDEM_CHECK_ARG(threads >= 1, "cpu thread_pool",
                   "thread count must be >= 1 (got " + std::to_string(threads) + ")");
  workers_.reserve(size_t(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true, std::memory_order_release);
  }
  job_ready_.notify_all();
  for (auto& w : workers_) w.join();
}

bool ThreadPool::claim(uint32_t generation, int* part) {
  uint64_t claims = claims_.load(std::memory_order_acquire);
  while (generation_of(claims) == generation && next_part_of(claims) < uint32_t(size())) {
    if (claims_.compare_exchange_weak(claims, claims + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      *part = int(next_part_of(claims));
      return true;
    }
  }
  return false;
}

void ThreadPool::run_part(int part) {
  tls_running_pool = this;
  try {
    (*job_)(part);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
  tls_running_pool = nullptr;
  if (parts_done_.fetch_add(1, std::memory_order_acq_rel) + 1 == size()) {
    // The caller checks parts_done_ under mutex_ before it sleeps: taking the mutex here means
    // it is either not yet checking (and will see the count) or already waiting (and is woken).
    { std::lock_guard<std::mutex> lock(mutex_); }
    job_done_.notify_one();
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  auto job_published = [&] {
    return generation_of(claims_.load(std::memory_order_acquire)) != seen ||
           stop_.load(std::memory_order_acquire);
  };
  for (;;) {
    if (!poll_until(spin_us_, job_published)) {
      std::unique_lock<std::mutex> lock(mutex_);
      job_ready_.wait(lock, job_published);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // A worker that woke late may find the job done, or a newer one; it only runs parts it
    // claims, and claims only parts of the job it read.
    seen = generation_of(claims_.load(std::memory_order_acquire));
    int part = 0;
    while (claim(seen, &part)) run_part(part);
  }
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  if (workers_.empty() || tls_running_pool == this) {
    // Single thread, or a nested call from inside a part: run every part here.
    for (int t = 0; t < size(); ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  job_ = &fn;
  parts_done_.store(0, std::memory_order_relaxed);
  const uint32_t generation = ++generation_;
  {
    std::lock_guard<std::mutex> lock(mutex_);  // pairs with the predicate check of sleepers
    claims_.store(uint64_t(generation) << 32, std::memory_order_release);
  }
  job_ready_.notify_all();
  int part = 0;
  while (claim(generation, &part)) run_part(part);
  auto all_done = [&] { return parts_done_.load(std::memory_order_acquire) == size(); };
  if (!poll_until(spin_us_, all_done)) {
    std::unique_lock<std::mutex> lock(mutex_);
    job_done_.wait(lock, all_done);
  }
  job_ = nullptr;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
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
