// The pool runs every part exactly once, survives exceptions, nesting, concurrent callers and
// sleeping workers.
#include <gtest/gtest.h>

#include <atomic>
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

TEST(ThreadPool, RejectsZeroThreads) {
  EXPECT_THROW(ThreadPool(0), Error);
}

}  // namespace
}  // namespace tandem::cpu
