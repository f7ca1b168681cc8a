// The runtime session: generation with a callback matches prefill and decode by hand, the
// callback can stop it, text round-trips, reports parse, and -ngl pins ask a backend's kind.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <span>
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

// sum((a-b)^2) / sum(a^2); NaN when either holds a NaN.
double nmse(std::span<const float> a, std::span<const float> b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    den += double(a[i]) * double(a[i]);
  }
  return num / den;
}

TEST(Session, BatchedDecodeMatchesEachSequenceDecodedAlone) {
  SessionOptions o = tiny_options();
  o.n_sequences = 3;
  Session batched(o);
  ASSERT_EQ(batched.n_sequences(), 3);
  // Prompts of different lengths, so every row of a batched step sits at another position.
  const std::vector<std::vector<int32_t>> prompts = {
      batched.tokenize("hello world"), batched.tokenize("a much longer prompt than the others"),
      batched.tokenize("x")};
  const int64_t n_vocab = batched.config().n_vocab;
  std::vector<std::unique_ptr<Session>> alone;
  std::vector<int32_t> next;
  for (int s = 0; s < 3; ++s) {
    alone.push_back(std::make_unique<Session>(tiny_options()));
    const auto a = alone.back()->prefill(prompts[size_t(s)]);
    const std::vector<float> expected(a.begin(), a.end());
    const auto b = batched.eval_sequence(s, prompts[size_t(s)]);
    EXPECT_LT(nmse(expected, b), 1e-10) << "prefill of sequence " << s;
    next.push_back(argmax(expected));
  }
  // All three rows in one graph, against each sequence decoded alone.
  const std::vector<int> all = {0, 1, 2};
  const auto first = batched.decode_batch(all, next);
  ASSERT_EQ(int64_t(first.size()), 3 * n_vocab);
  const std::vector<float> rows(first.begin(), first.end());
  for (int s = 0; s < 3; ++s) {
    const auto expected = alone[size_t(s)]->decode(next[size_t(s)]);
    const std::span<const float> row(rows.data() + s * n_vocab, size_t(n_vocab));
    EXPECT_LT(nmse(expected, row), 1e-10) << "row " << s;
    next[size_t(s)] = argmax(expected);
    EXPECT_EQ(batched.n_past(s), int64_t(prompts[size_t(s)].size()) + 1);
  }
  // A subset in another order: rows follow the sequences asked for, each over its own cache.
  const std::vector<int> subset = {2, 0};
  const std::vector<int32_t> subset_tokens = {next[2], next[0]};
  const auto second = batched.decode_batch(subset, subset_tokens);
  ASSERT_EQ(int64_t(second.size()), 2 * n_vocab);
  const std::vector<float> rows2(second.begin(), second.end());
  for (size_t r = 0; r < subset.size(); ++r) {
    const int s = subset[r];
    const auto expected = alone[size_t(s)]->decode(next[size_t(s)]);
    const std::span<const float> row(rows2.data() + int64_t(r) * n_vocab, size_t(n_vocab));
    EXPECT_LT(nmse(expected, row), 1e-10) << "row " << r << " (sequence " << s << ")";
  }
  EXPECT_EQ(batched.n_past(1), int64_t(prompts[1].size()) + 1);  // not in the subset
}

TEST(Session, BatchedDecodeRefusesBadSequences) {
  SessionOptions o = tiny_options();
  o.n_sequences = 2;
  Session s(o);
  s.eval_sequence(0, s.tokenize("a"));
  s.eval_sequence(1, s.tokenize("b"));
  const std::vector<int32_t> two = {5, 6};
  EXPECT_THROW(s.decode_batch(std::vector<int>{0, 0}, two), Error);  // the same sequence twice
  EXPECT_THROW(s.decode_batch(std::vector<int>{0, 2}, two), Error);  // no sequence 2
  EXPECT_THROW(s.decode_batch(std::vector<int>{0}, two), Error);     // a token too many
  EXPECT_THROW(s.eval_sequence(-1, two), Error);
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

// --n-cpu-moe N: the expert tensors of layers < N, and nothing else, pinned to the first host
// backend by kind; --cpu-moe (kAllLayers) every layer's.
TEST(HostExpertPins, PinTheFirstLayersExpertsToTheHostBackend) {
  auto backend = [](std::string id, BackendKind kind) {
    test::TestBackend::Config c;
    c.id = std::move(id);
    c.kind = kind;
    c.host_accessible = kind == BackendKind::Cpu;
    return std::shared_ptr<Backend>(std::make_shared<test::TestBackend>(std::move(c)));
  };
  std::vector<std::shared_ptr<Backend>> backends{backend("gpu:0", BackendKind::Gpu),
                                                 backend("host-x", BackendKind::Cpu)};
  auto pinned = [](const std::vector<TensorPin>& pins, const std::string& name) {
    for (const TensorPin& p : pins) {
      if (std::regex_search(name, std::regex(p.pattern))) return p.backend_id;
    }
    return std::string();
  };
  const auto pins = host_expert_pins(12, 11, backends);
  for (int l = 0; l < 12; ++l) {
    for (const char* t : {"gate", "up", "down", "gate_up"}) {
      const std::string name = "blk." + std::to_string(l) + ".ffn_" + t + "_exps.weight";
      EXPECT_EQ(pinned(pins, name), l < 11 ? "host-x" : "") << name;
    }
  }
  for (const char* other : {"blk.1.ffn_gate_inp.weight", "blk.1.attn_q.weight",
                            "blk.1.ffn_up.weight", "blk.1.ffn_norm.weight", "token_embd.weight"}) {
    EXPECT_EQ(pinned(pins, other), "") << other;
  }
  // Every layer: N at or above n_layer, or --cpu-moe.
  for (int n : {12, 40, kAllLayers}) {
    const auto all = host_expert_pins(12, n, backends);
    EXPECT_EQ(pinned(all, "blk.11.ffn_down_exps.weight"), "host-x") << n;
    EXPECT_EQ(pinned(all, "blk.11.ffn_down.weight"), "") << n;
  }
  EXPECT_TRUE(host_expert_pins(12, 0, backends).empty());
  EXPECT_THROW(host_expert_pins(12, -1, backends), Error);
  backends.pop_back();
  EXPECT_THROW(host_expert_pins(12, 2, backends), Error);  // no host backend
}

}  // namespace
}  // namespace tandem
