// Every CUDA kernel against the reference backend by NMSE, with fresh random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "cuda_test_util.h"
#include "ops/ops.h"
#include "reference_backend.h"

namespace tandem::test {
namespace {

constexpr double kExact = 1e-7, kSoftmax = 1e-6, kMatmul = 5e-4, kRope = 1e-3;

void expect_close(const Comparison& c, double limit, const std::string& what) {
  ASSERT_FALSE(c.nmse.empty()) << what << ": no outputs";
  for (size_t i = 0; i < c.nmse.size(); ++i) {
    EXPECT_LE(c.nmse[i], limit) << what << " output " << i << " nmse " << c.nmse[i] << " seed "
                                << test_seed();
  }
}

std::vector<int32_t> iota_from(int32_t start, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = start + i;
  return v;
}

TEST(CudaOps, BinaryWithBroadcast) {
  TANDEM_REQUIRE_GPU(backend);
  for (auto [bshape, name] : std::vector<std::pair<std::vector<int64_t>, const char*>>{
           {{37, 5, 3}, "same"}, {{37}, "row"}, {{37, 1, 3}, "general"}, {{1, 5, 1}, "column"}}) {
    Graph g;
    TensorId a = g.input("a", DType::F32, {37, 5, 3});
    TensorId b = bshape.size() == 1 ? g.input("b", DType::F32, {bshape[0]})
                                    : g.input("b", DType::F32, {bshape[0], bshape[1], bshape[2]});
    g.mark_output(g.add(a, b));
    g.mark_output(g.mul(a, b));
    expect_close(compare_with_reference(g, *backend), kExact, name);
  }
}

TEST(CudaOps, UnaryAndSwiGlu) {
  TANDEM_REQUIRE_GPU(backend);
  Graph g;
  TensorId x = g.input("x", DType::F32, {1000, 3});
  TensorId u = g.input("u", DType::F32, {1000, 3});
  g.mark_output(g.scale(x, -2.5f));
  g.mark_output(g.silu(x));
  g.mark_output(g.gelu(x));
  g.mark_output(g.swiglu(x, u));
  expect_close(compare_with_reference(g, *backend), kExact, "unary");
}

TEST(CudaOps, SoftmaxWithAndWithoutMask) {
  TANDEM_REQUIRE_GPU(backend);
  for (int64_t n : {1, 33, 1000, 5000}) {
    Graph g;
    TensorId x = g.input("x", DType::F32, {n, 6, 2});
    TensorId mask = g.input("mask", DType::F32, {n, 6});
    g.mark_output(g.softmax(x));
    g.mark_output(g.softmax(x, mask, 0.125f));
    expect_close(compare_with_reference(g, *backend), kSoftmax, "softmax n=" + std::to_string(n));
  }
}

TEST(CudaOps, Norms) {
  TANDEM_REQUIRE_GPU(backend);
  for (int64_t n : {37, 4096}) {
    Graph g;
    TensorId x = g.input("x", DType::F32, {n, 5});
    TensorId w = g.weight("w", DType::F32, {n});
    TensorId b = g.weight("b", DType::F32, {n});
    g.mark_output(g.rms_norm(x, w, 1e-5f));
    g.mark_output(g.rms_norm(x, kNoTensor, 1e-6f));
    g.mark_output(g.layer_norm(x, w, b, 1e-5f));
    g.mark_output(g.layer_norm(x, kNoTensor, kNoTensor, 1e-5f));
    expect_close(compare_with_reference(g, *backend), kExact, "norm n=" + std::to_string(n));
  }
}

TEST(CudaOps, Rope) {
  TANDEM_REQUIRE_GPU(backend);
  for (int n_rot : {128, 64}) {
    Graph g;
    TensorId x = g.input("x", DType::F32, {128, 8, 5});
    TensorId pos = g.input("pos", DType::I32, {5});
    g.mark_output(g.rope(x, pos, n_rot, 500000.0f));
    expect_close(compare_with_reference(g, *backend, {{pos, ints_bytes({0, 1, 77, 4000, 8191})}}),
                 kRope, "rope n_rot=" + std::to_string(n_rot));
  }
}

TEST(CudaOps, GetRowsEveryTableType) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    Graph g;
    TensorId table = g.weight("table", d, {96, 11});
    TensorId ids = g.input("ids", DType::I32, {4});
    g.mark_output(g.get_rows(table, ids));
    expect_close(compare_with_reference(g, *backend, {{ids, ints_bytes({10, 0, 3, 3})}}), kExact,
                 std::string("get_rows ") + std::string(dtype_name(d)));
  }
}

TEST(CudaOps, CopyCastQuantizeDequantize) {
  TANDEM_REQUIRE_GPU(backend);
  const DType floats[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
  for (DType from : floats)
    for (DType to : floats) {
      Graph g;
      TensorId x = g.input("x", from, {64, 7});
      g.mark_output(g.copy(x, to));
      expect_close(compare_with_reference(g, *backend), kExact,
                   "copy " + std::string(dtype_name(from)) + "->" + std::string(dtype_name(to)));
    }
  {
    Graph g;  // strided input (transposed view)
    TensorId x = g.input("x", DType::F32, {13, 9, 2});
    g.mark_output(g.copy(g.transpose(x), DType::F32));
    g.mark_output(g.copy(g.permute(x, {2, 0, 1, 3}), DType::F16));
    expect_close(compare_with_reference(g, *backend), kExact, "strided copy");
  }
  {
    Graph g;
    TensorId x = g.input("x", DType::I32, {5, 3});
    TensorId y = g.input("y", DType::I8, {5, 3});
    g.mark_output(g.copy(g.transpose(x), DType::I32));
    g.mark_output(g.copy(y, DType::I8));
    expect_close(compare_with_reference(g, *backend), 0.0, "integer copy");
  }
  for (DType d : {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16}) {
    Graph g;
    TensorId x = g.weight("x", d, {96, 5});
    g.mark_output(g.dequantize(x));
    expect_close(compare_with_reference(g, *backend), kExact,
                 "dequantize " + std::string(dtype_name(d)));
  }
}

TEST(CudaOps, MatMulEveryWeightType) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    for (auto [k, m, n] : {std::tuple{64, 48, 1}, {256, 300, 17}, {1000, 33, 64}}) {
      Graph g;
      TensorId a = g.weight("a", d, {k, m});
      TensorId b = g.input("b", DType::F32, {k, n});
      g.mark_output(g.matmul(a, b));
      expect_close(compare_with_reference(g, *backend), kMatmul,
                   "matmul " + std::string(dtype_name(d)) + " " + std::to_string(k) + "x" +
                       std::to_string(m) + "x" + std::to_string(n));
    }
    Graph g;  // batched, with a broadcast over b's batch
    TensorId a = g.weight("a", d, {64, 40, 2});
    TensorId b = g.input("b", DType::F32, {64, 5, 4});
    TensorId a1 = g.weight("a1", d, {64, 40});
    g.mark_output(g.matmul(a, b));
    g.mark_output(g.matmul(a1, b));
    expect_close(compare_with_reference(g, *backend), kMatmul,
                 "batched matmul " + std::string(dtype_name(d)));
  }
}

// Matrix-vector products of one b run as one launch inside a segment (Q, K, V; gate and up);
// the run stops at three, at another b, another K or dtype, and where the layout rules it out.
TEST(CudaOps, FusedMatvecsShareOneLaunch) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::Q4_0, DType::Q8_0}) {
    for (int64_t n : {1, 3}) {
      Graph g;
      TensorId x = g.input("x", DType::F32, {512, n});
      TensorId y = g.input("y", DType::F32, {512, n});
      TensorId z = g.input("z", DType::F32, {96, n});
      g.mark_output(g.matmul(g.weight("wq", d, {512, 300}), x));
      g.mark_output(g.matmul(g.weight("wk", d, {512, 77}), x));
      g.mark_output(g.matmul(g.weight("wv", d, {512, 77}), x));
      g.mark_output(g.matmul(g.weight("w4", d, {512, 130}), x));  // a fourth: a new run
      g.mark_output(g.matmul(g.weight("wg", d, {512, 1000}), y));
      g.mark_output(g.matmul(g.weight("wu", d, {512, 1000}), y));
      g.mark_output(g.matmul(g.weight("wz", d, {96, 40}), z));  // generic kernel
      g.mark_output(g.matmul(g.weight("wz2", d, {96, 40}), z));
      const std::string what =
          "fused matvecs " + std::string(dtype_name(d)) + " n=" + std::to_string(n);
      expect_close(compare_with_reference(g, *backend, {}, /*as_segment=*/true), kMatmul, what);
      expect_close(compare_with_reference(g, *backend, {}, /*as_segment=*/false), kMatmul, what);
    }
  }
}

// K-quant matrix-vector products of one b share its quantization and run one launch per run of
// equal dtype (a Q4_K_M layer mixes Q4_K and Q6_K); K of 2, 8 and 9 super-blocks (the kernel
// loads 8 at a time).
TEST(CudaOps, FusedKQuantMatvecsShareOneQuantization) {
  TANDEM_REQUIRE_GPU(backend);
  for (int64_t k : {512, 2048, 2304}) {
    for (int64_t n : {1, 3}) {
      Graph g;
      TensorId x = g.input("x", DType::F32, {k, n});
      TensorId y = g.input("y", DType::F32, {k, n});
      g.mark_output(g.matmul(g.weight("wq", DType::Q4_K, {k, 300}), x));
      g.mark_output(g.matmul(g.weight("wk", DType::Q6_K, {k, 77}), x));  // a new dtype run
      g.mark_output(g.matmul(g.weight("wv", DType::Q4_K, {k, 77}), x));
      g.mark_output(g.matmul(g.weight("w4", DType::Q4_K, {k, 130}), x));  // a fourth: a new group
      g.mark_output(g.matmul(g.weight("wg", DType::Q5_K, {k, 1000}), y));
      g.mark_output(g.matmul(g.weight("wu", DType::Q5_K, {k, 1000}), y));
      const std::string what =
          "fused K-quant matvecs k=" + std::to_string(k) + " n=" + std::to_string(n);
      expect_close(compare_with_reference(g, *backend, {}, /*as_segment=*/true), kMatmul, what);
      expect_close(compare_with_reference(g, *backend, {}, /*as_segment=*/false), kMatmul, what);
    }
  }
}

// f32 / f16 / bf16 weights: 1 to 8 columns of b with K a multiple of 256 take the streaming
// matrix-vector kernel (f32 b), the rest (K = 96, 9 columns) cuBLAS on tensor cores.
// K of 4096 and more: two or four warps share a row (8704: two, an odd row count leaves a
// block's second row empty).
TEST(CudaOps, HalfMatMulMatvecAndTensorCorePaths) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    for (auto [k, m, n] : {std::tuple{256, 129, 1},
                           {2048, 2048, 1},
                           {4096, 1000, 3},
                           {2304, 77, 8},
                           {14336, 300, 1},
                           {8192, 2048, 1},
                           {8704, 131, 2},
                           {96, 50, 2},
                           {512, 200, 9}}) {
      Graph g;
      TensorId a = g.weight("a", d, {k, m});
      TensorId b = g.input("b", DType::F32, {k, n});
      g.mark_output(g.matmul(a, b));
      const std::string what = "matmul " + std::string(dtype_name(d)) + " " + std::to_string(k) +
                               "x" + std::to_string(m) + "x" + std::to_string(n);
      expect_close(compare_with_reference(g, *backend), kMatmul, what);
      expect_close(compare_with_reference(g, *backend, {}, /*as_segment=*/true), kMatmul, what);
    }
  }
}

// f16 / bf16 products of the same b in a segment: Q, K and V as one launch, then gate and up
// with the SwiGLU of their outputs as one launch that writes all three.
TEST(CudaOps, FusedHalfMatvecsAndGateUpSwiGlu) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t n : {1, 3}) {
      Graph g;
      TensorId x = g.input("x", DType::F32, {512, n});
      TensorId y = g.input("y", DType::F32, {768, n});
      g.mark_output(g.matmul(g.weight("wq", d, {512, 300}), x));
      g.mark_output(g.matmul(g.weight("wk", d, {512, 77}), x));
      g.mark_output(g.matmul(g.weight("wv", d, {512, 77}), x));
      TensorId gate = g.matmul(g.weight("wg", d, {768, 1000}), y);
      TensorId up = g.matmul(g.weight("wu", d, {768, 1000}), y);
      g.mark_output(gate);
      g.mark_output(up);
      g.mark_output(g.swiglu(gate, up));
      const std::string what =
          "fused half matvecs " + std::string(dtype_name(d)) + " n=" + std::to_string(n);
      const auto before = backend->graph_stats();
      expect_close(compare_with_reference(g, *backend, {}, /*as_segment=*/true), kMatmul, what);
      const auto after = backend->graph_stats();
      EXPECT_EQ(after.fused_launches - before.fused_launches, 2) << what;
      EXPECT_EQ(after.fused_nodes - before.fused_nodes, 6) << what;
      expect_close(compare_with_reference(g, *backend, {}, /*as_segment=*/false), kMatmul, what);
    }
  }
}

// ExpertMatMul with quantized weights: one product per (token, choice) for a few tokens, the
// pairs grouped by expert (each expert's rows read once per tile of pairs) from 8 tokens on;
// b with one column per token or one per choice; every (token, choice) checked against the
// reference, with experts chosen unevenly (a hot expert gets more pairs than one tile holds).
// M = 200 leaves the tensor-core kernel's last block with a partial warp and a warp past M.
TEST(CudaOps, ExpertMatMulPerPairAndGrouped) {
  TANDEM_REQUIRE_GPU(backend);
  std::mt19937 rng(test_seed());
  for (DType d : {DType::Q4_0, DType::Q8_0, DType::Q4_K}) {
    for (int64_t t : {1, 3, 8, 37, 100}) {
      for (int64_t b_cols : {1, 4}) {
        // K = 480 (15 blocks) takes the tensor-core kernel that reads global memory directly,
        // K = 512 the one that stages chunks of 8 blocks in shared memory.
        for (int64_t K : {512, 480}) {
          if (is_k_quant(d) && K % 256 != 0) continue;
          const int64_t M = 200, E = 6, k = 4;
          Graph g;
          TensorId a = g.weight("a", d, {K, M, E});
          TensorId b = g.input("b", DType::F32, {K, b_cols, t});
          TensorId ids = g.input("ids", DType::I32, {k, t});
          g.mark_output(g.expert_matmul(a, b, ids));
          std::vector<int32_t> chosen;
          for (int64_t i = 0; i < t; ++i) {
            // k distinct experts, expert 0 in most tokens
            std::vector<int32_t> e{0, 1, 2, 3, 4, 5};
            std::shuffle(e.begin() + (i % 3 == 0 ? 0 : 1), e.end(), rng);
            chosen.insert(chosen.end(), e.begin(), e.begin() + k);
          }
          const std::string what = "expert_matmul " + std::string(dtype_name(d)) +
                                   " t=" + std::to_string(t) + " b_cols=" + std::to_string(b_cols) +
                                   " K=" + std::to_string(K);
          for (bool segment : {false, true}) {
            expect_close(compare_with_reference(g, *backend, {{ids, ints_bytes(chosen)}}, segment),
                         kMatmul, what);
          }
        }
      }
    }
  }
}

// A MoE layer's gate and up ExpertMatMul of one b and one set of ids, then the SwiGLU of their
// outputs: one launch in a captured segment (fewer than 8 tokens), writing all three outputs.
TEST(CudaOps, FusedExpertGateUpSwiGlu) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::Q4_0, DType::Q4_K}) {
    for (int64_t t : {1, 3}) {
      const int64_t K = 512, M = 160, E = 5, k = 2;
      Graph g;
      TensorId wg = g.weight("wg", d, {K, M, E});
      TensorId wu = g.weight("wu", d, {K, M, E});
      TensorId b = g.input("b", DType::F32, {K, 1, t});
      TensorId ids = g.input("ids", DType::I32, {k, t});
      TensorId gate = g.expert_matmul(wg, b, ids);
      TensorId up = g.expert_matmul(wu, b, ids);
      g.mark_output(gate);
      g.mark_output(up);
      g.mark_output(g.swiglu(gate, up));
      std::vector<int32_t> chosen;
      for (int64_t i = 0; i < t; ++i) {
        chosen.push_back(int32_t((3 * i) % E));
        chosen.push_back(int32_t((3 * i + 2) % E));
      }
      const std::string what =
          "fused expert gate/up " + std::string(dtype_name(d)) + " t=" + std::to_string(t);
      const auto before = backend->graph_stats();
      expect_close(compare_with_reference(g, *backend, {{ids, ints_bytes(chosen)}}, true), kMatmul,
                   what);
      const auto after = backend->graph_stats();
      EXPECT_EQ(after.fused_nodes - before.fused_nodes, 3) << what;
      expect_close(compare_with_reference(g, *backend, {{ids, ints_bytes(chosen)}}, false), kMatmul,
                   what);
    }
  }
}

// A MoE layer's down ExpertMatMul (b one column per choice) and the MoeCombine of its output:
// one launch in a captured segment, both outputs as the reference's.
TEST(CudaOps, FusedExpertDownCombine) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::Q4_0, DType::Q8_0, DType::Q4_K}) {
    for (int64_t t : {1, 3}) {
      const int64_t K = 512, M = 160, E = 5, k = 2;
      Graph g;
      TensorId wd = g.weight("wd", d, {K, M, E});
      TensorId b = g.input("b", DType::F32, {K, k, t});
      TensorId ids = g.input("ids", DType::I32, {k, t});
      TensorId weights = g.input("weights", DType::F32, {k, t});
      TensorId experts = g.expert_matmul(wd, b, ids);
      g.mark_output(experts);
      g.mark_output(g.moe_combine(experts, weights));
      std::vector<int32_t> chosen;
      for (int64_t i = 0; i < t; ++i) {
        chosen.push_back(int32_t((2 * i + 1) % E));
        chosen.push_back(int32_t((2 * i + 4) % E));
      }
      const std::string what =
          "fused expert down/combine " + std::string(dtype_name(d)) + " t=" + std::to_string(t);
      const auto before = backend->graph_stats();
      expect_close(compare_with_reference(g, *backend, {{ids, ints_bytes(chosen)}}, true), kMatmul,
                   what);
      const auto after = backend->graph_stats();
      EXPECT_EQ(after.fused_nodes - before.fused_nodes, 2) << what;
      expect_close(compare_with_reference(g, *backend, {{ids, ints_bytes(chosen)}}, false), kMatmul,
                   what);
    }
  }
}

// MoeRoute and the MoeWeights of its ids: one launch in a captured segment; ids exact, weights
// as the reference's (over all experts, or normalized over the chosen).
TEST(CudaOps, FusedMoeRouteAndWeights) {
  TANDEM_REQUIRE_GPU(backend);
  for (auto [experts, t, k] : {std::tuple{10, 3, 4}, {128, 1, 8}, {64, 9, 2}}) {
    for (bool normalize : {false, true}) {
      Graph g;
      TensorId logits = g.input("logits", DType::F32, {experts, t});
      TensorId ids = g.moe_route(logits, int32_t(k));
      g.mark_output(ids);
      g.mark_output(g.moe_weights(logits, ids, normalize));
      const std::string what = "moe route + weights " + std::to_string(experts) + "x" +
                               std::to_string(t) + " k=" + std::to_string(k);
      const auto before = backend->graph_stats();
      const Comparison c = compare_with_reference(g, *backend, {}, /*as_segment=*/true);
      const auto after = backend->graph_stats();
      ASSERT_EQ(c.nmse.size(), 2u);
      EXPECT_EQ(c.nmse[0], 0.0) << what << ": ids";
      EXPECT_LE(c.nmse[1], kSoftmax) << what << ": weights";
      EXPECT_EQ(after.fused_nodes - before.fused_nodes, 2) << what;
    }
  }
}

// Each K x M weight matrix of dtype d times a K x N b, against the reference.
void expect_quantized_products(Backend& backend, DType d,
                               std::initializer_list<std::array<int64_t, 3>> shapes) {
  for (const auto& [k, m, n] : shapes) {
    Graph g;
    TensorId a = g.weight("a", d, {k, m});
    TensorId b = g.input("b", DType::F32, {k, n});
    g.mark_output(g.matmul(a, b));
    expect_close(compare_with_reference(g, backend), kMatmul,
                 "quantized matmul " + std::string(dtype_name(d)) + " " + std::to_string(k) + "x" +
                     std::to_string(m) + "x" + std::to_string(n));
  }
}

TEST(CudaOps, QuantizedMatMulMatvecAndTensorCorePaths) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::Q4_0, DType::Q8_0}) {
    // K % 256 == 0 takes the staged matrix-vector kernel (one or several rows per tile, one
    // or several groups per thread; 2048x69000 and Q8_0's 4096x14336: more tiles per block than
    // its partial buffers hold, so the block adds row sums more than once); K = 96 and a K too
    // large for its shared memory take the generic one; 9 to 32 columns slices of up to 8; more
    // the GEMM.
    expect_quantized_products(*backend, d,
                              {{256, 129, 1},
                               {4096, 14336, 1},
                               {2048, 69000, 1},
                               {4096, 64, 3},
                               {2048, 37, 8},
                               {14336, 300, 1},
                               {11008, 77, 4},
                               {4096, 2000, 2},
                               {81920, 9, 1},
                               {65536, 40, 8},
                               {96, 50, 2},
                               {512, 200, 9},
                               {4096, 300, 16},
                               {2048, 77, 27},
                               {96, 40, 20},
                               {1024, 256, 64}});
    Graph g;  // batched b over one weight matrix (generic and staged kernels)
    TensorId a = g.weight("a", d, {128, 24});
    TensorId b = g.input("b", DType::F32, {128, 2, 3});
    g.mark_output(g.matmul(a, b));
    TensorId a2 = g.weight("a2", d, {512, 24});
    TensorId b2 = g.input("b2", DType::F32, {512, 2, 3});
    g.mark_output(g.matmul(a2, b2));
    expect_close(compare_with_reference(g, *backend), kMatmul, "batched quantized matvec");
  }
}

// K-quant weights: K a multiple of 256 (of 2,048 for Q6_K, whose 210-byte rows must fill 16-byte
// copies) takes the staged kernel, with one or several rows per tile and 1 to 8 columns; K =
// 4608 (18 super-blocks) and 256 leave Q6_K to the generic one; 9 columns slice. Rows of 8,192 or
// more take bulk tile copies for Q5_K and Q6_K; 8192x4400 gives each CTA more tiles than its ring
// has slots (every mbarrier passes a phase twice).
TEST(CudaOps, KQuantMatvecStagedAndGenericPaths) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : kKQuantDTypes) {
    expect_quantized_products(*backend, d,
                              {{256, 129, 1},
                               {2048, 37, 8},
                               {4096, 300, 1},
                               {4096, 64, 3},
                               {14336, 64, 1},
                               {8192, 4400, 1},
                               {2048, 2000, 2},
                               {4608, 40, 1},
                               {512, 200, 9}});
  }
}

// A product of a few outputs multiplies f32 b: with 8-bit b a single dot product of 32 terms misses
// the bound in ~10% of random draws, so 64 draws each would all but surely catch an int8 path.
TEST(CudaOps, QuantizedMatMulWithFewOutputsIsExact) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::Q4_0, DType::Q8_0}) {
    for (auto [k, m, n] : {std::tuple{32, 1, 1}, {256, 3, 5}, {64, 1, 9}}) {  // 9: past matvec
      std::mt19937 rng(test_seed());
      for (int draw = 0; draw < 64; ++draw) {
        Graph g;
        TensorId a = g.weight("a", d, {k, m}), b = g.input("b", DType::F32, {k, n});
        g.mark_output(g.matmul(a, b));
        const std::map<TensorId, Bytes> leaves{{a, random_leaf(g.tensor(a), rng)},
                                               {b, random_leaf(g.tensor(b), rng)}};
        expect_close(compare_with_reference(g, *backend, leaves), kMatmul,
                     "few outputs " + std::string(dtype_name(d)) + " " + std::to_string(k) + "x" +
                         std::to_string(m) + "x" + std::to_string(n));
      }
    }
  }
}

void attention_case(CudaBackend& backend, DType cache, int64_t d, int64_t hq, int64_t hkv,
                    int64_t ctx, std::vector<int32_t> positions) {
  const auto t = int64_t(positions.size());
  Graph g;
  TensorId q = g.input("q", DType::F32, {d, hq, t});
  TensorId k = g.kv_cache("k", cache, {d, hkv, ctx});
  TensorId v = g.kv_cache("v", cache, {d, hkv, ctx});
  TensorId pos = g.input("pos", DType::I32, {t});
  g.mark_output(g.attention(q, k, v, pos, 1.0f / std::sqrt(float(d))));
  expect_close(compare_with_reference(g, backend, {{pos, ints_bytes(positions)}}), kMatmul,
               "attention " + std::string(dtype_name(cache)) + " D=" + std::to_string(d) +
                   " Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) +
                   " C=" + std::to_string(ctx) + " T=" + std::to_string(t));
}

TEST(CudaOps, AttentionPrefillAndDecode) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType cache : {DType::F32, DType::F16}) {
    attention_case(*backend, cache, 64, 8, 2, 16, iota_from(0, 7));  // prefill
    attention_case(*backend, cache, 128, 32, 8, 1000, {999});        // split decode
    attention_case(*backend, cache, 128, 32, 8, 4096, {17});         // short context
    // 128 keys run whole in one block per head, 129 split (both kernels, one launch).
    attention_case(*backend, cache, 64, 32, 8, 600, {127, 128});
    attention_case(*backend, cache, 128, 32, 8, 600, {127, 128});
    attention_case(*backend, cache, 80, 24, 2, 300, {5, 299, 150});        // odd dim, group 12
    attention_case(*backend, cache, 32, 4, 4, 2048, iota_from(1000, 40));  // MHA, long prefill
    attention_case(*backend, cache, 256, 16, 4, 64, {63, 0});              // largest dim
    // Head dim 128 over an f16 cache takes the decode kernel (up to 8 tokens).
    attention_case(*backend, cache, 128, 8, 1, 4096, {4000});         // 32 splits, 2 slices
    attention_case(*backend, cache, 128, 12, 1, 300, {5, 299, 150});  // group 12
    attention_case(*backend, cache, 128, 3, 1, 20000, {19999, 640});  // group 3, long slices
    attention_case(*backend, cache, 128, 4, 4, 500, {0, 1, 63, 64, 65, 499, 250, 7});  // 8 tokens
    attention_case(*backend, cache, 128, 16, 2, 700, iota_from(600, 9));  // 9 tokens: general
  }
}

TEST(CudaOps, DecodeAttentionReplayedWithNewPositions) {
  TANDEM_REQUIRE_GPU(backend);
  // A captured decode step replayed at other positions, whole contexts and split ones: the
  // split counters must be re-armed, and a position past the cache is a typed error that leaves the
  // next step intact.
  const int64_t d = 128, hq = 32, hkv = 8, ctx = 2048;
  Graph g;
  TensorId q = g.input("q", DType::F32, {d, hq, 1});
  TensorId k = g.kv_cache("k", DType::F16, {d, hkv, ctx});
  TensorId v = g.kv_cache("v", DType::F16, {d, hkv, ctx});
  TensorId pos = g.input("pos", DType::I32, {1});
  TensorId out = g.attention(q, k, v, pos, 1.0f / std::sqrt(float(d)));
  g.mark_output(out);
  PositionReplay replay(g, *backend, pos);
  for (int32_t p : {2047, 100, 1500, 0, 127, 128}) replay.step(p, {out}, kMatmul);
  replay.expect_rejected(int32_t(ctx));
  replay.step(777, {out}, kMatmul);
}

TEST(CudaOps, KvWriteThenAttention) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType cache : {DType::F32, DType::F16}) {
    Graph g;
    TensorId k = g.kv_cache("k", cache, {64, 2, 32});
    TensorId v = g.kv_cache("v", cache, {64, 2, 32});
    TensorId src_k = g.input("src_k", DType::F32, {64, 2, 3});
    TensorId src_v = g.input("src_v", DType::F32, {64, 2, 3});
    TensorId q = g.input("q", DType::F32, {64, 4, 3});
    TensorId pos = g.input("pos", DType::I32, {3});
    TensorId k2 = g.kv_write(k, src_k, pos);
    TensorId v2 = g.kv_write(v, src_v, pos);
    g.mark_output(k2);
    g.mark_output(g.attention(q, k2, v2, pos, 0.125f));
    for (bool segment : {false, true}) {
      expect_close(compare_with_reference(g, *backend, {{pos, ints_bytes({20, 21, 22})}}, segment),
                   kMatmul, std::string("kv_write ") + std::string(dtype_name(cache)));
    }
  }
}

// The small ops of a decode layer in the order the llama graph emits them: the residual Add and
// the RmsNorm of its sum, then RoPE of Q and K and the cache writes of K and V. A captured
// segment runs each group as one launch (graph_stats counts them), with the results of the
// separate kernels; one token (decode) and several (prefill), both cache dtypes, a row length
// that is no multiple of the block.
TEST(CudaOps, FusedAddRmsNormAndRopeKvWrite) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType cache : {DType::F16, DType::F32}) {
    for (int64_t t : {1, 5}) {
      for (int64_t dim : {4096, 300}) {
        const int64_t hd = 64, hq = 4, hkv = 2, ctx = 40;
        Graph g;
        TensorId x = g.input("x", DType::F32, {dim, t});
        TensorId r = g.input("r", DType::F32, {dim, t});
        TensorId w = g.weight("w", DType::F32, {dim});
        TensorId q = g.input("q", DType::F32, {hd, hq, t});
        TensorId k = g.input("k", DType::F32, {hd, hkv, t});
        TensorId v = g.input("v", DType::F32, {hd, hkv, t});
        TensorId pos = g.input("pos", DType::I32, {t});
        TensorId kc = g.kv_cache("kc", cache, {hd, hkv, ctx});
        TensorId vc = g.kv_cache("vc", cache, {hd, hkv, ctx});
        TensorId s = g.add(x, r);
        g.mark_output(s);
        g.mark_output(g.rms_norm(s, w, 1e-5f));
        TensorId qr = g.rope(q, pos, int32_t(hd), 500000.0f);
        TensorId kr = g.rope(k, pos, int32_t(hd), 500000.0f);
        g.mark_output(qr);
        g.mark_output(kr);
        g.mark_output(g.kv_write(kc, kr, pos));
        g.mark_output(g.kv_write(vc, v, pos));
        std::vector<int32_t> positions;
        for (int64_t i = 0; i < t; ++i) positions.push_back(int32_t(31 + i));
        const std::string what = "fused small ops, cache " + std::string(dtype_name(cache)) +
                                 " t=" + std::to_string(t) + " dim=" + std::to_string(dim);
        const auto before = backend->graph_stats();
        const Comparison fused = compare_with_reference(g, *backend, {{pos, ints_bytes(positions)}},
                                                        /*as_segment=*/true);
        const auto after = backend->graph_stats();
        EXPECT_EQ(after.fused_launches - before.fused_launches, 2) << what;
        EXPECT_EQ(after.fused_nodes - before.fused_nodes, 6) << what;
        ASSERT_EQ(fused.nmse.size(), 6u);
        EXPECT_LE(fused.nmse[0], kExact) << what << ": add";
        EXPECT_LE(fused.nmse[1], kExact) << what << ": rms_norm";
        for (size_t i = 2; i < 6; ++i) EXPECT_LE(fused.nmse[i], kRope) << what << ": output " << i;
      }
    }
  }
}

// A residual Add (or none), the RmsNorm of its sum and the one-column products of the norm's
// output (Q, K, V; gate, up): one launch of the staged kernel (quantized weights) or of the
// streaming kernel (f16, bf16), which makes b itself and writes the sum and the normed vector
// too. Two columns: the Add with its norm, then the products.
TEST(CudaOps, FusedAddRmsNormIntoMatvecs) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F16, DType::BF16}) {
    for (int64_t dim : {2048, 4096}) {
      for (bool with_add : {true, false}) {
        for (int64_t t : {1, 2}) {
          Graph g;
          TensorId x = g.input("x", DType::F32, {dim, t});
          TensorId r = g.input("r", DType::F32, {dim, t});
          TensorId s = with_add ? g.add(x, r) : x;
          if (with_add) g.mark_output(s);
          TensorId h = g.rms_norm(s, g.weight("w", DType::F32, {dim}), 1e-5f);
          g.mark_output(h);
          const int parts = with_add ? 3 : 2;  // Q, K, V or gate, up
          for (int p = 0; p < parts; ++p) {
            const int64_t rows = p == 0 ? 512 : with_add ? 128 : 512;
            g.mark_output(g.matmul(g.weight("w" + std::to_string(p), d, {dim, rows}), h));
          }
          const std::string what = "add + rms_norm + matvecs " + std::string(dtype_name(d)) +
                                   " dim=" + std::to_string(dim) + (with_add ? " add" : "") +
                                   " t=" + std::to_string(t);
          const auto before = backend->graph_stats();
          const Comparison fused = compare_with_reference(g, *backend, {}, /*as_segment=*/true);
          const auto after = backend->graph_stats();
          const int64_t nodes = parts + 1 + with_add;
          EXPECT_EQ(after.fused_launches - before.fused_launches, t == 1 || !with_add ? 1 : 2)
              << what;
          EXPECT_EQ(after.fused_nodes - before.fused_nodes, t == 1 || with_add ? nodes : parts)
              << what;
          ASSERT_EQ(fused.nmse.size(), size_t(nodes));
          for (size_t i = 0; i < size_t(nodes - parts); ++i) {
            EXPECT_LE(fused.nmse[i], kExact) << what << ": output " << i;
          }
          for (size_t i = size_t(nodes - parts); i < size_t(nodes); ++i) {
            EXPECT_LE(fused.nmse[i], kMatmul) << what << ": output " << i;
          }
          expect_close(compare_with_reference(g, *backend, {}, /*as_segment=*/false), kMatmul,
                       what);
        }
      }
    }
  }
}

// Gate and up of one column and the SwiGlu of their outputs (after the Add and its norm, or
// alone): the staged kernel's CTAs take the same rows of both and write the GLU too. Two
// columns: the products fuse, the SwiGlu runs alone. f16 weights (the streaming kernel): the
// same in one launch with the norm for one column; for two, the Add and its norm, then gate, up
// and the SwiGlu in one launch.
TEST(CudaOps, FusedGateUpSwiGlu) {
  TANDEM_REQUIRE_GPU(backend);
  for (DType d : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F16}) {
    for (bool norm : {true, false}) {
      for (int64_t t : {1, 2}) {
        const int64_t dim = 2048, ff = 1000;
        Graph g;
        TensorId x = g.input("x", DType::F32, {dim, t});
        TensorId h = x;
        if (norm) {
          TensorId s = g.add(x, g.input("r", DType::F32, {dim, t}));
          h = g.rms_norm(s, g.weight("w", DType::F32, {dim}), 1e-5f);
          g.mark_output(s);
          g.mark_output(h);
        }
        TensorId gate = g.matmul(g.weight("wg", d, {dim, ff}), h);
        TensorId up = g.matmul(g.weight("wu", d, {dim, ff}), h);
        g.mark_output(gate);
        g.mark_output(up);
        g.mark_output(g.swiglu(gate, up));
        const std::string what = "gate/up + swiglu " + std::string(dtype_name(d)) +
                                 (norm ? " norm" : "") + " t=" + std::to_string(t);
        const auto before = backend->graph_stats();
        expect_close(compare_with_reference(g, *backend, {}, /*as_segment=*/true), kMatmul, what);
        const auto after = backend->graph_stats();
        EXPECT_EQ(after.fused_launches - before.fused_launches, t == 2 && norm ? 2 : 1) << what;
        const bool half = d == DType::F16;  // its GLU launch takes any number of columns
        EXPECT_EQ(after.fused_nodes - before.fused_nodes,
                  t == 1 || half ? (norm ? 5 : 3) : (norm ? 4 : 2))
            << what;
        expect_close(compare_with_reference(g, *backend, {}, /*as_segment=*/false), kMatmul, what);
      }
    }
  }
}

TEST(CudaOps, TransformerBlockAsOneSegment) {
  TANDEM_REQUIRE_GPU(backend);
  // A small decode block with every op family, run as one captured segment twice.
  const int64_t dim = 256, ff = 512, hd = 64, hq = 4, hkv = 2, ctx = 64, t = 2;
  Graph g;
  TensorId ids = g.input("ids", DType::I32, {t});
  TensorId pos = g.input("pos", DType::I32, {t});
  TensorId emb = g.weight("emb", DType::Q8_0, {dim, 10});
  TensorId wq = g.weight("wq", DType::Q4_0, {dim, hq * hd});
  TensorId wk = g.weight("wk", DType::Q4_0, {dim, hkv * hd});
  TensorId wv = g.weight("wv", DType::F16, {dim, hkv * hd});
  TensorId wg = g.weight("wg", DType::Q8_0, {dim, ff});
  TensorId wu = g.weight("wu", DType::Q8_0, {dim, ff});
  TensorId wd = g.weight("wd", DType::BF16, {ff, dim});
  TensorId norm = g.weight("norm", DType::F32, {dim});
  TensorId kc = g.kv_cache("kc", DType::F16, {hd, hkv, ctx});
  TensorId vc = g.kv_cache("vc", DType::F16, {hd, hkv, ctx});
  TensorId x = g.get_rows(emb, ids);
  TensorId h = g.rms_norm(x, norm, 1e-5f);
  TensorId qh = g.rope(g.reshape(g.matmul(wq, h), {hd, hq, t}), pos, hd, 10000.0f);
  TensorId kh = g.rope(g.reshape(g.matmul(wk, h), {hd, hkv, t}), pos, hd, 10000.0f);
  TensorId vh = g.reshape(g.matmul(wv, h), {hd, hkv, t});
  TensorId k2 = g.kv_write(kc, kh, pos);
  TensorId v2 = g.kv_write(vc, vh, pos);
  TensorId att = g.reshape(g.attention(qh, k2, v2, pos, 0.125f), {dim, t});
  TensorId x2 = g.add(x, att);
  TensorId h2 = g.rms_norm(x2, norm, 1e-5f);
  TensorId f = g.matmul(wd, g.swiglu(g.matmul(wg, h2), g.matmul(wu, h2)));
  g.mark_output(g.add(x2, f));
  // Q and K weights a quarter the size of the others. With all weights in [-1, 1] the logits
  // spread ~28, the softmax is all but an argmax, and the int8 rounding of the matrix-vector
  // kernels' input moves weight between near-tied keys: block NMSE up to 6e-3 (9 of 40 seeds
  // over the limit, H100). A quarter gives logits of spread ~2.
  std::mt19937 rng(test_seed());
  auto quarter_scale = [&](TensorId id) {
    const TensorDesc& d = g.tensor(id);
    std::uniform_real_distribution<float> dist(-0.25f, 0.25f);
    std::vector<float> v(static_cast<size_t>(d.elements()));
    for (float& e : v) e = dist(rng);
    Bytes out(d.bytes());
    from_f32(d.dtype, v.data(), out.data(), d.elements());
    return out;
  };
  const std::map<TensorId, Bytes> fixed = {{ids, ints_bytes({3, 7})},
                                           {pos, ints_bytes({30, 31})},
                                           {wq, quarter_scale(wq)},
                                           {wk, quarter_scale(wk)}};
  for (int rep = 0; rep < 2; ++rep) {
    expect_close(compare_with_reference(g, *backend, fixed, true), kMatmul, "block");
  }
}

// Each family file adds its own rows and ops/dispatch.cpp lists the families: a family missing
// from the list leaves its ops undeclared. The rows exist without a GPU, so this always runs.
TEST(CudaKernelRows, DeclareEveryComputeOp) {
  const std::vector<OpCapability>& rows = cuda::kernel_table().capabilities();
  for (int i = 0; i < kOpKindCount; ++i) {
    const auto op = OpKind(i);
    bool declared = false;
    for (const OpCapability& row : rows) declared |= row.op == op;
    EXPECT_EQ(declared, is_compute(op)) << op_name(op);
  }
}

}  // namespace
}  // namespace tandem::test
