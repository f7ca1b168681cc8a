// The registry: the reference is always there, unknown ids are a clear error, and
// available_backends() never includes the reference.
#include <gtest/gtest.h>

#include <algorithm>

#include "tandem/registry.h"
#include "test_util.h"

// Under AddressSanitizer an impossible allocation must return null (so the backend can throw
// OutOfMemory) instead of aborting the test binary.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1";
}

namespace tandem {
namespace {

TEST(Error, CodeWhereAndMessage) {
  const Error e(ErrorCode::Format, "gguf header", "bad magic (0x46554747)");
  EXPECT_EQ(e.code(), ErrorCode::Format);
  EXPECT_EQ(e.where(), "gguf header");
  EXPECT_EQ(e.message(), "bad magic (0x46554747)");
  EXPECT_STREQ(e.what(), "[gguf header] bad magic (0x46554747)");
  EXPECT_EQ(error_code_name(ErrorCode::InvalidArgument), "InvalidArgument");
  EXPECT_EQ(error_code_name(ErrorCode::OutOfMemory), "OutOfMemory");
  EXPECT_EQ(error_code_name(ErrorCode::DeviceLost), "DeviceLost");
  EXPECT_EQ(error_code_name(ErrorCode(77)), "Unknown");
  test::expect_error([] { throw_error(ErrorCode::Io, "file x", "cannot open (errno 2)"); },
                     ErrorCode::Io, "file x", {"cannot open (errno 2)"});
  test::expect_error([] { TANDEM_CHECK_ARG(1 + 1 == 3, "math", "arithmetic is broken (3)"); },
                     ErrorCode::InvalidArgument, "math", {"arithmetic is broken (3)"});
  EXPECT_NO_THROW(TANDEM_CHECK_ARG(true, "math", "never"));
}

TEST(Registry, ReferenceIsAlwaysAvailable) {
  const auto ids = available_backend_ids();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), "reference");
  auto ref = create_backend("reference");
  ASSERT_TRUE(ref);
  EXPECT_EQ(ref->backend_id(), "reference");
  EXPECT_EQ(ref->kind(), BackendKind::Cpu);
  EXPECT_TRUE(ref->host_accessible());
  EXPECT_GT(ref->memory().total_bytes, 0u);
  for (const auto& b : available_backends()) EXPECT_NE(b->backend_id(), "reference");
  EXPECT_EQ(available_backends().size() + 1, ids.size());
}

TEST(Registry, UnknownIdsAreAClearError) {
  for (const char* id : {"tpu", "cuda:99", "cuda:", "cuda:x", "cuda:-1", ""}) {
    test::expect_error([&] { create_backend(id); }, ErrorCode::InvalidArgument, "registry",
                       {"unknown backend '" + std::string(id) + "'", "available: reference"});
  }
}

TEST(Buffer, FreesThroughItsOwnerAndMoves) {
  auto ref = create_backend("reference");
  Buffer a = ref->allocate(100);
  ASSERT_TRUE(a);
  EXPECT_EQ(a.bytes(), 100u);
  EXPECT_EQ(a.owner(), ref.get());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  Buffer b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_TRUE(b);
  b = ref->allocate(8);
  EXPECT_EQ(b.bytes(), 8u);
  b.reset();
  EXPECT_FALSE(b);
  Buffer zero = ref->allocate(0);
  EXPECT_TRUE(zero);
}

TEST(Buffer, ImpossibleAllocationIsOutOfMemory) {
  auto ref = create_backend("reference");
  test::expect_error([&] { ref->allocate(size_t(1) << 62); }, ErrorCode::OutOfMemory,
                     "reference allocate", {"out of memory (need"});
}

}  // namespace
}  // namespace tandem
