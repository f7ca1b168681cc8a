#include "tandem/runtime.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <ostream>
#include <sstream>
#include <streambuf>
#include <utility>

#include "capacity.h"
#include "gpu_setup.h"
#include "pipeline_leader.h"
#include "tandem/bytes.h"
#include "tandem/error.h"
#include "tandem/layer_split.h"
#include "tandem/registry.h"

namespace tandem {

namespace {

// Failures one step recovers from before it gives up (each lowers a budget or drops a device).
constexpr int kMaxStepRecoveries = 8;

// The stream warnings go to when the caller wants none.
std::ostream& null_stream() {
  struct NullBuffer : std::streambuf {
    int overflow(int c) override { return c; }
  };
  static NullBuffer buffer;
  static std::ostream stream(&buffer);
  return stream;
}

// The first host (CPU-kind) backend's id: where -ngl and --n-cpu-moe keep weights.
const std::string& host_backend_id(std::span<const std::shared_ptr<Backend>> backends,
                                   const char* flag, const char* what) {
  auto host = std::find_if(backends.begin(), backends.end(),
                           [](const auto& b) { return b->kind() == BackendKind::Cpu; });
  TANDEM_CHECK_ARG(host != backends.end(), flag,
                   std::string("no host (CPU) backend to keep ") + what + " on");
  return (*host)->backend_id();
}

// A pin's backend as llama.cpp's -ot spells it: a buffer type, "CPU" for host memory and
// "CUDA<N>" for GPU N; any other name is a backend id and stays as given.
std::string pin_backend_id(const std::string& id,
                           std::span<const std::shared_ptr<Backend>> backends) {
  if (std::any_of(backends.begin(), backends.end(),
                  [&](const auto& b) { return b->backend_id() == id; })) {
    return id;
  }
  std::string upper = id;
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (upper == "CPU") return host_backend_id(backends, "--override-tensor", "the tensors");
  const std::string digits = upper.starts_with("CUDA") ? upper.substr(4) : "";
  if (!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos)
    return "cuda:" + digits;
  return id;
}

}  // namespace

std::vector<TensorPin> host_layer_pins(int n_layer, int n_gpu_layers,
                                       std::span<const std::shared_ptr<Backend>> backends,
                                       bool tied_embeddings) {
  TANDEM_CHECK_ARG(n_gpu_layers >= 0, "--n-gpu-layers",
                   "must be >= 0 (got " + std::to_string(n_gpu_layers) + ")");
  const std::string& id = host_backend_id(backends, "--n-gpu-layers", "the other layers");
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

std::vector<TensorPin> host_expert_pins(int n_layer, int n_cpu_moe,
                                        std::span<const std::shared_ptr<Backend>> backends) {
  TANDEM_CHECK_ARG(n_cpu_moe >= 0, "--n-cpu-moe",
                   "must be >= 0 (got " + std::to_string(n_cpu_moe) + ")");
  if (n_cpu_moe == 0 || n_layer <= 0) return {};
  const std::string& id = host_backend_id(backends, "--n-cpu-moe", "the experts");
  // llama.cpp's patterns: "\.ffn_(up|down|gate|gate_up)_exps", per layer for --n-cpu-moe.
  const std::string experts = "\\.ffn_(up|down|gate|gate_up)_exps";
  if (n_cpu_moe >= n_layer) return {{experts, id}};
  std::string layers;
  for (int l = 0; l < n_cpu_moe; ++l) layers += (layers.empty() ? "" : "|") + std::to_string(l);
  return {{"^blk\\.(" + layers + ")" + experts, id}};
}

Session::Session(const SessionOptions& options)
    : file_(gguf::File::open(options.model_path)), config_(LlamaConfig::from_gguf(file_)) {
  layers_ = {0, int(config_.n_layer)};
  if (options.pipeline && options.pipeline->n_ranks() > 1) {
    TANDEM_CHECK_ARG(!options.layers, "session", "a pipeline's rank 0 chooses its own layers");
    pipeline_ = std::make_shared<PipelineLeader>(options.pipeline, file_, config_, options);
    layers_ = pipeline_->range();
  } else if (options.layers) {
    layers_ = *options.layers;
    TANDEM_CHECK_ARG(
        0 <= layers_.begin && layers_.begin < layers_.end && layers_.end <= int(config_.n_layer),
        "session",
        "layers [" + std::to_string(layers_.begin) + ", " + std::to_string(layers_.end) +
            ") are not a range of the model's " + std::to_string(config_.n_layer) + " layers");
  }
  try {
    init(options);
  } catch (const std::exception& e) {
    if (pipeline_) pipeline_->fail(e.what());
    throw;
  }
  if (pipeline_) pipeline_->start();
}

void Session::init(const SessionOptions& options) {
  const bool whole_model = layers_.begin == 0 && layers_.end == int(config_.n_layer);
  TANDEM_CHECK_ARG(whole_model || options.n_sequences == 1, "session",
                   "a pipeline or a layer range runs one sequence (n_sequences " +
                       std::to_string(options.n_sequences) + ")");
  tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file_));
  kv_dtype_ = options.kv_dtype;
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : std::min<int64_t>(config_.context_length, 4096);
  TANDEM_CHECK_ARG(n_ctx_ >= 1, "session", "context length must be >= 1");

  Strategy strategy = Strategy::parse(options.strategy);
  BackendOptions backend_options;
  backend_options.cpu_threads = options.threads;
  auto backends = options.backends.empty() ? available_backends(backend_options) : options.backends;
  for (const auto& b : backends)
    TANDEM_CHECK_ARG(b != nullptr, "session",
                     "a backend given in SessionOptions::backends is null");
  std::vector<TensorPin> pins = options.pins;
  for (TensorPin& pin : pins) pin.backend_id = pin_backend_id(pin.backend_id, backends);
  // The tensors these layers need: their blocks, the embedding where they start the model, the
  // output layer where they end it (the embedding too, where it is tied).
  auto in_layers = [&](const std::string& name) {
    const int l = layer_of(name);
    if (l >= 0) return l >= layers_.begin && l < layers_.end;
    const bool first = layers_.begin == 0, last = layers_.end == int(config_.n_layer);
    if (name == "token_embd.weight") return first || (last && config_.tied_embeddings);
    return last;
  };
  SessionOptions local = options;
  if (pipeline_) local.tensor_split.clear();  // one proportion per rank, not per local GPU
  const GpuSetup gpus = setup_gpus(backends, local, strategy, int(config_.n_layer));
  Capacity capacity;
  for (const auto& t : file_.tensors()) {
    if (in_layers(t.name)) capacity.weights_bytes += double(t.bytes);
  }
  capacity.n_ctx = n_ctx_;
  capacity.kv_dtype = kv_dtype_;
  TANDEM_CHECK_ARG(options.n_sequences >= 1, "session",
                   "n_sequences must be >= 1 (got " + std::to_string(options.n_sequences) + ")");
  past_.assign(size_t(options.n_sequences), 0);
  history_.assign(size_t(options.n_sequences), {});
  strict_ = options.strict;
  capacity.kv_bytes = kv_cache_bytes(config_, n_ctx_, kv_dtype_) * double(options.n_sequences) *
                      double(layers_.size()) / double(config_.n_layer);
  add_gpu_budgets(capacity, backends, gpus, strategy);
  capacity.host_bytes = double(host_available_bytes());
  check_capacity(capacity);
  if (options.n_cpu_moe) {
    // After the user's -ot, before the GPU layer ranges and -ngl: the experts of those layers
    // stay in host memory whatever device holds the rest of the layer.
    if (config_.is_moe()) {
      const auto experts = host_expert_pins(int(config_.n_layer), *options.n_cpu_moe, backends);
      pins.insert(pins.end(), experts.begin(), experts.end());
    } else {
      TANDEM_CHECK_ARG(*options.n_cpu_moe >= 0, "--n-cpu-moe",
                       "must be >= 0 (got " + std::to_string(*options.n_cpu_moe) + ")");
      if (options.log && *options.n_cpu_moe > 0) {
        *options.log << "tandem: --n-cpu-moe: the model has no experts; the flag changes nothing\n";
      }
    }
  }
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
  routing_stats_ = options.routing_stats;
  // Hot experts where the placement is this Session's own to choose and a device can hold them;
  // few experts a layer (Mixtral's 8) are placed as whole layers.
  const bool a_device = std::any_of(backends.begin(), backends.end(),
                                    [](const auto& b) { return !b->host_accessible(); });
  hot_enabled_ = options.hot_experts && config_.is_moe() && config_.n_expert >= 16 &&
                 strategy.kind == Strategy::Kind::Automatic && !pipeline_ && whole_model &&
                 !options.n_cpu_moe && !options.n_gpu_layers && options.pins.empty() && a_device;
  if (options.hot_experts && !hot_enabled_ && options.log) {
    *options.log << "tandem: --hot-experts: applies to a mixture of 16 or more experts a layer, "
                    "placed by --strategy auto with a GPU and no -ngl, --n-cpu-moe or -ot; the "
                    "experts stay whole\n";
  }
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
  options.layer_begin = layers_.begin;
  options.layer_end = layers_.end;
  if (n_tokens <= kHotMaxTokens) {
    for (const HotLayer& h : hot_) {
      options.hot_experts.push_back({h.set.layer, h.set.experts, h.set.share});
    }
  }
  LlamaGraph& lg = graphs_.emplace(key, build_llama_graph(config_, file_, options)).first->second;
  if (routing_stats_ || hot_enabled_) {
    for (const LlamaGraph::Route& r : lg.routes) lg.graph.mark_output(r.ids);
  }
  return lg;
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
  history_[size_t(sequence)].clear();
}

void Session::remember(int sequence, std::span<const int32_t> tokens) {
  std::vector<int32_t>& h = history_[size_t(sequence)];
  h.resize(size_t(past_[size_t(sequence)]));
  h.insert(h.end(), tokens.begin(), tokens.end());
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
  if (!pipeline_) return eval_stage(tokens, past_[0], {}, all_logits);
  check_step(0, tokens);
  const int64_t n = int64_t(tokens.size());
  const LlamaGraph& lg = graph_for(n, all_logits);
  positions_.resize(size_t(n));
  std::iota(positions_.begin(), positions_.end(), int32_t(past_[0]));
  // This rank's layers, then the step and their hidden state go to the next rank (every rank
  // learns the step from its neighbour), the logits come back from the last. A failure here
  // stops the other ranks rather than leave them waiting.
  try {
    pipeline_->check_running();
    stage_out_.resize(size_t(lg.graph.tensor(lg.output()).elements()));
    ++steps_run_;
    run_recovering(lg, tokens, positions_, stage_out_);
    tokens_evaluated_ += n;
    size_logits(size_t(config_.n_vocab * (all_logits ? n : 1)));
    pipeline_->step(tokens, past_[0], all_logits, stage_out_, logits_);
  } catch (const std::exception& e) {
    pipeline_->abort(e.what());
    throw;
  }
  remember(0, tokens);
  past_[0] += n;
  return logits_;
}

std::span<const float> Session::eval_stage(std::span<const int32_t> tokens, int64_t start,
                                           std::span<const float> hidden, bool all_logits) {
  TANDEM_CHECK_ARG(
      start >= 0 && start <= n_ctx_, "session",
      "start position " + std::to_string(start) + " outside [0, " + std::to_string(n_ctx_) + "]");
  TANDEM_CHECK_ARG(!pipeline_, "session", "a pipeline's rank 0 evaluates with eval()");
  past_[0] = start;  // positions from start on are written again
  check_step(0, tokens);
  const int64_t n = int64_t(tokens.size());
  const size_t want = layers_.begin > 0 ? size_t(n * config_.n_embd) : 0;
  TANDEM_CHECK_ARG(hidden.size() == want, "session",
                   "layers from " + std::to_string(layers_.begin) + " on take " +
                       std::to_string(want) + " floats of hidden state for " + std::to_string(n) +
                       " tokens (got " + std::to_string(hidden.size()) + ")");
  const LlamaGraph& lg = graph_for(n, all_logits);
  positions_.resize(size_t(n));
  std::iota(positions_.begin(), positions_.end(), int32_t(start));
  hidden_in_ = hidden;
  try {
    run_step(lg, tokens);
  } catch (...) {
    hidden_in_ = {};
    throw;
  }
  hidden_in_ = {};
  remember(0, tokens);
  past_[0] += n;
  review_hot_experts();  // after the step: its logits stay where they are
  return logits_;
}

std::span<const float> Session::eval_sequence(int sequence, std::span<const int32_t> tokens) {
  if (pipeline_ && n_past(sequence) >= 0) return eval(tokens);  // one sequence: 0
  check_step(sequence, tokens);
  const int64_t n = int64_t(tokens.size());
  const LlamaGraph& lg = graph_for(n, false, sequence);
  positions_.resize(size_t(n));
  std::iota(positions_.begin(), positions_.end(), int32_t(past_[size_t(sequence)]));
  run_step(lg, tokens);
  remember(sequence, tokens);
  past_[size_t(sequence)] += n;
  review_hot_experts();
  return logits_;
}

std::span<const float> Session::decode_batch(std::span<const int> sequences,
                                             std::span<const int32_t> tokens) {
  TANDEM_CHECK_ARG(layers_.begin == 0 && layers_.end == int(config_.n_layer) && !pipeline_,
                   "session", "decode_batch runs the whole model in one process");
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
  for (size_t r = 0; r < sequences.size(); ++r) {
    remember(sequences[r], tokens.subspan(r, 1));
    past_[size_t(sequences[r])] += 1;
  }
  return logits_;
}

std::span<const float> Session::run_step(const LlamaGraph& lg, std::span<const int32_t> tokens) {
  size_logits(size_t(lg.graph.tensor(lg.output()).elements()));
  ++steps_run_;
  run_recovering(lg, tokens, positions_, logits_);
  tokens_evaluated_ += int64_t(tokens.size());
  return logits_;
}

void Session::run_recovering(const LlamaGraph& lg, std::span<const int32_t> tokens,
                             std::span<const int32_t> positions, std::span<float> logits) {
  for (int attempt = 0;; ++attempt) {
    // What a failed attempt allocated is what it holds beyond this (compared by hash: copied
    // only when it changed, so not on every token).
    if (executor_->residency().hash() != residency_before_.hash())
      residency_before_ = executor_->residency();
    try {
      execute_step(lg, tokens, positions, logits);
      return;
    } catch (const Error& e) {
      if (attempt >= kMaxStepRecoveries || !recover(e)) throw;
    }
  }
}

void Session::execute_step(const LlamaGraph& lg, std::span<const int32_t> tokens,
                           std::span<const int32_t> positions, std::span<float> logits) {
  const int64_t n = int64_t(tokens.size());
  plan_residency(kPlanPrefillTokens);
  last_placement_ = scheduler_->plan(lg.graph, executor_->residency());
  last_graph_ = &lg.graph;
  retired_graphs_.clear();
  // Plans are cached: an unchanged placement needs no new uploads (keeps this off the per-token
  // path; preload scans the residency).
  if (last_placement_ != uploaded_for_) {
    executor_->preload(lg.graph, *last_placement_, load_progress_);
    uploaded_for_ = last_placement_;
  }
  Bindings bindings;
  bindings.input(lg.positions, positions.data(), positions.size_bytes())
      .output(lg.output(), logits.data(), logits.size_bytes());
  if (lg.tokens != kNoTensor) bindings.input(lg.tokens, tokens.data(), tokens.size_bytes());
  if (lg.hidden_in != kNoTensor)
    bindings.input(lg.hidden_in, hidden_in_.data(), hidden_in_.size_bytes());
  if (lg.rows != kNoTensor) {
    rows_.resize(size_t(n));
    std::iota(rows_.begin(), rows_.end(), 0);
    bindings.input(lg.rows, rows_.data(), rows_.size() * sizeof(int32_t));
  }
  const bool count_routes = (routing_stats_ || hot_enabled_) && !lg.routes.empty();
  if (count_routes) {
    size_t total = 0;
    for (const LlamaGraph::Route& r : lg.routes) {
      total += size_t(lg.graph.tensor(r.ids).elements());
    }
    route_ids_.resize(total);
    size_t at = 0;
    for (const LlamaGraph::Route& r : lg.routes) {
      const size_t ids = size_t(lg.graph.tensor(r.ids).elements());
      bindings.output(r.ids, route_ids_.data() + at, ids * sizeof(int32_t));
      at += ids;
    }
  }
  // One step in learn_every_ is timed per op (it synchronizes after every op) to learn from.
  const bool sampled = learn_ && learn_every_ > 0 && ++steps_ % learn_every_ == 0;
  const TimingMode timing = executor_->options().timing;
  if (sampled) executor_->set_timing(TimingMode::PerOp);
  // Decode steps are timed for the hot experts' trial (before and after the split); the planning
  // and uploads above stay out of it.
  const bool timed = hot_enabled_ && (!hot_split_ || hot_timing_) && !sampled &&
                     lg.graph.tensor(lg.positions).elements() <= kHotMaxTokens;
  const auto t0 =
      timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  try {
    executor_->run(lg.graph, *last_placement_, bindings);
  } catch (...) {
    if (sampled) executor_->set_timing(timing);
    throw;
  }
  if (sampled) executor_->set_timing(timing);
  if (timed) {
    hot_step_us_.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  if (learn_ && (sampled || learn_every_ == 0)) learn_from(lg.graph);
  if (count_routes) count_routing(lg);
}

bool Session::recover(const Error& error) {
  // A range after the first cannot evaluate its tokens again without the hidden states.
  if (layers_.begin > 0) return false;
  // A device that reports itself lost (its error may surface as another one, e.g. a copy that
  // read from it), whichever backend the error names.
  std::vector<std::string> lost;
  for (const auto& b : scheduler_->backends()) {
    if (b->lost() && std::find(lost_.begin(), lost_.end(), b->backend_id()) == lost_.end())
      lost.push_back(b->backend_id());
  }
  if (!lost.empty()) return recover_lost(error, lost);
  if (error.code() == ErrorCode::OutOfMemory) return recover_out_of_memory(error);
  return false;
}

namespace {

std::string others_than(const std::vector<std::shared_ptr<Backend>>& backends) {
  std::string s;
  for (const auto& b : backends) {
    if (!b->lost()) s += (s.empty() ? "" : ", ") + b->backend_id();
  }
  return s.empty() ? "no backend" : s;
}

}  // namespace

bool Session::recover_lost(const Error& error, const std::vector<std::string>& lost) {
  std::string ids;
  for (const std::string& id : lost) ids += (ids.empty() ? "" : ", ") + id;
  const std::string step = std::to_string(steps_run_);
  if (strict_) {
    Error e(ErrorCode::DeviceLost, "session",
            ids + " was lost during step " + step + " (" + error.what() +
                "); --strict forbids moving its work to the other backends (" +
                others_than(scheduler_->backends()) +
                "): run again without --strict to continue on them, or once the device is reset");
    e.set_backend(lost.front());
    throw e;
  }
  // Everything the lost devices held is gone: weights are read again from the model file where
  // the next placement wants them, KV caches are rebuilt.
  size_t caches = 0;
  for (const std::string& id : lost) {
    caches += executor_->release(id).size();
    lost_.push_back(id);
  }
  const std::string action =
      "marked lost; the step planned again on " + others_than(scheduler_->backends()) +
      ", the weights it held read again from the model file" + rebuild_caches(caches);
  for (const std::string& id : lost)
    recoveries_.push_back({ErrorCode::DeviceLost, id, steps_run_, error.what(), action});
  return true;
}

bool Session::recover_out_of_memory(const Error& error) {
  const std::string& id = error.backend();
  const int b = scheduler_->backend_index(id);
  // Host memory has no budget to lower; an error naming no backend cannot be moved.
  if (b == kNoBackend || scheduler_->backends()[size_t(b)]->host_accessible()) return false;
  const std::string step = std::to_string(steps_run_);
  if (strict_) {
    Error e(ErrorCode::OutOfMemory, "session",
            id + " ran out of memory during step " + step + " (" + error.what() +
                "); --strict forbids moving its work to another backend: give it a smaller "
                "budget (--gpu-mem) or run without --strict");
    e.set_backend(id);
    throw e;
  }
  // The budget drops to what the device held when it ran out (weights and KV caches that
  // fit); where that is no lower, to what it held before the step, then to nothing.
  const size_t budget = scheduler_->memory_budget(id);
  size_t lower = executor_->resident_bytes(id);
  if (lower >= budget) lower = residency_before_.resident_bytes(id);
  if (lower >= budget) lower = 0;
  if (lower >= budget && executor_->resident_bytes(id) == 0) return false;
  const std::string why = "budget lowered from " + format_bytes(budget) + " to " +
                          format_bytes(lower) + ": out of memory in step " + step;
  scheduler_->set_memory_budget(id, lower, why);
  std::string action = why + "; the step planned again";
  if (lower > 0) {
    // Frees what the failed attempt allocated there (its uploads, new caches, arenas): caches
    // it created hold nothing yet.
    executor_->release(id, residency_before_);
    rebuild_caches(0);
  } else {
    // Not even what it held before fits beside the step (the ops on its KV caches run there
    // whatever the budget): it keeps nothing, its caches are rebuilt elsewhere.
    action += ", everything it held freed" + rebuild_caches(executor_->release(id).size());
  }
  recoveries_.push_back({ErrorCode::OutOfMemory, id, steps_run_, error.what(), action});
  return true;
}

std::string Session::rebuild_caches(size_t freed) {
  // Placements change after a failure: planned again, and where weights live too (auto).
  uploaded_for_.reset();
  residency_planned_ = false;
  residency_stale_ = true;
  if (freed == 0) return "";
  // The caches of every sequence are refilled by evaluating its tokens so far again (those
  // left on other devices are rewritten with the same values).
  int64_t tokens = 0;
  for (int s = 0; s < n_sequences(); ++s) {
    const int64_t past = past_[size_t(s)];
    if (past == 0) continue;
    std::vector<int32_t> positions(static_cast<size_t>(past));
    std::iota(positions.begin(), positions.end(), 0);
    const LlamaGraph& lg = graph_for(past, false, s);
    std::vector<float> logits(size_t(lg.graph.tensor(lg.output()).elements()));
    run_recovering(lg, std::span(history_[size_t(s)]).first(size_t(past)), positions, logits);
    tokens += past;
  }
  return ", " + std::to_string(freed) + " KV caches it held rebuilt by evaluating " +
         std::to_string(tokens) + " earlier tokens again";
}

void Session::size_logits(size_t n) {
  // Page-locked up to a few decode batches' worth (an all-logits prompt of 512 tokens would pin
  // 256 MB); growing re-allocates, which steps of the same size never do.
  constexpr size_t kMaxPinnedBytes = size_t(64) << 20;
  const size_t bytes = n * sizeof(float);
  // Memory a lost device page-locked is not used again (its context is gone).
  if (logits_pinned_ && logits_pinned_.owner()->lost()) logits_pinned_.reset();
  if (logits_pinned_.bytes() < bytes && bytes <= kMaxPinnedBytes) {
    logits_pinned_.reset();
    for (const auto& b : executor_->backends()) {
      if (b->lost()) continue;
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
  // A residency plan made beforehand (plan_phases) is kept, unless a device failed since.
  if (scheduler_->strategy().kind != Strategy::Kind::Automatic ||
      (scheduler_->residency_plan() && !residency_stale_))
    return;
  residency_stale_ = false;
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
                         scheduler_->backends()[size_t(b)]->kind(), e.actual_us, e.work_scale);
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
  if (pipeline_) {
    os << "pipeline of " << pipeline_->ranges().size() << " ranks, layers";
    for (const LayerRange& r : pipeline_->ranges()) os << " [" << r.begin << ", " << r.end << ")";
    os << "; rank 0: ";
  }
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
  if (!hot_.empty()) {
    size_t least = hot_.front().set.experts.size(), most = least;
    std::vector<double> shares;
    for (const HotLayer& h : hot_) {
      least = std::min(least, h.set.experts.size());
      most = std::max(most, h.set.experts.size());
      shares.push_back(h.set.share);
    }
    std::sort(shares.begin(), shares.end());
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "; hot experts: %zu layers, %zu-%zu of %lld each (%.1f%% of their choices, "
                  "median), %lld experts swapped in",
                  hot_.size(), least, most, static_cast<long long>(config_.n_expert),
                  100.0 * shares[shares.size() / 2], static_cast<long long>(hot_changes_));
    os << buf;
    if (!hot_outcome_.empty()) os << " (" << hot_outcome_ << ")";
  } else if (!hot_outcome_.empty()) {
    os << "; hot experts tried: " << hot_outcome_;
  }
  for (size_t i = 0; i < recoveries_.size(); ++i) {
    const Recovery& r = recoveries_[i];
    os << (i ? ", " : "; recovered: ") << r.backend << " "
       << (r.error == ErrorCode::DeviceLost ? "lost" : "out of memory") << " in step " << r.step;
  }
  return os.str();
}

}  // namespace tandem
