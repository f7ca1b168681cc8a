// LLaMA graphs end to end: synthetic tiny models run through the scheduler and executor on every
// backend (alone and mixed) and must match the reference backend; decode after prefill must
// equal a longer prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "llama_util.h"
#include "tandem/error.h"
#include "tandem/model/synthetic.h"
#include "tandem/registry.h"
#include "tandem/runtime.h"

namespace tandem {
namespace {

using test::nmse;

std::string model_path(DType dtype) {
  static std::map<DType, std::string> paths;
  auto it = paths.find(dtype);
  if (it != paths.end()) return it->second;
  const auto& dir = test::process_temp_dir("tandem_llama_test_");
  std::string path = (dir / ("tiny_" + std::string(dtype_name(dtype)) + ".gguf")).string();
  SyntheticSpec spec = synthetic_preset("tiny", dtype, 7);
  spec.threads = 1;
  write_synthetic_model(spec, path);
  return paths[dtype] = path;
}

std::vector<int32_t> random_tokens(int n, int64_t n_vocab) {
  std::random_device rd;
  std::mt19937 rng(rd());
  std::uniform_int_distribution<int32_t> d(0, int32_t(n_vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

std::vector<float> all_logits(const std::string& path, const std::string& strategy,
                              std::span<const int32_t> tokens, std::vector<TensorPin> pins = {}) {
  Session e(test::options(path, strategy, std::move(pins)));
  auto l = e.eval(tokens, true);
  return {l.begin(), l.end()};
}

// Measured on the CPU backend (2026-11-21): f32/f16 ~4e-14; q8_0/q4_0 0.8e-4 to 1.5e-4, from
// quantizing activations to 8 bits on the fast path. Each run prints its "[ measured ]" NMSE.
double tolerance(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F16 ? 1e-5 : 1e-3;
}

struct Case {
  DType dtype;
  std::string strategy;
};

class LlamaLogits : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaLogits, MatchesTheReferenceBackend) {
  const Case& c = GetParam();
  if (c.strategy.rfind("only:", 0) == 0) {
    auto ids = available_backend_ids();
    if (std::find(ids.begin(), ids.end(), c.strategy.substr(5)) == ids.end()) {
      GTEST_SKIP() << "backend " << c.strategy.substr(5) << " is not available here";
    }
  }
  std::string path = model_path(c.dtype);
  auto tokens = random_tokens(9, 512);
  auto ref = all_logits(path, "only:reference", tokens);
  auto got = all_logits(path, c.strategy, tokens);
  ASSERT_EQ(ref.size(), got.size());
  double e = nmse(ref, got);
  std::printf("[ measured ] %s %s nmse %.3g\n", std::string(dtype_name(c.dtype)).c_str(),
              c.strategy.c_str(), e);
  EXPECT_LE(e, tolerance(c.dtype)) << c.strategy;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType d : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
    for (std::string s : {"only:cpu", "only:cuda:0", "gpu", "auto", "cpu"}) out.push_back({d, s});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Tiny, LlamaLogits, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           std::string s = std::string(dtype_name(param_info.param.dtype)) + "_" +
                                           param_info.param.strategy;
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s;
                         });

// A tiny model in each K-quant file type (rows of 256, so no tensor falls back; layer 1 of 2
// is a use_more_bits layer, so the medium mixes hold Q6_K next to Q4_K or Q5_K).
std::string k_quant_model_path(DType dtype, SyntheticMix mix) {
  static std::map<DType, std::string> paths;
  auto it = paths.find(dtype);
  if (it != paths.end()) return it->second;
  const auto& dir = test::process_temp_dir("tandem_llama_test_");
  std::string path = (dir / ("tiny_" + std::string(dtype_name(dtype)) + ".gguf")).string();
  SyntheticSpec spec = synthetic_preset("tiny", dtype, 11, mix);
  spec.n_embd = 256;
  spec.n_ff = 512;
  spec.threads = 1;
  write_synthetic_model(spec, path);
  return paths[dtype] = path;
}

TEST(LlamaKQuants, LogitsOfEveryBackendMatchTheReference) {
  std::vector<std::string> strategies{"only:cpu", "gpu"};
  const auto ids = available_backend_ids();
  if (std::find(ids.begin(), ids.end(), "cuda:0") != ids.end()) strategies.push_back("only:cuda:0");
  for (auto [dtype, mix] : {std::pair{DType::Q4_K, SyntheticMix::KQuantMedium},
                            std::pair{DType::Q5_K, SyntheticMix::KQuantMedium},
                            std::pair{DType::Q6_K, SyntheticMix::Pure}}) {
    std::string path = k_quant_model_path(dtype, mix);
    auto tokens = random_tokens(9, 512);
    auto ref = all_logits(path, "only:reference", tokens);
    for (const std::string& strategy : strategies) {
      auto got = all_logits(path, strategy, tokens);
      ASSERT_EQ(ref.size(), got.size());
      const double e = nmse(ref, got);
      std::printf("[ measured ] %s %s nmse %.3g\n", std::string(dtype_name(dtype)).c_str(),
                  strategy.c_str(), e);
      EXPECT_LE(e, tolerance(dtype)) << dtype_name(dtype) << " " << strategy;
    }
  }
}

TEST(LlamaMixed, LayersSplitAcrossBackendsMatchTheReference) {
  // Layer 1 pinned to the reference, everything else on the default placement: the hidden
  // state crosses backends twice per step and the result must not change.
  std::string path = model_path(DType::F32);
  auto tokens = random_tokens(6, 512);
  auto ref = all_logits(path, "only:reference", tokens);
  auto got = all_logits(path, "gpu", tokens, {{"blk\\.1\\..*", "reference"}});
  EXPECT_LE(nmse(ref, got), 1e-5);
}

TEST(LlamaDecode, DecodeAfterPrefillEqualsLongerPrefill) {
  for (const std::string strategy : {"only:reference", "gpu"}) {
    std::string path = model_path(DType::F32);
    auto tokens = random_tokens(8, 512);
    SessionOptions o;
    o.model_path = path;
    o.strategy = strategy;
    o.n_ctx = 64;
    o.kv_dtype = DType::F32;
    Session full(o);
    auto all = full.eval(tokens, true);
    const size_t V = 512;
    std::vector<float> last_full(all.end() - V, all.end());

    Session step(o);
    step.eval(std::span<const int32_t>(tokens.data(), tokens.size() - 1));
    auto dec = step.eval(std::span<const int32_t>(&tokens.back(), 1));
    EXPECT_LE(nmse(last_full, dec), 1e-6) << strategy;
    // And the second-to-last position of the prefill equals a prefill one token shorter.
    Session shorter(o);
    auto s = shorter.eval(std::span<const int32_t>(tokens.data(), tokens.size() - 1));
    std::vector<float> prev(all.end() - 2 * V, all.end() - V);
    EXPECT_LE(nmse(prev, s), 1e-6) << strategy;
  }
}

TEST(LlamaEngine, RejectsBadInput) {
  std::string path = model_path(DType::F32);
  SessionOptions o;
  o.model_path = path;
  o.strategy = "cpu";
  o.n_ctx = 8;
  Session e(o);
  std::vector<int32_t> bad{600};
  EXPECT_THROW(e.eval(bad), Error);
  std::vector<int32_t> too_long(9, 1);
  EXPECT_THROW(e.eval(too_long), Error);
  std::vector<int32_t> ok(8, 1);
  EXPECT_NO_THROW(e.eval(ok));
  EXPECT_THROW(e.eval(std::vector<int32_t>{1}), Error);  // context full
  o.model_path = path + ".missing";
  try {
    Session missing(o);
    FAIL() << "a missing file must throw";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::Io);
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// -ngl says where weights live: later layers' weights stay in host memory (read there, or
// streamed to a GPU for a batch), earlier layers' are uploaded.
TEST(LlamaMixed, NGpuLayersKeepsLaterLayersWeightsInHostMemory) {
  std::string path = model_path(DType::Q8_0);
  auto tokens = random_tokens(5, 512);
  SessionOptions o;
  o.model_path = path;
  o.strategy = "gpu";
  o.n_ctx = 32;
  o.kv_dtype = DType::F32;
  o.n_gpu_layers = 1;
  Session e(o);
  auto got = e.eval(tokens, true);
  auto ref = all_logits(path, "only:reference", tokens);
  EXPECT_LE(nmse(ref, std::vector<float>(got.begin(), got.end())), 1e-3);
  const Graph& g = *e.last_graph();
  const Placement& p = *e.last_placement();
  bool has_gpu = false;
  for (const auto& id : available_backend_ids()) has_gpu = has_gpu || id.rfind("cuda:", 0) == 0;
  for (const Node& n : g.nodes()) {
    if (!is_compute(n.op)) continue;
    for (TensorId in : n.inputs) {
      const std::string& name = g.tensor(g.storage_of(in)).name;
      const std::string& where = p.at(n.id).backend->backend_id();
      if (name.rfind("blk.1.", 0) == 0 || name == "token_embd.weight") {
        EXPECT_FALSE(e.executor().residency().contains(where, name)) << name << " on " << where;
        const auto& streamed = p.at(n.id).streamed;
        const bool is_streamed =
            std::find(streamed.begin(), streamed.end(), g.storage_of(in)) != streamed.end();
        EXPECT_TRUE(where == "cpu" || is_streamed) << op_name(n.op) << " reading " << name;
      }
      if (name.rfind("blk.0.", 0) == 0) {
        // No -ngl pin to the CPU may catch layer 0 (pins are regex searches); with several
        // GPUs, the layer split's pins place it on one of them.
        EXPECT_FALSE(p.at(n.id).reason.kind == SelectionReason::Kind::UserPreference &&
                     where.rfind("cuda:", 0) != 0)
            << op_name(n.op) << " reading " << name << ": " << p.at(n.id).reason.to_string();
      }
      if (has_gpu && name.rfind("blk.0.", 0) == 0) {
        EXPECT_EQ(where.rfind("cuda:", 0), 0u) << op_name(n.op) << " reading " << name;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
