#include "thread_pool.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

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

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
              std::atomic<uint32_t>::is_always_lock_free);

class FutexParking final : public Parking {
 public:
  void wait(std::atomic<uint32_t>& word, uint32_t expected, Waiter) override {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr,
            nullptr, 0);
  }
  void wake_all(std::atomic<uint32_t>& word) override {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
            nullptr, 0);
  }
};

}  // namespace

Parking& futex_parking() {
  static FutexParking parking;
  return parking;
}

int usable_cpu_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, int(std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int threads, int spin_us, Parking& parking)
    : spin_us_(threads > usable_cpu_count() ? 0 : std::max(0, spin_us)), parking_(parking) {
  TANDEM_CHECK_ARG(threads >= 1, "cpu thread_pool",
                   "thread count must be >= 1 (got " + std::to_string(threads) + ")");
  workers_.reserve(size_t(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  parking_.wake_all(generation_);
  for (auto& w : workers_) w.join();
}

bool ThreadPool::claim(uint32_t generation, int* part) {
  const uint64_t seen = claims_.load(std::memory_order_acquire);
  if (generation_of(seen) != generation || next_part_of(seen) >= uint32_t(size())) return false;
  // One fetch_add per claim: a compare-exchange loop retries under contention, and with many
  // threads waking at once the retries cost more than the parts. The increment may land in a
  // newer job than the one read (published meanwhile); the part it takes is then that job's,
  // and running it is right: job_ is that job's (the next cannot start before this part ends).
  const uint64_t claims = claims_.fetch_add(1, std::memory_order_acq_rel);
  if (next_part_of(claims) >= uint32_t(size())) return false;
  *part = int(next_part_of(claims));
  return true;
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
  // Sequentially consistent with the caller's caller_sleeping_ store and parts_done_ load: either
  // the caller sees the last part done, or this sees the caller asleep and wakes it.
  if (parts_done_.fetch_add(1, std::memory_order_seq_cst) + 1 == uint32_t(size()) &&
      caller_sleeping_.load(std::memory_order_seq_cst)) {
    parking_.wake_all(parts_done_);
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  auto job_published = [&] {
    return generation_.load(std::memory_order_acquire) != seen ||
           stop_.load(std::memory_order_acquire);
  };
  for (;;) {
    if (!poll_until(spin_us_, job_published)) {
      // Same pairing as for the caller: the publisher bumps generation_ and then reads
      // sleeping_workers_; the futex rechecks the word, so a bump in between is not lost.
      while (!job_published()) {
        sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
        const uint32_t now = generation_.load(std::memory_order_seq_cst);
        if (now == seen && !stop_.load(std::memory_order_seq_cst))
          parking_.wait(generation_, seen, Parking::Waiter::Worker);
        sleeping_workers_.fetch_sub(1, std::memory_order_seq_cst);
      }
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // A worker that woke late may find the job done, or a newer one; it only runs parts it
    // claims (see claim).
    seen = generation_.load(std::memory_order_acquire);
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
  const uint32_t generation = generation_.load(std::memory_order_relaxed) + 1;
  claims_.store(uint64_t(generation) << 32, std::memory_order_release);
  generation_.store(generation, std::memory_order_seq_cst);
  if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) parking_.wake_all(generation_);
  int part = 0;
  while (claim(generation, &part)) run_part(part);
  const uint32_t parts = uint32_t(size());
  auto all_done = [&] { return parts_done_.load(std::memory_order_acquire) == parts; };
  if (!poll_until(spin_us_, all_done)) {
    for (;;) {
      caller_sleeping_.store(true, std::memory_order_seq_cst);
      const uint32_t done = parts_done_.load(std::memory_order_seq_cst);
      if (done == parts) break;
      parking_.wait(parts_done_, done, Parking::Waiter::Caller);
    }
    caller_sleeping_.store(false, std::memory_order_relaxed);
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

void ThreadPool::parallel_chunks(int64_t n, int64_t chunk,
                                 const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks == 1 || workers_.empty() || tls_running_pool == this) {
    fn(0, n);
    return;
  }
  std::atomic<int64_t> next{0};
  run([&](int) {
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      fn(c * chunk, std::min(n, (c + 1) * chunk));
    }
  });
}

}  // namespace tandem::cpu
