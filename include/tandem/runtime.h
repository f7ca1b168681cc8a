// A model session: a mapped GGUF model, its tokenizer, the backends from the registry, a
// scheduler over them, an executor that keeps weights and the KV cache resident between steps,
// and a sampler. What the CLI, the C API and the Python module all run. Graphs are built once
// per step shape and reused.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "tandem/backend.h"
#include "tandem/calibration.h"
#include "tandem/error.h"
#include "tandem/executor.h"
#include "tandem/layer_split.h"
#include "tandem/model/gguf.h"
#include "tandem/model/llama_config.h"
#include "tandem/model/llama_graph.h"
#include "tandem/model/sampler.h"
#include "tandem/model/tokenizer.h"
#include "tandem/pipeline.h"
#include "tandem/scheduler.h"

namespace tandem {

class PipelineLeader;

// The prefill length the automatic placement plans residency for (with one-token decode).
inline constexpr int64_t kPlanPrefillTokens = 512;

struct SessionOptions {
  std::string model_path;
  // The backends to run on instead of the registry's (available_backends()); empty: those.
  // For programs that bring their own backend, and for tests.
  std::vector<std::shared_ptr<Backend>> backends;
  std::string strategy = "gpu";                      // gpu | cpu | auto | only:ID
  std::optional<uint64_t> gpu_memory;                // persistent-memory budget for every GPU
  std::map<std::string, uint64_t> gpu_memory_by_id;  // per GPU ("cuda:1"), over gpu_memory
  // Several GPUs: the GPU layers split in contiguous ranges, in device order, by these
  // proportions (llama.cpp --tensor-split; empty: by each GPU's budget or free memory).
  std::vector<double> tensor_split;
  bool single_gpu = false;  // --split-mode none: only the first GPU takes part
  int threads = 0;          // CPU backend threads (0: physical cores)
  int64_t n_ctx = 0;        // KV cache length (0: min(trained, 4096))
  // Independent sequences, each with a KV cache of n_ctx positions (a server's slots); their
  // decode steps can run as one graph (Session::decode_batch).
  int n_sequences = 1;
  DType kv_dtype = DType::F16;
  // Every fallback is an error, and so is a device that runs out of memory or is lost during
  // a step (without it the step moves to the other backends; see Session::recoveries()).
  bool strict = false;
  std::vector<TensorPin> pins;  // --override-tensor style pins
  // llama.cpp -ngl: layers >= N (weights and KV cache), the token embedding and, below
  // n_layer + 1, the output layer live in host memory. Unset: placement is the strategy's alone.
  std::optional<int> n_gpu_layers;
  // llama.cpp --n-cpu-moe: the expert tensors (ffn_{gate,up,down}_exps) of layers < N live in
  // host memory, so their ExpertMatMul runs on the host; kAllLayers (--cpu-moe): every layer's.
  // On a model without experts it pins nothing, as in llama.cpp.
  std::optional<int> n_cpu_moe;
  TimingMode timing = TimingMode::Off;
  bool record_events = true;
  // Cost profile: another file (--cost-profile), none (--no-calibrate), a quick calibration
  // when missing (run, bench, tune), and learning from timed ops (TimingMode::PerOp) or from one
  // step in learn_every, timed per op when the rest are not.
  std::string cost_profile;
  bool no_calibrate = false;
  bool calibrate_if_missing = false;
  bool learn = false;
  int learn_every = 0;
  // Count which experts each mixture-of-experts layer's router chooses (Session::routing):
  // every step copies the routers' choices out of wherever they ran.
  bool routing_stats = false;
  // A mixture of experts placed automatically (Strategy auto, a GPU, no pin, -ngl or
  // --n-cpu-moe): the experts each layer's router chooses most in decode, counted while running,
  // get weights of their own (hot experts) that the residency plan can keep on the GPU while
  // the rest stay in host memory; decode runs them there. After kHotReviewSteps decode steps the
  // residency is planned again with them; every kHotReviewSteps more a layer's set is replaced
  // where the experts chosen most lately cover more of its choices by a margin
  // (Session::hot_experts; --hot-experts). The split is a trial: at the first review window
  // whose decode steps take no less time (median) than those before the split, the split is
  // undone and whole layers kept (Session::hot_experts_outcome). Off by default until
  // measured ahead of whole layers.
  bool hot_experts = false;
  // Called as weights are uploaded to a device (bytes done, bytes of this upload in all).
  HybridExecutor::Progress load_progress;
  // Where warnings while loading go (a missing cost profile); nullptr: nowhere.
  std::ostream* log = nullptr;
  // A pipeline across processes (pipeline.h), on rank 0: the embedding and the first layers run
  // here, and this rank leads the other ranks, which hold the rest; the layers split across
  // ranks by tensor_split (one proportion per rank), else evenly. One sequence only.
  std::shared_ptr<PipelineTransport> pipeline;
  // Only these layers (a pipeline rank's; the ranks' own sessions set it). A range that does
  // not start at layer 0 reads a hidden state (eval_stage); one that ends before the last layer
  // returns one.
  std::optional<LayerRange> layers;
};

// How often each expert of each mixture-of-experts layer was chosen over the steps a session ran
// with SessionOptions::routing_stats (its own layers only, in order).
struct RoutingStats {
  int64_t steps = 0;
  std::vector<int> layers;                   // model layer of each entry
  std::vector<std::vector<int64_t>> chosen;  // [entry][expert]: times chosen
  std::vector<int64_t> choices;              // [entry]: tokens x experts a token, counted
  // Per entry: the share of its choices that its `n` most chosen experts took.
  std::vector<double> top_share(size_t n) const;
  // Per entry: how many experts were chosen at least once.
  std::vector<int64_t> used() const;
};

// A layer whose experts are split in two products (SessionOptions::hot_experts): its hot
// experts in their slab's order, and the share of its recent choices they took.
struct HotExpertLayer {
  int layer = 0;
  std::vector<int32_t> experts;
  double share = 0.0;
};

// The policy of SessionOptions::hot_experts over one layer's choice counts (per expert):
// the share of the choices `experts` took; the fewest most chosen experts that took `coverage`
// of them, at least `least`, or none where that needs more than `most` (ties: the lower id);
// and the swaps into `current` (slot, expert): the most chosen other expert takes the slot of
// the least chosen hot one, and so on, while its count passes that one's by more than `sigmas`
// standard deviations of their difference (sqrt of their sum: counts of choices vary like
// Poisson counts), so that noise in the counts moves nothing.
double hot_share(std::span<const double> counts, std::span<const int32_t> experts);
std::vector<int32_t> choose_hot_experts(std::span<const double> counts, double coverage,
                                        size_t least, size_t most);
std::vector<std::pair<size_t, int32_t>> swap_hot_experts(std::span<const double> counts,
                                                         std::span<const int32_t> current,
                                                         double sigmas);

// One phase's placement as `plan` shows it: made without running or uploading anything.
struct PhasePlan {
  std::string name;  // "prefill" or "decode"
  int64_t n_tokens = 0;
  const Graph* graph = nullptr;
  std::shared_ptr<const Placement> placement;
  double predicted_us = 0.0;  // the cost model's step time
};

// A device that failed during a step, and what the session did so the step could run again:
// out of memory, its budget lowered to what it held and the step planned again; lost, its
// weights read again from the model file where the new placement needs them and the KV caches
// it held rebuilt by evaluating the sequence's earlier tokens again.
struct Recovery {
  ErrorCode error = ErrorCode::OutOfMemory;  // OutOfMemory or DeviceLost
  std::string backend;                       // the device
  int64_t step = 0;                          // the step it happened in (1: the first)
  std::string what;                          // the device's error
  std::string action;                        // what the session did
};

struct GenerateOptions {
  int n_predict = 64;  // tokens to generate; -1: until the end of generation or the context
  SamplerParams sampling;
};

// Called for every generated token with the text it completes (complete UTF-8 characters
// only); token kNoToken carries the text held back at the end. Return false to stop.
inline constexpr int32_t kNoToken = -1;
using TokenCallback = std::function<bool(int32_t token, std::string_view text)>;

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated, end-of-generation token excluded
  int64_t n_prompt = 0;
  double prompt_s = 0.0;    // evaluating the prompt
  double generate_s = 0.0;  // sampling and decoding the rest
  bool stopped = false;     // the callback asked to stop
};

// llama.cpp's -ngl as pins: the weights of layers >= n_gpu_layers, the token embedding and,
// below n_layer + 1, the output layer pinned to the first host (CPU-kind) backend. Where their
// ops run stays the scheduler's choice (a GPU may stream a host weight for a large batch). With
// tied embeddings (the output layer multiplies by token_embd) the embedding goes where the output
// layer goes: llama.cpp keeps a second copy on the GPU; pinned to the host, the GPU would stream
// the whole vocabulary matrix every token.
std::vector<TensorPin> host_layer_pins(int n_layer, int n_gpu_layers,
                                       std::span<const std::shared_ptr<Backend>> backends,
                                       bool tied_embeddings = false);

// llama.cpp's --n-cpu-moe as a pin: the expert tensors of layers < n_cpu_moe (every layer from
// n_layer on) pinned to the first host (CPU-kind) backend; none for 0. The rest of each layer
// stays the strategy's (or -ngl's).
inline constexpr int kAllLayers = std::numeric_limits<int>::max();
std::vector<TensorPin> host_expert_pins(int n_layer, int n_cpu_moe,
                                        std::span<const std::shared_ptr<Backend>> backends);

class Session {
 public:
  // Maps the model and builds the scheduler; uploads nothing until the first step. Throws
  // Error (Io, Format, InvalidArgument, OutOfMemory) naming what is wrong.
  explicit Session(const SessionOptions& options);

  const LlamaConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::File& file() const { return file_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return past_[0]; }
  const std::string& strategy_name() const { return strategy_name_; }

  // Text to token ids (add_bos: as the vocab asks) and back.
  std::vector<int32_t> tokenize(std::string_view text, bool add_bos = true) const;
  std::string detokenize(std::span<const int32_t> tokens) const;

  // Evaluates tokens at positions [n_past, n_past + size) and advances n_past. Returns the
  // logits of the last token (n_vocab floats) or, with all_logits, of every token.
  std::span<const float> eval(std::span<const int32_t> tokens, bool all_logits = false);
  // eval() by its usual names: a prompt, then one token at a time.
  std::span<const float> prefill(std::span<const int32_t> tokens) { return eval(tokens); }
  std::span<const float> decode(int32_t token) { return eval(std::span(&token, 1)); }
  // The logits of the most recent step (empty before the first).
  std::span<const float> logits() const { return logits_; }
  // One step of a session over a layer range (SessionOptions::layers): tokens at positions
  // [start, start + size) of sequence 0; `hidden` the previous range's output, f32
  // [n_embd x size] (empty where the range starts at layer 0). Returns the hidden state for the
  // next range or, where the range ends the model, the logits as eval() does.
  std::span<const float> eval_stage(std::span<const int32_t> tokens, int64_t start,
                                    std::span<const float> hidden, bool all_logits = false);
  // The layers run here ([0, n_layer) but in a pipeline).
  LayerRange layers() const { return layers_; }
  // From a fresh context: the prompt, then up to n_predict sampled tokens, each passed to
  // on_token as it comes. Stops at the end of generation or when the context is full.
  GenerateResult generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                          const TokenCallback& on_token = {});
  // Forgets the context (positions restart at 0; the cache is overwritten as it refills).
  void reset() { reset(0); }

  // Several sequences (SessionOptions::n_sequences), each with its own KV cache and positions;
  // the members above act on sequence 0.
  int n_sequences() const { return int(past_.size()); }
  int64_t n_past(int sequence) const;
  void reset(int sequence);
  // eval() of one sequence at its own positions; the logits of its last token.
  std::span<const float> eval_sequence(int sequence, std::span<const int32_t> tokens);
  // One token for each of `sequences` (distinct) in one graph: the matrix products and the FFN
  // run on all rows at once, each row's attention over its own sequence's cache. Row r is
  // tokens[r] of sequences[r]; returns n_vocab logits per row, row after row.
  std::span<const float> decode_batch(std::span<const int> sequences,
                                      std::span<const int32_t> tokens);

  // The placements of a prompt of n_prompt tokens and then a one-token decode step, each
  // planned over what the one before leaves resident, as eval() will make them.
  std::vector<PhasePlan> plan_phases(int64_t n_prompt);

  HybridScheduler& scheduler() { return *scheduler_; }
  HybridExecutor& executor() { return *executor_; }
  const HybridExecutor& executor() const { return *executor_; }
  const Telemetry& telemetry() const { return executor_->telemetry(); }
  // The placement of the most recent step (nullptr before the first).
  const Placement* last_placement() const { return last_placement_.get(); }
  const Graph* last_graph() const { return last_graph_; }
  // "cuda:0 301 ops, cpu 12 ops; resident: cuda:0 4312.50 MiB cpu 0.00 MiB", then
  // "; recovered: cuda:0 lost in step 3" after a device failed.
  std::string placement_summary() const;
  // {"strategy", "summary", "backends": [{id, kind, ops, resident_bytes, budget_bytes}],
  //  "phases": [{name, n_tokens, predicted_us, ops: {backend: n}}]}: plans the phases when no
  // step has run yet.
  std::string placement_json();
  // {"ops", "transfers", "transfer_bytes", "actual_us", "estimated_us", "graph_us",
  //  "backends": {id: {ops, actual_us, estimated_us, transfers_in, transfer_bytes}},
  //  "tokens": {"evaluated", "generated"},
  //  "recoveries": [{error, backend, step, what, action}]}
  std::string telemetry_json() const;
  // The cost model the scheduler was built with, refined by every timed op when learning.
  const LoadedCostModel& costs() const { return costs_; }
  // Writes what was learned back to the cost profile (no-op without one or without learning).
  void save_learned();
  // Every device failure recovered from, oldest first.
  const std::vector<Recovery>& recoveries() const { return recoveries_; }
  // The routers' choices counted so far (SessionOptions::routing_stats; empty without).
  const RoutingStats& routing() const { return routing_; }
  // The layers split into hot and other experts now (SessionOptions::hot_experts), and how
  // many experts were swapped into a set since the first split.
  std::vector<HotExpertLayer> hot_experts() const;
  int64_t hot_expert_changes() const { return hot_changes_; }
  // Whether hot experts are split (SessionOptions::hot_experts where it applies; false
  // again once a trial undid the split).
  bool hot_experts_enabled() const { return hot_enabled_; }
  // What the last review of the split decided (SessionOptions::hot_experts): empty before the
  // first, else the median decode step of its window against whole layers' and the verdict.
  const std::string& hot_experts_outcome() const { return hot_outcome_; }
  // Decode steps between two reviews of the hot sets, the part of a layer's choices its hot
  // experts aim to cover at the first split, how far (in standard deviations) an expert's count
  // must pass a hot one's to take its slot, and how far a set's share of the choices may drift
  // from the share its products were planned with before they are planned again.
  static constexpr int64_t kHotReviewSteps = 32;
  static constexpr double kHotCoverage = 0.9;
  static constexpr double kHotSwapSigmas = 3.0;
  static constexpr double kHotMargin = 0.1;
  // Steps of up to this many tokens run the split layers (prefill keeps one product a layer).
  static constexpr int64_t kHotMaxTokens = 4;

 private:
  // A split layer's data: the slabs (gate, up, down) and the two maps, bound as weights, and
  // the file's expert tensors the slabs are gathered from.
  struct HotLayer {
    HotExpertLayer set;
    std::vector<uint8_t> slab[3];
    std::vector<int32_t> hot_map, cold_map;
    const gguf::TensorInfo* source[3] = {};
  };
  // Gathers a layer's hot experts from the file (bound as its weights by bind_hot_layers).
  HotLayer make_hot_layer(int layer, std::vector<int32_t> experts, double share);
  // Puts expert `e` in slot `slot` of h, on the host: the maps' entries (the slot's expert
  // before leaves them) and its bytes from the file into the slabs.
  static void put_hot_expert(HotLayer& h, size_t slot, int32_t e);
  // Swaps (slot, expert) into a bound layer in place, their device copies rewritten (the
  // graphs and plans stay).
  void swap_hot_experts_in(HotLayer& h, std::span<const std::pair<size_t, int32_t>> swaps);
  // At a step's start: the review kHotReviewSteps after the last (or the first after step 1).
  void review_hot_experts();
  // The first split: the sets chosen, the residency planned again with them, layers whose
  // whole experts it keeps on a device left unsplit, what no longer lives there freed.
  void first_hot_split();
  // Undoes the split (the trial found decode no faster): whole layers again, counting stops.
  void end_hot_split();
  // After the hot sets changed: plans the residency again; then applies it: frees on each
  // device what the plan keeps elsewhere, refills KV caches that moved (`before`: the homes
  // before), uploads the new residency between steps.
  const ResidencyPlan* plan_residency_again();
  void apply_residency(const std::map<std::string, std::string, std::less<>>& before);
  void bind_hot_layers();
  // Drops the graphs of up to `max_tokens` tokens (built again with the hot experts as they are
  // now), keeping them alive until the next step.
  void retire_graphs(int64_t max_tokens = std::numeric_limits<int64_t>::max());
  // Plans the next decode (and prefill) and uploads what they read from a device.
  void preload_phases(bool prefill = true);
  void init(const SessionOptions& options);
  const LlamaGraph& graph_for(int64_t n_tokens, bool all_logits, int sequence = 0);
  void check_step(int sequence, std::span<const int32_t> tokens) const;
  // Plans and runs one step of `lg` over tokens (positions_ set by the caller), recovering
  // from a device that fails during it (run_recovering).
  std::span<const float> run_step(const LlamaGraph& lg, std::span<const int32_t> tokens);
  // execute_step until it succeeds: after each failure a device caused (out of memory, lost),
  // recover() moves the work off it and the step runs again; other errors, a failure under
  // strict and one past kMaxStepRecoveries are thrown.
  void run_recovering(const LlamaGraph& lg, std::span<const int32_t> tokens,
                      std::span<const int32_t> positions, std::span<float> logits);
  // Plans, uploads and runs one step once.
  void execute_step(const LlamaGraph& lg, std::span<const int32_t> tokens,
                    std::span<const int32_t> positions, std::span<float> logits);
  // Adds the step's router choices (route_ids_) to routing_.
  void count_routing(const LlamaGraph& lg);
  // False where the failure is not one a device caused (or nothing is left to move).
  bool recover(const Error& error);
  bool recover_lost(const Error& error, const std::vector<std::string>& lost);
  bool recover_out_of_memory(const Error& error);
  // After a failure: the next step plans again (uploads, auto's residency) and, where `freed`
  // KV caches were freed, refills them by evaluating each sequence's tokens so far again.
  // Returns what it rebuilt, for the recovery's action ("" when nothing).
  std::string rebuild_caches(size_t freed);
  // Appends a step's tokens to the sequence's history (the tokens at positions 0..n_past).
  void remember(int sequence, std::span<const int32_t> tokens);
  void plan_residency(int64_t n_prompt);
  void size_logits(size_t n);
  void learn_from(const Graph& graph);

  gguf::File file_;
  LlamaConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<HybridScheduler> scheduler_;
  std::unique_ptr<HybridExecutor> executor_;
  std::map<std::tuple<int64_t, bool, int>, LlamaGraph> graphs_;  // (tokens, all logits, sequence)
  std::map<std::vector<int>, LlamaGraph> batch_graphs_;          // by the rows' sequences
  std::vector<decltype(graphs_)::node_type> retired_graphs_;     // see retire_graphs
  std::shared_ptr<const Placement> last_placement_;
  const Graph* last_graph_ = nullptr;
  std::shared_ptr<const Placement> uploaded_for_;  // held, so its address cannot be reused
  std::vector<int32_t> positions_;
  std::vector<int32_t> rows_;  // 0, 1, ... for a batched decode
  // The last step's logits: in page-locked memory of a device that offers it (the step's
  // download lands there with no host copy), else in logits_host_.
  std::span<float> logits_;
  Buffer logits_pinned_;
  std::vector<float> logits_host_;
  int64_t n_ctx_ = 0;
  std::vector<int64_t> past_ = {0};  // positions used, per sequence
  // Per sequence: the tokens at positions [0, n_past), to rebuild a KV cache a device lost.
  std::vector<std::vector<int32_t>> history_ = {{}};
  bool strict_ = false;
  int64_t steps_run_ = 0;
  // What the executor held when the current step started (out of memory: the step's own
  // allocations are freed); copied only when it changed.
  Residency residency_before_;
  std::vector<std::string> lost_;  // devices already recovered from
  std::vector<Recovery> recoveries_;
  bool residency_stale_ = false;  // auto: a device failed, where things live is decided again
  DType kv_dtype_ = DType::F16;
  std::string strategy_name_;
  bool residency_planned_ = false;  // auto: plan_residency ran (kept off the per-token path)
  LoadedCostModel costs_;
  bool learn_ = false;
  int learn_every_ = 0;
  bool routing_stats_ = false;
  RoutingStats routing_;
  std::vector<int32_t> route_ids_;  // a step's router choices, every layer's in turn
  bool hot_enabled_ = false;
  bool hot_split_ = false;  // the first split was made
  std::vector<HotLayer> hot_;
  // Per routed layer (in lg.routes order, as routing_): recent choices per expert, halved at
  // every review so older steps fade.
  std::vector<int> hot_count_layers_;
  std::vector<std::vector<double>> hot_counts_;
  int64_t hot_steps_ = 0;  // steps counted for the hot experts (up to kHotMaxTokens tokens)
  int64_t hot_review_at_ = kHotReviewSteps;  // hot_steps_ from which the next review runs
  int64_t hot_changes_ = 0;
  // The trial of the split: decode step times (us) while it runs, the median before the split.
  bool hot_timing_ = false;
  std::vector<double> hot_step_us_;
  double hot_before_us_ = 0.0;
  double hot_review_us_ = 0.0;  // the last review's swaps and plans
  std::string hot_outcome_;
  int64_t steps_ = 0;
  size_t events_learned_ = 0;
  HybridExecutor::Progress load_progress_;
  int64_t tokens_evaluated_ = 0;
  int64_t tokens_generated_ = 0;
  LayerRange layers_;                         // the layers run here
  std::span<const float> hidden_in_;          // eval_stage's input, bound for its step only
  std::shared_ptr<PipelineLeader> pipeline_;  // rank 0 of a pipeline
  std::vector<float> stage_out_;              // rank 0's hidden state, for the next rank
};

}  // namespace tandem
