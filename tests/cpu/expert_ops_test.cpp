// The CPU backend's expert products (ExpertMatMul) against the reference: a token's products
// as groups, products through a map (a layer split into hot experts and the others), and
// expert ids or map entries out of range.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "amx.h"
#include "cpu_features.h"
#include "op_compare.h"
#include "reference_backend.h"
#include "tandem/error.h"

namespace tandem::cpu::cpu_test {
namespace {

constexpr double kMatMul = 5e-4;

// Random values in [-1, 1] in d's dtype, row by row at its strides.
std::vector<uint8_t> random_values(const TensorDesc& d, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(d.elements()));
  for (float& f : v) f = dist(rng);
  std::vector<uint8_t> bytes(d.bytes());
  for (int64_t r = 0; r < d.rows(); ++r) {
    from_f32(d.dtype, v.data() + r * d.ne[0], bytes.data() + r * d.nb[1], d.ne[0]);
  }
  return bytes;
}

// The bytes of a vector of i32.
std::vector<uint8_t> i32_bytes(const std::vector<int32_t>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

// A token's five expert nodes (gate, up, their SwiGLU s, down, the MoeCombine out) over the
// leaves' bytes in `data` (by tensor id), run three ways into outputs of their own (0xff bytes
// at first; in place, s over gate and out over down): as one segment (the CPU groups them 3 +
// 2), node by node, and by the reference. `apart` then gets the ctx and a copy of the
// executions, to check what ends a group. Every output in memory of its own must have the same
// bits grouped as alone and be near the reference's. Returns the grouped outputs.
using ExpertNodes = std::array<TensorId, 5>;
std::vector<std::vector<uint8_t>> expect_groups_match(
    CpuBackend& cpu, const Graph& g, const ExpertNodes& nodes,
    const std::vector<std::vector<uint8_t>>& data, bool in_place,
    const std::function<void(const OpContext&, std::vector<NodeExecution>)>& apart) {
  // Named copies, not a structured binding: clang before 16 cannot capture one in a lambda.
  const TensorId gate = nodes[0], s = nodes[2], down = nodes[3], out = nodes[4];
  auto run = [&](int how) {  // 0: segment, 1: node by node, 2: reference
    std::vector<std::vector<uint8_t>> outs;
    for (TensorId y : nodes) outs.emplace_back(g.tensor(y).bytes(), uint8_t(0xff));
    auto home = [&](TensorId t) -> void* {
      if (in_place && t == s) t = gate;
      if (in_place && t == out) t = down;
      for (size_t i = 0; i < nodes.size(); ++i)
        if (nodes[i] == t) return outs[i].data();
      return const_cast<uint8_t*>(data[size_t(t)].data());
    };
    std::vector<NodeExecution> execs;
    for (TensorId y : nodes) execs.push_back(execution_of(g, g.node(y), home));
    const OpContext ctx{cpu.pool(), kernels_for(cpu.isa())};
    EXPECT_EQ(expert_group_size(ctx, execs), 3u);
    EXPECT_EQ(expert_group_size(ctx, std::span(execs).subspan(3)), 2u);
    if (how == 0) {
      cpu.execute_segment(g, execs, 0);
    } else {
      for (const NodeExecution& e : execs) {
        if (how == 1) cpu.execute(g, e);
        if (how == 2) reference_execute(g, e);
      }
    }
    apart(ctx, execs);
    return outs;
  };
  const auto grouped = run(0), alone = run(1), ref = run(2);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (in_place && (nodes[i] == s || nodes[i] == out)) continue;  // not its own memory
    SCOPED_TRACE("node " + std::to_string(i));
    EXPECT_EQ(grouped[i], alone[i]);
    EXPECT_LE(nmse_f32(ref[i], grouped[i]), kMatMul);
  }
  return grouped;
}

// A token's expert products run as groups: gate, up and their SwiGLU as one pool job, down and
// the MoeCombine of its products as another. Every output (the products' too) must have the
// bits of the nodes run alone and match the reference, also where the SwiGLU or the combine
// writes over its input in place; groups end where the ids or the column differ.
TEST(CpuOpsGroup, OneTokenExpertsMatchOneByOne) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  constexpr int64_t H = 320, F = 64, kExperts = 6, kUsed = 3;  // down: three row items
  for (DType dt : {DType::Q4_0, DType::Q8_0})
    for (int threads : {1, 3})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " threads " + std::to_string(threads) +
                     (in_place ? " in place" : ""));
        CpuBackend cpu(threads);
        Graph g;
        const TensorId x = g.input("x", DType::F32, {H, 1, 1});
        const TensorId ids = g.input("ids", DType::I32, {kUsed, 1});
        const TensorId weights = g.input("weights", DType::F32, {kUsed, 1});
        const TensorId wg = g.weight("wg", dt, {H, F, kExperts});
        const TensorId wu = g.weight("wu", dt, {H, F, kExperts});
        const TensorId wd = g.weight("wd", dt, {F, H, kExperts});
        const TensorId gate = g.expert_matmul(wg, x, ids), up = g.expert_matmul(wu, x, ids);
        const TensorId s = g.swiglu(gate, up);
        const TensorId down = g.expert_matmul(wd, s, ids);
        const TensorId out = g.moe_combine(down, weights);
        std::vector<std::vector<uint8_t>> data(size_t(out) + 1);
        for (TensorId t : {x, weights, wg, wu, wd})
          data[size_t(t)] = random_values(g.tensor(t), rng);
        data[size_t(ids)] = i32_bytes({4, 0, 4});  // a repeat: ExpertMatMul allows one
        expect_groups_match(
            cpu, g, {gate, up, s, down, out}, data, in_place,
            [&](const OpContext& ctx, std::vector<NodeExecution> execs) {
              // Other ids or another column for up: gate runs alone.
              std::vector<uint8_t> other(data[size_t(ids)]);
              execs[1].inputs[2].data = other.data();
              EXPECT_EQ(expert_group_size(ctx, execs), 1u);
              execs[1].inputs[2].data = execs[0].inputs[2].data;
              execs[1].inputs[1].data = const_cast<uint8_t*>(data[size_t(weights)].data());
              EXPECT_EQ(expert_group_size(ctx, execs), 1u);
              // The combine's output partly inside the products: down runs alone.
              execs[4].output.data = static_cast<uint8_t*>(execs[3].output.data) + sizeof(float);
              EXPECT_EQ(expert_group_size(ctx, std::span(execs).subspan(3)), 1u);
            });
      }
}

// ExpertMatMul through a map (router expert -> slot of a, negative: skipped) on every CPU path:
// float and K-quant products per expert, the Q4_0 / Q8_0 pass over all experts (AMX where
// usable), one token's shared column. n_map != n, so a CPU that used the ids as slots would
// read other experts or refuse the ids; skipped columns (outputs start as NaN) must be zeros.
TEST(CpuOpsExpertMap, MappedProductsMatchReference) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  // Over 8 router experts: a hot slab of 3 slots, the full tensor less the hot experts; and a
  // map shorter than a (any negative entry skips).
  const std::vector<int32_t> hot = {-1, 0, -1, -1, 2, -1, 1, -1};
  const std::vector<int32_t> cold = {0, -1, 2, 3, -1, 5, -1, 7};
  const std::vector<int32_t> short_map = {3, -1, 0, -5};
  struct Shape {
    int64_t n, k, b_cols, tokens;
    const std::vector<int32_t>* map;
  };
  const Shape shapes[] = {{3, 2, 1, 40, &hot}, {8, 2, 1, 40, &cold}, {6, 3, 3, 17, &short_map},
                          {3, 4, 1, 1, &hot},  {8, 4, 4, 1, &cold},  {6, 2, 1, 1, &short_map}};
  constexpr int64_t M = 40;
  for (DType d : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_K})
    for (int threads : {1, 3})
      for (bool amx : {false, true}) {
        if (amx && (!amx::amx_usable() || is_k_quant(d) || !dtype_traits(d).is_quantized)) {
          continue;
        }
        CpuBackend cpu(threads);
        cpu.set_amx(amx);
        for (const Shape& sh : shapes) {
          const std::vector<int32_t>& map = *sh.map;
          const int64_t K = is_k_quant(d) ? 256 : 96, n_map = int64_t(map.size());
          SCOPED_TRACE(std::string(dtype_name(d)) + " threads " + std::to_string(threads) +
                       (amx ? " amx" : "") + " n " + std::to_string(sh.n) + " n_map " +
                       std::to_string(n_map) + " tokens " + std::to_string(sh.tokens));
          Graph g;
          const TensorId a = g.weight("a", d, {K, M, sh.n});
          const TensorId b = g.input("b", DType::F32, {K, sh.b_cols, sh.tokens});
          const TensorId ids = g.input("ids", DType::I32, {sh.k, sh.tokens});
          const TensorId m = g.input("map", DType::I32, {n_map});
          const TensorId y = g.expert_matmul(a, b, ids, m, 0.5f);
          // The first choice skipped, the second mapped; every third choice of a batch on one
          // expert, so that it has a full AMX tile of columns.
          const int32_t skipped = int32_t(
              std::find_if(map.begin(), map.end(), [](int32_t s) { return s < 0; }) - map.begin());
          const int32_t mapped = int32_t(
              std::find_if(map.begin(), map.end(), [](int32_t s) { return s >= 0; }) - map.begin());
          std::uniform_int_distribution<int32_t> draw(0, int32_t(n_map) - 1);
          std::vector<int32_t> chosen(size_t(sh.k * sh.tokens));
          for (size_t p = 0; p < chosen.size(); ++p) {
            chosen[p] = p == 0 ? skipped : p == 1 || p % 3 == 0 ? mapped : draw(rng);
          }
          const std::vector<uint8_t> adata = random_values(g.tensor(a), rng),
                                     bdata = random_values(g.tensor(b), rng),
                                     idata = i32_bytes(chosen), mdata = i32_bytes(map);
          const NodeExecution base = execution_of(g, g.node(y), [&](TensorId t) -> void* {
            return const_cast<uint8_t*>(t == a     ? adata.data()
                                        : t == b   ? bdata.data()
                                        : t == ids ? idata.data()
                                                   : mdata.data());
          });
          std::vector<uint8_t> got(g.tensor(y).bytes(), uint8_t(0xff)), want(got);  // NaN
          NodeExecution e_cpu = base, e_ref = base;
          e_cpu.output.data = got.data();
          e_ref.output.data = want.data();
          cpu.execute(g, e_cpu);
          reference_execute(g, e_ref);
          EXPECT_LE(nmse_f32(want, got), kMatMul);
          const auto* out = reinterpret_cast<const float*>(got.data());
          for (size_t p = 0; p < chosen.size(); ++p) {
            if (map[size_t(chosen[p])] >= 0) continue;
            for (int64_t r = 0; r < M; ++r) {
              ASSERT_EQ(out[p * M + size_t(r)], 0.0f) << "skipped choice " << p << " row " << r;
            }
          }
        }
      }
}

// A token's mapped expert products (gate and up through one map, down through the same) still
// run as groups: every output must have the bits of the nodes run alone, the skipped choice's
// columns zeros, and a bad map entry is an error, not a read. Gate and up through different
// maps (or one without) run alone.
TEST(CpuOpsGroup, MappedOneTokenExpertsMatchOneByOne) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  constexpr int64_t H = 320, F = 64, kSlots = 4, kUsed = 3;
  const std::vector<int32_t> map = {-1, 3, -1, 0, 1, -1};  // 6 router experts over 4 slots
  const std::vector<int32_t> chosen = {4, 0, 4};           // choice 1 is skipped
  for (DType dt : {DType::Q4_0, DType::Q8_0})
    for (int threads : {1, 3})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " threads " + std::to_string(threads) +
                     (in_place ? " in place" : ""));
        CpuBackend cpu(threads);
        Graph g;
        const TensorId x = g.input("x", DType::F32, {H, 1, 1});
        const TensorId ids = g.input("ids", DType::I32, {kUsed, 1});
        const TensorId m = g.input("map", DType::I32, {int64_t(map.size())});
        const TensorId weights = g.input("weights", DType::F32, {kUsed, 1});
        const TensorId wg = g.weight("wg", dt, {H, F, kSlots});
        const TensorId wu = g.weight("wu", dt, {H, F, kSlots});
        const TensorId wd = g.weight("wd", dt, {F, H, kSlots});
        const TensorId gate = g.expert_matmul(wg, x, ids, m, 0.5f);
        const TensorId up = g.expert_matmul(wu, x, ids, m, 0.5f);
        const TensorId s = g.swiglu(gate, up);
        const TensorId down = g.expert_matmul(wd, s, ids, m, 0.5f);
        const TensorId out = g.moe_combine(down, weights);
        std::vector<std::vector<uint8_t>> data(size_t(out) + 1);
        for (TensorId t : {x, weights, wg, wu, wd})
          data[size_t(t)] = random_values(g.tensor(t), rng);
        data[size_t(ids)] = i32_bytes(chosen);
        data[size_t(m)] = i32_bytes(map);
        const ExpertNodes nodes = {gate, up, s, down, out};
        const auto grouped = expect_groups_match(
            cpu, g, nodes, data, in_place,
            [&](const OpContext& ctx, std::vector<NodeExecution> execs) {
              // Up through a copy of the map, or through none: gate runs alone.
              std::vector<uint8_t> other(data[size_t(m)]);
              std::vector<NodeExecution> apart(execs);
              apart[1].inputs[3].data = other.data();
              EXPECT_EQ(expert_group_size(ctx, apart), 1u);
              apart[1].inputs.pop_back();
              EXPECT_EQ(expert_group_size(ctx, apart), 1u);
              // The combine's output over the map: down runs alone.
              execs[4].output.data = const_cast<uint8_t*>(data[size_t(m)].data());
              EXPECT_EQ(expert_group_size(ctx, std::span(execs).subspan(3)), 1u);
            });
        // The skipped choice's columns are zeros (the combine's output has no columns).
        for (size_t i = 0; i + 1 < nodes.size(); ++i) {
          if (in_place && nodes[i] == s) continue;  // not its own memory
          SCOPED_TRACE("node " + std::to_string(i));
          const auto* column = reinterpret_cast<const float*>(grouped[i].data()) +
                               g.tensor(nodes[i]).ne[0];  // choice 1's
          for (int64_t r = 0; r < g.tensor(nodes[i]).ne[0]; ++r) ASSERT_EQ(column[r], 0.0f) << r;
        }
        // A map entry past the slots, in the grouped path and alone: an error.
        data[size_t(m)] = i32_bytes({-1, 3, -1, 0, kSlots, -1});
        std::vector<std::vector<uint8_t>> outs;
        for (TensorId y : nodes) outs.emplace_back(g.tensor(y).bytes());
        std::vector<NodeExecution> execs;
        for (size_t i = 0; i < std::size(nodes); ++i) {
          execs.push_back(execution_of(g, g.node(nodes[i]), [&](TensorId t) -> void* {
            return t == nodes[i] ? outs[i].data() : data[size_t(t)].data();
          }));
        }
        try {
          cpu.execute_segment(g, execs, 0);
          ADD_FAILURE() << "a map entry past the slots ran";
        } catch (const Error& err) {
          EXPECT_EQ(err.code(), ErrorCode::InvalidArgument) << err.what();
        }
        EXPECT_THROW(cpu.execute(g, execs[3]), Error);
      }
}

// An expert id outside [0, n_expert) (the ids are data) is an error on the CPU and on the
// reference, never a read out of bounds.
TEST(CpuOpsErrors, ExpertIdsOutOfRangeThrow) {
  CpuBackend cpu(2);
  ReferenceBackend reference;
  // Leaves made one by one: their ids are then known (argument order is the compiler's).
  Graph g;
  const TensorId wa = g.weight("a", DType::F32, {4, 3, 2});
  const TensorId wb = g.input("b", DType::F32, {4, 1, 1});
  const TensorId wi = g.input("i", DType::I32, {1, 1});
  const TensorId y = g.expert_matmul(wa, wb, wi);
  std::vector<float> a(24, 0.5f), b(4, 0.5f), out(3);
  for (int32_t id : {0, -1, 2}) {
    NodeExecution e{&g.node(y),
                    {{&g.tensor(wa), a.data()}, {&g.tensor(wb), b.data()}, {&g.tensor(wi), &id}},
                    {&g.tensor(y), out.data()}};
    if (id == 0) {  // a valid id runs: the throws below are the ids'
      EXPECT_NO_THROW(cpu.execute(g, e));
      EXPECT_NO_THROW(reference.execute(g, e));
      continue;
    }
    EXPECT_THROW(cpu.execute(g, e), Error) << id;
    EXPECT_THROW(reference.execute(g, e), Error) << id;
  }
  Graph g2;
  const TensorId wl = g2.input("l", DType::F32, {2, 1});
  const TensorId wi2 = g2.input("i", DType::I32, {1, 1});
  const TensorId w = g2.moe_weights(wl, wi2, true);
  std::vector<float> logits(2, 0.5f), weight(1);
  int32_t bad = 2;
  NodeExecution e2{&g2.node(w),
                   {{&g2.tensor(wl), logits.data()}, {&g2.tensor(wi2), &bad}},
                   {&g2.tensor(w), weight.data()}};
  EXPECT_THROW(cpu.execute(g2, e2), Error);
  EXPECT_THROW(reference.execute(g2, e2), Error);
}

// With a map, an id outside [0, n_map) and an entry outside [0, n) that is not negative (the
// map is data too) are errors on the CPU and on the reference; any negative entry skips.
TEST(CpuOpsErrors, ExpertMapOutOfRangeThrows) {
  CpuBackend cpu(2);
  ReferenceBackend reference;
  Graph g;
  const TensorId wa = g.weight("a", DType::F32, {4, 3, 2}),
                 wb = g.input("b", DType::F32, {4, 1, 1});
  const TensorId wi = g.input("i", DType::I32, {1, 1}), wm = g.input("m", DType::I32, {3});
  const TensorId y = g.expert_matmul(wa, wb, wi, wm);
  std::vector<float> a(24, 0.5f), b(4, 0.5f), out(3);
  struct Choice {
    int32_t id, entry;  // map = {0, entry, 1}
  };
  auto execution = [&](int32_t* id, int32_t* map) {
    return NodeExecution{&g.node(y),
                         {{&g.tensor(wa), a.data()},
                          {&g.tensor(wb), b.data()},
                          {&g.tensor(wi), id},
                          {&g.tensor(wm), map}},
                         {&g.tensor(y), out.data()}};
  };
  for (Choice c : {Choice{3, 1}, Choice{-1, 1}, Choice{1, 2}, Choice{1, 100}}) {
    int32_t map[3] = {0, c.entry, 1};
    const NodeExecution e = execution(&c.id, map);
    SCOPED_TRACE("id " + std::to_string(c.id) + " entry " + std::to_string(c.entry));
    try {
      cpu.execute(g, e);
      ADD_FAILURE() << "the cpu ran it";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::InvalidArgument) << err.what();
    }
    EXPECT_THROW(reference.execute(g, e), Error);
  }
  int32_t id = 1, map[3] = {0, -7, 1};
  std::fill(out.begin(), out.end(), 1.0f);
  cpu.execute(g, execution(&id, map));
  EXPECT_EQ(out, std::vector<float>(3, 0.0f));
}

}  // namespace
}  // namespace tandem::cpu::cpu_test
