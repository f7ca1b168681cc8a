#include "tandem/runtime.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <ostream>
#include <sstream>
#include <streambuf>

#include "capacity.h"
#include "gpu_setup.h"
#include "tandem/error.h"
#include "tandem/registry.h"

namespace tandem {

namespace {

// The stream warnings go to when the caller wants none.
std::ostream& null_stream() {
  struct NullBuffer : std::streambuf {
    int overflow(int c) override { return c; }
  };
  static NullBuffer buffer;
  static std::ostream stream(&buffer);
  return stream;
}

}  // namespace

std::vector<TensorPin> host_layer_pins(int n_layer, int n_gpu_layers,
                                       std::span<const std::shared_ptr<Backend>> backends,
                                       bool tied_embeddings) {
  TANDEM_CHECK_ARG(n_gpu_layers >= 0, "--n-gpu-layers",
                   "must be >= 0 (got " + std::to_string(n_gpu_layers) + ")");
  auto host = std::find_if(backends.begin(), backends.end(),
                           [](const auto& b) { return b->kind() == BackendKind::Cpu; });
  TANDEM_CHECK_ARG(host != backends.end(), "--n-gpu-layers",
                   "no host (CPU) backend to keep the other layers on");
  const std::string& id = (*host)->backend_id();
  std::string layers;
  for (int l = n_gpu_layers; l < n_layer; ++l)
    layers += (layers.empty() ? "" : "|") + std::to_string(l);
  std::vector<TensorPin> pins;
  if (!layers.empty()) pins.push_back({"^blk\\.(" + layers + ")\\..*$", id});
  const bool output_on_host = n_gpu_layers <= n_layer;
  if (output_on_host || !tied_embeddings) pins.push_back({"^token_embd\\.weight$", id});
  if (output_on_host) pins.push_back({"^output(_norm)?\\.weight$", id});
  return pins;
}

Session::Session(const SessionOptions& options)
    : file_(gguf::File::open(options.model_path)), config_(LlamaConfig::from_gguf(file_)) {
  tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file_));
  kv_dtype_ = options.kv_dtype;
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : std::min<int64_t>(config_.context_length, 4096);
  TANDEM_CHECK_ARG(n_ctx_ >= 1, "session", "context length must be >= 1");

  Strategy strategy = Strategy::parse(options.strategy);
  std::vector<TensorPin> pins = options.pins;
  BackendOptions backend_options;
  backend_options.cpu_threads = options.threads;
  auto backends = available_backends(backend_options);
  const GpuSetup gpus = setup_gpus(backends, options, strategy, int(config_.n_layer));
  Capacity capacity;
  for (const auto& t : file_.tensors()) capacity.weights_bytes += double(t.bytes);
  capacity.n_ctx = n_ctx_;
  capacity.kv_dtype = kv_dtype_;
  TANDEM_CHECK_ARG(options.n_sequences >= 1, "session",
                   "n_sequences must be >= 1 (got " + std::to_string(options.n_sequences) + ")");
  past_.assign(size_t(options.n_sequences), 0);
  capacity.kv_bytes = kv_cache_bytes(config_, n_ctx_, kv_dtype_) * double(options.n_sequences);
  add_gpu_budgets(capacity, backends, gpus, strategy);
  capacity.host_bytes = double(host_available_bytes());
  check_capacity(capacity);
  pins.insert(pins.end(), gpus.pins.begin(), gpus.pins.end());
  if (options.n_gpu_layers) {
    // Where the weights live, as llama.cpp's -ngl; KV caches follow the budget.
    const auto host = host_layer_pins(int(config_.n_layer), *options.n_gpu_layers, backends,
                                      config_.tied_embeddings);
    pins.insert(pins.end(), host.begin(), host.end());
  }
  strategy_name_ = options.strategy;
  // A backend named by the strategy or a pin (e.g. "reference") joins even if it is not a
  // default one.
  std::vector<std::string> named;
  if (strategy.kind == Strategy::Kind::BackendOnly) named.push_back(strategy.backend_id);
  for (const auto& pin : pins) named.push_back(pin.backend_id);
  for (const auto& id : named) {
    bool present = std::any_of(backends.begin(), backends.end(),
                               [&](const auto& b) { return b->backend_id() == id; });
    if (!present) backends.push_back(create_backend(id, backend_options));
  }
  TANDEM_CHECK_ARG(options.learn_every >= 0, "--learn-every", "must be >= 0");
  CostProfileOptions cost_options;
  cost_options.path = options.cost_profile;
  cost_options.use_builtin = options.no_calibrate;
  cost_options.calibrate_if_missing = options.calibrate_if_missing;
  costs_ = load_cost_model(backends, cost_options, options.log ? *options.log : null_stream());
  learn_every_ = options.timing == TimingMode::PerOp ? 0 : options.learn_every;
  learn_ = costs_.measured &&
           ((options.learn && options.timing == TimingMode::PerOp) || learn_every_ > 0);
  auto builder = HybridScheduler::builder();
  for (auto& b : backends) builder.with_backend(b);
  builder.strategy(strategy).strict(options.strict).cost_model(costs_.model);
  for (const auto& pin : pins) builder.pin_tensor(pin.pattern, pin.backend_id);
  for (const auto& [id, bytes] : gpus.budgets) builder.memory_budget(id, bytes);
  scheduler_ = std::make_unique<HybridScheduler>(builder.build());
  ExecutorOptions exec_options;
  exec_options.timing = options.timing;
  exec_options.record_events = options.record_events;
  executor_ = std::make_unique<HybridExecutor>(*scheduler_, exec_options);
  for (const auto& t : file_.tensors()) executor_->bind_weight(t.name, t.data, t.bytes);
  load_progress_ = options.load_progress;
}

const LlamaGraph& Session::graph_for(int64_t n_tokens, bool all_logits, int sequence) {
  auto key = std::make_tuple(n_tokens, all_logits, sequence);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return it->second;
  LlamaGraphOptions options;
  options.n_tokens = n_tokens;
  options.n_ctx = n_ctx_;
  options.kv_dtype = kv_dtype_;
  options.all_logits = all_logits;
  options.sequence = sequence;
  return graphs_.emplace(key, build_llama_graph(config_, file_, options)).first->second;
}

int64_t Session::n_past(int sequence) const {
  TANDEM_CHECK_ARG(sequence >= 0 && sequence < n_sequences(), "session",
                   "sequence " + std::to_string(sequence) + " outside [0, " +
                       std::to_string(n_sequences()) + ")");
  return past_[size_t(sequence)];
}

void Session::reset(int sequence) {
  n_past(sequence);  // checks the id
  past_[size_t(sequence)] = 0;
}

void Session::check_step(int sequence, std::span<const int32_t> tokens) const {
  const int64_t n = int64_t(tokens.size());
  TANDEM_CHECK_ARG(n >= 1, "session", "no tokens to evaluate");
  const int64_t past = n_past(sequence);
  if (past + n > n_ctx_) {
    throw_error(ErrorCode::InvalidArgument, "session",
                "context full (" + std::to_string(past) + " + " + std::to_string(n) + " tokens > " +
                    std::to_string(n_ctx_) + "; raise --ctx-size)");
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= config_.n_vocab) {
      throw_error(ErrorCode::InvalidArgument, "session",
                  "token id " + std::to_string(t) + " outside the vocabulary [0, " +
                      std::to_string(config_.n_vocab) + ")");
    }
  }
}

std::span<const float> Session::eval(std::span<const int32_t> tokens, bool all_logits) {
  check_step(0, tokens);
  const int64_t n = int64_t(tokens.size());
  const LlamaGraph& lg = graph_for(n, all_logits);
  positions_.resize(size_t(n));
  std::iota(positions_.begin(), positions_.end(), int32_t(past_[0]));
  run_step(lg, tokens);
  past_[0] += n;
  return logits_;
}

std::span<const float> Session::eval_sequence(int sequence, std::span<const int32_t> tokens) {
  check_step(sequence, tokens);
  const int64_t n = int64_t(tokens.size());
  const LlamaGraph& lg = graph_for(n, false, sequence);
  positions_.resize(size_t(n));
  std::iota(positions_.begin(), positions_.end(), int32_t(past_[size_t(sequence)]));
  run_step(lg, tokens);
  past_[size_t(sequence)] += n;
  return logits_;
}

std::span<const float> Session::decode_batch(std::span<const int> sequences,
                                             std::span<const int32_t> tokens) {
  TANDEM_CHECK_ARG(!sequences.empty() && sequences.size() == tokens.size(), "session",
                   "decode_batch needs one token per sequence (" +
                       std::to_string(sequences.size()) + " sequences, " +
                       std::to_string(tokens.size()) + " tokens)");
  for (size_t r = 0; r < sequences.size(); ++r) check_step(sequences[r], tokens.subspan(r, 1));
  std::vector<int> key(sequences.begin(), sequences.end());
  auto it = batch_graphs_.find(key);
  if (it == batch_graphs_.end()) {
    it =
        batch_graphs_.emplace(key, build_llama_decode_batch(config_, file_, n_ctx_, kv_dtype_, key))
            .first;
  }
  positions_.resize(sequences.size());
  for (size_t r = 0; r < sequences.size(); ++r)
    positions_[r] = int32_t(past_[size_t(sequences[r])]);
  run_step(it->second, tokens);
  for (int s : sequences) past_[size_t(s)] += 1;
  return logits_;
}

std::span<const float> Session::run_step(const LlamaGraph& lg, std::span<const int32_t> tokens) {
  const int64_t n = int64_t(tokens.size());
  size_logits(size_t(lg.graph.tensor(lg.logits).elements()));

  plan_residency(kPlanPrefillTokens);
  last_placement_ = scheduler_->plan(lg.graph, executor_->residency());
  last_graph_ = &lg.graph;
  // Plans are cached: an unchanged placement needs no new uploads (keeps this off the per-token
  // path; preload scans the residency).
  if (last_placement_ != uploaded_for_) {
    executor_->preload(lg.graph, *last_placement_, load_progress_);
    uploaded_for_ = last_placement_;
  }
  Bindings bindings;
  bindings.input(lg.tokens, tokens.data(), tokens.size_bytes())
      .input(lg.positions, positions_.data(), positions_.size() * sizeof(int32_t))
      .output(lg.logits, logits_.data(), logits_.size() * sizeof(float));
  if (lg.rows != kNoTensor) {
    rows_.resize(size_t(n));
    std::iota(rows_.begin(), rows_.end(), 0);
    bindings.input(lg.rows, rows_.data(), rows_.size() * sizeof(int32_t));
  }
  // One step in learn_every_ is timed per op (it synchronizes after every op) to learn from.
  const bool sampled = learn_ && learn_every_ > 0 && ++steps_ % learn_every_ == 0;
  const TimingMode timing = executor_->options().timing;
  if (sampled) executor_->set_timing(TimingMode::PerOp);
  executor_->run(lg.graph, *last_placement_, bindings);
  if (sampled) executor_->set_timing(timing);
  if (learn_ && (sampled || learn_every_ == 0)) learn_from(lg.graph);
  tokens_evaluated_ += n;
  return logits_;
}

void Session::size_logits(size_t n) {
  // Page-locked up to a few decode batches' worth (an all-logits prompt of 512 tokens would pin
  // 256 MB); growing re-allocates, which steps of the same size never do.
  constexpr size_t kMaxPinnedBytes = size_t(64) << 20;
  const size_t bytes = n * sizeof(float);
  if (logits_pinned_.bytes() < bytes && bytes <= kMaxPinnedBytes) {
    logits_pinned_.reset();
    for (const auto& b : executor_->backends()) {
      try {
        logits_pinned_ = b->allocate_host(bytes);
      } catch (const Error&) {
        // The OS refused to page-lock more: ordinary memory serves.
      }
      if (logits_pinned_) break;
    }
  }
  if (logits_pinned_.bytes() >= bytes) {
    logits_ = {static_cast<float*>(logits_pinned_.data()), n};
  } else {
    logits_host_.resize(n);
    logits_ = logits_host_;
  }
}

void Session::plan_residency(int64_t n_prompt) {
  if (residency_planned_) return;
  residency_planned_ = true;
  if (scheduler_->strategy().kind != Strategy::Kind::Automatic || scheduler_->residency_plan())
    return;
  // Where weights and KV caches live is decided once, for prefill and decode together.
  const Graph* phases[] = {&graph_for(std::clamp<int64_t>(n_prompt, 1, n_ctx_), false).graph,
                           &graph_for(1, false).graph};
  scheduler_->plan_residency(phases, executor_->residency());
}

std::vector<PhasePlan> Session::plan_phases(int64_t n_prompt) {
  TANDEM_CHECK_ARG(n_prompt >= 1 && n_prompt <= n_ctx_, "plan",
                   "prompt length must be in [1, " + std::to_string(n_ctx_) + "] (got " +
                       std::to_string(n_prompt) + ")");
  plan_residency(n_prompt);
  std::vector<PhasePlan> out;
  Residency r = executor_->residency();
  for (auto [name, n] : {std::pair<const char*, int64_t>{"prefill", n_prompt}, {"decode", 1}}) {
    PhasePlan p;
    p.name = name;
    p.n_tokens = n;
    p.graph = &graph_for(n, false).graph;
    p.placement = scheduler_->plan(*p.graph, r);
    p.predicted_us = scheduler_->predict_us(*p.graph, *p.placement);
    r = residency_after(*p.graph, *p.placement, std::move(r));
    out.push_back(std::move(p));
  }
  return out;
}

void Session::learn_from(const Graph& graph) {
  const std::vector<ExecutionEvent> events = executor_->telemetry().get_telemetry();
  if (events_learned_ > events.size()) events_learned_ = 0;  // the telemetry was cleared
  for (size_t i = events_learned_; i < events.size(); ++i) {
    const ExecutionEvent& e = events[i];
    if (e.kind != EventKind::Op || !(e.actual_us > 0.0)) continue;
    const int b = scheduler_->backend_index(e.backend);
    if (b == kNoBackend) continue;
    costs_.model.observe(graph, graph.node(e.node), e.backend,
                         scheduler_->backends()[size_t(b)]->kind(), e.actual_us);
  }
  costs_.model.end_observations();
  events_learned_ = events.size();
}

void Session::save_learned() {
  if (learn_) save_cost_model(costs_);
}

std::string Session::placement_summary() const {
  std::ostringstream os;
  if (!last_placement_) return "no step run yet";
  auto ops = last_placement_->ops_per_backend();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i) os << ", ";
    os << last_placement_->backends[i]->backend_id() << " " << ops[i] << " ops";
  }
  // Resident bytes in MiB to the hundredth, so a budget check reading them is not fooled by
  // rounding ("4.00 GiB" may be 4,101 MiB).
  os << "; resident:";
  for (const auto& b : executor_->backends()) {
    char buf[48];
    std::snprintf(buf, sizeof buf, " %s %.2f MiB", b->backend_id().c_str(),
                  double(executor_->resident_bytes(b->backend_id())) / double(1 << 20));
    os << buf;
  }
  return os.str();
}

}  // namespace tandem
