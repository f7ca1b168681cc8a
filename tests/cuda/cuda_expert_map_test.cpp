// The CUDA backend's ExpertMatMul with a map (a layer split into its hot experts and the
// others) against the reference: every kernel path, the fusions, and ids outside the map.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ops/ops.h"
#include "reference_backend.h"
#include "tandem/error.h"

namespace tandem::test {
namespace {

constexpr double kMatmul = 5e-4;

// ExpertMatMul with a map: choice e reads a's matrix map[e], and none (a column of zeros, not an
// error) where that is negative.

// What the CUDA outputs hold before a run: a column the kernels leave unwritten shows.
constexpr float kUnwritten = 1e3f;

// The marked outputs of `graph` on the reference and on the CUDA backend, node by node and as
// one captured segment, from the same leaves (`fixed`, or random).
struct BothOutputs {
  std::vector<std::vector<float>> reference, cuda, cuda_segment;
};
BothOutputs run_on_both(const Graph& graph, Backend& cuda, const std::map<TensorId, Bytes>& fixed) {
  std::mt19937 rng(test_seed());
  std::map<TensorId, Bytes> leaves = fixed;
  for (const Node& node : graph.nodes()) {
    if (is_leaf(node.op) && !leaves.count(node.id)) {
      leaves[node.id] = random_leaf(graph.tensor(node.id), rng);
    }
  }
  auto run = [&](Backend& backend, bool as_segment) {
    GraphRunner runner(graph, backend);
    for (const auto& [id, bytes] : leaves) runner.set(id, bytes);
    for (TensorId out : graph.outputs()) {
      const TensorDesc& d = graph.tensor(out);
      const std::vector<float> poison(size_t(d.elements()), kUnwritten);
      Bytes bytes(d.bytes());
      from_f32(d.dtype, poison.data(), bytes.data(), d.elements());
      runner.set(out, bytes);
    }
    runner.run(as_segment, graph.signature());
    std::vector<std::vector<float>> outs;
    for (TensorId out : graph.outputs()) {
      outs.push_back(to_floats(graph.tensor(out), runner.get(out)));
    }
    return outs;
  };
  ReferenceBackend reference;
  BothOutputs o;
  o.reference = run(reference, false);
  o.cuda = run(cuda, false);
  o.cuda_segment = run(cuda, true);
  return o;
}

void expect_both_close(const BothOutputs& o, double limit, const std::string& what) {
  ASSERT_FALSE(o.reference.empty()) << what << ": no outputs";
  for (size_t i = 0; i < o.reference.size(); ++i) {
    const double by_node = nmse(o.reference[i], o.cuda[i]);
    const double segment = nmse(o.reference[i], o.cuda_segment[i]);
    EXPECT_LE(by_node, limit) << what << " output " << i << " nmse " << by_node << " seed "
                              << test_seed();
    EXPECT_LE(segment, limit) << what << " output " << i << " (segment) nmse " << segment
                              << " seed " << test_seed();
  }
}

// Each token's k distinct choices among the map's experts: (t + 1) % (k + 1) of them (as far as
// the map allows) experts it skips, the others experts it maps to a matrix.
std::vector<int32_t> mapped_choices(const std::vector<int32_t>& map, int64_t k, int64_t T,
                                    std::mt19937& rng) {
  std::vector<int32_t> skipped, mapped;
  for (size_t e = 0; e < map.size(); ++e) (map[e] < 0 ? skipped : mapped).push_back(int32_t(e));
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n_skip =
        std::clamp<int64_t>((t + 1) % (k + 1), k - int64_t(mapped.size()), int64_t(skipped.size()));
    std::shuffle(skipped.begin(), skipped.end(), rng);
    std::shuffle(mapped.begin(), mapped.end(), rng);
    std::vector<int32_t> chosen(skipped.begin(), skipped.begin() + n_skip);
    chosen.insert(chosen.end(), mapped.begin(), mapped.begin() + (k - n_skip));
    std::shuffle(chosen.begin(), chosen.end(), rng);
    ids.insert(ids.end(), chosen.begin(), chosen.end());
  }
  return ids;
}

// The columns (M values per choice) of an [M, k, T] output: exactly zero where the map skips the
// choice's expert, not all zero elsewhere.
void expect_skipped_columns_zero(const std::vector<float>& out, int64_t M,
                                 const std::vector<int32_t>& ids, const std::vector<int32_t>& map,
                                 const std::string& what) {
  ASSERT_EQ(out.size(), size_t(M) * ids.size()) << what;
  size_t wrong = 0, first = 0;
  for (size_t z = 0; z < ids.size(); ++z) {
    const auto column = out.begin() + ptrdiff_t(z * size_t(M));
    const bool zeros = std::all_of(column, column + M, [](float v) { return v == 0.0f; });
    if (zeros != (map[size_t(ids[z])] < 0) && wrong++ == 0) first = z;
  }
  EXPECT_EQ(wrong, 0u) << what << ": " << wrong << " columns wrong, the first choice " << first
                       << " (expert " << ids[first] << ", matrix " << map[size_t(ids[first])]
                       << ", value " << out[first * size_t(M)] << ") seed " << test_seed();
}

// A mapped ExpertMatMul on every path: f16 weights take the element-wise kernel; Q4_0, Q8_0 and
// Q4_K one warp per row of each (token, choice); Q4_0 and Q8_0 from 8 tokens the pairs grouped
// by matrix on the tensor cores (K = 512 and 480 for both of its kernels), the skipped pairs in
// tiles of their own. The maps name more experts than a has matrices (two share one) or fewer.
// Against the reference, with the skipped columns exactly zero in outputs filled beforehand.
TEST(CudaOps, MappedExpertMatMulEveryPath) {
  TANDEM_REQUIRE_GPU(backend);
  std::mt19937 rng(test_seed());
  const std::vector<std::pair<int64_t, std::vector<int32_t>>> maps = {
      {4, {2, -1, 0, 3, -1, -1, 1, -1, 0, 3}},  // 10 experts, 4 matrices
      {6, {5, -1, 1, 4}}};                      // 4 experts, 6 matrices
  for (DType d : {DType::F16, DType::Q4_0, DType::Q8_0, DType::Q4_K}) {
    for (int64_t t : {1, 3, 37, 100}) {
      for (int64_t b_cols : {1, 4}) {
        for (int64_t K : {512, 480}) {
          if (is_k_quant(d) && K % 256 != 0) continue;
          for (const auto& [n, map] : maps) {
            const int64_t M = 200, k = 4;
            Graph g;
            TensorId a = g.weight("a", d, {K, M, n});
            TensorId b = g.input("b", DType::F32, {K, b_cols, t});
            TensorId ids = g.input("ids", DType::I32, {k, t});
            TensorId m = g.input("map", DType::I32, {int64_t(map.size())});
            g.mark_output(g.expert_matmul(a, b, ids, m));
            const std::vector<int32_t> chosen = mapped_choices(map, k, t, rng);
            const std::string what =
                "mapped expert_matmul " + std::string(dtype_name(d)) + " t=" + std::to_string(t) +
                " b_cols=" + std::to_string(b_cols) + " K=" + std::to_string(K) + " map " +
                std::to_string(map.size()) + "->" + std::to_string(n);
            const BothOutputs o =
                run_on_both(g, *backend, {{ids, ints_bytes(chosen)}, {m, ints_bytes(map)}});
            expect_both_close(o, kMatmul, what);
            expect_skipped_columns_zero(o.cuda[0], M, chosen, map, what);
            expect_skipped_columns_zero(o.cuda_segment[0], M, chosen, map, what + " (segment)");
          }
        }
      }
    }
  }
}

// A MoE block split as src/model/llama_graph.cpp splits it: gate, up, SwiGLU and down over a slab
// of 3 hot experts (map: expert -> slot or -1), the same over the full tensors for the others
// (map: expert -> itself or -1), the sum of both weighted by the combine. In a captured segment
// each side's gate, up and SwiGLU are one launch (6 fused nodes). One mapped block whose down
// product feeds the combine fuses that pair too (5); gate and up of different maps are not fused
// (2: down and combine), or up would read through gate's map. Every output against the
// reference, each product's skipped columns exactly zero.
TEST(CudaOps, MappedExpertBlockFusions) {
  TANDEM_REQUIRE_GPU(backend);
  std::mt19937 rng(test_seed());
  const int64_t n_embd = 512, n_ff = 256, E = 8, k = 4;
  const std::vector<int32_t> hot_map = {-1, 1, -1, 2, -1, -1, 0, -1};  // experts 6, 1, 3
  const std::vector<int32_t> cold_map = {0, -1, 2, -1, 4, 5, -1, 7};
  enum class Block { HotAndCold, OneMapped, GateUpMapsDiffer };
  for (DType d : {DType::Q4_0, DType::Q4_K}) {
    for (int64_t t : {1, 3}) {
      for (Block block : {Block::HotAndCold, Block::OneMapped, Block::GateUpMapsDiffer}) {
        Graph g;
        TensorId h = g.input("h", DType::F32, {n_embd, 1, t});
        TensorId ids = g.input("ids", DType::I32, {k, t});
        TensorId weights = g.input("weights", DType::F32, {k, t});
        TensorId hot = g.input("hot_map", DType::I32, {E});
        TensorId cold = g.input("cold_map", DType::I32, {E});
        struct Product {
          size_t output;  // index in g.outputs()
          int64_t rows;
          const std::vector<int32_t>* map;
        };
        std::vector<Product> products;
        auto mark = [&](TensorId x, int64_t rows, const std::vector<int32_t>* map) {
          g.mark_output(x);
          if (map) products.push_back({g.outputs().size() - 1, rows, map});
        };
        // gate and up through their maps, down through gate's; glu's and down's zeros are
        // those of a shared map (with two maps, a column one of them skips is zeros too).
        auto experts = [&](const std::string& side, int64_t n, TensorId gate_map,
                           const std::vector<int32_t>& gate_values, TensorId up_map,
                           const std::vector<int32_t>& up_values) {
          TensorId gate =
              g.expert_matmul(g.weight(side + "_gate", d, {n_embd, n_ff, n}), h, ids, gate_map);
          TensorId up =
              g.expert_matmul(g.weight(side + "_up", d, {n_embd, n_ff, n}), h, ids, up_map);
          TensorId glu = g.swiglu(gate, up);
          TensorId down =
              g.expert_matmul(g.weight(side + "_down", d, {n_ff, n_embd, n}), glu, ids, gate_map);
          mark(gate, n_ff, &gate_values);
          mark(up, n_ff, &up_values);
          mark(glu, n_ff, gate_map == up_map ? &gate_values : nullptr);
          mark(down, n_embd, gate_map == up_map ? &gate_values : nullptr);
          return down;
        };
        int64_t fused = 0;
        std::string name;
        if (block == Block::HotAndCold) {
          TensorId hot_out = experts("hot", 3, hot, hot_map, hot, hot_map);
          TensorId cold_out = experts("cold", E, cold, cold_map, cold, cold_map);
          mark(g.moe_combine(g.add(hot_out, cold_out), weights), 0, nullptr);
          fused = 6;
          name = "hot and cold";
        } else if (block == Block::OneMapped) {
          mark(g.moe_combine(experts("cold", E, cold, cold_map, cold, cold_map), weights), 0,
               nullptr);
          fused = 5;
          name = "one mapped block";
        } else {
          mark(g.moe_combine(experts("mixed", E, cold, cold_map, hot, hot_map), weights), 0,
               nullptr);
          fused = 2;
          name = "gate and up of different maps";
        }
        const std::vector<int32_t> chosen = mapped_choices(hot_map, k, t, rng);
        const std::string what = "mapped expert block (" + name + ") " +
                                 std::string(dtype_name(d)) + " t=" + std::to_string(t);
        const auto before = backend->graph_stats();
        const BothOutputs o = run_on_both(
            g, *backend,
            {{ids, ints_bytes(chosen)}, {hot, ints_bytes(hot_map)}, {cold, ints_bytes(cold_map)}});
        const auto after = backend->graph_stats();
        EXPECT_EQ(after.fused_nodes - before.fused_nodes, fused) << what;
        expect_both_close(o, kMatmul, what);
        for (const Product& p : products) {
          const std::string which = what + " output " + std::to_string(p.output);
          expect_skipped_columns_zero(o.cuda[p.output], p.rows, chosen, *p.map, which);
          expect_skipped_columns_zero(o.cuda_segment[p.output], p.rows, chosen, *p.map,
                                      which + " (segment)");
        }
      }
    }
  }
}

// An expert id outside the map (a's matrix 5 exists, the map's expert 5 does not) and a map
// entry past a's matrices are typed errors at synchronize, not reads past the map or the weights,
// on every path: node by node (one warp per row; f16's element-wise kernel; from 8 tokens the
// grouped pairs) and captured (fused gate/up and down/combine). The backend stays usable and the
// next run with valid ids matches the reference.
TEST(CudaOps, MappedExpertIdOutsideTheMapIsAnError) {
  TANDEM_REQUIRE_GPU(backend);
  const int64_t K = 256, M = 64, n = 6, k = 4;
  const std::vector<int32_t> map = {5, -1, 1, 4};  // 4 experts, 6 matrices
  for (auto [d, t] :
       {std::pair{DType::Q4_0, int64_t(1)}, {DType::Q4_0, int64_t(40)}, {DType::F16, int64_t(1)}}) {
    for (bool segment : {false, true}) {
      Graph g;
      TensorId b = g.input("b", DType::F32, {K, 1, t});
      TensorId ids = g.input("ids", DType::I32, {k, t});
      TensorId m = g.input("map", DType::I32, {int64_t(map.size())});
      TensorId weights = g.input("weights", DType::F32, {k, t});
      TensorId gate = g.expert_matmul(g.weight("wg", d, {K, M, n}), b, ids, m);
      TensorId up = g.expert_matmul(g.weight("wu", d, {K, M, n}), b, ids, m);
      TensorId down = g.expert_matmul(g.weight("wd", d, {M, K, n}), g.swiglu(gate, up), ids, m);
      TensorId out = g.moe_combine(down, weights);
      g.mark_output(out);
      const std::string what = "mapped expert block " + std::string(dtype_name(d)) +
                               " t=" + std::to_string(t) + (segment ? " (segment)" : "");
      ReferenceBackend reference;
      GraphRunner ref_run(g, reference), cuda_run(g, *backend);
      std::mt19937 rng(test_seed());
      for (TensorId leaf :
           {b, weights, g.node(gate).inputs[0], g.node(up).inputs[0], g.node(down).inputs[0]}) {
        const Bytes bytes = random_leaf(g.tensor(leaf), rng);
        ref_run.set(leaf, bytes);
        cuda_run.set(leaf, bytes);
      }
      std::vector<int32_t> valid(size_t(k * t));
      for (size_t z = 0; z < valid.size(); ++z) valid[z] = int32_t(z % map.size());
      auto expect_error = [&](const std::vector<int32_t>& bad_ids,
                              const std::vector<int32_t>& bad_map, const std::string& bad) {
        cuda_run.set(ids, ints_bytes(bad_ids));
        cuda_run.set(m, ints_bytes(bad_map));
        try {
          cuda_run.run(segment, g.signature());
          ADD_FAILURE() << what << ": " << bad << " was accepted";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << what << ": " << e.what();
        }
        EXPECT_FALSE(backend->lost()) << what;
      };
      std::vector<int32_t> outside = valid;
      outside.back() = 5;
      expect_error(outside, map, "expert 5 of a 4-expert map");
      std::vector<int32_t> past = map;
      past[2] = int32_t(n);  // expert 2 (chosen by valid) -> matrix 6 of 6
      expect_error(valid, past, "map entry 6 of 6 matrices");
      for (GraphRunner* r : {&ref_run, &cuda_run}) {
        r->set(ids, ints_bytes(valid));
        r->set(m, ints_bytes(map));
      }
      ref_run.run();
      ASSERT_NO_THROW(cuda_run.run(segment, g.signature())) << what;
      const TensorDesc& desc = g.tensor(out);
      EXPECT_LE(nmse(to_floats(desc, ref_run.get(out)), to_floats(desc, cuda_run.get(out))),
                kMatmul)
          << what << ": valid ids after the errors, seed " << test_seed();
    }
  }
}

}  // namespace
}  // namespace tandem::test
