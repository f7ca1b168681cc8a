// token_logprobs against a plain reference (log-softmax in double, a full sort for the best
// tokens), and the text a token gets in an answer.
#include "logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace tandem::server {
namespace {

struct Reference {
  std::vector<double> logprob;
  std::vector<int32_t> order;  // best first, lower id first on ties
};

Reference reference(const std::vector<float>& logits) {
  double max = -std::numeric_limits<double>::infinity();
  for (float x : logits) max = std::max(max, double(x));
  double sum = 0.0;
  for (float x : logits) sum += std::exp(double(x) - max);
  Reference r;
  for (float x : logits) r.logprob.push_back(double(x) - max - std::log(sum));
  r.order.resize(logits.size());
  std::iota(r.order.begin(), r.order.end(), 0);
  std::stable_sort(r.order.begin(), r.order.end(),
                   [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  return r;
}

void expect_matches_reference(const std::vector<float>& logits, int32_t chosen, int n_top) {
  const Reference ref = reference(logits);
  const GeneratedLogprob got = token_logprobs(logits, chosen, n_top);
  EXPECT_EQ(got.chosen.token, chosen);
  EXPECT_NEAR(got.chosen.logprob, ref.logprob[size_t(chosen)], 1e-4);
  ASSERT_EQ(got.top.size(), std::min<size_t>(size_t(n_top), logits.size()));
  for (size_t i = 0; i < got.top.size(); ++i) {
    SCOPED_TRACE("top " + std::to_string(i));
    EXPECT_EQ(got.top[i].token, ref.order[i]);
    EXPECT_NEAR(got.top[i].logprob, ref.logprob[size_t(ref.order[i])], 1e-4);
  }
}

TEST(TokenLogprobs, MatchTheReferenceLogSoftmaxAndTopTokens) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> logits(5000);
  for (float& x : logits) x = normal(rng);
  for (int n_top : {0, 1, 5, 20}) {
    SCOPED_TRACE("n_top " + std::to_string(n_top));
    expect_matches_reference(logits, 123, n_top);
  }
  // A rising row moves the running maximum at every element.
  std::vector<float> rising(300);
  for (size_t i = 0; i < rising.size(); ++i) rising[i] = float(i) * 0.5f;
  expect_matches_reference(rising, 299, 3);
}

TEST(TokenLogprobs, TiesKeepTheLowerIdFirstAndMaskedTokensAreImpossible) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {kNegInf, 1.0f, 3.0f, 3.0f, kNegInf, 3.0f, 2.0f};
  expect_matches_reference(logits, 3, 4);
  const GeneratedLogprob masked = token_logprobs(logits, 0, 0);
  EXPECT_EQ(masked.chosen.logprob, kNegInf);
  // More best tokens than the vocabulary has: all of them.
  EXPECT_EQ(token_logprobs(logits, 1, 20).top.size(), logits.size());
}

TEST(TokenLogprobs, TokenTextIsUtf8OrItsBytes) {
  Vocab v;
  v.tokens = {"<unk>", "<s>", "</s>", "<0xE2>", "\xE2\x96\x81hi", "ok"};
  v.types = {TokenType::Unknown, TokenType::Control, TokenType::Control,
             TokenType::Byte,    TokenType::Normal,  TokenType::Normal};
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  const Tokenizer tokenizer(v);
  EXPECT_EQ(logprob_token_text(tokenizer, 5), "ok");
  EXPECT_EQ(logprob_token_text(tokenizer, 4), " hi");
  EXPECT_EQ(logprob_token_text(tokenizer, 3), "bytes:\\xe2");  // part of a character
  EXPECT_EQ(logprob_token_text(tokenizer, 2), "</s>");         // control tokens by name

  const std::vector<GeneratedLogprob> generated = {
      {{5, -0.5f}, {{4, -0.25f}, {5, -0.5f}}, 0},
      {{3, -2.0f}, {{4, -0.1f}}, 2},
  };
  const auto completion = completion_logprobs_json(tokenizer, generated);
  EXPECT_EQ(completion["tokens"], nlohmann::ordered_json({"ok", "bytes:\\xe2"}));
  EXPECT_EQ(completion["text_offset"], nlohmann::ordered_json({0, 2}));
  // The best tokens, then the chosen one when it is not among them.
  EXPECT_EQ(completion["top_logprobs"][1].size(), 2u);
  EXPECT_EQ(completion["top_logprobs"][1].begin().key(), " hi");
  const auto chat = chat_logprobs_json(tokenizer, generated);
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][1]["bytes"], nlohmann::ordered_json({0xE2}));
  EXPECT_EQ(chat["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["top_logprobs"][0]["token"], " hi");
}

}  // namespace
}  // namespace tandem::server
