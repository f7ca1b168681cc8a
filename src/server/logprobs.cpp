#include "logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "../model/unicode.h"

namespace tandem::server {

namespace {

using ojson = nlohmann::ordered_json;

bool is_utf8(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    const unicode::Decoded d = unicode::decode_utf8(text, at);
    if (d.codepoint == unicode::kInvalid) return false;
    at += d.length;
  }
  return true;
}

ojson bytes_json(const std::string& piece) {
  ojson bytes = ojson::array();
  for (char c : piece) bytes.push_back(int(uint8_t(c)));
  return bytes;
}

}  // namespace

GeneratedLogprob token_logprobs(std::span<const float> logits, int32_t chosen, int n_top) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t keep = size_t(std::clamp<int64_t>(n_top, 0, int64_t(logits.size())));
  GeneratedLogprob out;
  out.top.reserve(keep + 1);
  // Online log-sum-exp: `sum` is sum(exp(x - max)) over the logits seen so far.
  float max = kNegInf;
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (x > max) {
      sum = sum * std::exp(double(max) - double(x)) + 1.0;
      max = x;
    } else if (x != kNegInf) {
      sum += std::exp(double(x) - double(max));
    }
    // Strictly better than the worst kept one: equal logits keep the lower id first.
    if (keep > 0 && (out.top.size() < keep || x > out.top.back().logprob)) {
      auto at = std::upper_bound(out.top.begin(), out.top.end(), x,
                                 [](float v, const TokenLogprob& t) { return v > t.logprob; });
      out.top.insert(at, TokenLogprob{int32_t(i), x});
      if (out.top.size() > keep) out.top.pop_back();
    }
  }
  const float log_sum = max + float(std::log(sum));
  for (TokenLogprob& t : out.top) t.logprob -= log_sum;
  out.chosen = {chosen, logits[size_t(chosen)] - log_sum};
  return out;
}

std::string logprob_token_text(const Tokenizer& tokenizer, int32_t token) {
  const std::string piece = tokenizer.token_to_piece(token, /*special=*/true);
  if (is_utf8(piece)) return piece;
  std::string text = "bytes:";
  for (char c : piece) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(uint8_t(c)));
    text += buf;
  }
  return text;
}

ojson completion_logprobs_json(const Tokenizer& tokenizer,
                               std::span<const GeneratedLogprob> logprobs) {
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top_logprobs = ojson::array(),
        text_offset = ojson::array();
  for (const GeneratedLogprob& g : logprobs) {
    tokens.push_back(logprob_token_text(tokenizer, g.chosen.token));
    token_logprobs.push_back(g.chosen.logprob);
    text_offset.push_back(g.text_offset);
    // Keyed by text, as OpenAI's: a token whose text a better one has is left out.
    ojson top = ojson::object();
    for (const TokenLogprob& t : g.top)
      top.emplace(logprob_token_text(tokenizer, t.token), t.logprob);
    top.emplace(logprob_token_text(tokenizer, g.chosen.token), g.chosen.logprob);
    top_logprobs.push_back(std::move(top));
  }
  return ojson{{"tokens", std::move(tokens)},
               {"token_logprobs", std::move(token_logprobs)},
               {"top_logprobs", std::move(top_logprobs)},
               {"text_offset", std::move(text_offset)}};
}

ojson chat_logprobs_json(const Tokenizer& tokenizer, std::span<const GeneratedLogprob> logprobs) {
  auto entry = [&tokenizer](const TokenLogprob& t) {
    const std::string piece = tokenizer.token_to_piece(t.token, /*special=*/true);
    return ojson{{"token", logprob_token_text(tokenizer, t.token)},
                 {"logprob", t.logprob},
                 {"bytes", bytes_json(piece)}};
  };
  ojson content = ojson::array();
  for (const GeneratedLogprob& g : logprobs) {
    ojson e = entry(g.chosen);
    ojson top = ojson::array();
    for (const TokenLogprob& t : g.top) top.push_back(entry(t));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return ojson{{"content", std::move(content)}};
}

}  // namespace tandem::server
