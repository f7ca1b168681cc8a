// `tandem serve` over a socket on 127.0.0.1 with the tiny synthetic model: a completion equals
// the session's own greedy generation, a streamed chat equals the whole one, 16 concurrent
// clients each get their own complete answer, malformed requests get a 4xx with OpenAI's error
// body while the server keeps serving, /metrics parses, logprobs and several choices have
// OpenAI's shape, and a stop lets the request in flight finish.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "request.h"
#include "server.h"
#include "tandem/runtime.h"
#include "tiny_model.h"

namespace tandem::server {
namespace {

using json = nlohmann::json;

constexpr int64_t kSlotContext = 64;

SessionOptions tiny_session() {
  SessionOptions o;
  o.model_path = test::tiny_model_path();
  o.strategy = "cpu";
  o.n_ctx = kSlotContext;
  o.no_calibrate = true;
  o.threads = 1;
  o.timing = TimingMode::Timeline;
  return o;
}

// A server on an ephemeral port, serving from its own thread until destroyed.
class RunningServer {
 public:
  explicit RunningServer(size_t max_body_bytes = kDefaultMaxBodyBytes) {
    ServerOptions o;
    o.session = tiny_session();
    o.port = 0;
    o.n_slots = 4;
    o.model_alias = "tiny";
    o.max_body_bytes = max_body_bytes;
    server_ = std::make_unique<Server>(o);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->run(); });
  }
  ~RunningServer() { stop(); }
  void stop() {
    server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  Server& server() { return *server_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }
  int port() const { return port_; }

 private:
  std::unique_ptr<Server> server_;
  int port_ = 0;
  std::thread thread_;
};

RunningServer& shared_server() {
  static RunningServer server(64 << 10);
  return server;
}

// `text` as a JSON answer carries it: invalid UTF-8 (a random model's stray byte tokens) becomes
// U+FFFD.
std::string as_sent(const std::string& text) {
  return json::parse(json(text).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

// The text the session itself generates greedily for `prompt`, as the server sends it.
std::string greedy_text(const std::string& prompt, int n_predict, int64_t* n_prompt = nullptr) {
  static Session session(tiny_session());
  GenerateOptions g;
  g.n_predict = n_predict;
  g.sampling = SamplerParams::greedy();
  std::string text;
  const std::vector<int32_t> tokens = session.tokenizer().encode(prompt);  // as the server
  if (n_prompt) *n_prompt = int64_t(tokens.size());
  session.generate(tokens, g, [&](int32_t, std::string_view piece) {
    text += piece;
    return true;
  });
  return as_sent(text);
}

json post(const httplib::Client& c_in, const std::string& path, const json& body,
          int expect_status = 200) {
  httplib::Client& c = const_cast<httplib::Client&>(c_in);
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(res) << "no response to " << path;
  if (!res) return json();
  EXPECT_EQ(res->status, expect_status) << res->body;
  return json::parse(res->body, nullptr, false);
}

// Checks OpenAI's completion shape and returns the text.
std::string completion_text(const json& j, bool chat, int max_tokens) {
  EXPECT_TRUE(j.is_object()) << j.dump();
  if (!j.is_object()) return {};
  EXPECT_EQ(j["object"], chat ? "chat.completion" : "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_TRUE(j["id"].is_string());
  EXPECT_EQ(j["choices"].size(), 1u);
  const json& choice = j["choices"][0];
  EXPECT_TRUE(choice["finish_reason"] == "stop" || choice["finish_reason"] == "length")
      << choice.dump();
  const json& usage = j["usage"];
  EXPECT_LE(usage["completion_tokens"].get<int>(), max_tokens);
  EXPECT_EQ(usage["total_tokens"].get<int>(),
            usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
  if (choice["finish_reason"] == "length") {
    EXPECT_EQ(usage["completion_tokens"].get<int>(), max_tokens);
  }
  const json& text = chat ? choice["message"]["content"] : choice["text"];
  EXPECT_TRUE(text.is_string());
  if (chat) {
    EXPECT_EQ(choice["message"]["role"], "assistant");
  }
  return text.is_string() ? text.get<std::string>() : "";
}

TEST(Serve, HealthAndModels) {
  auto c = shared_server().client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json j = json::parse(models->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["meta"]["chat_template"], "plain");  // the synthetic file has none
}

TEST(Serve, CompletionEqualsTheSessionsGreedyGeneration) {
  auto c = shared_server().client();
  const json j =
      post(c, "/v1/completions",
           {{"model", "tiny"}, {"prompt", "hello world"}, {"max_tokens", 8}, {"temperature", 0}});
  int64_t n_prompt = 0;
  EXPECT_EQ(completion_text(j, false, 8), greedy_text("hello world", 8, &n_prompt));
  EXPECT_EQ(j["usage"]["prompt_tokens"], n_prompt);
}

TEST(Serve, StopStringEndsTheCompletionBeforeIt) {
  auto c = shared_server().client();
  const std::string full = greedy_text("the cat", 12);
  ASSERT_GE(full.size(), 4u);
  // Two ASCII characters from the second half (never part of a replaced byte).
  size_t at = full.size() / 2;
  while (at + 1 < full.size() && (uint8_t(full[at]) >= 0x80 || uint8_t(full[at + 1]) >= 0x80)) ++at;
  ASSERT_LT(at + 1, full.size()) << full;
  const std::string stop = full.substr(at, 2);
  const json j =
      post(c, "/v1/completions",
           {{"prompt", "the cat"}, {"max_tokens", 12}, {"temperature", 0}, {"stop", stop}});
  EXPECT_EQ(completion_text(j, false, 12), full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

// The events of a server-sent-event body, "data: " stripped; the last must be [DONE].
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> events;
  size_t at = 0;
  while (at < body.size()) {
    const size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "unterminated event at " << at;
    if (end == std::string::npos) break;
    const std::string event = body.substr(at, end - at);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    events.push_back(event.substr(6));
    at = end + 2;
  }
  return events;
}

TEST(Serve, StreamedChatEqualsTheWholeOne) {
  auto c = shared_server().client();
  const json messages = json::array({{{"role", "system"}, {"content", "be brief"}},
                                     {{"role", "user"}, {"content", "say something"}}});
  const json whole = post(c, "/v1/chat/completions",
                          {{"messages", messages}, {"max_tokens", 10}, {"temperature", 0}});
  const std::string expected = completion_text(whole, true, 10);

  json body = {{"messages", messages},
               {"max_tokens", 10},
               {"temperature", 0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  const std::vector<std::string> events = sse_events(res->body);
  ASSERT_GE(events.size(), 4u);  // role, content..., finish, usage, [DONE]
  EXPECT_EQ(events.back(), "[DONE]");
  std::string streamed;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_EQ(e["id"], json::parse(events[0])["id"]);
    if (i + 2 == events.size()) {  // usage, no choices
      EXPECT_TRUE(e["choices"].empty());
      EXPECT_EQ(e["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
      continue;
    }
    const json& choice = e["choices"][0];
    if (i == 0) {
      EXPECT_EQ(choice["delta"]["role"], "assistant");
    }
    if (choice["delta"].contains("content")) streamed += choice["delta"]["content"];
    if (!choice["finish_reason"].is_null()) {
      EXPECT_EQ(i + 3, events.size()) << "a finish_reason before the last chunk";
      finish = choice["finish_reason"];
    }
  }
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
}

TEST(Serve, StreamedCompletionEndsWithDone) {
  auto c = shared_server().client();
  json body = {{"prompt", "once upon"}, {"max_tokens", 6}, {"temperature", 0}, {"stream", true}};
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  const auto events = sse_events(res->body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "text_completion");
    text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, greedy_text("once upon", 6));
}

TEST(Serve, SixteenConcurrentClientsEachGetTheirOwnAnswer) {
  const std::vector<std::string> prompts = {"alpha", "the quick brown fox", "one two three",
                                            "zebra"};
  std::vector<std::string> expected;
  for (const auto& p : prompts) expected.push_back(greedy_text(p, 6));
  constexpr int kClients = 16;
  std::vector<json> answers(kClients);
  std::vector<int> statuses(kClients, 0);
  std::vector<std::string> errors(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      auto c = shared_server().client();
      const bool stream = false;
      json body = {{"prompt", prompts[size_t(i) % prompts.size()]},
                   {"max_tokens", 6},
                   {"temperature", 0},
                   {"stream", stream}};
      auto res = c.Post("/v1/completions", body.dump(), "application/json");
      if (!res) {
        errors[size_t(i)] = httplib::to_string(res.error());
        return;
      }
      statuses[size_t(i)] = res->status;
      answers[size_t(i)] = json::parse(res->body, nullptr, false);
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) {
    SCOPED_TRACE("client " + std::to_string(i));
    EXPECT_EQ(statuses[size_t(i)], 200) << errors[size_t(i)];
    EXPECT_EQ(completion_text(answers[size_t(i)], false, 6), expected[size_t(i) % prompts.size()]);
  }
  // Every answer counted once.
  const std::string metrics = shared_server().server().metrics_text();
  EXPECT_NE(metrics.find("tandem_slots{state=\"total\"} 4"), std::string::npos);
}

TEST(Serve, MalformedRequestsGetAnErrorAndTheServerKeepsServing) {
  auto c = shared_server().client();
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "word ";
  const std::vector<std::pair<std::string, std::string>> completions = {
      {"/v1/completions", "not json"},
      {"/v1/completions", "{\"prompt\": \"a\""},
      {"/v1/completions", "[1, 2]"},
      {"/v1/completions", ""},
      {"/v1/completions", "{}"},
      {"/v1/completions", R"({"prompt": 5})"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": "8"})"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": -1})"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 1000})"},
      {"/v1/completions", R"({"prompt": ")" + long_prompt + R"("})"},
      {"/v1/completions", R"({"prompt": [1, 2, 999999]})"},
      {"/v1/completions", R"({"prompt": "a", "temperature": "hot"})"},
      {"/v1/completions", R"({"prompt": "a", "temperature": 9})"},
      {"/v1/completions", R"({"prompt": "a", "top_p": 0})"},
      {"/v1/completions", R"({"prompt": "a", "top_k": -3})"},
      {"/v1/completions", R"({"prompt": "a", "stream": "yes"})"},
      {"/v1/completions", R"({"prompt": "a", "stop": 5})"},
      {"/v1/completions", R"({"prompt": "a", "stop": ["a","b","c","d","e"]})"},
      {"/v1/completions", R"({"prompt": "a", "n": 9})"},
      {"/v1/completions", R"({"prompt": "a", "n": 0})"},
      {"/v1/completions", R"({"prompt": "a", "logprobs": 6})"},
      {"/v1/completions", R"({"prompt": "a", "logprobs": true})"},
      {"/v1/completions", R"({"prompt": "a", "seed": "x"})"},
      {"/v1/completions", R"({"prompt": "a", "model": 42})"},
      {"/v1/completions", R"({"prompt": "a", "model": "gpt-4"})"},
      {"/v1/chat/completions", R"({"messages": "hi"})"},
      {"/v1/chat/completions", R"({"messages": []})"},
      {"/v1/chat/completions", R"({"messages": [{"content": "hi"}]})"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": 7}]})"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}],
                                   "stream_options": 1})"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}],
                                   "logprobs": 1})"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}],
                                   "top_logprobs": 2})"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}],
                                   "logprobs": true, "top_logprobs": 21})"},
      {"/v1/nothing-here", "{}"},
      {"/v1/completions", std::string(100 << 10, 'x')},  // over the 64 KiB body limit
  };
  ASSERT_EQ(completions.size(), 35u);
  for (const auto& [path, body] : completions) {
    SCOPED_TRACE(path + " " + body.substr(0, 80));
    auto res = c.Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_GE(res->status, 400);
    EXPECT_LT(res->status, 500);
    const json j = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << res->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const json ok = post(c, "/v1/completions", {{"prompt", "still here"}, {"max_tokens", 2}});
  completion_text(ok, false, 2);
}

TEST(Serve, UnknownModelIsNotFoundAndTooManyTokensNamesTheContext) {
  auto c = shared_server().client();
  const json unknown = post(c, "/v1/completions", {{"prompt", "a"}, {"model", "gpt-4"}}, 404);
  EXPECT_EQ(unknown["error"]["code"], "model_not_found");
  const json too_many = post(c, "/v1/completions", {{"prompt", "a"}, {"max_tokens", 1000}}, 400);
  EXPECT_EQ(too_many["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(too_many["error"]["param"], "max_tokens");
}

TEST(Serve, MetricsArePrometheusTextWithPerBackendCounters) {
  auto c = shared_server().client();
  post(c, "/v1/completions", {{"prompt", "count me"}, {"max_tokens", 3}});
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const std::regex sample(
      R"(^[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? [-+0-9.eE]+(inf)?$)");
  std::istringstream lines(res->body);
  std::string line;
  std::map<std::string, double> values;
  while (std::getline(lines, line)) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) continue;
    EXPECT_TRUE(std::regex_match(line, sample)) << line;
    const size_t space = line.rfind(' ');
    values[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  EXPECT_GT(values["tandem_backend_ops_total{backend=\"cpu\"}"], 0.0);
  EXPECT_GE(values["tandem_generated_tokens_total"], 3.0);
  EXPECT_GT(values["tandem_prompt_tokens_total"], 0.0);
  EXPECT_GT(values["tandem_backend_seconds_total{backend=\"cpu\"}"], 0.0);
  EXPECT_GE(values["tandem_http_requests_total{route=\"/v1/completions\",status=\"200\"}"], 1.0);
  EXPECT_TRUE(values.count("tandem_backend_transfer_bytes_total{backend=\"cpu\"}"));
  EXPECT_TRUE(values.count("tandem_tokens_per_second{phase=\"generation\"}"));
}

// Checks one greedy token's completions-style entry: the map of the best is sorted, at most n
// long, and begins with the chosen token, whose logprob is the best one.
void expect_greedy_completion_logprobs(const nlohmann::ordered_json& lp, size_t n_tokens, int n) {
  ASSERT_TRUE(lp.is_object()) << lp.dump();
  ASSERT_EQ(lp["tokens"].size(), n_tokens);
  ASSERT_EQ(lp["token_logprobs"].size(), n_tokens);
  ASSERT_EQ(lp["top_logprobs"].size(), n_tokens);
  ASSERT_EQ(lp["text_offset"].size(), n_tokens);
  for (size_t i = 0; i < n_tokens; ++i) {
    SCOPED_TRACE("token " + std::to_string(i));
    const double chosen = lp["token_logprobs"][i].get<double>();
    EXPECT_LE(chosen, 0.0);
    const auto& top = lp["top_logprobs"][i];
    // Keyed by text: two tokens with one text (a byte token and its character) share an entry.
    EXPECT_GE(top.size(), 1u);
    EXPECT_LE(top.size(), size_t(n));
    double previous = 0.0;
    for (auto it = top.begin(); it != top.end(); ++it) {
      EXPECT_LE(it.value().get<double>(), previous) << top.dump();
      previous = it.value().get<double>();
    }
    EXPECT_EQ(top.begin().key(), lp["tokens"][i]);
    EXPECT_NEAR(top.begin().value().get<double>(), chosen, 1e-6);
    if (i > 0) {
      EXPECT_GE(lp["text_offset"][i], lp["text_offset"][i - 1]);
    }
  }
  if (n_tokens > 0) {
    EXPECT_EQ(lp["text_offset"][0], 0);
  }
}

TEST(Serve, CompletionLogprobsAreSortedAndTheGreedyTokenIsTheBest) {
  auto c = shared_server().client();
  const json body = {
      {"prompt", "hello world"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 3}};
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto j = nlohmann::ordered_json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["text"], greedy_text("hello world", 6));  // asking changes nothing
  const size_t n_tokens = j["usage"]["completion_tokens"].get<size_t>();
  expect_greedy_completion_logprobs(j["choices"][0]["logprobs"], n_tokens, 3);

  // Streamed, the chunks carry the same tokens.
  json streamed_body = body;
  streamed_body["stream"] = true;
  auto streamed = c.Post("/v1/completions", streamed_body.dump(), "application/json");
  ASSERT_TRUE(streamed);
  json tokens = json::array();
  for (const std::string& event : sse_events(streamed->body)) {
    if (event == "[DONE]") break;
    const json e = json::parse(event);
    const json& lp = e["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (const json& t : lp["tokens"]) tokens.push_back(t);
  }
  EXPECT_EQ(tokens, json(j["choices"][0]["logprobs"]["tokens"]));

  // Not asked: null.
  const json plain = post(c, "/v1/completions", {{"prompt", "hello world"}, {"max_tokens", 2}});
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
}

// The raw bytes of a logprobs token: its text, or the bytes a "bytes:\xNN..." token names.
std::string token_bytes(const std::string& token) {
  if (token.rfind("bytes:", 0) != 0) return token;
  std::string out;
  for (size_t at = 6; at + 4 <= token.size(); at += 4)
    out += char(std::stoi(token.substr(at + 2, 2), nullptr, 16));
  return out;
}

TEST(Serve, LogprobsLeaveOutTheTokensOfAStopString) {
  auto c = shared_server().client();
  const json full =
      post(c, "/v1/completions",
           {{"prompt", "the cat"}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 0}});
  const json& tokens = full["choices"][0]["logprobs"]["tokens"];
  const json& offsets = full["choices"][0]["logprobs"]["text_offset"];
  std::string raw;
  for (const json& t : tokens) raw += token_bytes(t.get<std::string>());
  // A later token of plain ASCII text is the stop string; it ends the text where it first occurs.
  std::string stop;
  for (size_t k = 1; k < tokens.size() && stop.empty(); ++k) {
    const std::string t = tokens[k];
    const auto printable = [](char ch) { return ch >= ' ' && uint8_t(ch) < 0x80; };
    if (!t.empty() && t.rfind("bytes:", 0) != 0 && std::all_of(t.begin(), t.end(), printable)) {
      stop = t;
    }
  }
  ASSERT_FALSE(stop.empty()) << tokens.dump();
  const int64_t cut = int64_t(raw.find(stop));
  size_t kept = 0;
  while (kept < offsets.size() && offsets[kept].get<int64_t>() < cut) ++kept;
  ASSERT_LT(kept, tokens.size());  // the stop string's own token at least is left out

  const json cut_short = post(c, "/v1/completions",
                              {{"prompt", "the cat"},
                               {"max_tokens", 12},
                               {"temperature", 0},
                               {"logprobs", 0},
                               {"stop", stop}});
  EXPECT_EQ(cut_short["choices"][0]["finish_reason"], "stop");
  const json& listed = cut_short["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(listed.size(), kept) << "stop " << json(stop).dump() << " in " << tokens.dump();
  for (size_t i = 0; i < kept; ++i) EXPECT_EQ(listed[i], tokens[i]);
}

TEST(Serve, ChatLogprobsHaveOpenAIsShape) {
  auto c = shared_server().client();
  const json messages = json::array({{{"role", "user"}, {"content", "say something"}}});
  const json j = post(c, "/v1/chat/completions",
                      {{"messages", messages},
                       {"max_tokens", 5},
                       {"temperature", 0},
                       {"logprobs", true},
                       {"top_logprobs", 4}});
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_TRUE(content.is_array()) << j.dump();
  EXPECT_EQ(content.size(), j["usage"]["completion_tokens"].get<size_t>());
  for (const json& e : content) {
    EXPECT_TRUE(e["token"].is_string());
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(e["bytes"].is_array());
    for (const json& b : e["bytes"]) EXPECT_TRUE(b.is_number_integer() && b >= 0 && b < 256);
    const json& top = e["top_logprobs"];
    ASSERT_EQ(top.size(), 4u);
    for (size_t k = 1; k < top.size(); ++k) EXPECT_LE(top[k]["logprob"], top[k - 1]["logprob"]);
    EXPECT_EQ(top[0]["token"], e["token"]);
    EXPECT_NEAR(top[0]["logprob"].get<double>(), e["logprob"].get<double>(), 1e-6);
  }
  // logprobs without top_logprobs: the chosen tokens only.
  const json bare = post(c, "/v1/chat/completions",
                         {{"messages", messages}, {"max_tokens", 2}, {"logprobs", true}});
  for (const json& e : bare["choices"][0]["logprobs"]["content"])
    EXPECT_TRUE(e["top_logprobs"].empty());
}

TEST(Serve, SeveralChoicesEachSampleTheirOwnContinuation) {
  auto c = shared_server().client();
  const std::string expected = greedy_text("one two", 4);
  const json one =
      post(c, "/v1/completions", {{"prompt", "one two"}, {"max_tokens", 4}, {"temperature", 0}});
  const json greedy =
      post(c, "/v1/completions",
           {{"prompt", "one two"}, {"max_tokens", 4}, {"temperature", 0}, {"n", 3}});
  ASSERT_EQ(greedy["choices"].size(), 3u) << greedy.dump();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(greedy["choices"][i]["index"], i);
    EXPECT_EQ(greedy["choices"][i]["text"], expected);
  }
  // The prompt counts once, the choices' tokens all.
  EXPECT_EQ(greedy["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
  EXPECT_EQ(greedy["usage"]["completion_tokens"], 3 * one["usage"]["completion_tokens"].get<int>());

  // Sampled: choice i draws with seed + i.
  const json sampled = post(
      c, "/v1/completions",
      {{"prompt", "one two"}, {"max_tokens", 4}, {"temperature", 1.5}, {"seed", 40}, {"n", 2}});
  const json alone =
      post(c, "/v1/completions",
           {{"prompt", "one two"}, {"max_tokens", 4}, {"temperature", 1.5}, {"seed", 41}});
  ASSERT_EQ(sampled["choices"].size(), 2u);
  EXPECT_EQ(sampled["choices"][1]["text"], alone["choices"][0]["text"]);

  // Streamed: every chunk names its choice; each choice ends once.
  auto res = c.Post("/v1/chat/completions",
                    json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                         {"max_tokens", 3},
                         {"temperature", 0},
                         {"n", 2},
                         {"stream", true}}
                        .dump(),
                    "application/json");
  ASSERT_TRUE(res);
  std::map<int, std::string> text;
  std::map<int, int> finishes;
  for (const std::string& event : sse_events(res->body)) {
    if (event == "[DONE]") break;
    const json choice = json::parse(event)["choices"][0];
    const int index = choice["index"];
    ASSERT_TRUE(index == 0 || index == 1) << event;
    if (choice["delta"].contains("content")) text[index] += choice["delta"]["content"];
    if (!choice["finish_reason"].is_null()) ++finishes[index];
  }
  EXPECT_EQ(finishes[0], 1);
  EXPECT_EQ(finishes[1], 1);
  EXPECT_EQ(text[0], text[1]);
}

TEST(Serve, TooManyChoicesIsAnInvalidRequest) {
  auto c = shared_server().client();
  const json j = post(c, "/v1/completions", {{"prompt", "a"}, {"n", kMaxChoices + 1}}, 400);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"].contains("code"));
}

TEST(Serve, StopLetsTheRequestInFlightFinish) {
  RunningServer running;
  json answer;
  int status = 0;
  std::atomic<bool> answered{false};
  std::thread client([&] {
    auto c = running.client();
    json body = {{"prompt", "a long answer"}, {"max_tokens", 40}, {"temperature", 0}};
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    if (!res) return;
    status = res->status;
    answer = json::parse(res->body, nullptr, false);
    answered = true;
  });
  // Stop as soon as the server has the request (40 tokens take far longer than this poll).
  while (running.server().requests_in_flight() == 0 && !answered) std::this_thread::yield();
  running.stop();  // returns once the request in flight has its answer
  client.join();
  EXPECT_EQ(status, 200);
  EXPECT_EQ(completion_text(answer, false, 40), greedy_text("a long answer", 40));
  auto after = running.client().Get("/health");
  EXPECT_FALSE(after) << "still answering after stop";
}

// A client that keeps its connection open after one answer, as pooling clients do (OpenAI's
// Python client): a raw socket, so nothing on the client side closes it.
class IdleKeepAliveClient {
 public:
  explicit IdleKeepAliveClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~IdleKeepAliveClient() { ::close(fd_); }
  // Sends GET /health (HTTP/1.1, keep-alive by default) and reads the answer's head.
  std::string get_health() {
    const std::string request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    if (!connected_ || ::send(fd_, request.data(), request.size(), 0) < 0) return {};
    std::string answer;
    char buf[512];
    while (answer.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      answer.append(buf, size_t(n));
    }
    return answer;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

TEST(Serve, StopDoesNotWaitForAnIdleKeepAliveConnection) {
  RunningServer running;
  IdleKeepAliveClient idle(running.port());
  const std::string head = idle.get_health();
  ASSERT_NE(head.find("200 OK"), std::string::npos) << head;
  // httplib 0.11 waits out an idle connection's keep-alive timeout (5 s) before it can stop;
  // answers close their connection instead.
  EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
  const auto t0 = std::chrono::steady_clock::now();
  running.stop();
  const double stop_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(stop_s, 2.5) << "stop waited for the idle connection";
}

}  // namespace
}  // namespace tandem::server
