// The engine's multi-GPU setup over fake GPUs: which GPUs take part, their budgets, and the pins
// that split the layers (by -ts, by budget, under -ngl), checked before any model is loaded.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "gpu_setup.h"
#include "tandem/error.h"
#include "test_backends.h"

namespace tandem::cli {
namespace {

constexpr int kLayers = 32;

std::vector<std::shared_ptr<Backend>> cpu_and_two_gpus() {
  return {test::make_cpu(), test::make_gpu("gpu0"), test::make_gpu("gpu1")};
}

// The backend the setup's pins give a tensor ("" when none matches).
std::string pinned(const GpuSetup& s, const std::string& name) {
  for (const TensorPin& p : s.pins) {
    if (std::regex_search(name, std::regex(p.pattern))) return p.backend_id;
  }
  return "";
}

// The first layer pinned to gpu1 (kLayers when none).
int first_on_gpu1(const GpuSetup& s) {
  for (int l = 0; l < kLayers; ++l) {
    if (pinned(s, "blk." + std::to_string(l) + ".attn_q.weight") == "gpu1") return l;
  }
  return kLayers;
}

GpuSetup setup(std::vector<std::shared_ptr<Backend>>& backends, const SessionOptions& o,
               const std::string& strategy = "gpu") {
  return setup_gpus(backends, o, Strategy::parse(strategy), kLayers);
}

TEST(GpuSetup, SplitsLayersByTensorSplitWithCachesAndOutput) {
  auto backends = cpu_and_two_gpus();
  SessionOptions o;
  o.tensor_split = {3, 1};
  GpuSetup s = setup(backends, o);
  EXPECT_TRUE(s.layers_split);
  EXPECT_EQ(first_on_gpu1(s), 24);
  EXPECT_EQ(pinned(s, "blk.0.ffn_up.weight"), "gpu0");
  EXPECT_EQ(pinned(s, "cache_k.23"), "gpu0");
  EXPECT_EQ(pinned(s, "cache_v.24"), "gpu1");
  EXPECT_EQ(pinned(s, "blk.31.ffn_down.weight"), "gpu1");
  EXPECT_EQ(pinned(s, "output.weight"), "gpu1");
  EXPECT_EQ(pinned(s, "output_norm.weight"), "gpu1");
  EXPECT_EQ(pinned(s, "token_embd.weight"), "");
  EXPECT_TRUE(s.budgets.empty());
  EXPECT_EQ(backends.size(), 3u);
}

TEST(GpuSetup, DefaultSplitFollowsPerGpuBudgets) {
  auto backends = cpu_and_two_gpus();
  SessionOptions o;
  o.gpu_memory_by_id = {{"gpu0", uint64_t(10) << 30}, {"gpu1", uint64_t(30) << 30}};
  GpuSetup s = setup(backends, o);
  EXPECT_EQ(first_on_gpu1(s), 8);
  ASSERT_EQ(s.budgets.size(), 2u);
  EXPECT_EQ(s.budgets[0], std::make_pair(std::string("gpu0"), uint64_t(10) << 30));
  EXPECT_EQ(s.budgets[1], std::make_pair(std::string("gpu1"), uint64_t(30) << 30));
  // One size for every GPU, one GPU overridden.
  o.gpu_memory = uint64_t(4) << 30;
  o.gpu_memory_by_id = {{"gpu1", uint64_t(12) << 30}};
  s = setup(backends, o);
  EXPECT_EQ(first_on_gpu1(s), 8);
  ASSERT_EQ(s.budgets.size(), 2u);
  EXPECT_EQ(s.budgets[0].second, uint64_t(4) << 30);
  // Unknown ids are refused, naming the flag.
  o.gpu_memory_by_id = {{"gpu7", 1}};
  try {
    setup(backends, o);
    FAIL() << "an unknown GPU id must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--gpu-mem"), std::string::npos) << e.what();
  }
}

TEST(GpuSetup, NglSplitsOnlyTheGpuLayers) {
  auto backends = cpu_and_two_gpus();
  SessionOptions o;
  o.n_gpu_layers = 10;
  GpuSetup s = setup(backends, o);
  EXPECT_EQ(first_on_gpu1(s), 5);
  EXPECT_EQ(pinned(s, "blk.9.attn_q.weight"), "gpu1");
  EXPECT_EQ(pinned(s, "blk.10.attn_q.weight"), "");  // -ngl's own pins send it to the CPU
  EXPECT_EQ(pinned(s, "output.weight"), "");
  // Under the automatic strategy the split needs -ngl; the CPU strategy never splits.
  EXPECT_TRUE(setup(backends, o, "auto").layers_split);
  EXPECT_FALSE(setup(backends, o, "cpu").layers_split);
  o.n_gpu_layers.reset();
  EXPECT_FALSE(setup(backends, o, "auto").layers_split);
  EXPECT_TRUE(setup(backends, o, "auto").pins.empty());
}

TEST(GpuSetup, SplitModeNoneKeepsTheFirstGpuOnly) {
  auto backends = cpu_and_two_gpus();
  SessionOptions o;
  o.single_gpu = true;
  GpuSetup s = setup(backends, o);
  EXPECT_FALSE(s.layers_split);
  EXPECT_TRUE(s.pins.empty());
  ASSERT_EQ(backends.size(), 2u);
  EXPECT_EQ(backends[0]->backend_id(), "cpu");
  EXPECT_EQ(backends[1]->backend_id(), "gpu0");
  // One GPU: nothing to split.
  SessionOptions plain;
  EXPECT_FALSE(setup(backends, plain).layers_split);
}

}  // namespace
}  // namespace tandem::cli
