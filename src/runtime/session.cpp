#include "tandem/runtime.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <ostream>
#include <set>
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
  // Hot experts where the placement is the session's own to choose and a device can hold them;
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
  try {
    executor_->run(lg.graph, *last_placement_, bindings);
  } catch (...) {
    if (sampled) executor_->set_timing(timing);
    throw;
  }
  if (sampled) executor_->set_timing(timing);
  if (learn_ && (sampled || learn_every_ == 0)) learn_from(lg.graph);
  if (count_routes) count_routing(lg);
}

void Session::count_routing(const LlamaGraph& lg) {
  // The hot experts serve the small steps (decode), whose routing a prompt's does not show: only
  // those steps count for them.
  const int64_t n_tokens = lg.graph.tensor(lg.positions).elements();
  if (hot_enabled_ && n_tokens <= kHotMaxTokens) {
    ++hot_steps_;
    if (hot_counts_.empty()) {
      for (const LlamaGraph::Route& route : lg.routes) {
        hot_count_layers_.push_back(route.layer);
        hot_counts_.emplace_back(size_t(config_.n_expert), 0.0);
      }
    }
    size_t at = 0;
    for (size_t i = 0; i < lg.routes.size() && i < hot_counts_.size(); ++i) {
      const size_t n = size_t(lg.graph.tensor(lg.routes[i].ids).elements());
      for (size_t j = 0; j < n; ++j) {
        const int32_t e = route_ids_[at + j];
        if (e >= 0 && size_t(e) < hot_counts_[i].size()) hot_counts_[i][size_t(e)] += 1.0;
      }
      at += n;
    }
  }
  if (!routing_stats_) return;
  RoutingStats& r = routing_;
  if (r.layers.empty()) {
    for (const LlamaGraph::Route& route : lg.routes) {
      r.layers.push_back(route.layer);
      r.chosen.emplace_back(size_t(config_.n_expert), 0);
      r.choices.push_back(0);
    }
  }
  ++r.steps;
  size_t at = 0;
  for (size_t i = 0; i < lg.routes.size() && i < r.layers.size(); ++i) {
    const size_t n = size_t(lg.graph.tensor(lg.routes[i].ids).elements());
    for (size_t j = 0; j < n; ++j) {
      const int32_t e = route_ids_[at + j];
      if (e >= 0 && size_t(e) < r.chosen[i].size()) ++r.chosen[i][size_t(e)];
    }
    r.choices[i] += int64_t(n);
    at += n;
  }
}

std::vector<double> RoutingStats::top_share(size_t n) const {
  std::vector<double> out;
  for (size_t i = 0; i < chosen.size(); ++i) {
    std::vector<int64_t> c = chosen[i];
    std::sort(c.begin(), c.end(), std::greater<>());
    int64_t top = 0;
    for (size_t k = 0; k < std::min(n, c.size()); ++k) top += c[k];
    out.push_back(choices[i] > 0 ? double(top) / double(choices[i]) : 0.0);
  }
  return out;
}

std::vector<int64_t> RoutingStats::used() const {
  std::vector<int64_t> out;
  for (const auto& c : chosen)
    out.push_back(std::count_if(c.begin(), c.end(), [](int64_t x) { return x > 0; }));
  return out;
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

std::vector<HotExpertLayer> Session::hot_experts() const {
  std::vector<HotExpertLayer> out;
  for (const HotLayer& h : hot_) out.push_back(h.set);
  return out;
}

namespace {

const char* const kSlabs[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};

std::string expert_tensor(int layer, const char* what) {
  return "blk." + std::to_string(layer) + "." + what + ".weight";
}

// The experts of `counts` by count, most chosen first (ties: the lower id).
std::vector<int32_t> by_count(std::span<const double> counts) {
  std::vector<int32_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return counts[size_t(a)] > counts[size_t(b)]; });
  return order;
}

}  // namespace

double hot_share(std::span<const double> counts, std::span<const int32_t> experts) {
  double total = 0.0, in = 0.0;
  for (double c : counts) total += c;
  for (int32_t e : experts) {
    if (e >= 0 && size_t(e) < counts.size()) in += counts[size_t(e)];
  }
  return total > 0.0 ? in / total : 0.0;
}

std::vector<int32_t> choose_hot_experts(std::span<const double> counts, double coverage,
                                        size_t least, size_t most) {
  std::vector<int32_t> top = by_count(counts);
  double total = 0.0, in = 0.0;
  for (double c : counts) total += c;
  size_t n = 0;
  while (n < top.size() && !(total > 0.0 && in >= coverage * total)) in += counts[size_t(top[n++])];
  n = std::max(n, std::min(least, top.size()));
  if (n > most || total <= 0.0) return {};
  top.resize(n);
  return top;
}

std::vector<int32_t> replace_hot_experts(std::span<const double> counts,
                                         std::span<const int32_t> current, double margin) {
  std::vector<int32_t> top = by_count(counts);
  top.resize(std::min(top.size(), current.size()));
  if (hot_share(counts, top) > hot_share(counts, current) + margin) return top;
  return {};
}

Session::HotLayer Session::make_hot_layer(int layer, std::vector<int32_t> experts, double share) {
  HotLayer h;
  h.set.layer = layer;
  h.set.share = share;
  std::sort(experts.begin(), experts.end());
  h.set.experts = std::move(experts);
  h.hot_map.assign(size_t(config_.n_expert), -1);
  h.cold_map.resize(size_t(config_.n_expert));
  std::iota(h.cold_map.begin(), h.cold_map.end(), 0);
  for (size_t slot = 0; slot < h.set.experts.size(); ++slot) {
    h.hot_map[size_t(h.set.experts[slot])] = int32_t(slot);
    h.cold_map[size_t(h.set.experts[slot])] = -1;
  }
  for (int i = 0; i < 3; ++i) {
    const gguf::TensorInfo* t = file_.find_tensor(expert_tensor(layer, kSlabs[i]));
    TANDEM_CHECK_ARG(t != nullptr, "hot experts",
                     "missing tensor '" + expert_tensor(layer, kSlabs[i]) + "'");
    const size_t per_expert = t->bytes / size_t(t->ne[2]);
    h.slab[i].resize(per_expert * h.set.experts.size());
    for (size_t slot = 0; slot < h.set.experts.size(); ++slot) {
      std::memcpy(h.slab[i].data() + slot * per_expert,
                  t->data + size_t(h.set.experts[slot]) * per_expert, per_expert);
    }
  }
  return h;
}

void Session::retire_graphs() {
  // The last step's graph stays readable (last_graph) until the next step runs.
  while (!graphs_.empty()) retired_graphs_.push_back(graphs_.extract(graphs_.begin()));
}

void Session::bind_hot_layers() {
  for (const HotLayer& h : hot_) {
    for (int i = 0; i < 3; ++i) {
      executor_->bind_weight(hot_expert_name(h.set.layer, kSlabs[i]), h.slab[i].data(),
                             h.slab[i].size());
    }
    executor_->bind_weight(hot_expert_name(h.set.layer, "hot_map"), h.hot_map.data(),
                           h.hot_map.size() * sizeof(int32_t));
    executor_->bind_weight(hot_expert_name(h.set.layer, "cold_map"), h.cold_map.data(),
                           h.cold_map.size() * sizeof(int32_t));
  }
}

void Session::review_hot_experts() {
  if (!hot_enabled_ || hot_counts_.empty() || hot_steps_ < hot_review_at_) return;
  hot_review_at_ = hot_steps_ + kHotReviewSteps;
  if (!hot_split_) {
    first_hot_split();
  } else {
    // Hysteresis: a set is replaced only where the experts chosen most lately cover more of the
    // layer's recent choices than it does by kHotMargin; its size stays (so does the residency).
    bool changed = false;
    std::vector<HotLayer> retired;  // bound until the new sets are
    for (HotLayer& h : hot_) {
      const auto it = std::find(hot_count_layers_.begin(), hot_count_layers_.end(), h.set.layer);
      if (it == hot_count_layers_.end()) continue;
      const std::vector<double>& counts = hot_counts_[size_t(it - hot_count_layers_.begin())];
      const double now = hot_share(counts, h.set.experts);
      if (std::vector<int32_t> top = replace_hot_experts(counts, h.set.experts, kHotMargin);
          !top.empty()) {
        const double share = hot_share(counts, top);
        retired.push_back(std::exchange(h, make_hot_layer(h.set.layer, std::move(top), share)));
        ++hot_changes_;
        changed = true;
      } else if (std::abs(now - h.set.share) > kHotMargin) {
        h.set.share = now;  // the costs' share follows the routing
        changed = true;
      }
    }
    if (changed) {
      bind_hot_layers();
      retire_graphs();
      preload_phases();
    }
  }
  for (auto& counts : hot_counts_) {
    for (double& c : counts) c *= 0.5;
  }
}

void Session::first_hot_split() {
  hot_split_ = true;
  // Per layer the fewest experts that took kHotCoverage of its choices so far; a layer that
  // needs more than a quarter of its experts for that is left whole.
  std::vector<HotLayer> hot;
  for (size_t i = 0; i < hot_counts_.size(); ++i) {
    const std::vector<double>& counts = hot_counts_[i];
    std::vector<int32_t> top = choose_hot_experts(
        counts, kHotCoverage, size_t(config_.n_expert_used), size_t(config_.n_expert) / 4);
    if (top.empty()) continue;
    const double share = hot_share(counts, top);
    hot.push_back(make_hot_layer(hot_count_layers_[i], std::move(top), share));
  }
  if (hot.empty()) return;
  std::swap(hot_, hot);
  bind_hot_layers();
  retire_graphs();
  // Where things live is decided again, with the hot experts as units of their own.
  std::map<std::string, std::string, std::less<>> before;
  if (const ResidencyPlan* p = scheduler_->residency_plan()) before = p->home;
  residency_planned_ = false;
  residency_stale_ = true;
  plan_residency(kPlanPrefillTokens);
  const ResidencyPlan* plan = scheduler_->residency_plan();
  if (!plan) return;
  // A layer whose whole experts stay on a device needs no hot ones.
  auto on_device = [&](const std::string& name) {
    const auto it = plan->home.find(name);
    if (it == plan->home.end()) return false;
    const int b = scheduler_->backend_index(it->second);
    return b != kNoBackend && !scheduler_->backends()[size_t(b)]->host_accessible();
  };
  const size_t split = hot_.size();
  std::erase_if(hot_, [&](const HotLayer& h) {
    return on_device(expert_tensor(h.set.layer, "ffn_gate_exps"));
  });
  if (hot_.size() != split) retire_graphs();
  // What the new plan keeps elsewhere leaves each device; KV caches that moved are refilled.
  size_t moved_caches = 0;
  auto home = [](const auto& homes, const std::string& name) {
    const auto it = homes.find(name);
    return it == homes.end() ? std::string() : it->second;
  };
  std::set<std::string> caches;
  for (const auto* homes : {&std::as_const(before), &plan->home}) {
    for (const auto& [name, id] : *homes) {
      if (name.rfind("cache_", 0) == 0) caches.insert(name);
    }
  }
  for (const std::string& name : caches) {
    if (home(before, name) != home(plan->home, name)) ++moved_caches;
  }
  for (const auto& b : scheduler_->backends()) {
    if (b->host_accessible() || b->lost()) continue;
    Residency keep;
    for (const auto& [name, id] : plan->home) {
      if (id == b->backend_id()) keep.add(id, name, 0);
    }
    executor_->release(b->backend_id(), keep);
  }
  uploaded_for_.reset();
  if (moved_caches > 0) rebuild_caches(moved_caches);
  preload_phases();
}

void Session::preload_phases() {
  // The weights the next prefill and decode read from a device, uploaded now (between steps)
  // rather than in the next step.
  for (const int64_t n : {std::clamp<int64_t>(kPlanPrefillTokens, 1, n_ctx_), int64_t(1)}) {
    const LlamaGraph& lg = graph_for(n, false);
    auto placement = scheduler_->plan(lg.graph, executor_->residency());
    executor_->preload(lg.graph, *placement);
  }
  uploaded_for_.reset();
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
                  "median), %lld changes",
                  hot_.size(), least, most, static_cast<long long>(config_.n_expert),
                  100.0 * shares[shares.size() / 2], static_cast<long long>(hot_changes_));
    os << buf;
  }
  for (size_t i = 0; i < recoveries_.size(); ++i) {
    const Recovery& r = recoveries_[i];
    os << (i ? ", " : "; recovered: ") << r.backend << " "
       << (r.error == ErrorCode::DeviceLost ? "lost" : "out of memory") << " in step " << r.step;
  }
  return os.str();
}

}  // namespace tandem
