// TensorDesc: strides, contiguity, bytes, views, and the errors for impossible shapes.
#include <gtest/gtest.h>

#include "tandem/graph.h"
#include "tandem/tensor.h"
#include "test_util.h"

namespace tandem {
namespace {

TEST(Tensor, ContiguousStridesAndBytes) {
  TensorDesc d = make_tensor_desc("x", DType::F32, {4, 3, 2});
  EXPECT_EQ(d.n_dims, 3);
  EXPECT_EQ(d.ne, (Dims{4, 3, 2, 1}));
  EXPECT_EQ(d.nb, (Dims{4, 16, 48, 96}));
  EXPECT_EQ(d.elements(), 24);
  EXPECT_EQ(d.rows(), 6);
  EXPECT_EQ(d.bytes(), 96u);
  EXPECT_TRUE(d.is_contiguous());
  EXPECT_FALSE(d.is_view());
  EXPECT_EQ(d.role, TensorRole::Activation);

  TensorDesc h = make_tensor_desc("h", DType::F16, {5}, TensorRole::Weight);
  EXPECT_EQ(h.nb, (Dims{2, 10, 10, 10}));
  EXPECT_EQ(h.bytes(), 10u);
  EXPECT_EQ(h.role, TensorRole::Weight);

  // Block formats: nb[0] is one block, a row is ne[0] / 32 blocks.
  TensorDesc q = make_tensor_desc("q", DType::Q4_0, {64, 3});
  EXPECT_EQ(q.nb, (Dims{18, 36, 108, 108}));
  EXPECT_EQ(q.bytes(), 108u);
  EXPECT_TRUE(q.is_contiguous());
  TensorDesc q8 = make_tensor_desc("q8", DType::Q8_0, {4096, 4096});
  EXPECT_EQ(q8.bytes(), size_t(4096) * 128 * 34);

  TensorDesc four = make_tensor_desc("4d", DType::I8, {2, 3, 4, 5});
  EXPECT_EQ(four.nb, (Dims{1, 2, 6, 24}));
  EXPECT_EQ(four.bytes(), 120u);
}

TEST(Tensor, ContiguityFollowsStrides) {
  TensorDesc d = make_tensor_desc("x", DType::F32, {4, 3});
  d.nb = {4, 20, 60, 60};  // rows padded to 5 floats
  EXPECT_FALSE(d.is_contiguous());
  EXPECT_EQ(d.bytes(), size_t(2 * 20 + 4 * 4));  // last row starts at 40, holds 16 bytes
  d.nb = {8, 32, 96, 96};                        // every other element
  EXPECT_FALSE(d.is_contiguous());
  // A dim of size 1 may have any stride.
  TensorDesc one = make_tensor_desc("y", DType::F32, {4, 1, 3});
  one.nb[1] = 999;
  EXPECT_TRUE(one.is_contiguous());
}

TEST(Tensor, Strings) {
  TensorDesc d = make_tensor_desc("x", DType::BF16, {4096, 32});
  EXPECT_EQ(shape_string(d), "[4096, 32]");
  EXPECT_EQ(desc_string(d), "bf16[4096, 32]");
  EXPECT_EQ(role_name(TensorRole::KvCache), "kv-cache");
  EXPECT_EQ(role_name(TensorRole::Output), "output");
}

TEST(Tensor, RejectsImpossibleShapes) {
  test::expect_error(
      [] {
        make_tensor_desc("x", DType::F32, {4, 0});
      },
      ErrorCode::InvalidArgument, "tensor x", {"dim 1 is 0", "must be >= 1"});
  test::expect_error([] { make_tensor_desc("x", DType::F32, {-3}); }, ErrorCode::InvalidArgument,
                     "tensor x", {"dim 0 is -3"});
  test::expect_error(
      [] {
        make_tensor_desc("q", DType::Q8_0, {33, 2});
      },
      ErrorCode::InvalidArgument, "tensor q", {"33", "q8_0 block (32)"});
  test::expect_error(
      [] {
        make_tensor_desc("x", DType::F32, {1, 2, 3, 4, 5});
      },
      ErrorCode::InvalidArgument, "tensor x", {"1 to 4 dims (got 5)"});
  test::expect_error([] { make_tensor_desc("x", DType::F32, {}); }, ErrorCode::InvalidArgument,
                     "tensor x", {"got 0"});
  test::expect_error(
      [] {
        make_tensor_desc("big", DType::F32, {int64_t(1) << 40, int64_t(1) << 40});
      },
      ErrorCode::InvalidArgument, "tensor big", {"overflows"});
  test::expect_error(
      [] {
        contiguous_strides(DType::F32, {1, 1, int64_t(1) << 62, 4});
      },
      ErrorCode::InvalidArgument, "tensor", {"overflows"});
}

TEST(Tensor, ViewsThroughTheGraph) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {8, 4, 2});
  // Rows 1..2 of every matrix, columns 2..6: a strided window.
  TensorId v = g.view(x, {5, 2, 2}, {4, 32, 128}, 1 * 32 + 2 * 4);
  const TensorDesc& d = g.tensor(v);
  EXPECT_TRUE(d.is_view());
  EXPECT_EQ(d.view_of, x);
  EXPECT_EQ(d.view_offset, 40);
  EXPECT_FALSE(d.is_contiguous());
  EXPECT_EQ(d.bytes(), size_t(128 + 32 + 5 * 4));
  EXPECT_EQ(g.storage_of(v), x);

  // A view of a view accumulates its offset and keeps the root storage.
  TensorId vv = g.view(v, {5}, {4}, 32);
  EXPECT_EQ(g.tensor(vv).view_offset, 72);
  EXPECT_EQ(g.storage_of(vv), x);
  EXPECT_TRUE(g.tensor(vv).is_contiguous());

  TensorId t = g.transpose(g.reshape(x, {8, 8}));
  EXPECT_EQ(g.tensor(t).ne, (Dims{8, 8, 1, 1}));
  EXPECT_EQ(g.tensor(t).nb[0], 32);
  EXPECT_EQ(g.tensor(t).nb[1], 4);
  EXPECT_FALSE(g.tensor(t).is_contiguous());
  EXPECT_EQ(g.storage_of(t), x);
}

}  // namespace
}  // namespace tandem
