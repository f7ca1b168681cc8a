// Mixture-of-experts models end to end: the tiny Mixtral-layout (llama) and Qwen3-MoE synthetic
// models through the scheduler and executor must give the reference backend's logits on the
// CPU backend, in float and quantized weight types, with their MoE ops split across backends,
// in decode after prefill and in a batched decode step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "tandem/executor.h"
#include "tandem/model/llama_graph.h"
#include "tandem/model/synthetic.h"
#include "tandem/registry.h"
#include "tandem/runtime.h"
#include "tandem/scheduler.h"

namespace tandem {
namespace {

double nmse(std::span<const float> ref, std::span<const float> got) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(ref[i]) - got[i]) * (double(ref[i]) - got[i]);
    den += double(ref[i]) * ref[i];
  }
  return num / den;
}

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

SessionOptions options(const std::string& path, const std::string& strategy,
                       std::vector<TensorPin> pins = {}) {
  SessionOptions o;
  o.model_path = path;
  o.strategy = strategy;
  o.n_ctx = 64;
  o.kv_dtype = DType::F32;
  o.pins = std::move(pins);
  return o;
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
    const double e = nmse(ref.router[l], got.router[l]);
    EXPECT_LE(e, tolerance) << "layer " << l << " router logits";
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

}  // namespace
}  // namespace tandem
