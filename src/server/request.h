// OpenAI request bodies to checked values: /v1/completions and /v1/chat/completions. Fields
// this server does not know are ignored, as OpenAI's clients send many; a known field of the
// wrong type or out of range is a RequestError naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "chat_template.h"
#include "logprobs.h"
#include "tandem/model/sampler.h"

namespace tandem::server {

// An error a client caused: an HTTP status and OpenAI's error body fields.
class RequestError : public std::runtime_error {
 public:
  RequestError(int status, std::string message, std::string param = {}, std::string code = {});
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_, code_;
};

// {"error": {"message", "type", "param", "code"}}; type is invalid_request_error for 4xx.
std::string error_body(int status, std::string_view message, std::string_view param = {},
                       std::string_view code = {});

struct CompletionRequest {
  bool chat = false;
  std::optional<std::string> model;
  std::string prompt;                  // completions: the text prompt
  std::vector<int32_t> prompt_tokens;  // completions: a prompt given as token ids
  std::vector<ChatMessage> messages;   // chat
  std::optional<int64_t> max_tokens;   // unset: completions 16, chat until the context is full
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  SamplerParams sampling;
  int n = 1;  // choices
  // -1: no logprobs; else the chosen token's and this many best (completions `logprobs`, chat
  // `top_logprobs` with `logprobs: true`).
  int top_logprobs = -1;
};

inline constexpr int kMaxChoices = 8;  // `n`

// Parses and checks a body. Throws RequestError (400) for malformed JSON, a body that is not an
// object, a missing prompt/messages, or a known field of the wrong type or range.
CompletionRequest parse_completion_request(std::string_view body, bool chat);

}  // namespace tandem::server
