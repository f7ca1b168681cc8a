// `tandem serve`: the OpenAI-compatible HTTP server, with llama-server's flags (--host, --port,
// -m, -c, -np) and the placement flags of run.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "commands_impl.h"
#include "engine_flags.h"
#include "server.h"
#include "tandem/error.h"
#include "tandem/model/gguf.h"
#include "tandem/model/llama_config.h"

namespace tandem::cli {

namespace {

// Stops `server` on SIGINT or SIGTERM. The handler only writes the signal to a pipe (all a
// handler may safely do); a thread reads it and stops the server. Libraries start threads of
// their own (OpenBLAS), so blocking the signals and waiting for them would miss some.
class StopOnSignal {
 public:
  explicit StopOnSignal(server::Server& server) {
    if (pipe(pipe_) != 0) throw_error(ErrorCode::Io, "serve", "cannot create a pipe");
    write_end_ = pipe_[1];
    struct sigaction action = {};
    action.sa_handler = [](int signal) {
      const char c = char(signal);
      [[maybe_unused]] const ssize_t n = write(write_end_, &c, 1);
    };
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
    thread_ = std::thread([this, &server] {
      char c = 0;
      while (read(pipe_[0], &c, 1) < 0 && errno == EINTR) {
      }
      if (c != kWake) {
        std::fprintf(stderr, "tandem serve: stopping (finishing the requests in flight)\n");
        server.stop();
      }
    });
  }
  ~StopOnSignal() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    const char c = kWake;
    [[maybe_unused]] const ssize_t n = write(pipe_[1], &c, 1);
    thread_.join();
    close(pipe_[0]);
    close(pipe_[1]);
  }

 private:
  static constexpr char kWake = 0;  // not a signal number: ends the thread without stopping
  static inline int write_end_ = -1;
  int pipe_[2] = {-1, -1};
  struct sigaction old_int_ = {}, old_term_ = {};
  std::thread thread_;
};

}  // namespace

void add_serve(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand(
      "serve", "Serve the model over HTTP: OpenAI-compatible completions and chat, /metrics");
  struct Opts {
    EngineFlags engine;
    std::string host = "127.0.0.1", strategy = "gpu", alias;
    int port = 8080, parallel = server::kDefaultSlots, http_threads = 0;
  };
  auto o = std::make_shared<Opts>();
  o->engine.add(*cmd);
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port, printed)")
      ->capture_default_str();
  cmd->add_option("--parallel", o->parallel,
                  "Slots: requests served at once, each with its own context (-c is split "
                  "evenly between them, as llama-server does); more wait in a queue")
      ->capture_default_str();
  cmd->add_option("-a,--alias", o->alias, "Model id shown by /v1/models (default: file name)");
  cmd->add_option("--strategy", o->strategy, "gpu, cpu, auto or only:BACKEND")
      ->capture_default_str();
  cmd->add_option("--threads-http", o->http_threads,
                  "HTTP worker threads, one per open connection (0: max(32, 4 x --parallel))")
      ->capture_default_str();
  cmd->callback([&run, o]() {
    run = [o]() {
      TANDEM_CHECK_ARG(o->parallel >= 1 && o->parallel <= 256, "--parallel",
                       "must be in [1, 256] (got " + std::to_string(o->parallel) + ")");
      TANDEM_CHECK_ARG(o->port >= 0 && o->port <= 65535, "--port",
                       "must be in [0, 65535] (got " + std::to_string(o->port) + ")");
      TANDEM_CHECK_ARG(o->http_threads >= 0, "--threads-http", "must be >= 0");
      server::ServerOptions so;
      so.session = o->engine.to_options(o->strategy);
      print_gpu_flags_warning(o->engine);
      so.session.calibrate_if_missing = true;
      so.session.timing = TimingMode::Timeline;  // per-backend time for /metrics, no waiting
      so.session.load_progress = {};
      // -c is the context of all slots together.
      const LlamaConfig config = LlamaConfig::from_gguf(gguf::File::open(so.session.model_path));
      const int64_t total =
          o->engine.ctx > 0 ? o->engine.ctx : std::min<int64_t>(config.context_length, 4096);
      so.session.n_ctx = total / o->parallel;
      TANDEM_CHECK_ARG(so.session.n_ctx >= 2, "--ctx-size",
                       std::to_string(total) + " positions leave fewer than 2 per slot (" +
                           std::to_string(o->parallel) + " slots)");
      so.host = o->host;
      so.port = o->port;
      so.n_slots = o->parallel;
      so.model_alias = o->alias;
      so.http_threads = o->http_threads;
      server::Server server(so);
      const int port = server.bind();
      std::fprintf(stderr,
                   "tandem serve: model '%s', %d slots of %lld positions; listening on "
                   "http://%s:%d\n",
                   server.model_id().c_str(), server.n_slots(),
                   static_cast<long long>(server.n_ctx()), o->host.c_str(), port);
      {
        StopOnSignal on_signal(server);
        server.run();
      }
      std::fprintf(stderr, "tandem serve: stopped\n");
      return 0;
    };
  });
}

}  // namespace tandem::cli
