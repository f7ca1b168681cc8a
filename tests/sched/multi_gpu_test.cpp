// Several GPUs without GPUs: fake devices, each with its own memory, split a model's layers in
// contiguous ranges (split_layers, layer_range_pins), hand activations to each other with
// copy_to_peer (directly where they are peers, through host memory elsewhere), and must give
// the logits of one device.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <numeric>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "model_runs.h"
#include "tandem/error.h"
#include "tandem/layer_split.h"
#include "tandem/model/gguf.h"
#include "tandem/model/llama_config.h"
#include "tandem/model/llama_graph.h"
#include "tandem/model/synthetic.h"
#include "test_backends.h"

namespace tandem {
namespace {

using test::make_gpu;

std::vector<LayerRange> split(int n, std::vector<double> p) {
  return split_layers(n, p);
}

void expect_ranges(const std::vector<LayerRange>& got, std::vector<std::pair<int, int>> want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].begin, want[i].first) << "range " << i;
    EXPECT_EQ(got[i].end, want[i].second) << "range " << i;
  }
}

TEST(LayerSplit, FollowsLlamaCppProportions) {
  expect_ranges(split(32, {1, 1}), {{0, 16}, {16, 32}});
  expect_ranges(split(32, {3, 1}), {{0, 24}, {24, 32}});
  expect_ranges(split(64, {1, 1}), {{0, 32}, {32, 64}});
  expect_ranges(split(5, {1, 1, 1}), {{0, 2}, {2, 4}, {4, 5}});
  expect_ranges(split(16, {1}), {{0, 16}});
  // Budgets in bytes work as proportions too.
  expect_ranges(split(32, {80e9, 40e9}), {{0, 22}, {22, 32}});
}

TEST(LayerSplit, ZeroProportionsGetEmptyRanges) {
  expect_ranges(split(8, {0, 1}), {{0, 0}, {0, 8}});
  expect_ranges(split(8, {1, 0}), {{0, 8}, {8, 8}});
  expect_ranges(split(8, {1, 0, 1}), {{0, 4}, {4, 4}, {4, 8}});
  expect_ranges(split(0, {1, 1}), {{0, 0}, {0, 0}});
}

TEST(LayerSplit, RangesAreContiguousAndCoverEveryLayer) {
  std::mt19937 rng(test::test_seed());
  std::uniform_real_distribution<double> u(0.0, 4.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = int(rng() % 130);
    std::vector<double> p(1 + rng() % 8);
    for (double& x : p) x = (rng() % 4 == 0) ? 0.0 : u(rng);
    p[rng() % p.size()] += 0.5;
    const auto r = split_layers(n, p);
    ASSERT_EQ(r.size(), p.size());
    int next = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      EXPECT_EQ(r[i].begin, next) << "seed " << test::test_seed();
      EXPECT_GE(r[i].end, r[i].begin);
      if (p[i] == 0.0) {
        EXPECT_EQ(r[i].size(), 0);
      }
      next = r[i].end;
    }
    EXPECT_EQ(next, n);
  }
}

TEST(LayerSplit, RejectsBadProportions) {
  EXPECT_THROW(split(8, {}), Error);
  EXPECT_THROW(split(8, {0, 0}), Error);
  EXPECT_THROW(split(8, {1, -1}), Error);
  EXPECT_THROW(split(8, {1, std::nan("")}), Error);
  EXPECT_THROW(split(-1, {1}), Error);
}

TEST(LayerSplit, PinsMatchTheRangesWeightsAndCaches) {
  const std::vector<LayerRange> ranges{{0, 3}, {3, 3}, {3, 12}};
  const std::vector<std::string> ids{"gpu0", "gpu1", "gpu2"};
  const auto pins = layer_range_pins(ranges, ids);
  ASSERT_EQ(pins.size(), 2u);  // the empty range pins nothing
  auto pinned_to = [&](const std::string& name) -> std::string {
    for (const TensorPin& p : pins) {
      if (std::regex_search(name, std::regex(p.pattern))) return p.backend_id;
    }
    return "";
  };
  EXPECT_EQ(pinned_to("blk.0.attn_q.weight"), "gpu0");
  EXPECT_EQ(pinned_to("blk.2.ffn_down.weight"), "gpu0");
  EXPECT_EQ(pinned_to("cache_k.2"), "gpu0");
  EXPECT_EQ(pinned_to("blk.3.attn_norm.weight"), "gpu2");
  EXPECT_EQ(pinned_to("cache_v.11"), "gpu2");
  EXPECT_EQ(pinned_to("blk.12.attn_q.weight"), "");
  EXPECT_EQ(pinned_to("cache_k.12"), "");
  EXPECT_EQ(pinned_to("cache_k.1x"), "");
  EXPECT_EQ(pinned_to("output.weight"), "");
  EXPECT_EQ(pinned_to("token_embd.weight"), "");
  EXPECT_THROW(layer_range_pins(ranges, std::span(ids).first(2)), Error);
}

TEST(KeepActivationsOnTheirGpu, ActivationOpsFollowTheirInputBetweenGpus) {
  // x = rms_norm(in, w0) on gpu1 (pinned); y = silu(x) reads no weight: it runs on gpu1, where
  // its input is, not on the first GPU; z = matmul(w1, y) on gpu1 (pinned).
  auto gpu0 = make_gpu("gpu0"), gpu1 = make_gpu("gpu1");
  auto cpu = test::make_cpu();
  Graph g;
  TensorId in = g.input("in", DType::F32, {8, 2});
  TensorId x = g.rms_norm(in, g.weight("w0", DType::F32, {8}), 1e-5f);
  g.set_name(x, "x");
  TensorId y = g.silu(x);
  TensorId z = g.matmul(g.weight("w1", DType::F32, {8, 4}), y);
  g.mark_output(z);
  auto sched = HybridScheduler::builder()
                   .with_backend(gpu0)
                   .with_backend(gpu1)
                   .with_backend(cpu)
                   .pin_tensor("^w[01]$", "gpu1")
                   .build();
  auto p = sched.plan(g, Residency());
  EXPECT_EQ(p->backend_index(x), 1);
  EXPECT_EQ(p->backend_index(y), 1);
  EXPECT_EQ(p->backend_index(z), 1);
  EXPECT_EQ(p->at(y).reason.kind, SelectionReason::Kind::GpuAvailable);
  EXPECT_NE(p->at(y).reason.why.find("follows its input 'x' to gpu1"), std::string::npos)
      << p->at(y).reason.why;
  EXPECT_EQ(p->planned_transfers, 1u);  // `in` to gpu1, nothing back and forth
  // An input made on a host backend: the op goes to the first GPU, as before.
  auto host_sched = HybridScheduler::builder()
                        .with_backend(gpu0)
                        .with_backend(gpu1)
                        .with_backend(cpu)
                        .pin_tensor("^w[01]$", "cpu")
                        .strategy(Strategy::gpu_preferred())
                        .build();
  auto q = host_sched.plan(g, Residency());
  EXPECT_EQ(q->backend_index(x), 2);
  EXPECT_NE(q->backend_index(y), 1);
  EXPECT_EQ(q->at(y).reason.why.find("follows its input"), std::string::npos);
}

// ---- The mini model over two fake GPUs ----

struct TwoGpuRun {
  std::shared_ptr<test::TestBackend> gpu0, gpu1;
  std::vector<std::vector<float>> logits;
  ExecutorStats stats;
};

TwoGpuRun run_split(const test::MiniModel& model, const std::vector<test::ModelStep>& steps,
                    const std::string& group0, const std::string& group1) {
  TwoGpuRun r;
  const auto caps = ReferenceBackend::reference_capabilities();
  r.gpu0 = make_gpu("gpu0", caps, group0);
  r.gpu1 = make_gpu("gpu1", caps, group1);
  auto sched = HybridScheduler::builder()
                   .with_backend(r.gpu0)
                   .with_backend(r.gpu1)
                   .pin_tensor("^blk\\.0\\.", "gpu0")
                   .pin_tensor("^(blk\\.1\\.|output)", "gpu1")
                   .build();
  HybridExecutor exec(sched);
  r.logits = test::run_steps(sched, exec, model, steps);
  r.stats = exec.stats();
  EXPECT_TRUE(exec.residency().contains("gpu0", "blk.0.attn_q.weight"));
  EXPECT_TRUE(exec.residency().contains("gpu1", "blk.1.attn_q.weight"));
  EXPECT_FALSE(exec.residency().contains("gpu0", "blk.1.attn_q.weight"));
  return r;
}

class PeerCopy : public ::testing::Test {
 protected:
  std::mt19937 rng_{test::test_seed()};
};

TEST_F(PeerCopy, PeersCopyDirectlyAndGiveTheLogitsOfOneDevice) {
  test::MiniModel model(rng_);
  auto steps = test::prefill_then_decode(rng_);
  auto expected = test::reference_logits(model, steps);
  TwoGpuRun r = run_split(model, steps, "nvlink", "nvlink");
  test::expect_bitwise_equal(r.logits, expected);
  EXPECT_TRUE(r.gpu0->peer_copy_direct(*r.gpu1));
  // The hidden state crossed from gpu0 to gpu1 every step, never through host memory: gpu0
  // never copies to the host (the logits come from gpu1).
  EXPECT_GE(r.gpu0->direct_copies_out, int(steps.size()));
  EXPECT_EQ(r.gpu0->direct_copies_out, r.gpu0->peer_copies_out);
  EXPECT_EQ(r.gpu0->copies_out, 0);
  EXPECT_EQ(r.gpu1->direct_copies_out, r.gpu1->peer_copies_out);
  EXPECT_EQ(r.stats.peer_transfers, size_t(r.gpu0->peer_copies_out + r.gpu1->peer_copies_out));
}

TEST_F(PeerCopy, NonPeersGoThroughHostMemoryWithTheSameLogits) {
  test::MiniModel model(rng_);
  auto steps = test::prefill_then_decode(rng_);
  auto expected = test::reference_logits(model, steps);
  TwoGpuRun r = run_split(model, steps, "", "");
  test::expect_bitwise_equal(r.logits, expected);
  EXPECT_FALSE(r.gpu0->peer_copy_direct(*r.gpu1));
  EXPECT_GE(r.gpu0->peer_copies_out, int(steps.size()));
  EXPECT_EQ(r.gpu0->direct_copies_out, 0);
  EXPECT_EQ(r.gpu0->copies_out, r.gpu0->peer_copies_out);  // each one through host memory
  EXPECT_GT(r.stats.peer_transfers, 0u);
}

// ---- A synthetic LLaMA split across two fake GPUs ----

struct LlamaRun {
  std::vector<std::vector<float>> logits;
  std::vector<std::string> cache_home;  // per layer: the backend holding cache_k.L
  ExecutorStats stats;
};

LlamaRun run_llama(const gguf::File& file, const LlamaConfig& config,
                   std::vector<std::shared_ptr<Backend>> gpus, std::vector<double> proportions,
                   const std::vector<std::vector<int32_t>>& steps) {
  auto builder = HybridScheduler::builder();
  std::vector<std::string> ids;
  for (auto& g : gpus) {
    builder.with_backend(g);
    ids.push_back(g->backend_id());
  }
  const auto ranges = split_layers(int(config.n_layer), proportions);
  for (const TensorPin& p : layer_range_pins(ranges, ids))
    builder.pin_tensor(p.pattern, p.backend_id);
  builder.pin_tensor("^output(_norm)?\\.weight$", ids.back());
  auto sched = builder.build();
  HybridExecutor exec(sched);
  for (const auto& t : file.tensors()) exec.bind_weight(t.name, t.data, t.bytes);
  LlamaRun r;
  int32_t n_past = 0;
  for (const auto& tokens : steps) {
    LlamaGraphOptions o;
    o.n_tokens = int64_t(tokens.size());
    o.n_ctx = 16;
    o.kv_dtype = DType::F32;
    o.all_logits = true;
    LlamaGraph lg = build_llama_graph(config, file, o);
    std::vector<int32_t> positions(tokens.size());
    std::iota(positions.begin(), positions.end(), n_past);
    n_past += int32_t(tokens.size());
    std::vector<float> logits(size_t(lg.graph.tensor(lg.logits).elements()));
    const auto placement = sched.plan(lg.graph, exec.residency());
    exec.run(lg.graph, *placement,
             Bindings()
                 .input(lg.tokens, tokens.data(), 4 * tokens.size())
                 .input(lg.positions, positions.data(), 4 * positions.size())
                 .output(lg.logits, logits.data(), 4 * logits.size()));
    r.logits.push_back(std::move(logits));
  }
  for (int l = 0; l < int(config.n_layer); ++l)
    r.cache_home.push_back(exec.kv_cache_backend(kv_cache_name(true, l)));
  r.stats = exec.stats();
  return r;
}

TEST(LlamaSplit, TwoFakeGpusGiveTheLogitsOfOne) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tandem_multi_gpu_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "tiny4.gguf").string();
  SyntheticSpec spec = synthetic_preset("tiny", DType::Q8_0, 11);
  spec.n_layer = 4;
  spec.threads = 1;
  write_synthetic_model(spec, path);
  {
    gguf::File file = gguf::File::open(path);
    const LlamaConfig config = LlamaConfig::from_gguf(file);
    std::mt19937 rng(test::test_seed());
    std::uniform_int_distribution<int32_t> tok(0, int32_t(config.n_vocab - 1));
    std::vector<std::vector<int32_t>> steps{
        {tok(rng), tok(rng), tok(rng), tok(rng), tok(rng)}, {tok(rng)}, {tok(rng)}};
    const auto caps = ReferenceBackend::reference_capabilities();
    const LlamaRun one = run_llama(file, config, {make_gpu("gpu0", caps)}, {1}, steps);
    auto gpu0 = make_gpu("gpu0", caps, "nvlink"), gpu1 = make_gpu("gpu1", caps, "nvlink");
    const LlamaRun two = run_llama(file, config, {gpu0, gpu1}, {1, 1}, steps);
    test::expect_bitwise_equal(two.logits, one.logits);
    EXPECT_EQ(two.cache_home, (std::vector<std::string>{"gpu0", "gpu0", "gpu1", "gpu1"}));
    // The hidden state crosses once per step, from gpu0 to gpu1, directly; nothing comes back.
    EXPECT_EQ(two.stats.peer_transfers, steps.size());
    EXPECT_EQ(gpu0->direct_copies_out, int(steps.size()));
    EXPECT_EQ(gpu0->copies_out, 0);
    EXPECT_EQ(gpu1->peer_copies_out, 0);
    EXPECT_EQ(one.stats.peer_transfers, 0u);
    // The first GPU takes three layers of four with a 3:1 split.
    auto g0 = make_gpu("gpu0", caps, "nvlink"), g1 = make_gpu("gpu1", caps, "nvlink");
    const LlamaRun skewed = run_llama(file, config, {g0, g1}, {3, 1}, steps);
    test::expect_bitwise_equal(skewed.logits, one.logits);
    EXPECT_EQ(skewed.cache_home, (std::vector<std::string>{"gpu0", "gpu0", "gpu0", "gpu1"}));
    EXPECT_EQ(skewed.stats.peer_transfers, steps.size());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem
