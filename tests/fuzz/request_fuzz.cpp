// libFuzzer target for the server's request bodies (/v1/completions, /v1/chat/completions): any
// body must parse into a request within its documented ranges or throw RequestError with a 4xx
// status, whose error body is JSON; a chat request's messages must render under every chat
// template. The first byte picks the endpoint, the rest is the body.
//   cmake --preset fuzz && cmake --build build/fuzz --target request_fuzz
//   mkdir -p /tmp/request && cp tests/fuzz/corpus/request/* /tmp/request
//   ./build/fuzz/tests/fuzz/request_fuzz -max_total_time=600 -print_final_stats=1 /tmp/request
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "chat_template.h"
#include "request.h"

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

constexpr tandem::server::ChatTemplate kTemplates[] = {
    tandem::server::ChatTemplate::Plain,  tandem::server::ChatTemplate::ChatML,
    tandem::server::ChatTemplate::Llama2, tandem::server::ChatTemplate::Llama3,
    tandem::server::ChatTemplate::Gemma,  tandem::server::ChatTemplate::Phi3,
    tandem::server::ChatTemplate::Zephyr};

void check(const tandem::server::CompletionRequest& r, bool chat) {
  using namespace tandem::server;
  require(r.chat == chat);
  require(r.n >= 1 && r.n <= kMaxChoices);
  require(r.stop.size() <= 4);
  for (const std::string& s : r.stop) require(!s.empty());
  require(!r.max_tokens || *r.max_tokens >= 0);
  require(r.top_logprobs >= -1 &&
          r.top_logprobs <= (chat ? kMaxChatTopLogprobs : kMaxCompletionLogprobs));
  const auto& s = r.sampling;
  require(s.temperature >= 0.0f && s.temperature <= 2.0f);
  require(s.top_p > 0.0f && s.top_p <= 1.0f);
  require(s.top_k >= 0);
  require(s.min_p >= 0.0f && s.min_p <= 1.0f);
  require(s.repeat_penalty > 0.0f);
  for (int32_t t : r.prompt_tokens) require(t >= 0);
  if (chat) {
    require(!r.messages.empty());
    for (const ChatMessage& m : r.messages) {
      require(m.role == "system" || m.role == "user" || m.role == "assistant");
    }
    for (ChatTemplate t : kTemplates) (void)apply_chat_template(t, r.messages);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::server;
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  CompletionRequest r;
  try {
    r = parse_completion_request(body, chat);
  } catch (const RequestError& e) {
    require(e.status() >= 400 && e.status() < 500);
    const std::string err = error_body(e.status(), e.what(), e.param(), e.code());
    require(nlohmann::json::accept(err));
    return 0;
  }
  check(r, chat);
  return 0;
}
