// Launches of the staged matrix-vector kernel that take the nodes after the products with them,
// against the reference backend by NMSE (cuda_ops_test.cpp has the other fused patterns).
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ops/rope_kv.h"
#include "reference_backend.h"

namespace tandem::test {
namespace {

constexpr double kExact = 1e-7, kMatmul = 5e-4, kRope = 1e-3;

// One token's attention inputs as the llama graph emits them: [the residual Add,] the RmsNorm,
// the Q, K and V products of its output, RoPE of Q and K, the cache writes of K (rotated) and
// V. A captured segment runs them as one launch of the staged kernel (graph_stats counts it),
// whose CTAs rotate and write their own rows after their row sums. Every dtype of the staged
// kernel, both cache dtypes, whole and partial rotation (n_rot < head dim), a row split whose
// CTAs take 5 or 6 row pairs; a position past the cache is the same typed error as the
// separate kernels give, and the next step runs.
TEST(CudaFused, NormQkvRopeAndCacheWritesInOneLaunch) {
  TANDEM_REQUIRE_GPU(backend);
  const int64_t dim = 2048, hd = 64, hq = 16, hkv = 4, ctx = 40;
  for (DType d : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    for (DType cache : {DType::F16, DType::F32}) {
      for (bool with_add : {true, false}) {
        for (int32_t n_rot : {64, 32}) {
          Graph g;
          TensorId x = g.input("x", DType::F32, {dim, 1});
          TensorId s = with_add ? g.add(x, g.input("r", DType::F32, {dim, 1})) : x;
          if (with_add) g.mark_output(s);
          TensorId h = g.rms_norm(s, g.weight("w", DType::F32, {dim}), 1e-5f);
          g.mark_output(h);
          TensorId pos = g.input("pos", DType::I32, {1});
          TensorId kc = g.kv_cache("kc", cache, {hd, hkv, ctx});
          TensorId vc = g.kv_cache("vc", cache, {hd, hkv, ctx});
          TensorId q = g.matmul(g.weight("wq", d, {dim, hq * hd}), h);
          TensorId k = g.matmul(g.weight("wk", d, {dim, hkv * hd}), h);
          TensorId v = g.matmul(g.weight("wv", d, {dim, hkv * hd}), h);
          for (TensorId p : {q, k, v}) g.mark_output(p);
          TensorId qr = g.rope(g.reshape(q, {hd, hq, 1}), pos, n_rot, 500000.0f);
          TensorId kr = g.rope(g.reshape(k, {hd, hkv, 1}), pos, n_rot, 500000.0f);
          g.mark_output(qr);
          g.mark_output(kr);
          g.mark_output(g.kv_write(kc, kr, pos));
          g.mark_output(g.kv_write(vc, g.reshape(v, {hd, hkv, 1}), pos));
          const std::string what = "norm + qkv + rope + kv_write " + std::string(dtype_name(d)) +
                                   " cache " + std::string(dtype_name(cache)) +
                                   (with_add ? " add" : "") + " n_rot=" + std::to_string(n_rot);
          const auto before = backend->graph_stats();
          const Comparison fused =
              compare_with_reference(g, *backend, {{pos, ints_bytes({17})}}, /*as_segment=*/true);
          const auto after = backend->graph_stats();
          EXPECT_EQ(after.fused_launches - before.fused_launches, 1) << what;
          EXPECT_EQ(after.fused_nodes - before.fused_nodes, with_add ? 9 : 8) << what;
          const size_t leading = with_add ? 2 : 1;  // the sum and the normed vector
          ASSERT_EQ(fused.nmse.size(), leading + 7);
          for (size_t i = 0; i < leading; ++i) EXPECT_LE(fused.nmse[i], kExact) << what << " " << i;
          for (size_t i = leading; i < leading + 3; ++i) {
            EXPECT_LE(fused.nmse[i], kMatmul) << what << ": product " << i;
          }
          // RoPE and the caches: the products' error, rotated (a cache's other rows are the
          // same random leaf on both sides; one wrong row of 40 would read ~2.5e-2).
          for (size_t i = leading + 3; i < leading + 7; ++i) {
            EXPECT_LE(fused.nmse[i], kMatmul) << what << ": output " << i;
          }
        }
      }
    }
  }
  // A position past the cache: the launch flags it, the step fails with InvalidArgument, and a
  // valid position runs next.
  Graph g;
  TensorId x = g.input("x", DType::F32, {dim, 1});
  TensorId h = g.rms_norm(x, g.weight("w", DType::F32, {dim}), 1e-5f);
  TensorId pos = g.input("pos", DType::I32, {1});
  TensorId kc = g.kv_cache("kc", DType::F16, {hd, hkv, ctx});
  TensorId vc = g.kv_cache("vc", DType::F16, {hd, hkv, ctx});
  TensorId q = g.matmul(g.weight("wq", DType::Q4_0, {dim, hq * hd}), h);
  TensorId k = g.matmul(g.weight("wk", DType::Q4_0, {dim, hkv * hd}), h);
  TensorId v = g.matmul(g.weight("wv", DType::Q4_0, {dim, hkv * hd}), h);
  TensorId qr = g.rope(g.reshape(q, {hd, hq, 1}), pos, int32_t(hd), 500000.0f);
  TensorId kr = g.rope(g.reshape(k, {hd, hkv, 1}), pos, int32_t(hd), 500000.0f);
  g.mark_output(qr);
  TensorId kw = g.kv_write(kc, kr, pos);
  TensorId vw = g.kv_write(vc, g.reshape(v, {hd, hkv, 1}), pos);
  g.mark_output(kw);
  g.mark_output(vw);
  PositionReplay replay(g, *backend, pos);
  replay.step(3, {qr, kw, vw}, kRope);
  replay.expect_rejected(int32_t(ctx));
  replay.step(39, {qr, kw, vw}, kRope);
}

// One token's Q, K and V products, then RoPE of Q and K and the cache writes, as NodeExecutions
// over made-up addresses (the matching compares pointers only: no GPU needed). The executions
// point into the graph: not copied.
struct QkvRopeSegment {
  Graph g;
  TensorId q, k, v, qr, kr, kc, vc, kw, vw, pos;
  std::vector<NodeExecution> execs;
  TensorId att = kNoTensor;
  QkvRopeSegment(int64_t tokens, DType k_cache, DType v_cache, bool neox, bool write_raw_k,
                 bool with_attention = false) {
    const int64_t dim = 256, hd = 64, hq = 4, hkv = 2, ctx = 40;
    TensorId h = g.input("h", DType::F32, {dim, tokens});
    pos = g.input("pos", DType::I32, {tokens});
    kc = g.kv_cache("kc", k_cache, {hd, hkv, ctx});
    vc = g.kv_cache("vc", v_cache, {hd, hkv, ctx});
    q = g.matmul(g.weight("wq", DType::Q4_0, {dim, hq * hd}), h);
    k = g.matmul(g.weight("wk", DType::Q4_0, {dim, hkv * hd}), h);
    v = g.matmul(g.weight("wv", DType::Q4_0, {dim, hkv * hd}), h);
    auto rope = [&](TensorId x, int64_t heads) {
      x = g.reshape(x, {hd, heads, tokens});
      return neox ? g.rope_neox(x, pos, int32_t(hd), 10000.0f)
                  : g.rope(x, pos, int32_t(hd), 10000.0f);
    };
    qr = rope(q, hq);
    kr = rope(k, hkv);
    kw = g.kv_write(kc, write_raw_k ? g.reshape(k, {hd, hkv, tokens}) : kr, pos);
    vw = g.kv_write(vc, g.reshape(v, {hd, hkv, tokens}), pos);
    if (with_attention) att = g.attention(qr, kw, vw, pos, 0.125f);
    for (const Node& n : g.nodes()) {  // graph order, as a segment runs
      if (is_compute(n.op))
        execs.push_back(execution_of(g, n, [&](TensorId id) { return address(id); }));
    }
  }
  QkvRopeSegment(const QkvRopeSegment&) = delete;
  QkvRopeSegment& operator=(const QkvRopeSegment&) = delete;
  void* address(TensorId id) const {
    const TensorDesc& d = g.tensor(id);
    return reinterpret_cast<uint8_t*>((size_t(g.storage_of(id)) + 1) << 20) +
           (d.is_view() ? d.view_offset : 0);
  }
};

// Segments the fused matchings refuse (QkvRopeSegment's arguments, K's cache f16).
struct RefusedCase {
  const char* what;
  int64_t tokens;
  DType v_cache;
  bool neox, write_raw_k;
};
constexpr RefusedCase kRefused[] = {{"neox", 1, DType::F16, true, false},
                                    {"two tokens", 2, DType::F16, false, false},
                                    {"the unrotated K cached", 1, DType::F16, false, true},
                                    {"caches of two dtypes", 1, DType::F32, false, false}};

// The staged launch's RoPE tail takes the four nodes after Q, K and V of one token in the llama
// graph's order, and rope_kv_write_kernel's matching takes the same four alone; anything else
// (NeoX pairs, two tokens, the unrotated K cached, caches of two dtypes, two products) leaves
// the tail out. Host code: runs without a GPU.
TEST(CudaFused, RopeTailTakesOneTokensRopeAndCacheWrites) {
  QkvRopeSegment s(1, DType::F16, DType::F16, false, false);
  ASSERT_EQ(s.execs.size(), 7u);
  cuda::RopeTail tail;
  ASSERT_EQ(cuda::rope_tail_of(s.execs, 3, &tail), 4u);
  EXPECT_EQ(tail.out[0], s.address(s.qr));
  EXPECT_EQ(tail.out[1], s.address(s.kr));
  EXPECT_EQ(tail.out[2], nullptr);
  EXPECT_EQ(tail.cache[0], nullptr);
  EXPECT_EQ(tail.cache[1], s.address(s.kw));
  EXPECT_EQ(tail.cache[2], s.address(s.vw));
  EXPECT_EQ(tail.token_stride[1], s.g.tensor(s.kc).nb[2]);
  EXPECT_EQ(tail.capacity[2], 40);
  EXPECT_EQ(tail.cache_dtype, DType::F16);
  EXPECT_EQ(tail.pos, s.address(s.pos));
  EXPECT_EQ(tail.head_dim, 64);
  EXPECT_EQ(tail.n_rot, 64);
  EXPECT_DOUBLE_EQ(tail.log_base, std::log(10000.0));
  cuda::RopeKvMatch m;
  ASSERT_EQ(cuda::match_rope_kv_write(std::span(s.execs).subspan(3), &m), 4u);
  EXPECT_EQ(m.parts.count, 3);  // Q; K with its cache; V's cache
  EXPECT_EQ(m.parts.part[1].cache, s.address(s.kw));
  EXPECT_FALSE(m.parts.part[2].rotate);

  EXPECT_EQ(cuda::rope_tail_of(s.execs, 2, &tail), 0u) << "Q and K alone";
  for (const RefusedCase& c : kRefused) {
    const QkvRopeSegment other(c.tokens, DType::F16, c.v_cache, c.neox, c.write_raw_k);
    EXPECT_EQ(cuda::rope_tail_of(other.execs, 3, &tail), 0u) << c.what;
  }
}

// The same four nodes with the Attention after them: the general attention kernel takes all five
// (match_rope_kv_attention); the cases the RoPE tail refuses (caches of two dtypes make no
// attention), and an attention that does not read what they write, leave the attention out.
// Host code: runs without a GPU.
TEST(CudaFused, RopeKvAttentionTakesOneTokensFiveNodes) {
  QkvRopeSegment s(1, DType::F16, DType::F16, false, false, true);
  ASSERT_EQ(s.execs.size(), 8u);
  const std::span<const NodeExecution> after_products = std::span(s.execs).subspan(3);
  cuda::RopeKvMatch m;
  ASSERT_EQ(cuda::match_rope_kv_attention(after_products, &m), 5u);
  EXPECT_EQ(m.parts.part[0].out, s.address(s.qr));
  EXPECT_EQ(m.parts.part[1].cache, s.address(s.kw));
  EXPECT_EQ(m.parts.part[2].cache, s.address(s.vw));
  EXPECT_EQ(m.positions->data, s.address(s.pos));
  EXPECT_EQ(cuda::match_rope_kv_attention(after_products.first(4), &m), 0u) << "no attention";
  for (const RefusedCase& c : kRefused) {
    if (c.v_cache != DType::F16) continue;  // no attention over caches of two dtypes
    const QkvRopeSegment other(c.tokens, DType::F16, c.v_cache, c.neox, c.write_raw_k, true);
    EXPECT_EQ(cuda::match_rope_kv_attention(std::span(other.execs).subspan(3), &m), 0u) << c.what;
  }
  // The attention reading another query than the Q Rope's output.
  std::vector<NodeExecution> other_q = s.execs;
  other_q.back().inputs[0] = other_q[0].output;
  EXPECT_EQ(cuda::match_rope_kv_attention(std::span(other_q).subspan(3), &m), 0u);
}

// One token's RoPE of Q and K, the cache writes and the attention over the caches, captured as
// one segment: a launch of the general attention kernel that rotates and writes them itself
// (graph_stats counts it), against the reference: both cache dtypes, head dims 64 and 96 (and
// 128 over an f32 cache), whole and partial rotation, a context run whole and one split; then
// replayed at new positions, a position past the cache the same typed error as before.
TEST(CudaFused, RopeCacheWritesAndAttentionInOneLaunch) {
  TANDEM_REQUIRE_GPU(backend);
  struct Shape {
    int64_t hd, hq, hkv;
    DType cache;
  };
  const int64_t ctx = 600;
  auto build = [&](Graph& g, const Shape& sh, int32_t n_rot, TensorId* pos_out) {
    TensorId q = g.input("q", DType::F32, {sh.hd, sh.hq, 1});
    TensorId k = g.input("k", DType::F32, {sh.hd, sh.hkv, 1});
    TensorId v = g.input("v", DType::F32, {sh.hd, sh.hkv, 1});
    TensorId pos = g.input("pos", DType::I32, {1});
    TensorId kc = g.kv_cache("kc", sh.cache, {sh.hd, sh.hkv, ctx});
    TensorId vc = g.kv_cache("vc", sh.cache, {sh.hd, sh.hkv, ctx});
    TensorId qr = g.rope(q, pos, n_rot, 500000.0f);
    TensorId kr = g.rope(k, pos, n_rot, 500000.0f);
    TensorId kw = g.kv_write(kc, kr, pos), vw = g.kv_write(vc, v, pos);
    TensorId att = g.attention(qr, kw, vw, pos, 1.0f / std::sqrt(float(sh.hd)));
    for (TensorId t : {qr, kr, kw, vw, att}) g.mark_output(t);
    *pos_out = pos;
  };
  for (const Shape& sh : {Shape{64, 32, 8, DType::F16}, Shape{64, 32, 8, DType::F32},
                          Shape{96, 8, 2, DType::F16}, Shape{128, 16, 4, DType::F32}}) {
    for (int32_t n_rot : {int32_t(sh.hd), int32_t(sh.hd / 2)}) {
      for (int32_t p : {17, 450}) {
        Graph g;
        TensorId pos;
        build(g, sh, n_rot, &pos);
        const std::string what = "hd " + std::to_string(sh.hd) + " cache " +
                                 std::string(dtype_name(sh.cache)) + " n_rot " +
                                 std::to_string(n_rot) + " position " + std::to_string(p);
        const auto before = backend->graph_stats();
        const Comparison c =
            compare_with_reference(g, *backend, {{pos, ints_bytes({p})}}, /*as_segment=*/true);
        const auto after = backend->graph_stats();
        // The second position may replay the first one's capture (the same graph, buffers at
        // the same addresses): the launch decides whole or split from the position it reads.
        if (p == 17 || after.replays == before.replays) {
          EXPECT_EQ(after.fused_launches - before.fused_launches, 1) << what;
          EXPECT_EQ(after.fused_nodes - before.fused_nodes, 5) << what;
        }
        ASSERT_EQ(c.nmse.size(), 5u);
        for (size_t i = 0; i < 4; ++i) EXPECT_LE(c.nmse[i], kRope) << what << " output " << i;
        EXPECT_LE(c.nmse[4], kMatmul) << what << " attention";
      }
    }
  }
  Graph g;
  TensorId pos;
  build(g, Shape{64, 32, 8, DType::F16}, 64, &pos);
  PositionReplay replay(g, *backend, pos);
  for (int32_t p : {599, 3, 128, 127, 300}) replay.step(p, g.outputs(), kRope);
  replay.expect_rejected(int32_t(ctx));
  replay.step(40, g.outputs(), kRope);
}

}  // namespace
}  // namespace tandem::test
