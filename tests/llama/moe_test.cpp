// Mixture-of-experts models end to end: the tiny Mixtral-layout (llama) and Qwen3-MoE synthetic
// models through the scheduler and executor must give the reference backend's logits on the
// CPU backend, in float and quantized weight types, with their MoE ops split across backends,
// in decode after prefill and in a batched decode step. Placement: --n-cpu-moe and -ot keep
// experts in host memory beside a (fake) GPU with the logits of one backend, and the automatic
// placement under a budget that holds the dense part but not the experts keeps the experts there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "moe_util.h"
#include "tandem/calibration.h"
#include "tandem/executor.h"
#include "tandem/layer_split.h"
#include "tandem/model/llama_graph.h"
#include "tandem/model/synthetic.h"
#include "tandem/registry.h"
#include "tandem/runtime.h"
#include "tandem/scheduler.h"
#include "test_backends.h"

namespace tandem {
namespace {

using namespace moe_test;

// K-quant files widen the tiny shapes to whole 256-element super-blocks.
std::string model_path(const std::string& preset, DType dtype,
                       SyntheticMix mix = SyntheticMix::Pure) {
  static std::map<std::string, std::string> paths;
  const std::string name = preset + "_" + std::string(dtype_name(dtype));
  if (auto it = paths.find(name); it != paths.end()) return it->second;
  const auto& dir = test::process_temp_dir("tandem_moe_test_");
  std::string path = (dir / (name + ".gguf")).string();
  SyntheticSpec spec = synthetic_preset(preset, dtype, 5, mix);
  if (is_k_quant(dtype)) {
    spec.n_embd = 256;
    spec.n_ff = 256;
    if (spec.n_ff_expert > 0) spec.n_ff_expert = 256;
    if (spec.head_dim > 0) spec.head_dim = 64;
  }
  spec.threads = 1;
  write_synthetic_model(spec, path);
  return paths[name] = path;
}

std::vector<int32_t> random_tokens(int n) {
  std::random_device rd;
  std::mt19937 rng(rd());
  std::uniform_int_distribution<int32_t> d(0, 511);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

std::vector<float> all_logits(const std::string& path, const std::string& strategy,
                              std::span<const int32_t> tokens, std::vector<TensorPin> pins = {}) {
  Session s(options(path, strategy, std::move(pins)));
  auto l = s.eval(tokens, true);
  return {l.begin(), l.end()};
}

struct Case {
  std::string preset;
  DType dtype;
  std::string strategy;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.preset << " " << dtype_name(c.dtype) << " " << c.strategy;
}

// Float weights: the CPU and the reference differ by float rounding alone (~1e-7 relative), far
// below any router margin, so they route alike and every logit is compared.
class MoeLogits : public ::testing::TestWithParam<Case> {};

TEST_P(MoeLogits, MatchTheReferenceBackend) {
  const Case& c = GetParam();
  const std::string path = model_path(c.preset, c.dtype);
  const auto tokens = random_tokens(9);
  const auto ref = all_logits(path, "only:reference", tokens);
  const auto got = all_logits(path, c.strategy, tokens);
  ASSERT_EQ(ref.size(), got.size());
  const double e = nmse(ref, got);
  std::printf("[ measured ] %s %s %s nmse %.3g\n", c.preset.c_str(),
              std::string(dtype_name(c.dtype)).c_str(), c.strategy.c_str(), e);
  EXPECT_LE(e, 1e-5);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (std::string preset : {"tiny-moe", "tiny-qwen3moe"}) {
    for (DType d : {DType::F32, DType::F16}) out.push_back({preset, d, "only:cpu"});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Tiny, MoeLogits, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           std::string s = param_info.param.preset + "_" +
                                           std::string(dtype_name(param_info.param.dtype)) + "_" +
                                           param_info.param.strategy;
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s;
                         });

// One prompt through one backend, keeping each layer's router logits and chosen experts.
struct RoutedRun {
  std::vector<float> logits;
  std::vector<std::vector<float>> router;  // per layer: [n_expert, T]
  std::vector<std::vector<int32_t>> ids;   // per layer: [k, T]
};

// Under `strategy` ("cpu", "gpu", "only:ID") over the backends a session would use.
RoutedRun run_routed(const std::string& path, const std::string& strategy,
                     const std::vector<int32_t>& tokens) {
  gguf::File file = gguf::File::open(path);
  const LlamaConfig config = LlamaConfig::from_gguf(file);
  const Strategy st = Strategy::parse(strategy);
  auto backends = available_backends();
  if (st.kind == Strategy::Kind::BackendOnly &&
      std::none_of(backends.begin(), backends.end(),
                   [&](const auto& b) { return b->backend_id() == st.backend_id; })) {
    backends.push_back(create_backend(st.backend_id));
  }
  auto builder = HybridScheduler::builder();
  for (auto& b : backends) builder.with_backend(b);
  auto sched = builder.strategy(st).build();
  HybridExecutor exec(sched);
  for (const auto& t : file.tensors()) exec.bind_weight(t.name, t.data, t.bytes);
  LlamaGraphOptions o;
  o.n_tokens = int64_t(tokens.size());
  o.n_ctx = 16;
  o.kv_dtype = DType::F32;
  o.all_logits = true;
  LlamaGraph lg = build_llama_graph(config, file, o);
  std::vector<TensorId> routes;
  for (const Node& n : lg.graph.nodes()) {
    if (n.op == OpKind::MoeRoute) routes.push_back(n.id);
  }
  RoutedRun r;
  r.logits.resize(size_t(lg.graph.tensor(lg.logits).elements()));
  r.router.resize(routes.size());
  r.ids.resize(routes.size());
  Bindings b;
  for (size_t l = 0; l < routes.size(); ++l) {
    const TensorId logits = lg.graph.node(routes[l]).inputs[0];
    lg.graph.mark_output(logits);
    lg.graph.mark_output(routes[l]);
    r.router[l].resize(size_t(lg.graph.tensor(logits).elements()));
    r.ids[l].resize(size_t(lg.graph.tensor(routes[l]).elements()));
    b.output(logits, r.router[l].data(), 4 * r.router[l].size());
    b.output(routes[l], r.ids[l].data(), 4 * r.ids[l].size());
  }
  std::vector<int32_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), 0);
  b.input(lg.tokens, tokens.data(), 4 * tokens.size())
      .input(lg.positions, positions.data(), 4 * positions.size())
      .output(lg.logits, r.logits.data(), 4 * r.logits.size());
  exec.run(lg.graph, *sched.plan(lg.graph, exec.residency()), b);
  return r;
}

// A session counting its routers' choices (SessionOptions::routing_stats) counts exactly the
// ids each layer's MoeRoute produced, step after step, and a session without it counts nothing.
TEST(MoeRouting, ASessionCountsEveryChoiceOfEveryLayer) {
  const std::string path = model_path("tiny-qwen3moe", DType::F32);
  const auto tokens = random_tokens(7);
  const RoutedRun routed = run_routed(path, "only:cpu", tokens);
  SessionOptions o = options(path, "only:cpu");
  o.routing_stats = true;
  Session s(o);
  s.eval(tokens, true);
  const RoutingStats& r = s.routing();
  ASSERT_EQ(r.layers.size(), routed.ids.size());
  EXPECT_EQ(r.steps, 1);
  for (size_t l = 0; l < r.layers.size(); ++l) {
    EXPECT_EQ(r.layers[l], int(l));
    std::vector<int64_t> want(size_t(s.config().n_expert), 0);
    for (int32_t e : routed.ids[l]) ++want[size_t(e)];
    EXPECT_EQ(r.chosen[l], want) << "layer " << l;
    EXPECT_EQ(r.choices[l], int64_t(tokens.size()) * s.config().n_expert_used);
  }
  s.decode(tokens[0]);
  EXPECT_EQ(s.routing().steps, 2);
  EXPECT_EQ(s.routing().choices[0], int64_t(tokens.size() + 1) * s.config().n_expert_used);
  for (double share : s.routing().top_share(size_t(s.config().n_expert))) {
    EXPECT_DOUBLE_EQ(share, 1.0);
  }
  Session quiet(options(path, "only:cpu"));
  quiet.eval(tokens);
  EXPECT_TRUE(quiet.routing().layers.empty());
  EXPECT_EQ(quiet.routing().steps, 0);
}

// The summaries of counts made by hand: two layers of four experts.
TEST(MoeRouting, TopSharesAndUsedExpertsOfHandMadeCounts) {
  RoutingStats r;
  r.layers = {0, 1};
  r.chosen = {{2, 0, 5, 3}, {0, 0, 0, 0}};
  r.choices = {10, 0};
  EXPECT_EQ(r.used(), (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(r.top_share(1), (std::vector<double>{0.5, 0.0}));
  EXPECT_EQ(r.top_share(2), (std::vector<double>{0.8, 0.0}));
  EXPECT_EQ(r.top_share(9), (std::vector<double>{1.0, 0.0}));  // more than the experts: all
}

// Quantized weights: the CPU rounds activations to 8 bits (~1e-2 relative), so a token whose
// last chosen and first excluded experts are that close may take the other one, a legitimate
// difference no tolerance on the logits covers (a GPU's float products may do the same, more
// rarely). Layer by layer, the router logits must agree while the routing does; where a
// token's experts first differ, everything after sees other inputs and is not compared.
// Without such a difference the logits must agree as the dense models' do (float weights 1e-5,
// quantized 1e-3).
class MoeRouted : public ::testing::TestWithParam<Case> {};

TEST_P(MoeRouted, MatchesTheReferenceWhileTheRoutingAgrees) {
  const Case& c = GetParam();
  const SyntheticMix mix = c.dtype == DType::Q4_K ? SyntheticMix::KQuantMedium : SyntheticMix::Pure;
  const std::string path = model_path(c.preset, c.dtype, mix);
  const auto tokens = random_tokens(9);
  const double tolerance = dtype_traits(c.dtype).is_quantized ? 1e-3 : 1e-5;
  const RoutedRun ref = run_routed(path, "only:reference", tokens);
  const RoutedRun got = run_routed(path, c.strategy, tokens);
  ASSERT_EQ(ref.ids.size(), 2u);  // two MoE layers
  bool same_routing = true;
  for (size_t l = 0; l < ref.ids.size() && same_routing; ++l) {
    // After the first MoE layer the router reads that layer's output, rounded to 8 bits on its
    // way into every expert product (one scale per 256 values for K-quants), and its logits are
    // few (n_expert a token): Q4_K on the CPU read 1.1e-3 and 1.3e-3 in 2 of ~360 runs (random
    // tokens), so twice the bound there.
    const double e = nmse(ref.router[l], got.router[l]);
    EXPECT_LE(e, l == 0 ? tolerance : 2 * tolerance) << "layer " << l << " router logits";
    same_routing = ref.ids[l] == got.ids[l];
    if (!same_routing) std::printf("[ measured ] routing differs from layer %zu\n", l);
  }
  if (!same_routing) return;
  const double e = nmse(ref.logits, got.logits);
  std::printf("[ measured ] %s %s %s nmse %.3g\n", c.preset.c_str(),
              std::string(dtype_name(c.dtype)).c_str(), c.strategy.c_str(), e);
  EXPECT_LE(e, tolerance);
}

std::vector<Case> routed_cases() {
  std::vector<Case> out;
  for (std::string preset : {"tiny-moe", "tiny-qwen3moe"}) {
    for (DType d : {DType::Q8_0, DType::Q4_0, DType::Q4_K}) out.push_back({preset, d, "cpu"});
    // Where a GPU runs the dense ops, the MoE ops fall back to the CPU.
    for (DType d : {DType::F32, DType::Q8_0}) out.push_back({preset, d, "gpu"});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Tiny, MoeRouted, ::testing::ValuesIn(routed_cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           std::string s = param_info.param.preset + "_" +
                                           std::string(dtype_name(param_info.param.dtype)) + "_" +
                                           param_info.param.strategy;
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s;
                         });

// Layer 0's gate and up experts and layer 1's router on the reference, everything else on the
// CPU: the hidden state and the routing cross backends inside the MoE block.
TEST(MoeMixed, ExpertsSplitAcrossBackendsEqualOneBackend) {
  for (std::string preset : {"tiny-moe", "tiny-qwen3moe"}) {
    const std::string path = model_path(preset, DType::F32);
    const auto tokens = random_tokens(7);
    const auto ref = all_logits(path, "only:reference", tokens);
    const std::vector<TensorPin> pins{{"blk\\.0\\.ffn_(gate|up)_exps", "reference"},
                                      {"blk\\.1\\.ffn_gate_inp", "reference"}};
    Session s(options(path, "cpu", pins));
    const auto l = s.eval(tokens, true);
    const std::vector<float> got(l.begin(), l.end());
    EXPECT_LE(nmse(ref, got), 1e-5) << preset;
    // The split happened: expert products and routing ops on both backends.
    std::set<std::string> expert_backends, route_backends;
    const Graph& g = *s.last_graph();
    for (const Node& n : g.nodes()) {
      if (!is_compute(n.op)) continue;
      const std::string& where = s.last_placement()->at(n.id).backend->backend_id();
      if (n.op == OpKind::ExpertMatMul) expert_backends.insert(where);
      if (n.op == OpKind::MoeRoute || n.op == OpKind::MoeWeights) route_backends.insert(where);
    }
    EXPECT_EQ(expert_backends, (std::set<std::string>{"cpu", "reference"})) << preset;
    EXPECT_EQ(route_backends, (std::set<std::string>{"cpu"})) << preset;
  }
}

TEST(MoeDecode, DecodeAfterPrefillEqualsLongerPrefill) {
  for (std::string preset : {"tiny-moe", "tiny-qwen3moe"}) {
    for (const std::string strategy : {"only:reference", "only:cpu"}) {
      const std::string path = model_path(preset, DType::F32);
      const auto tokens = random_tokens(8);
      Session full(options(path, strategy));
      const auto all = full.eval(tokens, true);
      const size_t V = 512;
      const std::vector<float> last_full(all.end() - V, all.end());
      Session step(options(path, strategy));
      step.eval(std::span<const int32_t>(tokens.data(), tokens.size() - 1));
      const auto dec = step.eval(std::span<const int32_t>(&tokens.back(), 1));
      EXPECT_LE(nmse(last_full, dec), 1e-6) << preset << " " << strategy;
    }
  }
}

// A batched decode step routes each row by its own token: it equals decoding each sequence on
// its own.
TEST(MoeDecode, BatchedDecodeEqualsOneSequenceAtATime) {
  for (std::string preset : {"tiny-moe", "tiny-qwen3moe"}) {
    const std::string path = model_path(preset, DType::F32);
    SessionOptions o = options(path, "only:cpu");
    o.n_sequences = 3;
    Session batched(o), single(o);
    std::vector<int32_t> next;
    for (int seq = 0; seq < 3; ++seq) {
      const auto prompt = random_tokens(3 + seq);
      batched.eval_sequence(seq, prompt);
      single.eval_sequence(seq, prompt);
      next.push_back(random_tokens(1)[0]);
    }
    const std::vector<int> seqs{0, 1, 2};
    const auto b = batched.decode_batch(seqs, next);
    const std::vector<float> rows(b.begin(), b.end());
    for (int seq = 0; seq < 3; ++seq) {
      const auto one = single.eval_sequence(seq, std::span<const int32_t>(&next[size_t(seq)], 1));
      const std::span<const float> row(rows.data() + seq * 512, 512);
      EXPECT_LE(nmse(one, row), 1e-6) << preset << " sequence " << seq;
    }
  }
}

// ---- Placement of experts beside a GPU (fake: reference kernels, its own memory) ----

SessionOptions fake_gpu_options(const std::string& path, const std::string& strategy) {
  SessionOptions o = options(path, strategy);
  o.backends = host_and_fake_gpu();
  o.no_calibrate = true;
  return o;
}

// Per layer, where the last step ran that layer's ExpertMatMul ops: the backend, and
// " streamed" where a GPU ran one with its weight streamed in from host memory.
std::map<int, std::set<std::string>> expert_backends(const Session& s) {
  std::map<int, std::set<std::string>> out;
  const Graph& g = *s.last_graph();
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::ExpertMatMul) continue;
    const std::string& w = g.tensor(g.storage_of(n.inputs[0])).name;
    const BackendSelection& sel = s.last_placement()->at(n.id);
    out[layer_of(w)].insert(sel.backend->backend_id() + (sel.streamed.empty() ? "" : " streamed"));
  }
  return out;
}

// Prefill all but the last token, then decode it: both compared with the reference's logits of
// the whole prompt (rows of a causal model do not depend on later tokens).
void expect_reference_logits(Session& s, const std::string& path, const std::string& what) {
  const auto tokens = random_tokens(7);
  const auto ref = all_logits(path, "only:reference", tokens);
  const size_t V = 512;
  const auto pre = s.eval(std::span<const int32_t>(tokens.data(), tokens.size() - 1), true);
  EXPECT_LE(nmse(std::span<const float>(ref.data(), pre.size()), pre), 1e-6) << what;
  const auto dec = s.eval(std::span<const int32_t>(&tokens.back(), 1));
  EXPECT_LE(nmse(std::span<const float>(ref.data() + ref.size() - V, V), dec), 1e-6) << what;
}

// Where the expert tensors of each layer are resident after the steps: true if on "gpu".
std::map<int, bool> experts_on_gpu(const Session& s) {
  std::map<int, bool> out;
  for (const auto& t : s.file().tensors()) {
    if (!is_expert(t.name)) continue;
    const auto locs = s.executor().residency().locations(t.name);
    out[layer_of(t.name)] = std::find(locs.begin(), locs.end(), "gpu") != locs.end();
  }
  return out;
}

// Experts pinned to the host stay in host memory: their products run there or on the GPU with
// the weight streamed in (the tiny experts cost less to stream than two activation copies);
// the experts not pinned are resident on the GPU and run there.
void expect_pinned_experts(const Session& s, const std::set<int>& pinned, const std::string& what) {
  for (const auto& [layer, on_gpu] : experts_on_gpu(s))
    EXPECT_EQ(on_gpu, !pinned.count(layer)) << what << ": layer " << layer;
  for (const auto& [layer, where] : expert_backends(s)) {
    if (!pinned.count(layer)) {
      EXPECT_EQ(where, std::set<std::string>{"gpu"}) << what << ": layer " << layer;
      continue;
    }
    for (const auto& w : where)
      EXPECT_TRUE(w == "host" || w == "gpu streamed") << what << ": layer " << layer << " " << w;
  }
}

// --n-cpu-moe 1 under the GPU strategy: layer 0's expert tensors stay in host memory, layer 1's
// and every other layer weight go to the GPU; the logits are the single backend's.
TEST(MoePlacement, NCpuMoeKeepsTheFirstLayersExpertsOnTheHost) {
  for (std::string preset : {"tiny-moe", "tiny-qwen3moe"}) {
    const std::string path = model_path(preset, DType::F32);
    SessionOptions o = fake_gpu_options(path, "gpu");
    o.n_cpu_moe = 1;
    Session s(o);
    expect_reference_logits(s, path, preset);
    expect_pinned_experts(s, {0}, preset);
    for (const auto& t : s.file().tensors()) {
      if (layer_of(t.name) < 0 || is_expert(t.name)) continue;
      const auto locs = s.executor().residency().locations(t.name);
      EXPECT_NE(std::find(locs.begin(), locs.end(), "gpu"), locs.end()) << preset << " " << t.name;
    }
  }
}

// llama.cpp's spellings of the same through -ot: every expert ("exps=CPU", the buffer name in
// capitals) or the experts of the layers a pattern names. The host is found by kind.
TEST(MoePlacement, OverrideTensorKeepsMatchedExpertsOnTheHost) {
  struct Case {
    std::string pattern;
    std::set<int> pinned;
  };
  const std::vector<Case> cases{
      {"exps=CPU", {0, 1}},
      {"blk\\.[1-9]\\.ffn_.*_exps=CPU", {1}},
  };
  for (const Case& c : cases) {
    const std::string path = model_path("tiny-qwen3moe", DType::F32);
    SessionOptions o = fake_gpu_options(path, "gpu");
    const size_t eq = c.pattern.rfind('=');
    o.pins = {{c.pattern.substr(0, eq), c.pattern.substr(eq + 1)}};
    Session s(o);
    expect_reference_logits(s, path, c.pattern);
    expect_pinned_experts(s, c.pinned, c.pattern);
  }
}

// Two GPUs split the layers in ranges (blk.0 on gpu0, blk.1 on gpu1); --n-cpu-moe's pins come
// first, so layer 0's experts stay on the host while the rest of layer 0 goes to gpu0.
TEST(MoePlacement, NCpuMoeWinsOverTheGpuLayerRanges) {
  const std::string path = model_path("tiny-moe", DType::F32);
  SessionOptions o = options(path, "gpu");
  o.backends = {test::make_cpu("host"), test::make_gpu("gpu0"), test::make_gpu("gpu1")};
  o.no_calibrate = true;
  o.n_cpu_moe = 1;
  Session s(o);
  expect_reference_logits(s, path, "two gpus");
  const Residency& r = s.executor().residency();
  for (const auto& t : s.file().tensors()) {
    const int layer = layer_of(t.name);
    if (layer < 0) continue;
    const auto locs = r.locations(t.name);
    const std::string want = layer == 0 && is_expert(t.name) ? "" : layer == 0 ? "gpu0" : "gpu1";
    EXPECT_EQ(locs.empty() ? "" : locs.front(), want) << t.name;
  }
}

TEST(MoePlacement, NCpuMoeBadValuesAndDenseModels) {
  const std::string moe = model_path("tiny-moe", DType::F32);
  SessionOptions o = fake_gpu_options(moe, "gpu");
  o.n_cpu_moe = -1;
  try {
    Session s(o);
    ADD_FAILURE() << "--n-cpu-moe -1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--n-cpu-moe"), std::string::npos) << e.what();
  }
  // A model without experts: nothing to keep on the host, as in llama.cpp; it says so.
  const auto& dir = test::process_temp_dir("tandem_moe_test_");
  const std::string dense = (dir / "tiny_dense.gguf").string();
  SyntheticSpec spec = synthetic_preset("tiny", DType::F32, 5);
  spec.threads = 1;
  write_synthetic_model(spec, dense);
  std::ostringstream log;
  SessionOptions d = fake_gpu_options(dense, "gpu");
  d.n_cpu_moe = kAllLayers;
  d.log = &log;
  Session s(d);
  EXPECT_NE(log.str().find("--n-cpu-moe: the model has no experts"), std::string::npos)
      << log.str();
  const auto tokens = random_tokens(3);
  s.eval(tokens);
  for (const auto& t : s.file().tensors()) {
    if (layer_of(t.name) < 0) continue;
    const auto locs = s.executor().residency().locations(t.name);
    EXPECT_NE(std::find(locs.begin(), locs.end(), "gpu"), locs.end()) << t.name;
  }
}

// Auto under a GPU budget that holds every layer's dense part (attention, norms, router), the
// output layer and the KV caches but no layer's experts: the experts stay in host memory and
// decode multiplies by them there; the dense part goes to the GPU, as llama.cpp users place a
// MoE model by hand (-ot exps=CPU). Whole layer ranges would leave a layer's attention on the
// host or take experts in place of dense weights.
TEST(MoePlacement, AutoUnderABudgetKeepsExpertsOnTheHost) {
  ExpertHeavy m;
  Graph prefill = m.graph(64), decode = m.graph(1);
  size_t dense = 0, experts_per_layer = 0;
  for (const Node& n : decode.nodes()) {
    if (n.op != OpKind::Weight && n.op != OpKind::KvCache) continue;
    const TensorDesc& t = decode.tensor(n.id);
    if (is_expert(t.name)) {
      if (layer_of(t.name) == 0) experts_per_layer += t.bytes();
    } else if (t.name != "token_embd.weight") {
      dense += t.bytes();
    }
  }
  ASSERT_GT(experts_per_layer, 4 * dense / size_t(m.config.n_layer)) << "experts dominate";
  auto sched = HybridScheduler::builder()
                   .with_backend(m.host)
                   .with_backend(m.gpu)
                   .strategy(Strategy::automatic())
                   .cost_model(m.costs())
                   .memory_budget("gpu", dense + experts_per_layer / 2)
                   .build();
  const Graph* phases[] = {&prefill, &decode};
  const ResidencyPlan& rp = sched.plan_residency(phases);
  std::printf("[ measured ] %s\n", rp.why.c_str());
  for (const auto& t : m.file.tensors()) {
    if (t.name == "token_embd.weight") continue;
    const bool on_gpu = rp.home.count(t.name) && rp.home.at(t.name) == "gpu";
    EXPECT_EQ(on_gpu, !is_expert(t.name)) << t.name << "\n" << rp.why;
  }
  // Decode reads the experts in host memory: the host multiplies by them, except where the
  // copy queue, idle otherwise, lands a tensor before the GPU needs it (the step's last ones).
  const auto placement = sched.plan(decode);
  std::multiset<std::string> experts;
  for (const Node& n : decode.nodes()) {
    const BackendSelection& sel = placement->at(n.id);
    const std::string where = sel.backend ? sel.backend->backend_id() : "";
    if (n.op == OpKind::ExpertMatMul) {
      experts.insert(where + (sel.streamed.empty() ? "" : " streamed"));
    } else if (n.op == OpKind::Attention) {
      EXPECT_EQ(where, "gpu") << sel.reason.to_string();
    }
  }
  EXPECT_EQ(experts.count("host") + experts.count("gpu streamed"), experts.size());
  EXPECT_GT(experts.count("host"), experts.size() / 2);
}

// --n-cpu-moe's pins on the same devices, under the GPU strategy: decode multiplies layer 0's
// tokens by its experts on the host (reading 8 of 128 experts beats streaming all 128, except
// what the idle copy queue lands in time), never by a resident copy; layer 1's experts are
// resident on the GPU.
TEST(MoePlacement, NCpuMoeExpertsRunOnTheHostInDecode) {
  ExpertHeavy m;
  Graph decode = m.graph(1);
  auto builder = HybridScheduler::builder();
  builder.with_backend(m.host).with_backend(m.gpu).cost_model(m.costs());
  const std::vector<std::shared_ptr<Backend>> backends{m.gpu, m.host};
  for (const TensorPin& p : host_expert_pins(int(m.config.n_layer), 1, backends))
    builder.pin_tensor(p.pattern, p.backend_id);
  auto sched = builder.build();
  const auto placement = sched.plan(decode);
  std::map<int, std::set<std::string>> where;
  for (const Node& n : decode.nodes()) {
    if (n.op != OpKind::ExpertMatMul) continue;
    const BackendSelection& sel = placement->at(n.id);
    where[layer_of(decode.tensor(decode.storage_of(n.inputs[0])).name)].insert(
        sel.backend->backend_id() + (sel.streamed.empty() ? "" : " streamed"));
  }
  EXPECT_EQ(where[1], std::set<std::string>{"gpu"});
  EXPECT_TRUE(where[0].count("host"));
  where[0].erase("gpu streamed");  // the copy queue may land the last one in time
  EXPECT_EQ(where[0], std::set<std::string>{"host"});
}

// Prefill with every layer's experts in host memory and streamed to the GPU (figures under
// which streaming wins), on this machine's first CUDA device where it has one, else the fake
// GPU. Copying an expert tensor by the experts the router names (ExecutorOptions::
// routed_expert_copies) gives the logits of whole copies, bit for bit, on prompts that route
// differently from one run to the next, and carries fewer bytes once a run has shown the routing.
TEST(MoeStreamed, ExpertsCopiedByRouteGiveTheLogitsOfWholeCopies) {
  ExpertHeavy m;
  const auto ids = available_backend_ids();
  const bool cuda = std::find(ids.begin(), ids.end(), "cuda:0") != ids.end();
  std::shared_ptr<Backend> gpu = cuda ? create_backend("cuda:0") : m.gpu;
  std::printf("[ measured ] experts streamed to %s\n", gpu->backend_id().c_str());
  CostModel costs = m.costs();
  BackendProfile slow_host = costs.profile(*m.host);
  slow_host.peak_gflops.fill(1e-3);
  slow_host.memory_bandwidth_gbs = 1e-3;
  costs.set_profile("host", slow_host);
  BackendProfile fast_gpu = costs.profile(*m.gpu);
  fast_gpu.link = {1e6, 0.0};
  costs.set_profile(gpu->backend_id(), fast_gpu);
  auto sched = HybridScheduler::builder()
                   .with_backend(m.host)
                   .with_backend(gpu)
                   .pin_tensor("_exps", "host")
                   .cost_model(costs)
                   .build();
  constexpr int64_t T = 6;
  LlamaGraphOptions go;
  go.n_tokens = T;
  go.n_ctx = 64;
  go.kv_dtype = DType::F32;
  LlamaGraph lg = build_llama_graph(m.config, m.file, go);
  auto placement = sched.plan(lg.graph);
  size_t streamed_experts = 0;
  for (const Node& n : lg.graph.nodes()) {
    if (n.op != OpKind::ExpertMatMul) continue;
    const BackendSelection& sel = placement->at(n.id);
    streamed_experts += sel.backend == gpu.get() && !sel.streamed.empty();
  }
  ASSERT_EQ(streamed_experts, size_t(3 * m.config.n_layer));

  std::vector<std::vector<float>> logits[2];
  size_t routed_bytes = 0;
  size_t bytes[2][3] = {};
  for (const bool by_expert : {true, false}) {
    ExecutorOptions eo;
    eo.routed_expert_copies = by_expert;
    HybridExecutor exec(sched, eo);
    for (const auto& t : m.file.tensors()) exec.bind_weight(t.name, t.data, t.bytes);
    std::mt19937 rng(7);  // the same prompts for both
    std::uniform_int_distribution<int32_t> token(0, int32_t(m.config.n_vocab) - 1);
    std::vector<int32_t> positions(T);
    std::iota(positions.begin(), positions.end(), 0);
    size_t before = 0;
    for (int run = 0; run < 3; ++run) {
      std::vector<int32_t> tokens(T);
      for (auto& x : tokens) x = token(rng);
      std::vector<float> out(size_t(lg.graph.tensor(lg.logits).elements()));
      exec.run(lg.graph, *placement,
               Bindings()
                   .input(lg.tokens, tokens.data(), 4 * tokens.size())
                   .input(lg.positions, positions.data(), 4 * positions.size())
                   .output(lg.logits, out.data(), 4 * out.size()));
      logits[by_expert ? 0 : 1].push_back(std::move(out));
      // A tensor's second streamed copy in a run is its routed one: some must carry experts
      // the copy ahead missed, or the device's routed copy is not what is checked here.
      std::map<TensorId, int> copies;
      for (const ExecutionEvent& e : exec.telemetry().get_telemetry()) {
        if (e.kind == EventKind::Transfer && e.streamed && ++copies[e.node] == 2 && run > 0) {
          routed_bytes += e.transfer_bytes;
        }
      }
      exec.telemetry().clear_telemetry();
      bytes[by_expert ? 0 : 1][run] = exec.stats().streamed_bytes - before;
      before = exec.stats().streamed_bytes;
    }
  }
  std::printf("[ measured ] copied once routed in runs 2 and 3: %zu bytes\n", routed_bytes);
  EXPECT_GT(routed_bytes, 0u);
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE("run " + std::to_string(run + 1));
    ASSERT_EQ(logits[0][size_t(run)].size(), logits[1][size_t(run)].size());
    EXPECT_EQ(std::memcmp(logits[0][size_t(run)].data(), logits[1][size_t(run)].data(),
                          4 * logits[0][size_t(run)].size()),
              0);
    if (run == 0) {
      EXPECT_EQ(bytes[0][run], bytes[1][run]);  // nothing known yet: all ahead
    } else {
      EXPECT_LT(bytes[0][run], bytes[1][run]);  // 6 tokens name at most 48 of 128
    }
    std::printf("[ measured ] run %d: streamed %zu bytes by expert, %zu whole\n", run + 1,
                bytes[0][run], bytes[1][run]);
  }
}

}  // namespace
}  // namespace tandem
