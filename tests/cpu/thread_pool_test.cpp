// The pool runs every part exactly once, survives exceptions, nesting, concurrent callers and
// sleeping workers; with more threads than CPUs it hands every job over without polling, and a
// caller waiting for a busy worker sleeps instead of holding its CPU.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tandem/error.h"
#include "thread_pool.h"

namespace tandem::cpu {
namespace {

TEST(ThreadPool, RunCallsEveryIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.size(), threads);
    std::vector<std::atomic<int>> hits(static_cast<size_t>(threads));
    for (int round = 0; round < 200; ++round) pool.run([&](int t) { hits[size_t(t)]++; });
    for (auto& h : hits) EXPECT_EQ(h.load(), 200);
  }
}

TEST(ThreadPool, ParallelForCoversRangeExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 3, 4, 5, 17, 1000, 4099}) {
    for (int64_t grain : {1, 4, 64}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
        EXPECT_LT(b, e);
        EXPECT_TRUE(b % grain == 0) << "begin " << b << " not aligned to " << grain;
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << n << " " << i;
    }
  }
}

TEST(ThreadPool, ParallelChunksCoverRangeExactlyOnce) {
  for (int threads : {1, 2, 5})
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(64), int64_t(1000)})
      for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(64), int64_t(5000)}) {
        ThreadPool pool(threads);
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_chunks(n, chunk, [&](int64_t b, int64_t e) {
          EXPECT_LT(b, e);
          for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << i;
      }
}

TEST(ThreadPool, ExceptionFromWorkerReachesCaller) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.run([](int t) {
    if (t == 2) throw std::runtime_error("boom");
  }),
               std::runtime_error);
  EXPECT_THROW(pool.run([](int t) {
    if (t == 0) throw std::runtime_error("caller");
  }),
               std::runtime_error);
  std::atomic<int> count{0};
  pool.run([&](int) { count++; });  // still usable afterwards
  EXPECT_EQ(count.load(), 3);
}

TEST(ThreadPool, NestedRunExecutesInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.run([&](int) { pool.run([&](int) { inner++; }); });
  EXPECT_EQ(inner.load(), 4);
}

TEST(ThreadPool, ConcurrentCallersAreSerialized) {
  ThreadPool pool(3);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 100; ++i) pool.run([&](int) { total++; });
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 3 * 100 * 3);
}

TEST(ThreadPool, WorkersWakeFromSleep) {
  ThreadPool pool(3, /*spin_us=*/0);  // workers go to sleep at once
  std::atomic<int> total{0};
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    pool.run([&](int) { total++; });
  }
  EXPECT_EQ(total.load(), 150);
}

// Many tiny jobs back to back exercise the handoff: a lost wake-up hangs, a skipped or repeated
// generation miscounts.
void expect_every_index_once(ThreadPool& pool, int rounds) {
  const int64_t n = 3 * pool.size() + 1;
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  for (int round = 0; round < rounds; ++round) {
    pool.parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[size_t(i)]++;
    });
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), rounds) << "index " << i;
}

TEST(ThreadPool, TinyJobsWithMoreThreadsThanCpusRunEveryIndexOnce) {
  const int threads = 2 * usable_cpu_count() + 1;
  for (int spin_us : {0, ThreadPool::kDefaultSpinUs}) {
    ThreadPool pool(threads, spin_us);
    EXPECT_EQ(pool.spin_us(), 0) << "an oversubscribed pool must not poll";
    expect_every_index_once(pool, 3000);
  }
}

// Restricts the calling thread (and the threads it creates) to one CPU for its lifetime.
class PinnedToOneCpu {
 public:
  PinnedToOneCpu() {
    ok_ = sched_getaffinity(0, sizeof saved_, &saved_) == 0;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    ok_ = ok_ && sched_setaffinity(0, sizeof one, &one) == 0;
  }
  ~PinnedToOneCpu() {
    if (ok_) sched_setaffinity(0, sizeof saved_, &saved_);
  }
  bool ok() const { return ok_; }

 private:
  cpu_set_t saved_;
  bool ok_ = false;
};

TEST(ThreadPool, ThreadsSharingOneCpuDoNotPoll) {
  PinnedToOneCpu pin;
  if (!pin.ok()) GTEST_SKIP() << "cannot set the CPU affinity here";
  ASSERT_EQ(usable_cpu_count(), 1);
  // Polling for a second would hold the only CPU away from the threads that the poller waits
  // for; the pool must hand every job over by sleeping and waking instead.
  ThreadPool pool(4, /*spin_us=*/1'000'000);
  EXPECT_EQ(pool.spin_us(), 0);
  expect_every_index_once(pool, 500);
  ThreadPool single(1, /*spin_us=*/1'000'000);
  EXPECT_EQ(single.spin_us(), 1'000'000) << "a pool that fits its CPUs keeps its polling";
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

TEST(ThreadPool, CallerSleepsWhileWaitingForABusyWorker) {
  // A caller that polls or yields in a loop until the workers finish burns the CPU those
  // workers need on a busy machine; it must poll for at most spin_us and then sleep.
  ThreadPool pool(2, ThreadPool::kDefaultSpinUs);
  constexpr auto kWorkerBusy = std::chrono::milliseconds(200);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> started{0};
  const double cpu0 = thread_cpu_seconds();
  pool.run([&](int) {
    // Both parts start before either ends, so one runs on the worker, which stays busy.
    started++;
    while (started.load() < 2) std::this_thread::yield();
    if (std::this_thread::get_id() != caller) std::this_thread::sleep_for(kWorkerBusy);
  });
  const double caller_cpu_s = thread_cpu_seconds() - cpu0;
  EXPECT_LT(caller_cpu_s, 0.25 * std::chrono::duration<double>(kWorkerBusy).count())
      << "the caller held its CPU while it waited";
}

// A signal handler that keeps its thread away from the pool until released, as the scheduler
// does to a descheduled worker on a busy machine.
std::atomic<bool> g_hold{false};
std::atomic<int> g_held{0};
void hold_thread(int) {
  g_held++;
  while (g_hold.load()) {
    timespec ts{0, 100'000};
    nanosleep(&ts, nullptr);
  }
  g_held--;
}

template <typename Pred>
bool wait_for(Pred pred, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(ThreadPool, JobsCompleteWhileAWorkerIsNotRunning) {
  // A job that needs every worker to take part waits, on a busy machine, for the scheduler to
  // run each one; the caller must run the parts that no running thread has claimed.
  ThreadPool pool(3, /*spin_us=*/0);
  const pthread_t caller = pthread_self();
  std::mutex mutex;
  std::vector<pthread_t> workers;
  ASSERT_TRUE(wait_for(
      [&] {
        pool.run([&](int) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          std::lock_guard<std::mutex> lock(mutex);
          if (pthread_equal(pthread_self(), caller)) return;
          for (pthread_t w : workers) {
            if (pthread_equal(w, pthread_self())) return;
          }
          workers.push_back(pthread_self());
        });
        return workers.size() == 2;
      },
      std::chrono::seconds(10)))
      << "the workers never ran a part";

  struct sigaction action {};
  action.sa_handler = hold_thread;
  sigemptyset(&action.sa_mask);
  struct sigaction previous {};
  ASSERT_EQ(sigaction(SIGUSR1, &action, &previous), 0);
  g_hold = true;
  ASSERT_EQ(pthread_kill(workers[0], SIGUSR1), 0);
  ASSERT_TRUE(wait_for([] { return g_held.load() == 1; }, std::chrono::seconds(10)));

  std::atomic<bool> done{false};
  std::thread jobs([&] {
    expect_every_index_once(pool, 1000);
    done = true;
  });
  const bool finished_while_held = wait_for([&] { return done.load(); }, std::chrono::seconds(10));
  g_hold = false;  // release the worker either way, so that a failure ends instead of hanging
  jobs.join();
  EXPECT_TRUE(finished_while_held) << "the jobs waited for a worker that was not running";
  ASSERT_TRUE(wait_for([] { return g_held.load() == 0; }, std::chrono::seconds(10)));
  sigaction(SIGUSR1, &previous, nullptr);
  // The released worker finds its jobs done and joins the next ones.
  expect_every_index_once(pool, 1000);
}

TEST(ThreadPool, RejectsZeroThreads) {
  EXPECT_THROW(ThreadPool(0), Error);
}

}  // namespace
}  // namespace tandem::cpu
