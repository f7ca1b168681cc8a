// Every op family of the CPU backend against the reference, for every kernel set this CPU
// runs (scalar, AVX2, AVX-512, AVX-512 VNNI) and for 1 and 3 threads, over odd shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "amx.h"
#include "cpu_features.h"
#include "op_compare.h"
#include "reference_backend.h"
#include "tandem/error.h"

namespace tandem::cpu::cpu_test {
namespace {

constexpr double kExact = 1e-7, kSoftmax = 1e-6, kMatMul = 5e-4, kRope = 1e-3;

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  auto add = [&](std::string name, std::function<TensorId(Graph&)> build, double threshold,
                 int32_t int_max = 1, bool increasing = false) {
    cases.push_back({std::move(name), std::move(build), threshold, int_max, increasing});
  };
  // Copy / Cast / quantize / dequantize.
  const DType convertible[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
  for (DType from : convertible)
    for (DType to : convertible) {
      add(
          "copy_" + std::string(dtype_name(from)) + "_" + std::string(dtype_name(to)),
          [=](Graph& g) {
            return g.copy(g.input("a", from, {64, 7, 2}), to);
          },
          kExact);
    }
  add(
      "copy_f32_transposed",
      [](Graph& g) {
        return g.copy(g.transpose(g.input("a", DType::F32, {13, 9})), DType::F32);
      },
      kExact);
  add(
      "copy_f16_permuted_to_f32",
      [](Graph& g) {
        return g.copy(g.permute(g.input("a", DType::F16, {5, 6, 7}), {2, 0, 1, 3}), DType::F32);
      },
      kExact);
  add(
      "copy_i32_transposed",
      [](Graph& g) {
        return g.copy(g.transpose(g.input("a", DType::I32, {5, 11})), DType::I32);
      },
      kExact, 1000);
  add(
      "copy_i8",
      [](Graph& g) {
        return g.copy(g.input("a", DType::I8, {33, 3}), DType::I8);
      },
      kExact);
  for (DType d : {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16}) {
    add(
        "dequantize_" + std::string(dtype_name(d)),
        [=](Graph& g) {
          return g.dequantize(g.weight("w", d, {96, 5}));
        },
        kExact);
  }
  for (DType d : convertible) {
    add(
        "get_rows_" + std::string(dtype_name(d)),
        [=](Graph& g) {
          return g.get_rows(g.weight("t", d, {64, 50}), g.input("ids", DType::I32, {9}));
        },
        kExact, 50);
  }
  // MatMul: odd sizes, the matrix-vector path, the tiled path, the OpenBLAS path, batches.
  struct Mm {
    int64_t k, m, n, a2, b2;
  };
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    for (Mm s : {Mm{33, 7, 5, 1, 1}, Mm{256, 67, 1, 1, 1}, Mm{64, 9, 2, 1, 1},
                 Mm{128, 130, 40, 1, 1}, Mm{48, 8, 6, 1, 3}, Mm{32, 12, 4, 2, 2}}) {
      add(
          "matmul_" + std::string(dtype_name(d)) + "_" + std::to_string(s.k) + "x" +
              std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.b2),
          [=](Graph& g) {
            return g.matmul(g.weight("a", d, {s.k, s.m, s.a2}),
                            g.input("b", DType::F32, {s.k, s.n, s.b2}));
          },
          kMatMul);
    }
  }
  for (DType d : {DType::Q8_0, DType::Q4_0}) {
    for (Mm s : {Mm{32, 1, 1, 1, 1}, Mm{64, 5, 1, 1, 1}, Mm{96, 7, 3, 1, 1}, Mm{64, 17, 1, 1, 1},
                 Mm{64, 4, 4, 1, 1}, Mm{256, 67, 5, 1, 1}, Mm{512, 130, 33, 1, 1},
                 Mm{160, 9, 70, 1, 1}, Mm{64, 8, 4, 2, 2}}) {
      add(
          "qmatmul_" + std::string(dtype_name(d)) + "_" + std::to_string(s.k) + "x" +
              std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.b2),
          [=](Graph& g) {
            return g.matmul(g.weight("a", d, {s.k, s.m, s.a2}),
                            g.input("b", DType::F32, {s.k, s.n, s.b2}));
          },
          kMatMul);
    }
  }
  // Elementwise.
  for (bool is_add : {true, false}) {
    const std::string op = is_add ? "add" : "mul";
    auto make = [is_add](Graph& g, TensorId a, TensorId b) {
      return is_add ? g.add(a, b) : g.mul(a, b);
    };
    add(
        op + "_same",
        [=](Graph& g) {
          return make(g, g.input("a", DType::F32, {37, 5, 3}),
                      g.input("b", DType::F32, {37, 5, 3}));
        },
        kExact);
    add(
        op + "_row_broadcast",
        [=](Graph& g) {
          return make(g, g.input("a", DType::F32, {37, 5, 3}), g.input("b", DType::F32, {37}));
        },
        kExact);
    add(
        op + "_column_broadcast",
        [=](Graph& g) {
          return make(g, g.input("a", DType::F32, {16, 4, 3}), g.input("b", DType::F32, {1, 4, 1}));
        },
        kExact);
    add(
        op + "_inner_repeat",
        [=](Graph& g) {
          return make(g, g.input("a", DType::F32, {24, 4, 3}), g.input("b", DType::F32, {8, 1, 3}));
        },
        kExact);
  }
  add(
      "scale",
      [](Graph& g) {
        return g.scale(g.input("x", DType::F32, {1000, 3}), -0.37f);
      },
      kExact);
  add(
      "silu",
      [](Graph& g) {
        return g.silu(g.input("x", DType::F32, {20000, 2}));
      },
      kExact);
  add(
      "gelu",
      [](Graph& g) {
        return g.gelu(g.input("x", DType::F32, {1001, 3}));
      },
      kExact);
  add(
      "swiglu",
      [](Graph& g) {
        return g.swiglu(g.input("g", DType::F32, {513, 2}), g.input("u", DType::F32, {513, 2}));
      },
      kExact);
  // Softmax, norms, RoPE.
  add(
      "softmax",
      [](Graph& g) {
        return g.softmax(g.input("x", DType::F32, {70, 6}));
      },
      kSoftmax);
  add(
      "softmax_mask_scale",
      [](Graph& g) {
        return g.softmax(g.input("x", DType::F32, {70, 6, 2}), g.input("m", DType::F32, {70, 8}),
                         0.5f);
      },
      kSoftmax);
  add(
      "rms_norm_w",
      [](Graph& g) {
        return g.rms_norm(g.input("x", DType::F32, {4096, 3}), g.weight("w", DType::F32, {4096}),
                          1e-5f);
      },
      kExact);
  add(
      "rms_norm",
      [](Graph& g) {
        return g.rms_norm(g.input("x", DType::F32, {31, 5}), kNoTensor, 1e-6f);
      },
      kExact);
  add(
      "layer_norm_wb",
      [](Graph& g) {
        return g.layer_norm(g.input("x", DType::F32, {300, 4}), g.weight("w", DType::F32, {300}),
                            g.weight("b", DType::F32, {300}), 1e-5f);
      },
      kExact);
  add(
      "layer_norm",
      [](Graph& g) {
        return g.layer_norm(g.input("x", DType::F32, {45, 2}), kNoTensor, kNoTensor, 1e-5f);
      },
      kExact);
  add(
      "rope_full",
      [](Graph& g) {
        return g.rope(g.input("x", DType::F32, {64, 4, 5}), g.input("p", DType::I32, {5}), 64,
                      10000.0f);
      },
      kRope, 4096);
  add(
      "rope_partial",
      [](Graph& g) {
        return g.rope(g.input("x", DType::F32, {128, 3, 2}), g.input("p", DType::I32, {2}), 32,
                      500000.0f);
      },
      kRope, 100000);
  add(
      "rope_neox_partial",
      [](Graph& g) {
        return g.rope_neox(g.input("x", DType::F32, {128, 3, 2}), g.input("p", DType::I32, {2}), 64,
                           1000000.0f);
      },
      kRope, 100000);
  // Mixture of experts: routing, weights, the expert products in every weight type (ids drawn
  // at random over 6 experts, repeats included) and the combine.
  add(
      "moe_route",
      [](Graph& g) {
        return g.moe_route(g.input("l", DType::F32, {16, 9}), 3);
      },
      kExact);
  for (bool normalize : {false, true}) {
    add(
        std::string("moe_weights") + (normalize ? "_normalized" : ""),
        [=](Graph& g) {
          return g.moe_weights(g.input("l", DType::F32, {16, 9}), g.input("i", DType::I32, {3, 9}),
                               normalize);
        },
        kSoftmax, 16);
  }
  for (DType d :
       {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    const int64_t K = is_k_quant(d) ? 256 : 96;
    add(
        "expert_matmul_" + std::string(dtype_name(d)),
        [=](Graph& g) {
          return g.expert_matmul(g.weight("a", d, {K, 33, 6}), g.input("b", DType::F32, {K, 1, 7}),
                                 g.input("i", DType::I32, {2, 7}));
        },
        kMatMul, 6);
  }
  for (DType d : {DType::Q4_0, DType::Q8_0}) {
    add(  // decode: one token, every choice reads its one column (quantized once); ids repeat
        "expert_matmul_one_token_" + std::string(dtype_name(d)),
        [=](Graph& g) {
          return g.expert_matmul(g.weight("a", d, {96, 40, 6}),
                                 g.input("b", DType::F32, {96, 1, 1}),
                                 g.input("i", DType::I32, {5, 1}));
        },
        kMatMul, 6);
  }
  add(
      "expert_matmul_column_per_choice",
      [](Graph& g) {
        return g.expert_matmul(g.weight("a", DType::Q8_0, {64, 20, 4}),
                               g.input("b", DType::F32, {64, 3, 5}),
                               g.input("i", DType::I32, {3, 5}));
      },
      kMatMul, 4);
  add(
      "moe_combine",
      [](Graph& g) {
        return g.moe_combine(g.input("x", DType::F32, {70, 3, 5}),
                             g.input("w", DType::F32, {3, 5}));
      },
      kExact);
  // Attention over f32 and f16 caches, prefill (several tokens) and decode (one, long).
  for (DType kv : {DType::F32, DType::F16}) {
    const std::string t(dtype_name(kv));
    add(
        "attention_prefill_" + t,
        [=](Graph& g) {
          return g.attention(g.input("q", DType::F32, {64, 8, 3}),
                             g.kv_cache("k", kv, {64, 2, 100}), g.kv_cache("v", kv, {64, 2, 100}),
                             g.input("p", DType::I32, {3}), 0.125f);
        },
        kMatMul, 100, true);
    add(
        "attention_decode_" + t,
        [=](Graph& g) {
          return g.attention(g.input("q", DType::F32, {128, 4, 1}),
                             g.kv_cache("k", kv, {128, 4, 300}), g.kv_cache("v", kv, {128, 4, 300}),
                             g.input("p", DType::I32, {1}), 0.088f);
        },
        kMatMul, 300);
    add(  // under 256 keys: one chunk, normalized in place without the merge pass
        "attention_decode_short_" + t,
        [=](Graph& g) {
          return g.attention(g.input("q", DType::F32, {64, 8, 1}),
                             g.kv_cache("k", kv, {64, 2, 200}), g.kv_cache("v", kv, {64, 2, 200}),
                             g.input("p", DType::I32, {1}), 0.125f);
        },
        kMatMul, 200);
    add(
        "kv_write_" + t,
        [=](Graph& g) {
          return g.kv_write(g.kv_cache("c", kv, {64, 2, 50}), g.input("s", DType::F32, {64, 2, 3}),
                            g.input("p", DType::I32, {3}));
        },
        kExact, 50, true);
  }
  add(
      "attention_chunks_random_positions",
      [](Graph& g) {
        return g.attention(
            g.input("q", DType::F32, {32, 2, 4}), g.kv_cache("k", DType::F16, {32, 1, 1000}),
            g.kv_cache("v", DType::F16, {32, 1, 1000}), g.input("p", DType::I32, {4}), 0.2f);
      },
      kMatMul, 1000);
  add(
      "attention_chunks_f32_odd_dim",
      [](Graph& g) {
        return g.attention(
            g.input("q", DType::F32, {72, 6, 2}), g.kv_cache("k", DType::F32, {72, 3, 700}),
            g.kv_cache("v", DType::F32, {72, 3, 700}), g.input("p", DType::I32, {2}), 0.1f);
      },
      kMatMul, 700);
  add(
      "kv_write_repeated_positions",
      [](Graph& g) {
        return g.kv_write(g.kv_cache("c", DType::F32, {8, 1, 4}),
                          g.input("s", DType::F32, {8, 1, 40}), g.input("p", DType::I32, {40}));
      },
      kExact, 4);
  return cases;
}

struct Config {
  Isa isa;
  int threads;
};

class CpuOps : public ::testing::TestWithParam<Config> {};

TEST_P(CpuOps, MatchReference) {
  const Config cfg = GetParam();
  if (int(cfg.isa) > int(best_isa())) GTEST_SKIP() << "this CPU lacks " << isa_name(cfg.isa);
  CpuBackend cpu(cfg.threads, cfg.isa);
  cpu.set_blas_policy(BlasPolicy::Auto);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const OpCase& c : all_cases()) {
    const double nmse = compare_with_reference(cpu, c, seed);
    EXPECT_LE(nmse, c.threshold) << c.name << " nmse " << nmse;
  }
}

TEST_P(CpuOps, OwnF32KernelsMatchReference) {
  const Config cfg = GetParam();
  if (int(cfg.isa) > int(best_isa())) GTEST_SKIP() << "this CPU lacks " << isa_name(cfg.isa);
  CpuBackend cpu(cfg.threads, cfg.isa);
  cpu.set_blas_policy(BlasPolicy::Never);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const OpCase& c : all_cases()) {
    if (c.name.rfind("matmul_f32", 0) != 0) continue;
    const double nmse = compare_with_reference(cpu, c, seed);
    EXPECT_LE(nmse, c.threshold) << c.name << " nmse " << nmse;
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, CpuOps,
                         ::testing::Values(Config{Isa::Scalar, 1}, Config{Isa::Scalar, 3},
                                           Config{Isa::Avx2, 1}, Config{Isa::Avx2, 3},
                                           Config{Isa::Avx512, 1}, Config{Isa::Avx512, 3},
                                           Config{Isa::Avx512Vnni, 1}, Config{Isa::Avx512Vnni, 3}),
                         [](const ::testing::TestParamInfo<Config>& param_info) {
                           return std::string(isa_name(param_info.param.isa)) + "_t" +
                                  std::to_string(param_info.param.threads);
                         });

TEST(CpuOpsAmx, QuantizedMatMulMatchesReference) {
  if (!amx::amx_usable()) GTEST_SKIP() << "no AMX-INT8 on this CPU or OS";
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  struct Shape {
    int64_t k, m, n;
  };
  for (int threads : {1, 3}) {
    CpuBackend cpu(threads);
    cpu.set_amx(true);
    for (DType d : {DType::Q4_0, DType::Q8_0})
      for (Shape s : {Shape{32, 16, 16}, Shape{160, 37, 20}, Shape{256, 48, 16}, Shape{96, 33, 40},
                      Shape{1024, 64, 65}}) {
        OpCase c{
            "amx_qmatmul_" + std::string(dtype_name(d)) + "_" + std::to_string(s.k) + "x" +
                std::to_string(s.m) + "x" + std::to_string(s.n),
            [=](Graph& g) {
              return g.matmul(g.weight("a", d, {s.k, s.m}), g.input("b", DType::F32, {s.k, s.n}));
            },
            kMatMul};
        const double nmse = compare_with_reference(cpu, c, seed);
        EXPECT_LE(nmse, kMatMul) << c.name << " threads " << threads;
      }
  }
}

TEST(CpuOpsAmx, CanBeSwitchedOff) {
  CpuBackend cpu(1);
  cpu.set_amx(false);
  EXPECT_FALSE(cpu.amx());
  if (!amx::amx_usable()) {
    EXPECT_THROW(cpu.set_amx(true), Error);
  }
}

// The cos/sin table is reused while positions, n_rot and base are the same: calls that change
// one of them (or repeat them exactly) must each still match the reference.
TEST(CpuOpsRope, TableFollowsPositionsAndParameters) {
  CpuBackend cpu(3);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto rope_case = [](int32_t n_rot, float base, bool neox, int64_t tokens = 4) {
    return OpCase{"rope",
                  [=](Graph& g) {
                    TensorId x = g.input("x", DType::F32, {128, 3, tokens});
                    TensorId p = g.input("p", DType::I32, {tokens});
                    return neox ? g.rope_neox(x, p, n_rot, base) : g.rope(x, p, n_rot, base);
                  },
                  kRope, 100000};
  };
  const OpCase cases[] = {rope_case(64, 10000.0f, false),
                          rope_case(64, 10000.0f, false),
                          rope_case(64, 500000.0f, false),
                          rope_case(32, 500000.0f, false),
                          rope_case(32, 500000.0f, true),
                          rope_case(64, 500000.0f, false, 300)};  // a table over several tasks
  for (const OpCase& c : cases)
    for (uint32_t s : {seed, seed + 1, seed + 1, seed}) {
      EXPECT_LE(compare_with_reference(cpu, c, s), kRope) << s;
    }
}

// execute_segment runs consecutive quantized products of one input as one pool job: every
// output must have the bits of the same node run alone and match the reference; a product the
// group cannot take (too few outputs for 8-bit activations) ends it, and so do outputs that
// share memory.
TEST(CpuOpsGroup, SharedInputProductsMatchOneByOne) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  constexpr int64_t K = 96;
  for (int threads : {1, 3})
    for (int64_t n : {1, 3}) {
      CpuBackend cpu(threads);
      Graph g;
      const TensorId x = g.input("x", DType::F32, {K, n});
      const std::pair<DType, int64_t> weights[] = {
          {DType::Q4_0, 37}, {DType::Q8_0, 16}, {DType::Q4_0, 22}, {DType::Q4_0, 6}};
      std::vector<TensorId> ids;
      std::vector<std::vector<uint8_t>> data;  // per tensor id
      data.resize(64);
      auto fill = [&](TensorId id) {
        const TensorDesc& d = g.tensor(id);
        std::vector<float> v(static_cast<size_t>(d.elements()));
        for (float& f : v) f = dist(rng);
        data[size_t(id)].resize(d.bytes());
        for (int64_t r = 0; r < d.rows(); ++r)
          from_f32(d.dtype, v.data() + r * d.ne[0], data[size_t(id)].data() + r * d.nb[1], d.ne[0]);
      };
      fill(x);
      for (auto [dt, m] : weights) {
        const TensorId w = g.weight("w" + std::to_string(ids.size()), dt, {K, m});
        fill(w);
        ids.push_back(g.matmul(w, x));
      }
      auto run = [&](bool segment, bool reference) {
        std::vector<std::vector<uint8_t>> outs;
        std::vector<NodeExecution> execs;
        for (TensorId y : ids) outs.emplace_back(g.tensor(y).bytes());
        for (size_t i = 0; i < ids.size(); ++i) {
          execs.push_back(execution_of(g, g.node(ids[i]), [&](TensorId t) -> void* {
            return t == ids[i] ? outs[i].data() : data[size_t(t)].data();
          }));
        }
        const OpContext ctx{cpu.pool(), kernels_for(cpu.isa())};
        EXPECT_EQ(quantized_matmul_group_size(ctx, execs), n == 1 ? 3u : 4u);
        if (reference) {
          for (const NodeExecution& e : execs) reference_execute(g, e);
        } else if (segment) {
          cpu.execute_segment(g, execs, 0);
        } else {
          for (const NodeExecution& e : execs) cpu.execute(g, e);
        }
        // An output inside another's memory, or inside the input, ends the group there.
        execs[1].output.data = execs[0].output.data;
        EXPECT_EQ(quantized_matmul_group_size(ctx, execs), 1u);
        execs[1].output.data = outs[1].data();
        execs[0].output.data = data[size_t(x)].data();
        EXPECT_EQ(quantized_matmul_group_size(ctx, execs), 1u);
        return outs;
      };
      const auto grouped = run(true, false), alone = run(false, false), ref = run(false, true);
      for (size_t i = 0; i < ids.size(); ++i) {
        SCOPED_TRACE("threads " + std::to_string(threads) + " n " + std::to_string(n) +
                     " product " + std::to_string(i));
        EXPECT_EQ(grouped[i], alone[i]);
        EXPECT_LE(nmse_f32(ref[i], grouped[i]), kMatMul);
      }
    }
}

TEST(CpuOpsErrors, BadPositionsAndIdsThrow) {
  CpuBackend cpu(2);
  Graph g;
  const TensorId att =
      g.attention(g.input("q", DType::F32, {16, 2, 1}), g.kv_cache("k", DType::F32, {16, 2, 8}),
                  g.kv_cache("v", DType::F32, {16, 2, 8}), g.input("p", DType::I32, {1}), 0.25f);
  std::vector<float> q(32, 0.5f), kv(256, 0.5f), out(32);
  int32_t pos = 8;  // one past the cache
  NodeExecution e{&g.node(att),
                  {{&g.tensor(0), q.data()},
                   {&g.tensor(1), kv.data()},
                   {&g.tensor(2), kv.data()},
                   {&g.tensor(3), &pos}},
                  {&g.tensor(att), out.data()}};
  EXPECT_THROW(cpu.execute(g, e), Error);
  Graph g2;
  const TensorId rows =
      g2.get_rows(g2.weight("t", DType::F32, {4, 3}), g2.input("i", DType::I32, {1}));
  std::vector<float> table(12), row(4);
  int32_t id = -1;
  NodeExecution e2{&g2.node(rows),
                   {{&g2.tensor(0), table.data()}, {&g2.tensor(1), &id}},
                   {&g2.tensor(rows), row.data()}};
  EXPECT_THROW(cpu.execute(g2, e2), Error);
}

TEST(CpuOpsErrors, RefusesWhatItDoesNotDeclare) {
  CpuBackend cpu(1);
  Graph g;
  const TensorId a = g.input("a", DType::F32, {8});
  g.reshape(a, {2, 4});
  EXPECT_FALSE(cpu.can_execute(g, g.node(1)));  // metadata ops never run on a backend
  for (const OpCapability& cap : cpu.capabilities()) EXPECT_TRUE(is_compute(cap.op));
}

// Each family file adds its own rows and ops/registry.cpp lists the families: a family missing
// from the list leaves its ops undeclared, which this catches.
TEST(CpuOpsTable, DeclaresEveryComputeOp) {
  CpuBackend cpu(1);
  for (int i = 0; i < kOpKindCount; ++i) {
    const auto op = OpKind(i);
    bool declared = false;
    for (const OpCapability& row : cpu.capabilities()) declared |= row.op == op;
    EXPECT_EQ(declared, is_compute(op)) << op_name(op);
  }
}

}  // namespace
}  // namespace tandem::cpu::cpu_test
