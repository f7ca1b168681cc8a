#include "server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "chat_template.h"
#include "request.h"
#include "slots.h"
#include "tandem/error.h"

namespace tandem::server {

namespace {

// Answers keep their fields in OpenAI's order (and a top_logprobs map best first).
using json = nlohmann::ordered_json;

constexpr int kListenBacklog = 1024;  // connections the kernel holds until they are accepted

// The JSON text of `j`; invalid UTF-8 in generated text is replaced, never an exception.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void send_error(httplib::Response& res, int status, std::string_view message,
                std::string_view param = {}, std::string_view code = {}) {
  res.status = status;
  res.set_content(error_body(status, message, param, code), "application/json");
}

std::string default_model_id(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name.empty() ? "tandem" : name;
}

// Prometheus text: "# HELP", "# TYPE", then samples.
class MetricsWriter {
 public:
  void family(const char* name, const char* type, const char* help) {
    os_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  void sample(const char* name, double value, const std::string& labels = {}) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", value);
    os_ << name << (labels.empty() ? "" : "{" + labels + "}") << ' ' << buf << '\n';
  }
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
};

std::string label(const char* key, const std::string& value) {
  std::string escaped;
  for (char c : value) {
    if (c == '\\' || c == '"') escaped += '\\';
    escaped += c == '\n' ? 'n' : c;
  }
  return std::string(key) + "=\"" + escaped + "\"";
}

}  // namespace

struct Server::Impl {
  ServerOptions options;
  std::unique_ptr<SlotEngine> engine;
  std::string model_id;
  ChatTemplate chat_template = ChatTemplate::Plain;
  httplib::Server http;
  std::atomic<uint64_t> next_id{1};
  std::atomic<int> in_flight{0};  // generation requests submitted and not yet answered
  std::atomic<bool> running{false}, stop_requested{false}, http_stopped{false};
  int listen_socket = -1;
  mutable std::mutex requests_mutex;
  std::map<std::pair<std::string, int>, uint64_t> requests;  // (route, status) -> count

  void routes();
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  Job make_job(const CompletionRequest& r) const;
  void count(const httplib::Request& req, const httplib::Response& res);
  std::string metrics() const;
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.options = std::move(options);
  TANDEM_CHECK_ARG(s.options.n_slots >= 1, "--parallel",
                   "must be >= 1 (got " + std::to_string(s.options.n_slots) + ")");
  s.engine = std::make_unique<SlotEngine>(s.options.session, s.options.n_slots);
  s.model_id = s.options.model_alias.empty() ? default_model_id(s.options.session.model_path)
                                             : s.options.model_alias;
  s.chat_template = chat_template_of(s.engine->model().file());
  const int threads =
      s.options.http_threads > 0 ? s.options.http_threads : std::max(32, 4 * s.options.n_slots);
  // httplib owns the queue it asks for.
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  s.http.set_payload_max_length(s.options.max_body_bytes);
  // One request per connection: httplib 0.11 cannot wake a worker waiting on an idle keep-alive
  // connection, so stop() would wait out its timeout (5 s). A new connection costs far less
  // than a generation.
  s.http.set_keep_alive_max_count(1);
  s.http.set_socket_options([&s](socket_t sock) {
    httplib::default_socket_options(sock);
    s.listen_socket = int(sock);
  });
  s.routes();
}

Server::~Server() {
  stop();
  impl_->engine->stop();
}

int Server::bind() {
  Impl& s = *impl_;
  const int port =
      s.options.port == 0
          ? s.http.bind_to_any_port(s.options.host)
          : (s.http.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1);
  if (port < 0) {
    throw_error(ErrorCode::Io, "serve",
                "cannot listen on " + s.options.host + ":" + std::to_string(s.options.port));
  }
  // httplib listens with a backlog of 5: a burst of clients connecting at once would overflow
  // it. Listening again sets a larger one.
  if (s.listen_socket >= 0) ::listen(s.listen_socket, kListenBacklog);
  return port;
}

void Server::run() {
  Impl& s = *impl_;
  s.running = true;
  if (!s.stop_requested) s.http.listen_after_bind();
  s.running = false;
  // Every handler has returned: no request waits on the engine any more.
  s.engine->stop();
}

void Server::stop() {
  Impl& s = *impl_;
  s.stop_requested = true;
  // httplib ignores a stop before its loop runs: wait for the loop run() is starting.
  while (s.running && !s.http.is_running()) std::this_thread::yield();
  if (!s.http_stopped.exchange(true)) s.http.stop();
}

const std::string& Server::model_id() const {
  return impl_->model_id;
}
int Server::n_slots() const {
  return impl_->engine->n_slots();
}
int64_t Server::n_ctx() const {
  return impl_->engine->n_ctx();
}
int Server::requests_in_flight() const {
  return impl_->in_flight;
}
std::string Server::metrics_text() const {
  return impl_->metrics();
}

void Server::Impl::routes() {
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  auto models = [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", model_id},
                  {"object", "model"},
                  {"created", unix_seconds()},
                  {"owned_by", "tandem"},
                  {"meta",
                   {{"n_ctx", engine->n_ctx()},
                    {"n_vocab", engine->model().config().n_vocab},
                    {"slots", engine->n_slots()},
                    {"chat_template", std::string(chat_template_name(chat_template))}}}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({model})}}),
                    "application/json");
  };
  http.Get("/v1/models", models);
  http.Get("/models", models);
  auto completions = [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, false);
  };
  auto chat = [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, true);
  };
  http.Post("/v1/completions", completions);
  http.Post("/completions", completions);
  http.Post("/v1/chat/completions", chat);
  http.Post("/chat/completions", chat);
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
  // Errors httplib finds itself (no route, body too large) get OpenAI's body too.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_error(res, 404, "no route for " + req.method + " " + req.path);
    } else if (res.status == 413) {
      send_error(res, 413, "the request body is too large");
    } else {
      send_error(res, res.status, "HTTP error " + std::to_string(res.status));
    }
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          send_error(res, 500, e.what());
        } catch (...) {
          send_error(res, 500, "unknown error");
        }
      });
  // Counted before the response is written (the logger runs after it: a client that read its
  // answer could read /metrics before its request was counted).
  http.set_post_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { count(req, res); });
}

Job Server::Impl::make_job(const CompletionRequest& r) const {
  const Tokenizer& tokenizer = engine->model().tokenizer();
  const int64_t n_ctx = engine->n_ctx();
  Job job;
  if (r.chat) {
    // The template's special tokens ("<|im_start|>") are control tokens, not text.
    EncodeOptions options;
    options.add_bos = tokenizer.vocab().add_bos;
    options.parse_special = true;
    job.prompt = tokenizer.encode(apply_chat_template(chat_template, r.messages), options);
  } else if (!r.prompt_tokens.empty()) {
    job.prompt = r.prompt_tokens;
    for (int32_t t : job.prompt) {
      if (t >= tokenizer.n_tokens()) {
        throw RequestError(400,
                           "token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                               std::to_string(tokenizer.n_tokens()) + ")",
                           "prompt");
      }
    }
  } else {
    job.prompt = tokenizer.encode(r.prompt);
  }
  if (job.prompt.empty()) throw RequestError(400, "the prompt has no tokens", "prompt");
  const int64_t n_prompt = int64_t(job.prompt.size());
  const int64_t room = n_ctx - n_prompt;
  if (room < 1 || (r.max_tokens && *r.max_tokens > room)) {
    throw RequestError(400,
                       "This model's maximum context length is " + std::to_string(n_ctx) +
                           " tokens. However, you requested " +
                           std::to_string(n_prompt + r.max_tokens.value_or(1)) + " tokens (" +
                           std::to_string(n_prompt) + " in the prompt, " +
                           std::to_string(r.max_tokens.value_or(1)) +
                           " for the completion). Please reduce the prompt or max_tokens.",
                       r.max_tokens ? "max_tokens" : (r.chat ? "messages" : "prompt"),
                       "context_length_exceeded");
  }
  // As OpenAI: completions default to 16 tokens, chat to whatever the context leaves.
  constexpr int64_t kDefaultCompletionTokens = 16;
  job.max_tokens = r.max_tokens ? *r.max_tokens
                   : r.chat     ? room
                                : std::min(room, kDefaultCompletionTokens);
  job.sampling = r.sampling;
  try {
    const Sampler checked(job.sampling);  // the engine thread must not meet a bad parameter
  } catch (const Error& e) {
    throw RequestError(400, e.what());
  }
  job.stop = r.stop;
  job.n_choices = r.n;
  job.top_logprobs = r.top_logprobs;
  return job;
}

void Server::Impl::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  CompletionRequest r;
  Job job;
  try {
    r = parse_completion_request(req.body, chat);
    if (r.model && *r.model != model_id) {
      throw RequestError(
          404, "The model '" + *r.model + "' does not exist (this server has '" + model_id + "')",
          "model", "model_not_found");
    }
    job = make_job(r);
  } catch (const RequestError& e) {
    send_error(res, e.status(), e.what(), e.param(), e.code());
    return;
  } catch (const Error& e) {  // the text could not be tokenized
    send_error(res, 400, e.what(), chat ? "messages" : "prompt");
    return;
  }
  const int64_t n_prompt = int64_t(job.prompt.size());
  std::shared_ptr<Completion> c = engine->submit(std::move(job));
  if (!c) {
    send_error(res, 503, "the server is shutting down");
    return;
  }
  ++in_flight;
  // Ends with the answer: the handler for a whole one, the stream's releaser for a stream.
  auto answered = std::shared_ptr<void>(nullptr, [this](void*) { --in_flight; });
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
  const int64_t created = unix_seconds();
  auto usage = [n_prompt](int64_t completion_tokens) {
    return json{{"prompt_tokens", n_prompt},
                {"completion_tokens", completion_tokens},
                {"total_tokens", n_prompt + completion_tokens}};
  };
  const bool logprobs = r.top_logprobs >= 0;
  const Tokenizer* tokenizer = &engine->model().tokenizer();
  // A choice's logprobs field: null unless asked for.
  auto logprobs_json = [chat, logprobs, tokenizer](std::span<const GeneratedLogprob> l) {
    if (!logprobs) return json(nullptr);
    return chat ? chat_logprobs_json(*tokenizer, l) : completion_logprobs_json(*tokenizer, l);
  };

  if (!r.stream) {
    const std::vector<ChoiceDelta> all = c->wait_all();
    json choices = json::array();
    int64_t completion_tokens = 0;
    for (const ChoiceDelta& d : all) {
      if (d.finish_reason == "error") {
        send_error(res, 500, d.error);
        return;
      }
      completion_tokens += d.completion_tokens;
      json choice = {{"index", d.index}};
      if (chat) {
        choice["message"] = {{"role", "assistant"}, {"content", d.text}};
      } else {
        choice["text"] = d.text;
      }
      choice["logprobs"] = logprobs_json(d.logprobs);
      // "cancelled" never reaches a client: only a client that left cancels.
      choice["finish_reason"] = d.finish_reason;
      choices.push_back(std::move(choice));
    }
    json body = {{"id", id},
                 {"object", chat ? "chat.completion" : "text_completion"},
                 {"created", created},
                 {"model", model_id},
                 {"choices", std::move(choices)},
                 {"usage", usage(completion_tokens)}};
    res.set_content(dump(body), "application/json");
    return;
  }

  const bool include_usage = r.include_usage;
  auto chunk = [id, created, chat, this](int index, const json& delta_or_text,
                                         const json& token_logprobs, const json& reason) {
    json choice = {{"index", index}};
    choice[chat ? "delta" : "text"] = delta_or_text;
    choice["logprobs"] = token_logprobs;
    choice["finish_reason"] = reason;
    return json{{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model_id},
                {"choices", json::array({choice})}};
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [c, chat, chunk, usage, logprobs_json, include_usage](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& event) {
          const std::string line = "data: " + dump(event) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        bool ok = true;
        for (int i = 0; ok && chat && i < c->n_choices(); ++i)
          ok = send(chunk(i, json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
        ChoiceDelta d;
        int64_t completion_tokens = 0;
        std::string error;
        while (ok && error.empty() && c->next(d)) {
          if (!d.text.empty() || !d.logprobs.empty()) {
            ok = send(chunk(d.index, chat ? json{{"content", d.text}} : json(d.text),
                            logprobs_json(d.logprobs), nullptr));
          }
          if (ok && d.finished) {
            completion_tokens += d.completion_tokens;
            if (d.finish_reason == "error") {
              error = d.error;
            } else {
              ok = send(chunk(d.index, chat ? json::object() : json(""), nullptr, d.finish_reason));
            }
          }
        }
        if (!ok || !error.empty())
          c->cancel();  // the client left, or a choice failed: free the slots
        if (!ok) return false;
        if (!error.empty()) {
          ok = send(json::parse(error_body(500, error)));
        } else if (include_usage) {
          json last = chunk(0, chat ? json::object() : json(""), nullptr, nullptr);
          last["choices"] = json::array();
          last["usage"] = usage(completion_tokens);
          ok = send(last);
        }
        const std::string done = "data: [DONE]\n\n";
        ok = ok && sink.write(done.data(), done.size());
        if (ok) sink.done();
        return ok;
      },
      // A no-op once finished; frees the slots when the stream never ran or broke off.
      [c, answered](bool) { c->cancel(); });
}

void Server::Impl::count(const httplib::Request& req, const httplib::Response& res) {
  // Known routes by name, everything else as one label, so clients cannot grow the series.
  static const char* const known[] = {"/health",           "/v1/models",          "/models",
                                      "/v1/completions",   "/completions",        "/metrics",
                                      "/chat/completions", "/v1/chat/completions"};
  std::string route = "other";
  for (const char* k : known)
    if (req.path == k) route = k;
  std::lock_guard lock(requests_mutex);
  ++requests[{route, res.status}];
}

std::string Server::Impl::metrics() const {
  const EngineStats st = engine->stats();
  MetricsWriter m;
  m.family("tandem_http_requests_total", "counter", "HTTP requests answered, by route and status");
  {
    std::lock_guard lock(requests_mutex);
    for (const auto& [key, n] : requests) {
      m.sample("tandem_http_requests_total", double(n),
               label("route", key.first) + "," + label("status", std::to_string(key.second)));
    }
  }
  m.family("tandem_requests_total", "counter", "Generation requests ended, by outcome");
  m.sample("tandem_requests_total", double(st.requests_finished), label("outcome", "finished"));
  m.sample("tandem_requests_total", double(st.requests_cancelled), label("outcome", "cancelled"));
  m.sample("tandem_requests_total", double(st.requests_failed), label("outcome", "failed"));
  m.family("tandem_slots", "gauge", "Slots (each a context and a sampler)");
  m.sample("tandem_slots", double(st.slots), label("state", "total"));
  m.sample("tandem_slots", double(st.slots_busy), label("state", "busy"));
  m.family("tandem_requests_in_flight", "gauge", "Generation requests not yet answered");
  m.sample("tandem_requests_in_flight", double(in_flight.load()));
  m.family("tandem_requests_queued", "gauge", "Requests waiting for a slot");
  m.sample("tandem_requests_queued", double(st.queued));
  m.family("tandem_prompt_tokens_total", "counter", "Prompt tokens evaluated");
  m.sample("tandem_prompt_tokens_total", double(st.prompt_tokens));
  m.family("tandem_generated_tokens_total", "counter", "Tokens generated");
  m.sample("tandem_generated_tokens_total", double(st.generated_tokens));
  m.family("tandem_prompt_seconds_total", "counter", "Time spent evaluating prompts");
  m.sample("tandem_prompt_seconds_total", st.prompt_s);
  m.family("tandem_generation_seconds_total", "counter", "Time spent in decode steps");
  m.sample("tandem_generation_seconds_total", st.generate_s);
  m.family("tandem_tokens_per_second", "gauge",
           "Tokens per second of evaluation time since the start, by phase");
  m.sample("tandem_tokens_per_second", st.prompt_s > 0 ? double(st.prompt_tokens) / st.prompt_s : 0,
           label("phase", "prompt"));
  m.sample("tandem_tokens_per_second",
           st.generate_s > 0 ? double(st.generated_tokens) / st.generate_s : 0,
           label("phase", "generation"));
  m.family("tandem_decode_steps_total", "counter",
           "Decode graphs run (each decodes one token of every busy slot)");
  m.sample("tandem_decode_steps_total", double(st.decode_steps));
  m.family("tandem_decode_rows_total", "counter",
           "Tokens decoded by those graphs (rows / steps: the mean batch)");
  m.sample("tandem_decode_rows_total", double(st.decode_rows));
  m.family("tandem_backend_ops_total", "counter", "Graph ops executed, by backend");
  for (const auto& [id, b] : st.backends)
    m.sample("tandem_backend_ops_total", double(b.ops), label("backend", id));
  m.family("tandem_backend_seconds_total", "counter",
           "Measured execution time, by backend (segments timed on the device's queues)");
  for (const auto& [id, b] : st.backends)
    m.sample("tandem_backend_seconds_total", b.time_s, label("backend", id));
  m.family("tandem_backend_transfers_total", "counter", "Tensor copies into a backend");
  for (const auto& [id, b] : st.backends)
    m.sample("tandem_backend_transfers_total", double(b.transfers_in), label("backend", id));
  m.family("tandem_backend_transfer_bytes_total", "counter", "Bytes copied into a backend");
  for (const auto& [id, b] : st.backends)
    m.sample("tandem_backend_transfer_bytes_total", double(b.transfer_bytes), label("backend", id));
  m.family("tandem_backend_tokens_per_second", "gauge",
           "Tokens evaluated (prompt and generated) per second of the backend's measured time");
  for (const auto& [id, b] : st.backends) {
    m.sample("tandem_backend_tokens_per_second",
             b.time_s > 0 ? double(st.prompt_tokens + st.generated_tokens) / b.time_s : 0,
             label("backend", id));
  }
  return m.str();
}

}  // namespace tandem::server
