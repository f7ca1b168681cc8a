// Calibration's decode layer (src/sched/calibration_decode.cpp) on reference kernels: its passes
// and warm-up, attention over the whole cache, a second cache length for attention alone, and an
// arena laid out as the executor lays out a run's.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "calibration_measure.h"
#include "reference_backend.h"
#include "tandem/calibration.h"
#include "test_backends.h"

namespace tandem {
namespace {

// A small layer (1B-like ratios) and its compute ops a pass.
constexpr detail::DecodeLayerShape kTiny{64, 4, 2, 16, 128};
constexpr int kLayerOps = 17;

// The layer `d` measured on `b` with its own generator and spending.
std::vector<std::pair<OpKey, OpSample>> measure(Backend& b, const detail::DecodeLayerShape& d,
                                                const detail::DecodeLayerPasses& passes,
                                                const std::function<void()>& lead_in) {
  SplitMix64 rng{7};
  detail::CalibrationSpent spent;
  return detail::measure_decode_layer(b, d, passes, lead_in, rng, spent);
}

TEST(Calibration, DecodeLayerRunsItsPassesAndTimesAttentionOverItsWholeCache) {
  // A small layer on reference kernels. Its 17 ops run once to warm up, then `min` passes, then
  // more up to `max` while the timed runs stay under `max_us`: 0 us stops at `min`, a day runs
  // to `max`.
  for (const auto& [passes, want] :
       {std::pair{detail::DecodeLayerPasses{2, 6, 0.0}, 2}, {{2, 6, 86400e6}, 6}}) {
    auto b = test::make_cpu("cpu");
    int lead_ins = 0;
    const auto samples = measure(*b, kTiny, passes, [&] { ++lead_ins; });
    EXPECT_EQ(b->executed, (want + 1) * kLayerOps) << passes.max_us;
    EXPECT_EQ(lead_ins, want + 1);
    // Attention's sample reads every key of the layer's cache: the token sits at its last
    // position, the planning bound the estimate assumes.
    Graph g;
    TensorId q = g.input("q", DType::F32, {16, 4, 1});
    const int64_t cache = detail::kFirstPosition + 1;
    TensorId kc = g.kv_cache("k", DType::F16, {16, 2, cache});
    TensorId vc = g.kv_cache("v", DType::F16, {16, 2, cache});
    TensorId a = g.attention(q, kc, vc, g.input("pos", DType::I32, {1}), 0.25f);
    const OpKey key = op_key(g, g.node(a));
    const OpWork w = op_work(g, g.node(a));
    EXPECT_EQ(std::count_if(samples.begin(), samples.end(),
                            [&](const auto& s) {
                              return s.first == key && s.second.flops == w.flops &&
                                     s.second.bytes == w.bytes && s.second.us > 0.0;
                            }),
              1);
  }
}

TEST(Calibration, DecodeLayerAtAnotherCacheLengthGivesItsAttentionAlone) {
  // attention_only: the layer runs whole (its attention meets what it meets in a model) and
  // returns one sample, its attention's, over every key of the longer cache.
  detail::DecodeLayerShape tiny = kTiny;
  tiny.cache = 32;
  tiny.attention_only = true;
  auto b = test::make_cpu("cpu");
  const auto samples = measure(*b, tiny, {2, 2, 0.0}, [] {});
  EXPECT_EQ(b->executed, 3 * kLayerOps);
  Graph g;
  TensorId a =
      g.attention(g.input("q", DType::F32, {16, 4, 1}), g.kv_cache("k", DType::F16, {16, 2, 32}),
                  g.kv_cache("v", DType::F16, {16, 2, 32}), g.input("pos", DType::I32, {1}), 0.25f);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].first, op_key(g, g.node(a)));
  EXPECT_EQ(samples[0].second.flops, op_work(g, g.node(a)).flops);
  EXPECT_EQ(samples[0].second.bytes, op_work(g, g.node(a)).bytes);
}

TEST(Calibration, DecodeLayerWarmsUpForItsWarmUpTimeBeforeItTimes) {
  // Untimed passes until warm_up_s has passed (the first layer of a calibration: the first
  // ~0.2 s of memory-bound work after the process stood idle ran slow), then the timed ones.
  // (DecodeLayerRunsItsPassesAndTimesAttentionOverItsWholeCache: one untimed pass at 0 s.)
  constexpr double kWarmUp = 0.2;
  auto b = test::make_cpu("cpu");
  std::vector<std::chrono::steady_clock::time_point> lead_ins;  // one per pass
  const auto before = std::chrono::steady_clock::now();
  const auto samples = measure(*b, kTiny, {2, 2, 0.0, kWarmUp},
                               [&] { lead_ins.push_back(std::chrono::steady_clock::now()); });
  ASSERT_FALSE(samples.empty());
  ASSERT_GE(lead_ins.size(), 3u);
  const size_t warm = lead_ins.size() - 2;  // two timed passes
  EXPECT_EQ(b->executed, int((warm + 2) * kLayerOps));
  // A pass of this layer takes well under the warm-up time: several warm passes, and the first
  // timed pass starts once the warm-up time has passed.
  EXPECT_GE(warm, 2u);
  EXPECT_GE(std::chrono::duration<double>(lead_ins[warm] - before).count(), kWarmUp);
}

TEST(Calibration, DecodeLayerLeadsInForItsLeadInTimeAfterEachFlush) {
  // After each pass's flush, lead_in runs again until lead_in_s has passed, then the layer's ops
  // (16 threads read the 1B's products 1.15-1.23x their run times after a single lead-in).
  // (DecodeLayerRunsItsPassesAndTimesAttentionOverItsWholeCache: one lead-in a pass at 0 s.)
  constexpr double kLeadIn = 0.02;
  auto b = test::make_cpu("cpu");
  // Per lead-in: the layer ops run before it and when it started; each takes 1 ms.
  std::vector<std::pair<int, std::chrono::steady_clock::time_point>> lead_ins;
  detail::DecodeLayerPasses passes{2, 2, 0.0};
  passes.lead_in_s = kLeadIn;
  const auto samples = measure(*b, kTiny, passes, [&] {
    lead_ins.push_back({b->executed, std::chrono::steady_clock::now()});
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  ASSERT_FALSE(samples.empty());
  ASSERT_EQ(b->executed, 3 * kLayerOps);  // one untimed pass, two timed
  std::vector<std::chrono::steady_clock::time_point> first(3);
  std::vector<int> count(3, 0);
  for (const auto& [ops, t] : lead_ins) {
    ASSERT_EQ(ops % kLayerOps, 0) << "a lead-in inside a pass";
    const int pass = ops / kLayerOps;
    ASSERT_LT(pass, 3);
    if (count[size_t(pass)]++ == 0) first[size_t(pass)] = t;
  }
  for (int pass = 0; pass < 3; ++pass) EXPECT_GE(count[size_t(pass)], 2) << pass;
  // A pass's ops start only once its lead-ins have run for kLeadIn.
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_GE(std::chrono::duration<double>(first[size_t(pass + 1)] - first[size_t(pass)]).count(),
              kLeadIn)
        << pass;
  }
}

// A host backend on reference kernels that records every execution's op and memory.
class RecordingBackend : public test::TestBackend {
 public:
  struct Run {
    OpKind op;
    TensorId storage;  // where the graph keeps the output (a KV cache for kv_write)
    const uint8_t* out;
    size_t out_bytes;
    std::vector<TensorId> input_storage;
    std::vector<const uint8_t*> inputs;
    std::vector<size_t> input_bytes;
  };
  explicit RecordingBackend(std::vector<OpCapability> caps)
      : TestBackend(config(std::move(caps))) {}
  void execute(const Graph& graph, const NodeExecution& exec) override {
    Run r{exec.node->op,
          graph.storage_of(exec.node->id),
          static_cast<const uint8_t*>(exec.output.data),
          exec.output.desc->bytes(),
          {},
          {},
          {}};
    for (size_t k = 0; k < exec.inputs.size(); ++k) {
      r.input_storage.push_back(graph.storage_of(exec.node->inputs[k]));
      r.inputs.push_back(static_cast<const uint8_t*>(exec.inputs[k].data));
      r.input_bytes.push_back(exec.inputs[k].desc->bytes());
    }
    runs.push_back(std::move(r));
    TestBackend::execute(graph, exec);
  }
  std::vector<Run> runs;

 private:
  static Config config(std::vector<OpCapability> caps) {
    Config c;
    c.id = "cpu";
    c.capabilities = std::move(caps);
    return c;
  }
};

bool overlaps(const uint8_t* a, size_t a_bytes, const uint8_t* b, size_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

TEST(Calibration, DecodeLayerOpsWriteMemoryEarlierOpsUsedAsTheExecutorLaysItOut) {
  // In a run the executor's arena puts an op's output where an op a few nodes earlier wrote (Q's
  // RoPE over the norm's output, a layer's output over its feed-forward block's): memory the
  // caches hold. The decode layer lays its ops out the same way, never over a value a later op
  // still reads. (With a buffer per op, last written a pass earlier, its one-token RoPE, add and
  // SwiGLU timed slower than in a run: bench/NOTES.md, 2026-11-27.)
  RecordingBackend b(ReferenceBackend::reference_capabilities());
  const auto samples = measure(b, kTiny, {1, 1, 0.0}, [] {});
  ASSERT_FALSE(samples.empty());
  ASSERT_EQ(b.runs.size(), size_t(2 * kLayerOps));  // the warm-up pass and one timed pass
  const std::span<const RecordingBackend::Run> pass(b.runs.data() + kLayerOps, kLayerOps);
  auto over_earlier = [&](size_t j) {
    for (size_t i = 0; i < j; ++i) {
      if (overlaps(pass[j].out, pass[j].out_bytes, pass[i].out, pass[i].out_bytes)) return true;
    }
    return false;
  };
  // The layer's ops in graph order: norm, Q, K, V, RoPE of Q, ..., SwiGLU, down, the last add.
  ASSERT_EQ(pass[0].op, OpKind::RmsNorm);
  ASSERT_EQ(pass[4].op, OpKind::Rope);
  ASSERT_EQ(pass[kLayerOps - 1].op, OpKind::Add);
  EXPECT_TRUE(overlaps(pass[4].out, pass[4].out_bytes, pass[0].out, pass[0].out_bytes));
  EXPECT_TRUE(over_earlier(kLayerOps - 1));
  size_t reused = 0;
  for (size_t j = 1; j < pass.size(); ++j) {
    reused += over_earlier(j) ? 1 : 0;
    // What op j reads, written by an earlier op of the pass or before the pass, no op since
    // wrote over.
    for (size_t k = 0; k < pass[j].inputs.size(); ++k) {
      const uint8_t* in = pass[j].inputs[k];
      size_t since = 0;
      for (size_t i = j; i-- > 0 && since == 0;) {
        if (pass[i].storage == pass[j].input_storage[k]) since = i + 1;
      }
      for (size_t i = since; i < j; ++i) {
        EXPECT_FALSE(overlaps(in, pass[j].input_bytes[k], pass[i].out, pass[i].out_bytes))
            << "op " << i << " (" << op_name(pass[i].op) << ") wrote over input " << k << " of op "
            << j << " (" << op_name(pass[j].op) << ")";
      }
    }
  }
  EXPECT_GE(reused, size_t(kLayerOps) / 2);
}

}  // namespace
}  // namespace tandem
