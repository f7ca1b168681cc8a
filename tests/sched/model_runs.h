// Running the mini model's steps (a prefill, then decodes) through a scheduler and executor,
// and comparing the logits with the reference backend's, for executor tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "mini_model.h"
#include "reference_backend.h"
#include "tandem/executor.h"
#include "tandem/scheduler.h"
#include "test_backends.h"

namespace tandem::test {

struct ModelStep {
  std::vector<int32_t> tokens, positions;
};

// Runs the model's steps (prefill, then decode) and returns the logits of each.
inline std::vector<std::vector<float>> run_steps(HybridScheduler& sched, HybridExecutor& exec,
                                                 const MiniModel& model,
                                                 const std::vector<ModelStep>& steps) {
  for (const auto& [name, w] : model.weights) {
    exec.bind_weight(name, w.bytes.data(), w.bytes.size());
  }
  std::vector<std::vector<float>> out;
  for (const ModelStep& s : steps) {
    const int64_t T = int64_t(s.tokens.size());
    Graph g = model.build(T);
    auto placement = sched.plan(g, exec.residency());
    std::vector<float> logits(size_t(MiniModel::kVocab * T), -7.0f);
    exec.run(g, *placement,
             Bindings()
                 .input("tokens", s.tokens.data(), 4 * s.tokens.size())
                 .input("positions", s.positions.data(), 4 * s.positions.size())
                 .output("logits", logits.data(), 4 * logits.size()));
    out.push_back(std::move(logits));
  }
  return out;
}

inline std::vector<ModelStep> prefill_then_decode(std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> tok(0, MiniModel::kVocab - 1);
  return {{{tok(rng), tok(rng), tok(rng)}, {0, 1, 2}}, {{tok(rng)}, {3}}, {{tok(rng)}, {4}}};
}

inline std::vector<std::vector<float>> reference_logits(const MiniModel& model,
                                                        const std::vector<ModelStep>& steps) {
  auto sched =
      HybridScheduler::builder().with_backend(std::make_shared<ReferenceBackend>()).build();
  HybridExecutor exec(sched);
  return run_steps(sched, exec, model, steps);
}

inline void expect_bitwise_equal(const std::vector<std::vector<float>>& a,
                                 const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    for (float v : a[i]) ASSERT_FALSE(std::isnan(v));
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), 4 * a[i].size()), 0)
        << "step " << i << ", seed " << test::test_seed();
  }
}

}  // namespace tandem::test
