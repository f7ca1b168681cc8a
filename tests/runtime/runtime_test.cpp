// The runtime session: generation with a callback matches prefill and decode by hand, the
// callback can stop it, text round-trips, reports parse, and -ngl pins ask a backend's kind.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/error.h"
#include "tandem/runtime.h"
#include "test_backends.h"
#include "tiny_model.h"

namespace tandem {
namespace {

SessionOptions tiny_options(const std::string& strategy = "cpu") {
  SessionOptions o;
  o.model_path = test::tiny_model_path();
  o.strategy = strategy;
  o.n_ctx = 64;
  o.no_calibrate = true;
  return o;
}

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

TEST(Session, GreedyGenerateEqualsPrefillThenDecodeByHand) {
  Session session(tiny_options());
  const std::vector<int32_t> prompt = session.tokenize("hello world");
  ASSERT_FALSE(prompt.empty());
  GenerateOptions g;
  g.n_predict = 6;
  g.sampling = SamplerParams::greedy();
  std::vector<int32_t> seen;
  std::string text;
  const GenerateResult r = session.generate(prompt, g, [&](int32_t t, std::string_view piece) {
    if (t != kNoToken) seen.push_back(t);
    text += piece;
    return true;
  });
  EXPECT_EQ(r.n_prompt, int64_t(prompt.size()));
  EXPECT_EQ(seen, r.tokens);
  EXPECT_EQ(session.n_past(), int64_t(prompt.size() + r.tokens.size()) - 1);

  // The same by hand, on a second session (greedy: the highest logit each step).
  Session by_hand(tiny_options());
  std::vector<int32_t> expected;
  int32_t next = argmax(by_hand.prefill(prompt));
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    if (by_hand.tokenizer().is_end_of_generation(next)) break;
    expected.push_back(next);
    if (i + 1 < r.tokens.size()) next = argmax(by_hand.decode(next));
  }
  EXPECT_EQ(r.tokens, expected);
  EXPECT_EQ(text, session.detokenize(r.tokens).substr(0, text.size()));
  const auto last = session.logits();
  EXPECT_EQ(int64_t(last.size()), session.config().n_vocab);
}

TEST(Session, TheCallbackStopsGeneration) {
  Session session(tiny_options());
  GenerateOptions g;
  g.n_predict = 20;
  g.sampling.seed = 5;
  g.sampling.temperature = 1.0f;
  g.sampling.top_k = 0;
  g.sampling.min_p = 0.0f;
  g.sampling.top_p = 1.0f;
  int calls = 0;
  const GenerateResult r =
      session.generate(session.tokenize("abc"), g,
                       [&](int32_t t, std::string_view) { return t == kNoToken || ++calls < 3; });
  EXPECT_TRUE(r.stopped || r.tokens.size() < 3);  // or the model ended first
  EXPECT_LE(r.tokens.size(), 3u);
}

TEST(Session, ResetRestartsTheContext) {
  Session session(tiny_options());
  const std::vector<int32_t> prompt{1, 5, 9};
  const auto l = session.prefill(prompt);
  const std::vector<float> first(l.begin(), l.end());
  EXPECT_EQ(session.n_past(), 3);
  session.reset();
  EXPECT_EQ(session.n_past(), 0);
  const auto again = session.prefill(prompt);
  ASSERT_EQ(again.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) ASSERT_NEAR(again[i], first[i], 1e-4f) << i;
  EXPECT_THROW(session.generate({}, GenerateOptions{}), Error);
}

TEST(Session, TextRoundTrips) {
  Session session(tiny_options());
  const std::string text = "the quick brown fox";
  EXPECT_EQ(session.detokenize(session.tokenize(text, false)), text);
  EXPECT_THROW(session.detokenize(std::vector<int32_t>{int32_t(session.config().n_vocab)}), Error);
}

TEST(Session, PlacementAndTelemetryAreJson) {
  Session session(tiny_options());
  // Before any step the placement is planned, not run.
  auto before = nlohmann::json::parse(session.placement_json());
  EXPECT_TRUE(before["last_step"].is_null());
  ASSERT_EQ(before["phases"].size(), 2u);
  EXPECT_EQ(before["phases"][1]["name"], "decode");
  EXPECT_GT(before["phases"][1]["ops"]["cpu"].get<int>(), 0);

  session.prefill(std::vector<int32_t>{1, 2, 3});
  auto after = nlohmann::json::parse(session.placement_json());
  EXPECT_GT(after["last_step"]["cpu"].get<int>(), 0);
  bool cpu_listed = false;
  for (const auto& b : after["backends"]) cpu_listed = cpu_listed || b["id"] == "cpu";
  EXPECT_TRUE(cpu_listed);

  auto t = nlohmann::json::parse(session.telemetry_json());
  EXPECT_EQ(t["tokens"]["evaluated"], 3);
  EXPECT_GT(t["ops"].get<int>(), 0);
  EXPECT_GT(t["backends"]["cpu"]["ops"].get<int>(), 0);
}

TEST(Session, LoadErrorsAreTyped) {
  SessionOptions o = tiny_options();
  o.model_path += ".missing";
  try {
    Session s(o);
    FAIL() << "a missing file must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Io);
  }
  o = tiny_options("nonsense");
  EXPECT_THROW(Session s(o), Error);
}

TEST(HostLayerPins, PinToTheFirstHostBackendByKind) {
  // A host backend under another id takes the pins: they follow the kind, not a name.
  auto backend = [](std::string id, BackendKind kind) {
    test::TestBackend::Config c;
    c.id = std::move(id);
    c.kind = kind;
    c.host_accessible = kind == BackendKind::Cpu;
    return std::shared_ptr<Backend>(std::make_shared<test::TestBackend>(std::move(c)));
  };
  std::vector<std::shared_ptr<Backend>> backends{backend("gpu:0", BackendKind::Gpu),
                                                 backend("host-x", BackendKind::Cpu)};
  const auto pins = host_layer_pins(4, 2, backends);
  ASSERT_EQ(pins.size(), 3u);
  for (const auto& p : pins) EXPECT_EQ(p.backend_id, "host-x");
  EXPECT_EQ(pins[0].pattern, "^blk\\.(2|3)\\..*$");
  EXPECT_EQ(host_layer_pins(4, 5, backends).size(), 1u);  // only the embedding
  // Tied embeddings: the embedding is the output matrix and goes where the output layer goes.
  EXPECT_EQ(host_layer_pins(4, 5, backends, /*tied_embeddings=*/true).size(), 0u);
  EXPECT_EQ(host_layer_pins(4, 4, backends, /*tied_embeddings=*/true).size(), 2u);
  EXPECT_THROW(host_layer_pins(4, -1, backends), Error);
  backends.pop_back();
  EXPECT_THROW(host_layer_pins(4, 2, backends), Error);
}

}  // namespace
}  // namespace tandem
