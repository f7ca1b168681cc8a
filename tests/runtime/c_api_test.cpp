// The C API: errors come back as codes with a message and never as a crash or an exception;
// a tiny model loads, tokenizes, evaluates and generates through it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem.h"
#include "tiny_model.h"

namespace {

struct ModelDeleter {
  void operator()(tandem_model* m) const { tandem_model_free(m); }
};
using ModelPtr = std::unique_ptr<tandem_model, ModelDeleter>;

ModelPtr load_tiny(const char* strategy = "cpu") {
  tandem_load_options o;
  tandem_load_options_init(&o);
  o.strategy = strategy;
  o.n_ctx = 64;
  o.no_calibrate = 1;
  tandem_model* m = nullptr;
  const tandem_status s = tandem_model_load(tandem::test::tiny_model_path().c_str(), &o, &m);
  EXPECT_EQ(s, TANDEM_OK) << tandem_last_error();
  return ModelPtr(m);
}

TEST(CApi, ABadPathIsAnIoErrorWithAMessage) {
  tandem_model* m = reinterpret_cast<tandem_model*>(0x1);
  const tandem_status s = tandem_model_load("/nonexistent/model.gguf", nullptr, &m);
  EXPECT_EQ(s, TANDEM_ERROR_IO);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(std::string(tandem_last_error()).find("/nonexistent/model.gguf"), std::string::npos)
      << tandem_last_error();
  EXPECT_STREQ(tandem_status_name(s), "io");
}

TEST(CApi, BadArgumentsAreRefusedWithoutACrash) {
  tandem_model* m = nullptr;
  EXPECT_EQ(tandem_model_load(nullptr, nullptr, &m), TANDEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tandem_model_load("x", nullptr, nullptr), TANDEM_ERROR_INVALID_ARGUMENT);
  tandem_load_options o;
  tandem_load_options_init(&o);
  o.strategy = "no-such-strategy";
  EXPECT_EQ(tandem_model_load(tandem::test::tiny_model_path().c_str(), &o, &m),
            TANDEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
  EXPECT_GT(std::string(tandem_last_error()).size(), 0u);
  const char* pins[] = {"no-equals-sign"};
  tandem_load_options_init(&o);
  o.pins = pins;
  o.n_pins = 1;
  EXPECT_EQ(tandem_model_load(tandem::test::tiny_model_path().c_str(), &o, &m),
            TANDEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tandem_last_error()).find("REGEX=BACKEND"), std::string::npos);
  // A file that is not a GGUF.
  EXPECT_NE(tandem_model_load("/proc/self/status", nullptr, &m), TANDEM_OK);
  EXPECT_EQ(tandem_eval(nullptr, nullptr, 0), TANDEM_ERROR_INVALID_ARGUMENT);
  tandem_model_free(nullptr);
}

TEST(CApi, TokenizeEvalAndLogits) {
  ModelPtr m = load_tiny();
  ASSERT_TRUE(m);
  size_t n = 0;
  EXPECT_EQ(tandem_tokenize(m.get(), "hello world", 1, nullptr, 0, &n),
            TANDEM_ERROR_BUFFER_TOO_SMALL);
  ASSERT_GT(n, 0u);
  std::vector<int32_t> ids(n);
  ASSERT_EQ(tandem_tokenize(m.get(), "hello world", 0, ids.data(), ids.size(), &n), TANDEM_OK);
  ids.resize(n);
  size_t length = 0;
  char small[2];
  EXPECT_EQ(tandem_detokenize(m.get(), ids.data(), ids.size(), small, sizeof small, &length),
            TANDEM_ERROR_BUFFER_TOO_SMALL);
  std::vector<char> text(length + 1);
  ASSERT_EQ(tandem_detokenize(m.get(), ids.data(), ids.size(), text.data(), text.size(), &length),
            TANDEM_OK);
  EXPECT_STREQ(text.data(), "hello world");

  const float* logits = nullptr;
  size_t n_vocab = 0;
  EXPECT_EQ(tandem_logits(m.get(), &logits, &n_vocab), TANDEM_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(tandem_eval(m.get(), ids.data(), ids.size()), TANDEM_OK) << tandem_last_error();
  ASSERT_EQ(tandem_logits(m.get(), &logits, &n_vocab), TANDEM_OK);
  EXPECT_EQ(int32_t(n_vocab), tandem_n_vocab(m.get()));
  EXPECT_EQ(tandem_n_past(m.get()), int64_t(ids.size()));
  // A token outside the vocabulary is an error; the session stays usable.
  const int32_t bad = tandem_n_vocab(m.get());
  EXPECT_EQ(tandem_eval(m.get(), &bad, 1), TANDEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tandem_last_error()).find("vocabulary"), std::string::npos);
  tandem_reset(m.get());
  EXPECT_EQ(tandem_n_past(m.get()), 0);
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  int stop_after = -1;
};

int collect(int32_t token, const char* text, void* user_data) {
  auto* c = static_cast<Collected*>(user_data);
  if (token >= 0) c->tokens.push_back(token);
  c->text += text;
  return c->stop_after >= 0 && int(c->tokens.size()) >= c->stop_after;
}

TEST(CApi, GenerateCallsBackPerTokenAndReportsJson) {
  ModelPtr m = load_tiny();
  ASSERT_TRUE(m);
  tandem_generate_options g;
  tandem_generate_options_init(&g);
  g.n_predict = 8;
  g.temperature = 0.0f;
  Collected first, second;
  int32_t generated = -1;
  ASSERT_EQ(tandem_generate(m.get(), "once upon", &g, collect, &first, &generated), TANDEM_OK)
      << tandem_last_error();
  EXPECT_EQ(generated, int32_t(first.tokens.size()));
  EXPECT_LE(generated, 8);
  // Greedy from a fresh context: the same tokens again.
  ASSERT_EQ(tandem_generate(m.get(), "once upon", &g, collect, &second, nullptr), TANDEM_OK);
  EXPECT_EQ(first.tokens, second.tokens);
  EXPECT_EQ(first.text, second.text);
  if (first.tokens.size() >= 2) {
    Collected stopped;
    stopped.stop_after = 1;
    ASSERT_EQ(tandem_generate(m.get(), "once upon", &g, collect, &stopped, &generated), TANDEM_OK);
    EXPECT_EQ(stopped.tokens.size(), 1u);
    EXPECT_EQ(generated, 1);
  }

  const char* json = nullptr;
  ASSERT_EQ(tandem_placement_json(m.get(), &json), TANDEM_OK) << tandem_last_error();
  auto placement = nlohmann::json::parse(json);
  EXPECT_EQ(placement["phases"].size(), 2u);
  EXPECT_GT(placement["last_step"]["cpu"].get<int>(), 0);
  ASSERT_EQ(tandem_telemetry_json(m.get(), &json), TANDEM_OK);
  auto telemetry = nlohmann::json::parse(json);
  EXPECT_GT(telemetry["tokens"]["generated"].get<int>(), 0);
  EXPECT_GT(telemetry["ops"].get<int>(), 0);

  g.n_predict = -2;
  EXPECT_EQ(tandem_generate(m.get(), "x", &g, nullptr, nullptr, nullptr),
            TANDEM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tandem_last_error()).find("n_predict"), std::string::npos);
}

}  // namespace
