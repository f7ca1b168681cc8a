// `tandem serve`: OpenAI-compatible HTTP over the runtime. /v1/completions and
// /v1/chat/completions (whole or streamed as server-sent events), /v1/models, /health and
// /metrics (Prometheus text). Requests share the slots of one SlotEngine.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tandem/runtime.h"

namespace tandem::server {

inline constexpr int kDefaultSlots = 4;
inline constexpr size_t kDefaultMaxBodyBytes = size_t(8) << 20;

struct ServerOptions {
  SessionOptions session;  // session.n_ctx: the context of each slot
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: a free port, chosen at bind()
  int n_slots = kDefaultSlots;
  std::string model_alias;  // the id /v1/models shows; default: the file name without .gguf
  // HTTP worker threads; each open connection holds one (0: max(32, 4 x slots), so /health and
  // /metrics still answer while every slot is busy and as many requests wait).
  int http_threads = 0;
  size_t max_body_bytes = kDefaultMaxBodyBytes;
};

class Server {
 public:
  // Loads the model into every slot; binds nothing yet. Throws as Session does.
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds options.host:options.port; returns the port (the chosen one for port 0). Throws Io.
  int bind();
  // Serves until stop(); returns once every request in flight has its response.
  void run();
  // Stops accepting connections and ends run(); safe from any thread, idempotent.
  void stop();

  const std::string& model_id() const;
  int n_slots() const;
  int64_t n_ctx() const;  // of each slot
  // Generation requests accepted and not yet answered in full.
  int requests_in_flight() const;
  // /metrics' text.
  std::string metrics_text() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::server
