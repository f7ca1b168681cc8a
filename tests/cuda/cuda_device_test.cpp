// The CUDA backend's device side: discovery, allocator, out-of-memory recovery, copies,
// device-lost marking and CUDA graph capture/replay.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "cuda_check.h"
#include "cuda_test_util.h"
#include "tandem/error.h"
#include "tandem/registry.h"

namespace tandem::test {
namespace {

TEST(CudaDevice, StickyErrorsAreClassifiedWithoutAGpu) {
  // Pure logic: runs everywhere, so CI without a GPU still checks the lost-device rule.
  EXPECT_TRUE(cuda::is_sticky_error(cudaErrorIllegalAddress));
  EXPECT_TRUE(cuda::is_sticky_error(cudaErrorLaunchFailure));
  EXPECT_FALSE(cuda::is_sticky_error(cudaErrorMemoryAllocation));
  EXPECT_FALSE(cuda::is_sticky_error(cudaErrorInvalidValue));
}

TEST(CudaDevice, AllocatorSizeClassesBoundWaste) {
  for (size_t n : {size_t(1), size_t(511), size_t(513), size_t(4097), size_t(1) << 20,
                   (size_t(1) << 30) + 1}) {
    const size_t c = cuda::CachingAllocator::size_class(n);
    EXPECT_GE(c, n);
    EXPECT_LE(c, std::max<size_t>(512, n + n / 4 + 512)) << n;
  }
}

TEST(CudaDevice, DiscoveryReportsIdentityMemoryAndFeatures) {
  TANDEM_REQUIRE_GPU(backend);
  EXPECT_EQ(backend->backend_id(), "cuda:0");
  EXPECT_EQ(backend->kind(), BackendKind::Gpu);
  EXPECT_FALSE(backend->host_accessible());
  EXPECT_FALSE(backend->lost());
  const MemoryInfo mem = backend->memory();
  EXPECT_GT(mem.total_bytes, size_t(1) << 30);
  EXPECT_LE(mem.free_bytes, mem.total_bytes);
  bool has_sm = false;
  for (const auto& f : backend->features()) has_sm |= f.rfind("sm_", 0) == 0;
  EXPECT_TRUE(has_sm);
  const auto ids = available_backend_ids();
  EXPECT_NE(std::find(ids.begin(), ids.end(), "cuda:0"), ids.end());
  EXPECT_EQ(create_backend("cuda:0")->backend_id(), "cuda:0");
  EXPECT_THROW(create_backend("cuda:99"), Error);
}

TEST(CudaDevice, CopiesRoundTripSmallAndLarge) {
  TANDEM_REQUIRE_GPU(backend);
  for (size_t bytes : {size_t(1), size_t(4096) + 3, size_t(9) << 20, size_t(40) << 20}) {
    std::vector<uint8_t> src(bytes), back(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) src[i] = uint8_t((i * 131 + test_seed()) & 0xff);
    Buffer a = backend->allocate(bytes), b = backend->allocate(bytes);
    backend->copy_from_host(a.data(), src.data(), bytes);
    backend->copy_within(b.data(), a.data(), bytes);
    backend->copy_to_host(back.data(), b.data(), bytes);
    EXPECT_EQ(src, back) << bytes << " bytes";
  }
}

TEST(CudaDevice, RoutedExpertsCopyTheNamedExpertsNotCopiedBefore) {
  TANDEM_REQUIRE_GPU(backend);
  // Experts of an odd size (the byte-wise kernel) and of whole 16-byte words over several
  // chunks; as many experts as the largest MoE presets and a small set.
  for (const size_t expert_bytes : {size_t(1000) + 3, size_t(200) << 10}) {
    for (const int n_expert : {8, 128}) {
      SCOPED_TRACE(std::to_string(n_expert) + " experts of " + std::to_string(expert_bytes));
      const size_t bytes = expert_bytes * size_t(n_expert);
      std::vector<uint8_t> src(bytes), back(bytes);
      for (size_t i = 0; i < bytes; ++i) src[i] = uint8_t((i * 131 + test_seed()) & 0xff);
      ASSERT_TRUE(backend->prepare_stream_source(src.data(), bytes));
      Buffer dst = backend->allocate(bytes);
      const std::vector<uint8_t> poison(bytes, 0xA5);
      backend->copy_from_host(dst.data(), poison.data(), bytes);
      // Named: 1, 2, 5 and the last (twice); 2 was copied ahead (flag 1), 6 too but not named.
      const std::vector<int32_t> ids = {1, 5, 2, n_expert - 1, 1, n_expert - 1, -3, n_expert};
      Buffer ids_dev = backend->allocate(ids.size() * 4);
      backend->copy_from_host(ids_dev.data(), ids.data(), ids.size() * 4);
      Buffer flags = backend->allocate_host(size_t(n_expert));
      auto* used = static_cast<uint8_t*>(flags.data());
      std::memset(used, 0, size_t(n_expert));
      used[2] = used[6] = 1;
      backend->stream_routed_experts(dst.data(), src.data(), expert_bytes, n_expert,
                                     static_cast<const int32_t*>(ids_dev.data()), ids.size(), used,
                                     3);
      backend->wait_stream_event(3);
      backend->synchronize();
      backend->copy_to_host(back.data(), dst.data(), bytes);
      for (int e = 0; e < n_expert; ++e) {
        const bool named = e == 1 || e == 2 || e == 5 || e == n_expert - 1;
        const bool copied = named && e != 2;
        const uint8_t* want = copied ? src.data() : poison.data();
        EXPECT_EQ(std::memcmp(back.data() + size_t(e) * expert_bytes,
                              want + size_t(e) * expert_bytes, expert_bytes),
                  0)
            << "expert " << e;
        EXPECT_EQ(int(used[e]), e == 2 ? 1 : copied ? 2 : 0) << "expert " << e;
      }
      backend->release_stream_source(src.data());
    }
  }
}

TEST(CudaDevice, PeerCopiesBetweenTwoGpusAreOrderedWithBothStreams) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA GPUs, " << cuda_device_count();
  auto gpu0 = create_backend("cuda:0"), gpu1 = create_backend("cuda:1");
  std::printf("[ measured ] peer access cuda:0 -> cuda:1: %s\n",
              gpu0->peer_copy_direct(*gpu1) ? "direct" : "through host memory");
  for (size_t bytes : {size_t(1), size_t(4096) + 3, size_t(40) << 20}) {
    std::vector<uint8_t> src(bytes), later(bytes), back(bytes, 0), back0(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) {
      src[i] = uint8_t((i * 131 + test_seed()) & 0xff);
      later[i] = uint8_t(~src[i]);
    }
    Buffer a = gpu0->allocate(bytes), b = gpu1->allocate(bytes), c = gpu0->allocate(bytes);
    // No synchronize in between: the copy must wait for the upload, and the overwrite of the
    // source after it must wait for the copy.
    gpu0->copy_from_host(a.data(), src.data(), bytes);
    gpu0->copy_to_peer(*gpu1, b.data(), a.data(), bytes);
    gpu0->copy_from_host(a.data(), later.data(), bytes);
    gpu1->copy_to_host(back.data(), b.data(), bytes);
    EXPECT_EQ(src, back) << bytes << " bytes cuda:0 -> cuda:1";
    gpu1->copy_to_peer(*gpu0, c.data(), b.data(), bytes);
    gpu0->copy_to_host(back0.data(), c.data(), bytes);
    EXPECT_EQ(src, back0) << bytes << " bytes cuda:1 -> cuda:0";
    gpu0->synchronize();
    gpu1->synchronize();
  }
  const size_t bytes = size_t(512) << 20;
  Buffer a = gpu0->allocate(bytes), b = gpu1->allocate(bytes);
  gpu0->copy_to_peer(*gpu1, b.data(), a.data(), bytes);  // warm-up
  gpu1->synchronize();
  gpu0->timer_start();
  gpu0->copy_to_peer(*gpu1, b.data(), a.data(), bytes);
  const double us = gpu0->timer_stop_us();
  gpu1->synchronize();
  std::printf("[ measured ] peer copy cuda:0 -> cuda:1: %.1f GB/s (512 MiB)\n", bytes / us / 1e3);
}

TEST(CudaDevice, FreedBlocksAreCachedAndReused) {
  TANDEM_REQUIRE_GPU(backend);
  void* first = nullptr;
  {
    Buffer b = backend->allocate(3 << 20);
    first = b.data();
  }
  EXPECT_GE(backend->cached_bytes(), size_t(3) << 20);
  Buffer again = backend->allocate(3 << 20);
  EXPECT_EQ(again.data(), first);
}

TEST(CudaDevice, OutOfMemoryIsTypedAndTheProcessKeepsWorking) {
  TANDEM_REQUIRE_GPU(backend);
  const size_t too_much = backend->memory().total_bytes + (size_t(1) << 30);
  try {
    Buffer b = backend->allocate(too_much);
    FAIL() << "allocating " << too_much << " bytes succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::OutOfMemory) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(backend->lost());
  std::vector<float> src(1000), back(1000);
  std::iota(src.begin(), src.end(), 1.0f);
  Buffer b = backend->allocate(src.size() * 4);
  backend->copy_from_host(b.data(), src.data(), src.size() * 4);
  backend->copy_to_host(back.data(), b.data(), src.size() * 4);
  EXPECT_EQ(src, back);
}

TEST(CudaDevice, RefusesWhatItDoesNotDeclare) {
  TANDEM_REQUIRE_GPU(backend);
  Graph g;
  TensorId x = g.input("x", DType::F32, {64, 4});
  TensorId v = g.reshape(x, {256});
  CapabilityCheck c = backend->check(g, g.node(v));
  EXPECT_EQ(c.reason, RejectReason::UnsupportedOp) << c.detail;
  TensorId y = g.silu(x);
  EXPECT_TRUE(backend->can_execute(g, g.node(y)));
}

TEST(CudaDevice, BadRowIdIsATypedErrorAtSynchronize) {
  TANDEM_REQUIRE_GPU(backend);
  Graph g;
  TensorId table = g.weight("table", DType::F32, {16, 10});
  TensorId ids = g.input("ids", DType::I32, {3});
  g.mark_output(g.get_rows(table, ids));
  GraphRunner run(g, *backend);
  std::mt19937 rng(test_seed());
  run.set(table, random_leaf(g.tensor(table), rng));
  run.set(ids, ints_bytes({1, 42, 3}));
  try {
    run.run();
    FAIL() << "row id 42 of 10 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
  }
  EXPECT_FALSE(backend->lost());
  run.set(ids, ints_bytes({1, 2, 3}));
  EXPECT_NO_THROW(run.run());
}

TEST(CudaDevice, SegmentIsCapturedOnceThenReplayed) {
  TANDEM_REQUIRE_GPU(backend);
  Graph g;
  TensorId x = g.input("x", DType::F32, {300, 7});
  TensorId w = g.weight("w", DType::F32, {300});
  TensorId y = g.silu(g.scale(g.rms_norm(x, w, 1e-5f), 0.5f));
  g.mark_output(y);
  GraphRunner run(g, *backend);
  std::mt19937 rng(test_seed());
  const auto before = backend->graph_stats();
  run.set(w, random_leaf(g.tensor(w), rng));
  for (int step = 0; step < 3; ++step) {
    // New data in the same buffers: a replay must see it.
    const Bytes xs = random_leaf(g.tensor(x), rng);
    run.set(x, xs);
    run.run(true, 1234);
    GraphRunner ref_check(g, *backend);
    ref_check.set(x, xs);
    ref_check.set(w, run.get(w));
    ref_check.run(false);
    EXPECT_LT(nmse(to_floats(g.tensor(y), ref_check.get(y)), to_floats(g.tensor(y), run.get(y))),
              1e-12)
        << "step " << step << " seed " << test_seed();
  }
  const auto after = backend->graph_stats();
  EXPECT_EQ(after.captures - before.captures, 1);
  EXPECT_EQ(after.replays - before.replays, 2);
  // Other pointers under the same signature: the instantiated graph is updated, not rebuilt.
  GraphRunner other(g, *backend);
  other.set(x, random_leaf(g.tensor(x), rng));
  other.set(w, random_leaf(g.tensor(w), rng));
  other.run(true, 1234);
  const auto updated = backend->graph_stats();
  EXPECT_EQ(updated.updates + updated.captures - after.updates - after.captures, 1);
}

// A poisoned context cannot be recovered in-process, so this runs in a fresh child process
// (gtest's threadsafe death-test style re-executes the binary for this test alone).
TEST(CudaDeviceDeathTest, KernelFaultMarksTheDeviceLost) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        CudaBackend fresh(0);
        int code = 1;
        try {
          fresh.inject_fault_for_testing();
        } catch (const Error& e) {
          code = e.code() == ErrorCode::DeviceLost && fresh.lost() ? 0 : 2;
          if (code == 0) {
            try {
              (void)fresh.allocate(16);
              code = 3;  // a lost device must refuse work
            } catch (const Error& again) {
              code = again.code() == ErrorCode::DeviceLost ? 0 : 4;
            }
          }
        }
        std::_Exit(code);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tandem::test
