#include "request.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <random>

namespace tandem::server {

namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw RequestError(400, message, param);
}

// A field that is present and not null, or nullptr (OpenAI treats null as absent).
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> number(const json& body, const char* name, double lo, double hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(name, std::string("'") + name + "' must be a number");
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    bad(name, std::string("'") + name + "' must be in [" + json(lo).dump() + ", " +
                  json(hi).dump() + "] (got " + v->dump() + ")");
  }
  return x;
}

std::optional<int64_t> integer(const json& body, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) bad(name, std::string("'") + name + "' must be an integer");
  const bool above = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(hi);
  const int64_t x = above ? hi : v->get<int64_t>();
  if (above || x < lo || x > hi) {
    bad(name, std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "] (got " + v->dump() + ")");
  }
  return x;
}

std::optional<bool> boolean(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(name, std::string("'") + name + "' must be a boolean");
  return v->get<bool>();
}

constexpr size_t kMaxStopStrings = 4;  // as OpenAI

std::vector<std::string> stop_strings(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) bad("stop", "'stop' must be a string or an array of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad("stop", "'stop' must be a string or an array of strings");
  }
  if (out.size() > kMaxStopStrings) bad("stop", "'stop' takes at most 4 strings");
  for (const auto& s : out)
    if (s.empty()) bad("stop", "'stop' strings must not be empty");
  return out;
}

void parse_prompt(const json& body, CompletionRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    return;
  }
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    r.prompt = (*p)[0].get<std::string>();
    return;
  }
  if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    for (const json& t : *p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        bad("prompt", "'prompt' token ids must be non-negative integers");
      }
      r.prompt_tokens.push_back(t.get<int32_t>());
    }
    return;
  }
  bad("prompt", "'prompt' must be a string, an array of one string, or an array of token ids");
}

void parse_messages(const json& body, CompletionRequest& r) {
  const json* m = field(body, "messages");
  if (!m) bad("messages", "'messages' is required");
  if (!m->is_array() || m->empty()) bad("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) bad(where, "'" + where + "' must be an object");
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string())
      bad(where + ".role", "'" + where + ".role' must be a string");
    ChatMessage out{role->get<std::string>(), {}};
    if (out.role != "system" && out.role != "user" && out.role != "assistant" &&
        out.role != "developer") {
      bad(where + ".role", "'" + where + ".role' must be system, developer, user or assistant");
    }
    if (out.role == "developer") out.role = "system";
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) {
      bad(where + ".content", "'" + where + ".content' is required");
    } else if (content->is_string()) {
      out.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: only text parts can be read by a text model.
      for (const json& part : *content) {
        auto type = part.is_object() ? part.find("type") : part.end();
        auto text = part.is_object() ? part.find("text") : part.end();
        if (type == part.end() || *type != "text" || text == part.end() || !text->is_string())
          bad(where + ".content", "'" + where + ".content' parts must be {type: text, text}");
        out.content += text->get<std::string>();
      }
    } else {
      bad(where + ".content", "'" + where + ".content' must be a string or an array of parts");
    }
    r.messages.push_back(std::move(out));
  }
}

}  // namespace

RequestError::RequestError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)),
      status_(status),
      param_(std::move(param)),
      code_(std::move(code)) {}

std::string error_body(int status, std::string_view message, std::string_view param,
                       std::string_view code) {
  const char* type = status >= 500 ? "server_error" : "invalid_request_error";
  json error = {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", error}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

CompletionRequest parse_completion_request(std::string_view body, bool chat) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw RequestError(400, "the request body is not valid JSON");
  if (!j.is_object()) throw RequestError(400, "the request body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  if (const json* m = field(j, "model")) {
    if (!m->is_string()) bad("model", "'model' must be a string");
    r.model = m->get<std::string>();
  }
  if (chat) {
    parse_messages(j, r);
  } else {
    parse_prompt(j, r);
  }
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  r.max_tokens = integer(j, "max_tokens", 0, kMaxInt);
  if (chat) {
    if (auto m = integer(j, "max_completion_tokens", 0, kMaxInt)) r.max_tokens = m;
  }
  r.n = int(integer(j, "n", 1, kMaxChoices).value_or(1));
  r.stream = boolean(j, "stream").value_or(false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  r.stop = stop_strings(j);
  SamplerParams& s = r.sampling;
  if (auto t = number(j, "temperature", 0.0, 2.0)) s.temperature = float(*t);
  // top_p and repeat_penalty are used as floats: a positive double that rounds to 0 is refused
  // here, with its name, rather than by the sampler.
  if (auto p = number(j, "top_p", 0.0, 1.0)) {
    if (float(*p) <= 0.0f) bad("top_p", "'top_p' must be in (0, 1] (got " + json(*p).dump() + ")");
    s.top_p = float(*p);
  }
  if (auto k = integer(j, "top_k", 0, kMaxInt)) s.top_k = int32_t(*k);
  if (auto p = number(j, "min_p", 0.0, 1.0)) s.min_p = float(*p);
  if (auto p = number(j, "presence_penalty", -2.0, 2.0)) s.presence_penalty = float(*p);
  if (auto p = number(j, "frequency_penalty", -2.0, 2.0)) s.frequency_penalty = float(*p);
  if (auto p = number(j, "repeat_penalty", 0.0, 100.0)) {
    if (float(*p) <= 0.0f) {
      bad("repeat_penalty", "'repeat_penalty' must be > 0 (got " + json(*p).dump() + ")");
    }
    s.repeat_penalty = float(*p);
  }
  const auto seed =
      integer(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  s.seed = seed ? uint64_t(*seed) : std::random_device{}();
  if (chat) {
    const bool logprobs = boolean(j, "logprobs").value_or(false);
    const auto top = integer(j, "top_logprobs", 0, kMaxChatTopLogprobs);
    if (top && !logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (logprobs) r.top_logprobs = int(top.value_or(0));
  } else if (auto n = integer(j, "logprobs", 0, kMaxCompletionLogprobs)) {
    r.top_logprobs = int(*n);
  }
  return r;
}

}  // namespace tandem::server
