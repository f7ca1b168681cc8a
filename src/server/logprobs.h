// Log-probabilities of generated tokens: the log-softmax of the logits the model produced (before
// penalties, temperature and truncation), the chosen token's and the best few, and their JSON
// forms in OpenAI's completions and chat answers.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "tandem/model/tokenizer.h"

namespace tandem::server {

inline constexpr int kMaxCompletionLogprobs = 5;  // /v1/completions `logprobs`, as OpenAI
inline constexpr int kMaxChatTopLogprobs = 20;    // /v1/chat/completions `top_logprobs`

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// One generated token: its log-probability, the best `n_top` tokens, best first, and where its
// text begins in the choice's text (bytes).
struct GeneratedLogprob {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
  int64_t text_offset = 0;
};

// log p(chosen) and the n_top most likely tokens (ties: the lower id first) of one row of logits.
// One pass over the row: an online log-sum-exp and a sorted list of the n_top best so far.
GeneratedLogprob token_logprobs(std::span<const float> logits, int32_t chosen, int n_top);

// A token's text for an answer: its bytes when they are UTF-8, else "bytes:\xNN..." (as OpenAI
// writes a token that holds part of a character).
std::string logprob_token_text(const Tokenizer& tokenizer, int32_t token);

// /v1/completions' `logprobs`: {tokens, token_logprobs, top_logprobs, text_offset}. A
// top_logprobs map holds the best tokens and the chosen one, one entry per distinct text.
nlohmann::ordered_json completion_logprobs_json(const Tokenizer& tokenizer,
                                                std::span<const GeneratedLogprob> logprobs);
// /v1/chat/completions' `logprobs`: {content: [{token, logprob, bytes, top_logprobs}]}.
nlohmann::ordered_json chat_logprobs_json(const Tokenizer& tokenizer,
                                          std::span<const GeneratedLogprob> logprobs);

}  // namespace tandem::server
