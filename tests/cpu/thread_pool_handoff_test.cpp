// The pool's wake-up protocol, step by step: a stand-in for the futex holds a thread that comes to
// sleep at a chosen point, so each test forces one interleaving of a sleeper and its waker and
// then checks that no thread sleeps through the event it waits for. Nothing here depends on how
// fast the machine is: a wait on another thread gives up only after kStuck, and only to turn a
// hang into a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "thread_pool.h"

namespace tandem::cpu {
namespace {

using Waiter = Parking::Waiter;
constexpr auto kStuck = std::chrono::seconds(60);

// Sleeps and wakes like a futex, recorded. A thread that comes to sleep as `who` can be held at
// the door: after it decided to sleep, before its word is compared. A sleeper whose word no
// longer holds the value it slept on, and that no wake reached, has lost its wake-up.
class RecordingParking final : public Parking {
 public:
  void wait(std::atomic<uint32_t>& word, uint32_t expected, Waiter who) override {
    std::unique_lock lock(mutex_);
    Door& door = doors_[index(who)];
    ++door.arrivals;
    changed_.notify_all();
    changed_.wait(lock, [&] { return !door.held; });
    if (word.load(std::memory_order_seq_cst) != expected) return;  // the futex's own check
    Sleeper me{&word, expected, who};
    sleepers_.push_back(&me);
    changed_.notify_all();
    changed_.wait(lock, [&] { return me.woken; });
    std::erase(sleepers_, &me);
  }

  void wake_all(std::atomic<uint32_t>& word) override {
    std::lock_guard lock(mutex_);
    for (Sleeper* s : sleepers_) s->woken = s->woken || s->word == &word;
    changed_.notify_all();
  }

  void hold(Waiter who) { set_held(who, true); }
  void release(Waiter who) { set_held(who, false); }

  // Waits until `count` threads in all have come to sleep as `who`; false if they never do.
  bool await_arrivals(Waiter who, int count) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, kStuck, [&] { return doors_[index(who)].arrivals >= count; });
  }
  // Waits until `count` threads are asleep as `who`; false if they never are.
  bool await_sleepers(Waiter who, int count) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, kStuck, [&] {
      return std::count_if(sleepers_.begin(), sleepers_.end(),
                           [&](const Sleeper* s) { return s->who == who && !s->woken; }) >= count;
    });
  }

  int lost_wakeups() {
    std::lock_guard lock(mutex_);
    return int(std::count_if(sleepers_.begin(), sleepers_.end(), [](const Sleeper* s) {
      return !s->woken && s->word->load(std::memory_order_seq_cst) != s->expected;
    }));
  }

  // Ends a failed test instead of leaving its threads asleep for good.
  void wake_everyone() {
    std::lock_guard lock(mutex_);
    for (Door& door : doors_) door.held = false;
    for (Sleeper* s : sleepers_) s->woken = true;
    changed_.notify_all();
  }

 private:
  struct Door {
    bool held = false;
    int arrivals = 0;
  };
  struct Sleeper {
    std::atomic<uint32_t>* word;
    uint32_t expected;
    Waiter who;
    bool woken = false;
  };
  static size_t index(Waiter who) { return who == Waiter::Worker ? 0 : 1; }
  void set_held(Waiter who, bool held) {
    std::lock_guard lock(mutex_);
    doors_[index(who)].held = held;
    changed_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  Door doors_[2];
  std::vector<Sleeper*> sleepers_;
};

// A flag one thread sets and another waits for (false if it never comes).
class Latch {
 public:
  void set() {
    std::lock_guard lock(mutex_);
    set_ = true;
    changed_.notify_all();
  }
  bool wait() {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, kStuck, [&] { return set_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool set_ = false;
};

// One job on a two-thread pool in which the caller's part and the worker's part overlap: the
// caller's waits until the worker's has started, and the worker's ends only after
// `worker_part_end()` returns (while the caller is about to wait for it).
void run_overlapping_job(ThreadPool& pool, const std::function<void()>& worker_part_end,
                         std::atomic<int>& parts_run) {
  const std::thread::id caller = std::this_thread::get_id();
  Latch worker_started;
  pool.run([&](int) {
    parts_run++;
    if (std::this_thread::get_id() == caller) {
      EXPECT_TRUE(worker_started.wait()) << "the worker never took a part";
      return;
    }
    worker_started.set();
    worker_part_end();
  });
}

TEST(ThreadPool, HandoffWakesAWorkerAsleepWhenAJobIsPublished) {
  RecordingParking parking;
  ThreadPool pool(2, /*spin_us=*/0, parking);
  ASSERT_TRUE(parking.await_sleepers(Waiter::Worker, 1));
  std::atomic<int> parts{0};
  pool.run([&](int) { parts++; });
  EXPECT_EQ(parts.load(), 2);
  // run() published the job and woke the workers before it returned.
  EXPECT_EQ(parking.lost_wakeups(), 0) << "the worker slept through the job";
  parking.wake_everyone();
}

TEST(ThreadPool, HandoffWorkerGoingToSleepAsAJobIsPublishedDoesNotSleepThroughIt) {
  RecordingParking parking;
  parking.hold(Waiter::Worker);
  ThreadPool pool(2, /*spin_us=*/0, parking);
  // The worker has seen no job and decided to sleep; the job is published before it sleeps.
  ASSERT_TRUE(parking.await_arrivals(Waiter::Worker, 1));
  std::atomic<int> parts{0};
  const std::thread::id caller = std::this_thread::get_id();
  pool.run([&](int) {
    EXPECT_EQ(std::this_thread::get_id(), caller) << "the held worker ran a part";
    parts++;
  });
  EXPECT_EQ(parts.load(), 2) << "a job waits for no worker that is not running";
  parking.release(Waiter::Worker);
  // It must find the job published (and done), and come back to sleep on the new generation.
  EXPECT_TRUE(parking.await_arrivals(Waiter::Worker, 2)) << "the worker slept through the job";
  EXPECT_EQ(parking.lost_wakeups(), 0);
  parking.wake_everyone();
}

TEST(ThreadPool, HandoffWakesTheCallerAsleepWhenTheLastPartEnds) {
  RecordingParking parking;
  ThreadPool pool(2, /*spin_us=*/0, parking);
  ASSERT_TRUE(parking.await_sleepers(Waiter::Worker, 1));
  std::atomic<int> parts{0};
  std::atomic<bool> done{false};
  std::thread runner([&] {
    run_overlapping_job(
        pool, [&] { EXPECT_TRUE(parking.await_sleepers(Waiter::Caller, 1)); }, parts);
    done = true;
  });
  // The worker ends its part with the caller asleep, then comes back to wait for a job.
  EXPECT_TRUE(parking.await_arrivals(Waiter::Worker, 2));
  EXPECT_EQ(parking.lost_wakeups(), 0) << "the caller slept through the last part's end";
  parking.wake_everyone();
  runner.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(parts.load(), 2);
}

TEST(ThreadPool, HandoffCallerGoingToSleepAsTheLastPartEndsDoesNotSleepThroughIt) {
  RecordingParking parking;
  parking.hold(Waiter::Caller);
  ThreadPool pool(2, /*spin_us=*/0, parking);
  ASSERT_TRUE(parking.await_sleepers(Waiter::Worker, 1));
  std::atomic<int> parts{0};
  Latch finished;
  std::thread runner([&] {
    // The worker's part ends once the caller has decided to sleep, before it sleeps.
    run_overlapping_job(
        pool, [&] { EXPECT_TRUE(parking.await_arrivals(Waiter::Caller, 1)); }, parts);
    finished.set();
  });
  EXPECT_TRUE(parking.await_arrivals(Waiter::Worker, 2));
  parking.release(Waiter::Caller);
  const bool returned = finished.wait();
  EXPECT_TRUE(returned) << "the caller slept through the last part's end";
  EXPECT_EQ(parking.lost_wakeups(), 0);
  parking.wake_everyone();
  runner.join();
  EXPECT_EQ(parts.load(), 2);
}

TEST(ThreadPool, HandoffStopWakesEveryWorker) {
  RecordingParking parking;
  auto pool = std::make_unique<ThreadPool>(4, /*spin_us=*/0, parking);
  ASSERT_TRUE(parking.await_sleepers(Waiter::Worker, 3));
  Latch destroyed;
  std::thread destroyer([&] {
    pool.reset();  // joins the workers
    destroyed.set();
  });
  const bool joined = destroyed.wait();
  EXPECT_TRUE(joined) << "a worker slept through the pool's stop";
  if (!joined) parking.wake_everyone();
  destroyer.join();
}

// A futex may return without a wake (a signal, or the word changed and changed back); a pool
// whose every sleep returns at once must still run each part exactly once per job.
class SpuriousParking final : public Parking {
 public:
  void wait(std::atomic<uint32_t>&, uint32_t, Waiter) override {}
  void wake_all(std::atomic<uint32_t>&) override {}
};

TEST(ThreadPool, HandoffSurvivesSpuriousWakeUps) {
  SpuriousParking parking;
  ThreadPool pool(3, /*spin_us=*/0, parking);
  constexpr int kRounds = 500;
  const int64_t n = 3 * pool.size() + 1;
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  for (int round = 0; round < kRounds; ++round) {
    pool.parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[size_t(i)]++;
    });
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), kRounds) << "index " << i;
}

}  // namespace
}  // namespace tandem::cpu
