// The pipeline protocol. Rank 0 leads; every message is fixed-size or sized by an earlier one:
//   Open (broadcast) -> each rank's Report (model opened) -> Plan (broadcast: layer ranges)
//   -> each rank's Report (part built) -> verdict (broadcast), then per step one message from
//   rank to rank, r -> r + 1: the Step header with the tokens and rank r's hidden state (inline
//   for a step of one token, else two more messages of exactly their sizes), and the logits from
//   the last rank back to 0; End travels the same way and closes the session; Exit (broadcast)
//   ends serve_pipeline_rank. A decode step is two messages on each rank, not four (two
//   broadcasts for the step and its tokens cost ~100 us each on NCCL).
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "pipeline_leader.h"
#include "tandem/error.h"
#include "tandem/hash.h"
#include "tandem/runtime.h"

namespace tandem {

namespace {

constexpr uint32_t kMagic = 0x54504950;  // "PIPT"
constexpr uint32_t kVersion = 2;         // 2: steps travel rank to rank, not broadcast
constexpr int kMaxRanks = 64;
constexpr size_t kTextBytes = 480;
constexpr size_t kStrategyBytes = 64;
constexpr size_t kFingerprintBytes = 64;  // of each tensor's data

enum class Command : int32_t { Open = 1, Step = 2, End = 3, Exit = 4 };

// Rank 0 to every rank: what comes next, with the session's shared settings (Open) or the
// step's shape (Step).
struct Header {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  Command command = Command::Exit;
  int32_t n_tokens = 0;
  int64_t start = 0;
  int32_t all_logits = 0;
  int32_t kv_dtype = 0;
  int64_t n_ctx = 0;
  int32_t n_gpu_layers = -1;  // unset
  int32_t n_cpu_moe = -1;     // unset
  int32_t strict = 0;
  char strategy[kStrategyBytes] = {};
};

// A rank to rank 0: its model opened (with the model's fingerprint), or its part built; or why
// not. Also rank 0's verdict to every rank.
struct Report {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  int32_t ok = 1;
  uint64_t model = 0;
  char text[kTextBytes] = {};
};

// Rank 0 to every rank: each rank's layers, or why the session cannot open.
struct Plan {
  int32_t ok = 1;
  int32_t n_ranks = 0;
  int32_t begin[kMaxRanks] = {};
  int32_t end[kMaxRanks] = {};
  char text[kTextBytes] = {};
};

template <size_t N>
void set_text(char (&out)[N], std::string_view text) {
  const size_t n = std::min(text.size(), N - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

template <size_t N>
std::string get_text(const char (&in)[N]) {
  return std::string(in, strnlen(in, N));
}

std::string rank_name(int rank) {
  return "rank " + std::to_string(rank);
}

[[noreturn]] void fail_with(const std::string& text) {
  throw_error(ErrorCode::InvalidArgument, "pipeline", text);
}

void check_header(const Header& h, int rank) {
  if (h.magic != kMagic || h.version != kVersion) {
    throw_error(ErrorCode::Format, "pipeline",
                rank_name(rank) +
                    " got a message of another protocol or version (the ranks must "
                    "run the same tandem build)");
  }
}

// A step's first message between neighbours: the header, then room for one token and its
// hidden state (a decode step is this message alone).
size_t step_message_bytes(int64_t n_embd) {
  return sizeof(Header) + sizeof(int32_t) + size_t(n_embd) * sizeof(float);
}

// The step (or End) `h` with its tokens and hidden state to rank `peer`: one message when the
// step has one token, else the header's message, then the tokens and the hidden state as they
// are (a prefill's hidden state is megabytes: packing it would copy it twice).
void send_step(PipelineTransport& t, const Header& h, std::span<const int32_t> tokens,
               std::span<const float> hidden, int64_t n_embd, int peer,
               std::vector<uint8_t>& message) {
  TANDEM_CHECK_ARG(
      h.command != Command::Step ||
          (tokens.size() == size_t(h.n_tokens) && hidden.size() == tokens.size() * size_t(n_embd)),
      "pipeline",
      "a step of " + std::to_string(h.n_tokens) + " tokens sends " + std::to_string(tokens.size()) +
          " tokens and " + std::to_string(hidden.size()) + " floats of hidden state");
  message.assign(step_message_bytes(n_embd), 0);
  std::memcpy(message.data(), &h, sizeof h);
  const bool single = h.command == Command::Step && h.n_tokens == 1;
  if (single) {
    std::memcpy(message.data() + sizeof h, tokens.data(), tokens.size_bytes());
    std::memcpy(message.data() + sizeof h + tokens.size_bytes(), hidden.data(),
                hidden.size_bytes());
  }
  t.send(message.data(), message.size(), peer);
  if (h.command != Command::Step || single) return;
  t.send(tokens.data(), tokens.size_bytes(), peer);
  t.send(hidden.data(), hidden.size_bytes(), peer);
}

// The layer ranges, one per rank, or why they cannot be made.
std::vector<LayerRange> split_for_ranks(int n_layer, int n_ranks, std::vector<double> proportions) {
  if (n_ranks > kMaxRanks) {
    fail_with(std::to_string(n_ranks) + " ranks: at most " + std::to_string(kMaxRanks));
  }
  if (n_ranks > n_layer) {
    fail_with(std::to_string(n_ranks) + " ranks for a model of " + std::to_string(n_layer) +
              " layers: every rank needs a layer");
  }
  if (proportions.size() > size_t(n_ranks)) {
    fail_with("--tensor-split gives " + std::to_string(proportions.size()) + " proportions for " +
              std::to_string(n_ranks) + " ranks");
  }
  if (proportions.empty()) proportions.assign(size_t(n_ranks), 1.0);
  proportions.resize(size_t(n_ranks), 0.0);
  std::vector<LayerRange> ranges = split_layers(n_layer, proportions);
  for (size_t r = 0; r < ranges.size(); ++r) {
    if (ranges[r].size() == 0) {
      fail_with(rank_name(int(r)) + " gets no layer (--tensor-split gives it too small a share)");
    }
  }
  return ranges;
}

}  // namespace

uint64_t model_fingerprint(const gguf::File& file) {
  uint64_t h = kFnvOffset64;
  for (const auto& t : file.tensors()) {
    h = fnv1a(t.name, h);
    h = hash_combine(h, uint64_t(t.dtype));
    for (int64_t n : t.ne) h = hash_combine(h, uint64_t(n));
    h = hash_combine(h, uint64_t(t.bytes));
    if (t.data) {
      const size_t n = std::min(t.bytes, kFingerprintBytes);
      h = fnv1a(std::string_view(reinterpret_cast<const char*>(t.data), n), h);
    }
  }
  return h;
}

// ---- Rank 0 ----

PipelineLeader::PipelineLeader(std::shared_ptr<PipelineTransport> transport, const gguf::File& file,
                               const LlamaConfig& config, const SessionOptions& options)
    : transport_(std::move(transport)), n_embd_(config.n_embd) {
  PipelineTransport& t = *transport_;
  TANDEM_CHECK_ARG(t.rank() == 0, "pipeline",
                   "only rank 0 opens a session (this is " + rank_name(t.rank()) + ")");
  const int n = t.n_ranks();
  Header open;
  open.command = Command::Open;
  open.kv_dtype = int32_t(options.kv_dtype);
  open.n_ctx = options.n_ctx;
  open.n_gpu_layers = options.n_gpu_layers.value_or(-1);
  open.n_cpu_moe = options.n_cpu_moe.value_or(-1);
  open.strict = options.strict;
  TANDEM_CHECK_ARG(options.strategy.size() < kStrategyBytes, "pipeline",
                   "strategy name too long ('" + options.strategy + "')");
  set_text(open.strategy, options.strategy);
  t.broadcast(&open, sizeof open, 0);

  std::string failure;
  const uint64_t model = model_fingerprint(file);
  for (int r = 1; r < n; ++r) {
    Report hello;
    t.recv(&hello, sizeof hello, r);
    if (!failure.empty()) continue;
    if (!hello.ok) {
      failure = rank_name(r) + ": " + get_text(hello.text);
    } else if (hello.model != model) {
      failure = rank_name(r) + " maps another model than rank 0 (" + options.model_path +
                "): every rank must run the same file";
    }
  }
  Plan plan;
  plan.n_ranks = n;
  if (failure.empty()) {
    try {
      ranges_ = split_for_ranks(int(config.n_layer), n, options.tensor_split);
      for (int r = 0; r < n; ++r) {
        plan.begin[r] = ranges_[size_t(r)].begin;
        plan.end[r] = ranges_[size_t(r)].end;
      }
    } catch (const Error& e) {
      failure = e.message();
    }
  }
  plan.ok = failure.empty();
  set_text(plan.text, failure);
  t.broadcast(&plan, sizeof plan, 0);
  if (!failure.empty()) fail_with(failure);
}

void PipelineLeader::settle(const std::string& failure) {
  PipelineTransport& t = *transport_;
  std::string first = failure.empty() ? "" : rank_name(0) + ": " + failure;
  for (int r = 1; r < t.n_ranks(); ++r) {
    Report ready;
    t.recv(&ready, sizeof ready, r);
    if (!ready.ok && first.empty()) first = rank_name(r) + ": " + get_text(ready.text);
  }
  Report verdict;
  verdict.ok = first.empty();
  set_text(verdict.text, first);
  t.broadcast(&verdict, sizeof verdict, 0);
  if (!first.empty()) fail_with(first);
}

void PipelineLeader::start() {
  try {
    settle("");
  } catch (...) {
    stopped_ = true;
    throw;
  }
  started_ = true;
}

void PipelineLeader::fail(const std::string& why) noexcept {
  if (stopped_) return;
  stopped_ = true;
  try {
    settle(why);
  } catch (const std::exception&) {
    // The verdict is out (or the transport failed); rank 0's own error is the one thrown.
  }
}

void PipelineLeader::check_running() const {
  TANDEM_CHECK_ARG(started_ && !stopped_, "pipeline", "the pipeline was stopped by an error");
}

void PipelineLeader::step(std::span<const int32_t> tokens, int64_t start, bool all_logits,
                          std::span<const float> hidden, std::span<float> logits) {
  check_running();
  Header step;
  step.command = Command::Step;
  step.n_tokens = int32_t(tokens.size());
  step.start = start;
  step.all_logits = all_logits;
  send_step(*transport_, step, tokens, hidden, n_embd_, 1, message_);
  transport_->recv(logits.data(), logits.size_bytes(), transport_->n_ranks() - 1);
}

void PipelineLeader::abort(const std::string& why) noexcept {
  if (stopped_) return;
  stopped_ = true;
  transport_->abort(rank_name(0) + ": " + why);
}

PipelineLeader::~PipelineLeader() {
  if (!started_ || stopped_) return;
  try {
    Header end;
    end.command = Command::End;
    send_step(*transport_, end, {}, {}, n_embd_, 1, message_);
  } catch (const std::exception&) {
    // A rank already gone: nothing waits for this.
  }
}

void end_pipeline(PipelineTransport& transport) {
  TANDEM_CHECK_ARG(transport.rank() == 0, "pipeline", "only rank 0 ends the pipeline");
  Header exit;
  exit.command = Command::Exit;
  transport.broadcast(&exit, sizeof exit, 0);
}

// ---- The other ranks ----

namespace {

// One session opened by rank 0's `open`: the handshake, then its steps until End.
void serve_session(const SessionOptions& options, const Header& open) {
  PipelineTransport& t = *options.pipeline;
  const int rank = t.rank(), n = t.n_ranks();
  Report hello;
  try {
    const gguf::File file = gguf::File::open(options.model_path);
    LlamaConfig::from_gguf(file);
    hello.model = model_fingerprint(file);
  } catch (const std::exception& e) {
    hello.ok = 0;
    set_text(hello.text, e.what());
  }
  t.send(&hello, sizeof hello, 0);
  Plan plan;
  t.broadcast(&plan, sizeof plan, 0);
  if (!plan.ok) fail_with(get_text(plan.text));
  if (plan.n_ranks != n) fail_with("rank 0 plans for " + std::to_string(plan.n_ranks) + " ranks");

  SessionOptions stage = options;
  stage.pipeline = nullptr;
  stage.layers = LayerRange{plan.begin[rank], plan.end[rank]};
  stage.tensor_split.clear();
  stage.strategy = get_text(open.strategy);
  stage.n_ctx = open.n_ctx;
  stage.kv_dtype = DType(open.kv_dtype);
  stage.strict = open.strict != 0;
  stage.n_gpu_layers =
      open.n_gpu_layers >= 0 ? std::optional<int>(open.n_gpu_layers) : std::nullopt;
  stage.n_cpu_moe = open.n_cpu_moe >= 0 ? std::optional<int>(open.n_cpu_moe) : std::nullopt;
  std::unique_ptr<Session> session;
  Report ready;
  try {
    session = std::make_unique<Session>(stage);
  } catch (const std::exception& e) {
    ready.ok = 0;
    set_text(ready.text, e.what());
  }
  t.send(&ready, sizeof ready, 0);
  Report verdict;
  t.broadcast(&verdict, sizeof verdict, 0);
  if (!verdict.ok) fail_with(get_text(verdict.text));

  const int64_t n_embd = session->config().n_embd;
  const bool last = rank + 1 == n;
  std::vector<int32_t> tokens;
  std::vector<float> hidden;
  std::vector<uint8_t> message(step_message_bytes(n_embd)), buffer;
  for (;;) {
    Header step;
    t.recv(message.data(), message.size(), rank - 1);
    std::memcpy(&step, message.data(), sizeof step);
    check_header(step, rank);
    if (step.command == Command::End) {
      if (!last) send_step(t, step, {}, {}, n_embd, rank + 1, buffer);
      return;
    }
    if (step.command != Command::Step || step.n_tokens < 1 || step.n_tokens > session->n_ctx()) {
      fail_with(rank_name(rank) + " expected a step of 1 to " + std::to_string(session->n_ctx()) +
                " tokens or the session's end");
    }
    tokens.resize(size_t(step.n_tokens));
    hidden.resize(size_t(step.n_tokens * n_embd));
    if (step.n_tokens == 1) {
      std::memcpy(tokens.data(), message.data() + sizeof step, sizeof(int32_t));
      std::memcpy(hidden.data(), message.data() + sizeof step + sizeof(int32_t),
                  hidden.size() * sizeof(float));
    } else {
      t.recv(tokens.data(), tokens.size() * sizeof(int32_t), rank - 1);
      t.recv(hidden.data(), hidden.size() * sizeof(float), rank - 1);
    }
    std::span<const float> out =
        session->eval_stage(tokens, step.start, hidden, step.all_logits != 0);
    if (last) {
      t.send(out.data(), out.size_bytes(), 0);
    } else {
      send_step(t, step, tokens, out, n_embd, rank + 1, buffer);
    }
  }
}

}  // namespace

void serve_pipeline_rank(const SessionOptions& options) {
  TANDEM_CHECK_ARG(options.pipeline != nullptr, "pipeline", "no transport to serve");
  PipelineTransport& t = *options.pipeline;
  TANDEM_CHECK_ARG(t.rank() > 0 && t.rank() < t.n_ranks(), "pipeline",
                   "serves ranks 1 to n - 1 (this is " + rank_name(t.rank()) + " of " +
                       std::to_string(t.n_ranks()) + ")");
  try {
    for (;;) {
      Header open;
      t.broadcast(&open, sizeof open, 0);
      check_header(open, t.rank());
      if (open.command == Command::Exit) return;
      if (open.command != Command::Open) {
        fail_with(rank_name(t.rank()) + " expected a session to open or the pipeline's end");
      }
      serve_session(options, open);
    }
  } catch (const std::exception& e) {
    t.abort(rank_name(t.rank()) + ": " + e.what());
    throw;
  }
}

}  // namespace tandem
