// Graph builder: shape and dtype inference for every op, every rejection with its code and
// "[where] what (values)" message, from_nodes (order, cycles, unknown tensors), signatures.
#include <gtest/gtest.h>

#include <algorithm>

#include "tandem/graph.h"
#include "test_util.h"

namespace tandem {
namespace {

using test::expect_error;
constexpr ErrorCode kInvalid = ErrorCode::InvalidArgument;

void expect_desc(const Graph& g, TensorId id, DType dtype, Dims ne, int n_dims) {
  const TensorDesc& d = g.tensor(id);
  EXPECT_EQ(d.dtype, dtype) << d.name;
  EXPECT_EQ(d.ne, ne) << d.name;
  EXPECT_EQ(d.n_dims, n_dims) << d.name;
  EXPECT_EQ(d.id, id);
}

TEST(OpNames, RoundTripAndClasses) {
  for (int i = 0; i < kOpKindCount; ++i) {
    EXPECT_EQ(op_from_name(op_name(OpKind(i))), OpKind(i));
  }
  EXPECT_EQ(op_name(OpKind::QuantizedMatMul), "quantized_matmul");
  EXPECT_EQ(op_from_name("conv2d"), std::nullopt);
  EXPECT_EQ(op_name(OpKind(200)), "unknown");
  EXPECT_TRUE(is_leaf(OpKind::KvCache));
  EXPECT_TRUE(is_metadata(OpKind::Transpose));
  EXPECT_TRUE(is_compute(OpKind::KvWrite));
  EXPECT_FALSE(is_compute(OpKind::View));
  EXPECT_FALSE(is_compute(OpKind::Weight));
}

TEST(GraphInference, LeavesAndRoles) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {16, 3});
  TensorId w = g.weight("w", DType::Q4_0, {64, 16});
  TensorId k = g.kv_cache("k", DType::F16, {8, 2, 10});
  EXPECT_EQ(g.tensor(x).role, TensorRole::Input);
  EXPECT_EQ(g.tensor(w).role, TensorRole::Weight);
  EXPECT_EQ(g.tensor(k).role, TensorRole::KvCache);
  EXPECT_EQ(g.node(w).op, OpKind::Weight);
  EXPECT_EQ(g.tensor(k).name, "k");
  EXPECT_EQ(g.size(), 3u);
  // leaf() re-derives strides from the shape.
  TensorDesc bad = make_tensor_desc("odd", DType::F32, {4, 2});
  bad.nb = {4, 100, 200, 200};
  TensorId o = g.leaf(OpKind::Input, bad);
  EXPECT_TRUE(g.tensor(o).is_contiguous());
  expect_error([&] { g.leaf(OpKind::Add, bad); }, kInvalid, "graph add", {"not a leaf"});
}

TEST(GraphInference, EveryOp) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {64, 5});
  TensorId x3 = g.input("x3", DType::F32, {64, 4, 5});
  TensorId ids = g.input("ids", DType::I32, {7});
  TensorId pos = g.input("pos", DType::I32, {5});
  TensorId wf16 = g.weight("wf16", DType::F16, {64, 33});
  TensorId wq8 = g.weight("wq8", DType::Q8_0, {64, 33});
  TensorId wq4 = g.weight("wq4", DType::Q4_0, {64, 1000});
  TensorId norm_w = g.weight("norm_w", DType::F32, {64});
  TensorId k = g.kv_cache("k", DType::F16, {64, 2, 40});
  TensorId v = g.kv_cache("v", DType::F16, {64, 2, 40});

  expect_desc(g, g.copy(x, DType::Q8_0), DType::Q8_0, {64, 5, 1, 1}, 2);
  expect_desc(g, g.copy(x, DType::BF16), DType::BF16, {64, 5, 1, 1}, 2);
  expect_desc(g, g.get_rows(wq4, ids), DType::F32, {64, 7, 1, 1}, 2);
  TensorId mm = g.matmul(wf16, x);
  EXPECT_EQ(g.node(mm).op, OpKind::MatMul);
  expect_desc(g, mm, DType::F32, {33, 5, 1, 1}, 2);
  TensorId qmm = g.matmul(wq8, x);
  EXPECT_EQ(g.node(qmm).op, OpKind::QuantizedMatMul);
  expect_desc(g, qmm, DType::F32, {33, 5, 1, 1}, 2);
  // Batched: a's batch dims broadcast over b's.
  TensorId a3 = g.input("a3", DType::F32, {64, 6, 2});
  TensorId b3 = g.input("b3", DType::F32, {64, 5, 4});
  expect_desc(g, g.matmul(a3, b3), DType::F32, {6, 5, 4, 1}, 3);
  TensorId row = g.input("row", DType::F32, {64});
  expect_desc(g, g.add(x, row), DType::F32, {64, 5, 1, 1}, 2);
  expect_desc(g, g.mul(x3, g.input("col", DType::F32, {1, 4})), DType::F32, {64, 4, 5, 1}, 3);
  TensorId sc = g.scale(x, 0.5f);
  EXPECT_EQ(g.node(sc).params.scale, 0.5f);
  expect_desc(g, sc, DType::F32, {64, 5, 1, 1}, 2);
  TensorId mask = g.input("mask", DType::F32, {64, 8});
  TensorId sm = g.softmax(x, mask, 0.125f);
  EXPECT_EQ(g.node(sm).inputs.size(), 2u);
  EXPECT_EQ(g.node(sm).params.scale, 0.125f);
  expect_desc(g, sm, DType::F32, {64, 5, 1, 1}, 2);
  EXPECT_EQ(g.node(g.softmax(x)).inputs.size(), 1u);
  TensorId rn = g.rms_norm(x, norm_w, 1e-5f);
  EXPECT_EQ(g.node(rn).params.eps, 1e-5f);
  expect_desc(g, rn, DType::F32, {64, 5, 1, 1}, 2);
  EXPECT_EQ(g.node(g.rms_norm(x, kNoTensor, 1e-5f)).inputs.size(), 1u);
  expect_desc(g, g.layer_norm(x, norm_w, norm_w, 1e-5f), DType::F32, {64, 5, 1, 1}, 2);
  TensorId rp = g.rope(x3, pos, 32, 500000.0f);
  EXPECT_EQ(g.node(rp).params.n_rot, 32);
  EXPECT_EQ(g.node(rp).params.freq_base, 500000.0f);
  expect_desc(g, rp, DType::F32, {64, 4, 5, 1}, 3);
  expect_desc(g, g.silu(x), DType::F32, {64, 5, 1, 1}, 2);
  expect_desc(g, g.gelu(x), DType::F32, {64, 5, 1, 1}, 2);
  expect_desc(g, g.swiglu(x, x), DType::F32, {64, 5, 1, 1}, 2);
  TensorId att = g.attention(x3, k, v, pos, 0.125f);
  expect_desc(g, att, DType::F32, {64, 4, 5, 1}, 3);
  expect_desc(g, g.dequantize(wq4), DType::F32, {64, 1000, 1, 1}, 2);
  expect_desc(g, g.dequantize(wf16), DType::F32, {64, 33, 1, 1}, 2);

  TensorId src = g.input("src", DType::F32, {64, 2, 5});
  TensorId kw = g.kv_write(k, src, pos);
  expect_desc(g, kw, DType::F16, {64, 2, 40, 1}, 3);
  EXPECT_EQ(g.tensor(kw).view_of, k);
  EXPECT_EQ(g.tensor(kw).role, TensorRole::KvCache);
  EXPECT_EQ(g.storage_of(kw), k);
  // Writing into the written cache still aliases the original storage.
  EXPECT_EQ(g.storage_of(g.kv_write(kw, src, pos)), k);

  TensorId r = g.reshape(x, {320});
  expect_desc(g, r, DType::F32, {320, 1, 1, 1}, 1);
  EXPECT_EQ(g.storage_of(r), x);
  TensorId p = g.permute(x3, {2, 0, 1, 3});
  expect_desc(g, p, DType::F32, {4, 5, 64, 1}, 3);
  EXPECT_EQ(g.tensor(p).nb, (Dims{256, 1024, 4, 5120}));
  TensorId t = g.transpose(x);
  expect_desc(g, t, DType::F32, {5, 64, 1, 1}, 2);
  EXPECT_EQ(g.node(t).op, OpKind::Transpose);
  // Copy is the one compute op that takes a strided input.
  expect_desc(g, g.copy(t, DType::F16), DType::F16, {5, 64, 1, 1}, 2);
  // Every op result is an activation until marked as an output.
  EXPECT_EQ(g.tensor(att).role, TensorRole::Activation);
  g.mark_output(att);
  g.mark_output(att);
  EXPECT_EQ(g.outputs(), std::vector<TensorId>{att});
  EXPECT_EQ(g.tensor(att).role, TensorRole::Output);
  g.set_name(att, "attn_out");
  EXPECT_EQ(g.tensor(att).name, "attn_out");
  EXPECT_EQ(g.tensor(t).name, "transpose#" + std::to_string(t));
}

class GraphRejects : public ::testing::Test {
 protected:
  Graph g;
  TensorId x = g.input("x", DType::F32, {64, 5});
  TensorId x3 = g.input("x3", DType::F32, {64, 4, 5});
  TensorId i32 = g.input("ids", DType::I32, {5});
  TensorId w = g.weight("w", DType::F16, {64, 8});
  TensorId q = g.weight("q", DType::Q4_0, {64, 8});
  TensorId k = g.kv_cache("k", DType::F32, {64, 2, 10});
  TensorId v = g.kv_cache("v", DType::F32, {64, 2, 10});
  TensorId strided = g.transpose(x);
};

TEST_F(GraphRejects, MismatchedShapes) {
  TensorId y = g.input("y", DType::F32, {48, 5});
  expect_error([&] { g.matmul(w, y); }, kInvalid, "graph matmul",
               {"inner dims differ", "'w' [64, 8]", "'y' [48, 5]"});
  expect_error(
      [&] {
        g.matmul(g.input("a", DType::F32, {64, 3, 3}), x3);
      },
      kInvalid, "graph matmul", {"batch dims", "[64, 3, 3]", "[64, 4, 5]"});
  expect_error([&] { g.add(x, y); }, kInvalid, "graph add",
               {"'y' [48, 5] does not broadcast to 'x' [64, 5]"});
  expect_error([&] { g.mul(y, x); }, kInvalid, "graph mul", {"does not broadcast"});
  expect_error([&] { g.swiglu(x, y); }, kInvalid, "graph swiglu",
               {"shapes differ: 'x' [64, 5] vs 'y' [48, 5]"});
  expect_error(
      [&] {
        g.softmax(x, g.input("m", DType::F32, {64, 3}));
      },
      kInvalid, "graph softmax", {"mask [64, 3] must be [64, >= 5]"});
  expect_error([&] { g.rms_norm(x, g.weight("nw", DType::F32, {32}), 1e-5f); }, kInvalid,
               "graph rms_norm", {"'nw' [32] must have 64 elements"});
  expect_error([&] { g.layer_norm(x, kNoTensor, g.weight("b", DType::F32, {64}), 1e-5f); },
               kInvalid, "graph layer_norm", {"a bias needs a weight"});
  expect_error([&] { g.rope(x3, g.input("p4", DType::I32, {4}), 64, 1e4f); }, kInvalid,
               "graph rope", {"one position per token (got 4)"});
  expect_error([&] { g.rope(x3, i32, 65, 1e4f); }, kInvalid, "graph rope",
               {"n_rot 65 must be even and in [2, 64]"});
  expect_error([&] { g.rope(x3, i32, 0, 1e4f); }, kInvalid, "graph rope", {"n_rot 0"});
  expect_error([&] { g.rope(x3, i32, 128, 1e4f); }, kInvalid, "graph rope", {"n_rot 128"});
  expect_error([&] { g.rope(x3, i32, 64, -1.0f); }, kInvalid, "graph rope", {"freq_base"});
  expect_error([&] { g.rms_norm(x, kNoTensor, -1.0f); }, kInvalid, "graph rms_norm",
               {"eps must be >= 0"});
  TensorId q3 = g.input("q3", DType::F32, {32, 4, 5});
  expect_error([&] { g.attention(q3, k, v, i32, 1.0f); }, kInvalid, "graph attention",
               {"[32, 4, 5]", "[64, 2, 10]"});
  TensorId q_odd = g.input("q_odd", DType::F32, {64, 3, 5});
  expect_error([&] { g.attention(q_odd, k, v, i32, 1.0f); }, kInvalid, "graph attention",
               {"query heads 3 are not a multiple of kv heads 2"});
  expect_error(
      [&] {
        g.attention(x3, k, g.kv_cache("v2", DType::F32, {64, 2, 11}), i32, 1.0f);
      },
      kInvalid, "graph attention", {"shapes differ"});
  expect_error([&] { g.attention(x3, k, v, g.input("p2", DType::I32, {2}), 1.0f); }, kInvalid,
               "graph attention", {"one position per query token"});
  expect_error(
      [&] {
        g.kv_write(k, g.input("s", DType::F32, {64, 3, 5}), i32);
      },
      kInvalid, "graph kv_write", {"src [64, 3, 5] must be [64, 2, tokens]"});
  expect_error([&] { g.get_rows(x3, i32); }, kInvalid, "graph get_rows",
               {"2-d table and 1-d ids", "[64, 4, 5]"});
  expect_error(
      [&] {
        g.reshape(x, {7, 7});
      },
      kInvalid, "graph reshape", {"cannot reshape [64, 5] to [7, 7]"});
  expect_error(
      [&] {
        g.view(x, {64, 6}, {4, 256}, 0);
      },
      kInvalid, "graph view", {"exceeds 'x' (1280 bytes)"});
  expect_error([&] { g.view(x, {64}, {4}, -4); }, kInvalid, "graph view", {"offset -4"});
  expect_error([&] { g.view(x, {8}, {8}, 0); }, kInvalid, "graph view",
               {"first stride must be one element (4 bytes)"});
  expect_error([&] { g.view(x, {8, 2}, {4}, 0); }, kInvalid, "graph view", {"one stride per dim"});
  expect_error([&] { g.permute(x, {0, 0, 1, 2}); }, kInvalid, "graph permute", {"permutation"});
  expect_error([&] { g.copy(g.input("odd", DType::F32, {33}), DType::Q8_0); }, kInvalid,
               "graph copy", {"33", "q8_0"});
}

TEST_F(GraphRejects, MixtureOfExpertsShapes) {
  TensorId logits = g.input("logits", DType::F32, {8, 5});
  expect_error([&] { g.moe_route(logits, 0); }, kInvalid, "graph moe_route",
               {"top_k 0 must be in [1, 8]"});
  expect_error([&] { g.moe_route(logits, 9); }, kInvalid, "graph moe_route", {"top_k 9"});
  expect_error([&] { g.moe_route(x3, 2); }, kInvalid, "graph moe_route",
               {"[64, 4, 5] must be [n_expert, tokens]"});
  TensorId ids = g.moe_route(logits, 2);
  expect_desc(g, ids, DType::I32, {2, 5, 1, 1}, 2);
  expect_error(
      [&] {
        g.moe_weights(logits, g.input("ids4", DType::I32, {2, 4}), false);
      },
      kInvalid, "graph moe_weights", {"'ids4' [2, 4] must be [k, 5]"});
  expect_error([&] { g.moe_weights(logits, i32, false); }, kInvalid, "graph moe_weights",
               {"'ids' [5] must be [k, 5]"});
  TensorId experts = g.weight("experts", DType::Q4_0, {64, 16, 8});
  TensorId cols = g.input("cols", DType::F32, {64, 1, 5});
  expect_desc(g, g.expert_matmul(experts, cols, ids), DType::F32, {16, 2, 5, 1}, 3);
  expect_error(
      [&] {
        g.expert_matmul(experts, g.input("c32", DType::F32, {32, 1, 5}), ids);
      },
      kInvalid, "graph expert_matmul", {"same K", "[64, 16, 8]", "[32, 1, 5]"});
  expect_error(
      [&] {
        g.expert_matmul(experts, g.input("c3", DType::F32, {64, 3, 5}), ids);
      },
      kInvalid, "graph expert_matmul", {"must have 1 or 2 columns per token"});
  expect_error(
      [&] {
        g.expert_matmul(experts, g.input("c6", DType::F32, {64, 1, 6}), ids);
      },
      kInvalid, "graph expert_matmul", {"must be [k, 6]"});
  TensorId outs = g.input("outs", DType::F32, {16, 2, 5});
  expect_desc(g, g.moe_combine(outs, g.moe_weights(logits, ids, true)), DType::F32, {16, 5, 1, 1},
              2);
  expect_error(
      [&] {
        g.moe_combine(outs, g.input("w3", DType::F32, {3, 5}));
      },
      kInvalid, "graph moe_combine", {"[16, 2, 5]", "[3, 5]"});
  expect_error([&] { g.rope_neox(x3, i32, 65, 1e4f); }, kInvalid, "graph rope_neox", {"n_rot 65"});
}

TEST_F(GraphRejects, WrongDTypes) {
  expect_error([&] { g.matmul(x, w); }, kInvalid, "graph matmul",
               {"b 'w' has dtype f16 (expected f32)"});
  expect_error([&] { g.matmul(i32, x); }, kInvalid, "graph matmul",
               {"a 'ids' has dtype i32 (expected f32, f16, bf16)"});
  expect_error(
      [&] {
        g.add_node(OpKind::QuantizedMatMul, {w, x});
      },
      kInvalid, "graph quantized_matmul",
      {"has dtype f16 (expected q8_0, q4_0, q4_k, q5_k, q6_k)"});
  expect_error([&] { g.add(w, x); }, kInvalid, "graph add", {"dtype f16 (expected f32)"});
  expect_error([&] { g.silu(i32); }, kInvalid, "graph silu", {"dtype i32"});
  expect_error(
      [&] {
        g.softmax(x, g.input("m", DType::F16, {64, 5}));
      },
      kInvalid, "graph softmax", {"mask 'm' has dtype f16"});
  expect_error([&] { g.get_rows(w, x); }, kInvalid, "graph get_rows",
               {"ids 'x' has dtype f32 (expected i32)"});
  expect_error(
      [&] {
        g.get_rows(g.weight("t8", DType::I8, {4, 4}), i32);
      },
      kInvalid, "graph get_rows", {"table 't8' has dtype i8"});
  expect_error([&] { g.rope(x3, g.input("pf", DType::F32, {5}), 64, 1e4f); }, kInvalid,
               "graph rope", {"positions 'pf' has dtype f32 (expected i32)"});
  expect_error([&] { g.attention(x3, q, q, i32, 1.0f); }, kInvalid, "graph attention",
               {"k 'q' has dtype q4_0 (expected f32, f16)"});
  TensorId kh = g.kv_cache("kh", DType::F16, {64, 2, 10});
  expect_error([&] { g.attention(x3, k, kh, i32, 1.0f); }, kInvalid, "graph attention",
               {"k and v dtypes differ"});
  expect_error([&] { g.dequantize(x); }, kInvalid, "graph dequantize",
               {"dtype f32 (expected q8_0, q4_0, q4_k, q5_k, q6_k, f16, bf16)"});
  expect_error(
      [&] {
        g.kv_write(g.kv_cache("kb", DType::BF16, {64, 2, 10}), x3, i32);
      },
      kInvalid, "graph kv_write", {"cache 'kb' has dtype bf16"});
  expect_error([&] { g.copy(x, DType::I32); }, kInvalid, "graph copy",
               {"cannot convert f32 to i32"});
  expect_error([&] { g.copy(i32, DType::I8); }, kInvalid, "graph copy",
               {"cannot convert i32 to i8"});
  expect_error([&] { g.copy(i32, DType::F32); }, kInvalid, "graph copy",
               {"cannot convert i32 to f32"});
  expect_error(
      [&] {
        g.permute(q, {1, 0, 2, 3});
      },
      kInvalid, "graph permute", {"cannot permute a quantized tensor"});
}

TEST_F(GraphRejects, WrongArity) {
  expect_error([&] { g.add_node(OpKind::Add, {x}); }, kInvalid, "graph add",
               {"takes 2 inputs (got 1)"});
  expect_error(
      [&] {
        g.add_node(OpKind::Silu, {x, x});
      },
      kInvalid, "graph silu", {"takes 1 inputs (got 2)"});
  expect_error(
      [&] {
        g.add_node(OpKind::Softmax, {x, x, x});
      },
      kInvalid, "graph softmax", {"takes 1 to 2 inputs (got 3)"});
  expect_error([&] { g.add_node(OpKind::LayerNorm, {}); }, kInvalid, "graph layer_norm",
               {"takes 1 to 3 inputs (got 0)"});
  expect_error(
      [&] {
        g.add_node(OpKind::Attention, {x3, k, v});
      },
      kInvalid, "graph attention", {"takes 4 inputs (got 3)"});
  expect_error(
      [&] {
        g.add_node(OpKind::KvWrite, {k, x3});
      },
      kInvalid, "graph kv_write", {"takes 3 inputs (got 2)"});
  expect_error([&] { g.add_node(OpKind::Input, {}); }, kInvalid, "graph input",
               {"leaves are added with"});
  expect_error([&] { g.add_node(OpKind(99), {x}); }, kInvalid, "graph", {"unknown op 99"});
  expect_error([&] { g.add_node(OpKind::View, {x}); }, kInvalid, "graph view",
               {"needs dims and strides"});
}

TEST_F(GraphRejects, UnknownTensorIds) {
  expect_error([&] { g.add(x, 999); }, kInvalid, "graph add", {"unknown tensor id 999 (graph has"});
  expect_error([&] { g.silu(-5); }, kInvalid, "graph silu", {"unknown tensor id -5"});
  expect_error([&] { g.matmul(12345, x); }, kInvalid, "graph matmul", {"unknown tensor id 12345"});
  expect_error([&] { g.tensor(777); }, kInvalid, "graph", {"unknown tensor id 777"});
  expect_error([&] { g.node(kNoTensor); }, kInvalid, "graph", {"unknown tensor id -1"});
  expect_error([&] { g.mark_output(100); }, kInvalid, "graph mark_output", {"100"});
  expect_error([&] { g.set_name(100, "n"); }, kInvalid, "graph set_name", {"100"});
}

TEST_F(GraphRejects, NonContiguousInputs) {
  ASSERT_FALSE(g.tensor(strided).is_contiguous());
  TensorId y = g.input("y", DType::F32, {5, 64});
  const std::string what = "is not contiguous (insert a copy)";
  expect_error([&] { g.add(strided, y); }, kInvalid, "graph add", {what, "[5, 64]"});
  expect_error([&] { g.silu(strided); }, kInvalid, "graph silu", {what});
  expect_error([&] { g.softmax(strided); }, kInvalid, "graph softmax", {what});
  expect_error(
      [&] {
        g.matmul(g.input("a", DType::F32, {5, 3}), strided);
      },
      kInvalid, "graph matmul", {what});
  expect_error([&] { g.rms_norm(strided, kNoTensor, 1e-5f); }, kInvalid, "graph rms_norm", {what});
  expect_error([&] { g.reshape(strided, {320}); }, kInvalid, "graph reshape",
               {"is not contiguous"});
  TensorId strided_q = g.view(q, {32, 8}, {18, 36}, 0);  // half of every quantized row
  expect_error([&] { g.copy(strided_q, DType::F32); }, kInvalid, "graph copy",
               {"quantized copy needs a contiguous input"});
}

// A graph built out of order by from_nodes: sorted, shapes re-inferred.
TEST(GraphFromNodes, SortsAndReInfers) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {32, 3});
  TensorId w = g.weight("w", DType::Q8_0, {32, 16});
  TensorId t = g.transpose(x);
  TensorId c = g.copy(t, DType::F16);
  TensorId m = g.matmul(w, x);
  TensorId s = g.silu(m);
  TensorId vw = g.view(s, {8, 3}, {4, 64}, 16);
  g.mark_output(s);

  std::vector<Node> nodes = g.nodes();
  std::vector<TensorDesc> descs;
  for (const Node& n : nodes) descs.push_back(g.tensor(n.id));
  std::reverse(nodes.begin(), nodes.end());
  std::reverse(descs.begin(), descs.end());
  Graph h = Graph::from_nodes(nodes, descs);
  ASSERT_EQ(h.size(), g.size());
  // Every node's inputs come before it.
  for (const Node& n : h.nodes()) {
    for (TensorId in : n.inputs) EXPECT_LT(in, n.id);
  }
  // Same multiset of (op, desc) after sorting; names survive.
  auto find = [&](const std::string& name) -> const TensorDesc& {
    for (const Node& n : h.nodes()) {
      if (h.tensor(n.id).name == name) return h.tensor(n.id);
    }
    throw std::runtime_error("missing " + name);
  };
  for (TensorId id : {x, w, t, c, m, s, vw}) {
    const TensorDesc& a = g.tensor(id);
    const TensorDesc& b = find(a.name);
    EXPECT_EQ(a.ne, b.ne) << a.name;
    EXPECT_EQ(a.nb, b.nb) << a.name;
    EXPECT_EQ(a.dtype, b.dtype) << a.name;
    EXPECT_EQ(a.view_offset, b.view_offset) << a.name;
    EXPECT_EQ(a.role, b.role) << a.name;
  }
  ASSERT_EQ(h.outputs().size(), 1u);
  EXPECT_EQ(h.tensor(h.outputs()[0]).name, g.tensor(s).name);
}

TEST(GraphFromNodes, RejectsCyclesAndUnknownTensors) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {4});
  TensorId a = g.silu(x);
  TensorId b = g.gelu(a);
  std::vector<Node> nodes = g.nodes();
  std::vector<TensorDesc> descs{g.tensor(x), g.tensor(a), g.tensor(b)};

  auto cyclic = nodes;
  cyclic[size_t(a)].inputs = {b};  // a <- b <- a
  expect_error([&] { Graph::from_nodes(cyclic, descs); }, kInvalid, "graph from_nodes",
               {"cycle (2 nodes on or behind it)"});
  auto self = nodes;
  self[size_t(b)].inputs = {b};
  expect_error([&] { Graph::from_nodes(self, descs); }, kInvalid, "graph from_nodes",
               {"cycle (1 nodes"});

  auto unknown = nodes;
  unknown[size_t(b)].inputs = {42};
  expect_error([&] { Graph::from_nodes(unknown, descs); }, kInvalid, "graph from_nodes",
               {"node 2 reads unknown tensor 42"});
  unknown[size_t(b)].inputs = {-1};
  expect_error([&] { Graph::from_nodes(unknown, descs); }, kInvalid, "graph from_nodes",
               {"unknown tensor -1"});

  auto dup = nodes;
  dup[2].id = 1;
  expect_error([&] { Graph::from_nodes(dup, descs); }, kInvalid, "graph from_nodes",
               {"unique", "(got 1)"});
  expect_error([&] { Graph::from_nodes(nodes, {descs[0]}); }, kInvalid, "graph from_nodes",
               {"3 nodes, 1 descriptions"});
  // Shapes are re-inferred, so an inconsistent node is rejected like in the builder.
  auto wrong_arity = nodes;
  wrong_arity[size_t(b)].inputs = {a, x};
  expect_error([&] { Graph::from_nodes(wrong_arity, descs); }, kInvalid, "graph gelu",
               {"takes 1 inputs (got 2)"});
  auto bad_op = nodes;
  bad_op[size_t(b)].op = OpKind(120);
  expect_error([&] { Graph::from_nodes(bad_op, descs); }, kInvalid, "graph", {"unknown op 120"});
}

TEST(GraphSignature, StructureNotNames) {
  auto build = [](const char* name, float eps, int64_t n) {
    Graph g;
    TensorId x = g.input(name, DType::F32, {n, 3});
    g.mark_output(g.rms_norm(x, kNoTensor, eps));
    return g;
  };
  EXPECT_EQ(build("a", 1e-5f, 8).signature(), build("b", 1e-5f, 8).signature());
  EXPECT_NE(build("a", 1e-5f, 8).signature(), build("a", 1e-6f, 8).signature());
  EXPECT_NE(build("a", 1e-5f, 8).signature(), build("a", 1e-5f, 9).signature());
  Graph g = build("a", 1e-5f, 8);
  const uint64_t before = g.signature();
  g.mark_output(0);
  EXPECT_NE(g.signature(), before);
}

TEST(GraphLastUses, CountsReadersAndAliases) {
  Graph g;
  TensorId x = g.input("x", DType::F32, {8, 2});
  TensorId r = g.reshape(x, {16});
  TensorId a = g.silu(x);
  TensorId b = g.gelu(r);  // reads x's storage through the reshape
  TensorId c = g.add(a, a);
  std::vector<int32_t> last = g.last_uses();
  EXPECT_EQ(last[size_t(x)], b);
  EXPECT_EQ(last[size_t(r)], b);
  EXPECT_EQ(last[size_t(a)], c);
  EXPECT_EQ(last[size_t(c)], -1);
}

}  // namespace
}  // namespace tandem
