// Hot experts (SessionOptions::hot_experts): the policy on hand-made counts, the most chosen
// experts of a skewed router resident on a fake GPU with the reference's logits, and the sets
// following a change of routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "moe_util.h"
#include "tandem/calibration.h"
#include "tandem/layer_split.h"

namespace tandem {
namespace {

using namespace moe_test;

// The hot-expert policy on counts made by hand: the fewest most chosen that cover the share
// asked (at least `least`, none past `most`), and an expert swapped in only where its count
// passes a hot one's by more than the noise of the two.
TEST(MoeHotExperts, ChosenAndSwappedByTheirShareOfTheChoices) {
  const std::vector<double> counts{1, 40, 0, 30, 20, 9};  // 100 choices
  EXPECT_DOUBLE_EQ(hot_share(counts, std::vector<int32_t>{1, 3}), 0.7);
  EXPECT_EQ(choose_hot_experts(counts, 0.9, 1, 6), (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(choose_hot_experts(counts, 0.91, 1, 6), (std::vector<int32_t>{1, 3, 4, 5}));
  EXPECT_EQ(choose_hot_experts(counts, 0.5, 3, 6), (std::vector<int32_t>{1, 3, 4}));
  EXPECT_TRUE(choose_hot_experts(counts, 0.9, 1, 2).empty()) << "needs 3, 2 allowed";
  EXPECT_TRUE(choose_hot_experts(std::vector<double>(6, 0.0), 0.9, 1, 6).empty());
  using Swaps = std::vector<std::pair<size_t, int32_t>>;
  // Hot {4, 5} (slots 0, 1): 40 against 9 differ by 31 > 2 x sqrt(49) = 14, 30 against 20 by
  // 10 < 2 x sqrt(50): one swap, into the least chosen one's slot.
  EXPECT_EQ(swap_hot_experts(counts, std::vector<int32_t>{4, 5}, 2.0), (Swaps{{1, 1}}));
  // At 1 sigma both pass (10 > sqrt(50) = 7.1): 3 takes the slot of 4.
  EXPECT_EQ(swap_hot_experts(counts, std::vector<int32_t>{4, 5}, 1.0), (Swaps{{1, 1}, {0, 3}}));
  EXPECT_TRUE(swap_hot_experts(counts, std::vector<int32_t>{4, 5}, 5.0).empty());
  EXPECT_TRUE(swap_hot_experts(counts, std::vector<int32_t>{3, 1}, 0.0).empty()) << "the best";
  EXPECT_TRUE(swap_hot_experts(std::vector<double>(6, 0.0), std::vector<int32_t>{0}, 0.0).empty());
}

// The bytes of a MoE file's dense tensors and of one layer's experts.
std::pair<size_t, size_t> dense_and_layer_experts(const std::string& path) {
  size_t dense = 0, experts_per_layer = 0;
  const gguf::File file = gguf::File::open(path);
  for (const auto& t : file.tensors()) {
    if (is_expert(t.name)) {
      if (layer_of(t.name) == 0) experts_per_layer += t.bytes;
    } else {
      dense += t.bytes;
    }
  }
  return {dense, experts_per_layer};
}

// auto over `backends` (a host and a fake GPU) with ExpertHeavy::costs' figures as the cost
// profile (a slow host, a fast GPU) and `budget` bytes of GPU memory (and 1 MiB for the rest).
SessionOptions hot_expert_options(const std::string& path,
                                  const std::vector<std::shared_ptr<Backend>>& backends,
                                  size_t budget, bool hot) {
  const std::string profile =
      (test::process_temp_dir("tandem_moe_test_") / "hot_experts_profile.json").string();
  if (!std::filesystem::exists(profile)) {
    const CostModel costs = ExpertHeavy::costs();
    std::vector<CalibratedDevice> devices;
    for (const auto& b : backends) {
      BackendProfile p = costs.profile(*b);
      p.calibrated = true;
      devices.push_back({device_key(*b), p});
    }
    write_cost_profile(profile, devices);
  }
  SessionOptions o = options(path, "auto");
  o.backends = backends;
  o.cost_profile = profile;
  o.gpu_memory = budget + (size_t(1) << 20);
  o.hot_experts = hot;
  return o;
}

// A host and a fake GPU on which one kind of expert product sleeps a millisecond: with
// `slow_split` the split layers' (those with a map) on either, else whole layers' (no map), so
// that the trial of a split finds decode slower after it, or faster.
std::vector<std::shared_ptr<Backend>> timed_backends(bool slow_split) {
  auto host = test::make_cpu("host");
  auto gpu = test::make_gpu("gpu");
  for (const auto& b : {host, gpu}) {
    b->on_execute = [slow_split](const Graph&, const Node& n) {
      if (n.op == OpKind::ExpertMatMul && (n.inputs.size() > 3) == slow_split) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    };
  }
  return {host, gpu};
}

// Hot experts (SessionOptions::hot_experts): a model of 128 experts a layer whose router is
// skewed, auto on the host and a fake GPU whose budget holds the dense layers and half of one
// layer's experts. After kHotReviewSteps decode steps the session splits each layer's experts
// into the most chosen in decode (a slab of their own, which the residency plan keeps on the
// GPU) and the rest (in host memory); decode runs the hot ones on the GPU; every step's logits
// stay the reference's, and those of the same session without hot experts.
TEST(MoeHotExperts, TheMostChosenExpertsLiveOnTheGpuAndTheLogitsStay) {
  const auto& dir = test::process_temp_dir("tandem_moe_test_");
  const std::string path = (dir / "expert_heavy_skewed.gguf").string();
  if (!std::filesystem::exists(path)) {
    SyntheticSpec spec = synthetic_preset("tiny-moe", DType::Q8_0, 5);
    spec.n_embd = 128;
    spec.n_expert = 128;
    spec.n_expert_used = 8;
    spec.moe_skew = 3.0f;
    spec.threads = 1;
    write_synthetic_model(spec, path);
  }
  const auto [dense, experts_per_layer] = dense_and_layer_experts(path);
  const size_t budget = dense + experts_per_layer / 2;
  const auto backends = timed_backends(false);  // the trial keeps the split
  auto session_options = [&](bool hot) { return hot_expert_options(path, backends, budget, hot); };
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, 511);
  const size_t prompt = 8, split_after = size_t(Session::kHotReviewSteps);
  std::vector<int32_t> tokens(prompt + split_after + 8);
  for (auto& t : tokens) t = token(rng);
  // Each session: the prompt, then the other tokens one at a time; every step's last logits.
  auto run = [&](Session& s, const std::function<void(int)>& after_step = {}) {
    std::vector<std::vector<float>> out;
    for (size_t at = 0, step = 0; at < tokens.size(); ++step) {
      const size_t n = at == 0 ? prompt : 1;
      auto l = s.eval(std::span<const int32_t>(tokens.data() + at, n));
      out.emplace_back(l.begin(), l.end());
      at += n;
      if (after_step) after_step(int(step));
    }
    return out;
  };
  Session reference(options(path, "only:reference"));
  const auto want = run(reference);
  Session whole(session_options(false));
  const auto unsplit = run(whole);
  EXPECT_TRUE(whole.hot_experts().empty());

  Session s(session_options(true));
  std::set<std::string> hot_where, cold_where;
  EXPECT_TRUE(s.hot_experts().empty()) << "no routing measured before the first step";
  const auto got = run(s, [&](int step) {
    // The prompt (a prefill keeps the layers whole) and the decode steps before the split run
    // one product a layer; the split comes after the last of those, and decode runs it.
    const bool split = size_t(step) > split_after;
    EXPECT_EQ(s.hot_experts().empty(), size_t(step) < split_after) << "step " << step;
    const Graph& g = *s.last_graph();
    for (const Node& n : g.nodes()) {
      if (n.op != OpKind::ExpertMatMul) continue;
      ASSERT_EQ(n.inputs.size(), split ? 4u : 3u) << "step " << step;
      if (!split) continue;
      const std::string& w = g.tensor(g.storage_of(n.inputs[0])).name;
      const BackendSelection& sel = s.last_placement()->at(n.id);
      const std::string where =
          sel.backend->backend_id() + (sel.streamed.empty() ? "" : " streamed");
      (w.find("_hot") != std::string::npos ? hot_where : cold_where).insert(where);
    }
  });
  const auto hot = s.hot_experts();
  ASSERT_EQ(hot.size(), size_t(s.config().n_layer)) << s.placement_summary();
  for (const HotExpertLayer& h : hot) {
    std::printf("[ measured ] layer %d: %zu hot experts, %.1f%% of the choices\n", h.layer,
                h.experts.size(), 100.0 * h.share);
    EXPECT_GE(h.experts.size(), size_t(s.config().n_expert_used));
    EXPECT_LE(h.experts.size(), size_t(s.config().n_expert / 4));
    EXPECT_GE(h.share, Session::kHotCoverage);
    for (const char* what : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      const auto locs = s.executor().residency().locations(hot_expert_name(h.layer, what));
      EXPECT_NE(std::find(locs.begin(), locs.end(), "gpu"), locs.end())
          << hot_expert_name(h.layer, what) << " resident on the GPU";
    }
  }
  EXPECT_EQ(hot_where, std::set<std::string>{"gpu"});
  EXPECT_FALSE(cold_where.count("gpu")) << "the other experts are not resident on the GPU";
  std::printf("[ measured ] %s\n", s.placement_summary().c_str());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(nmse(want[i], got[i]), 1e-6) << "step " << i;
    EXPECT_LE(nmse(unsplit[i], got[i]), 1e-9) << "step " << i;
  }
}

// The hot sets follow the routing: decode one token over and over (its choices fall on a few
// experts), then another (other experts). The split comes after kHotReviewSteps steps of the
// first; as the second's steps outweigh the first's in the halved counts, a review swaps the
// second's experts into the sets (in place: their slabs' slots and maps rewritten on the fake
// GPU too); the logits stay the reference's throughout. (Where each side runs is the search's:
// on this unskewed tiny model the hot products end on the host; ExecutorTest.ARefreshedWeight
// ReachesItsDeviceCopy checks the device copies.)
TEST(MoeHotExperts, TheSetsFollowTheRoutingAndTheLogitsStay) {
  ExpertHeavy m;
  const auto [dense, experts_per_layer] = dense_and_layer_experts(m.path);
  const auto backends = timed_backends(false);  // the trial keeps the split
  const size_t steps = size_t(Session::kHotReviewSteps);
  std::vector<int32_t> tokens(1 + 5 * steps, 5);
  for (size_t i = 1 + steps; i < tokens.size(); ++i) tokens[i] = 300;
  auto run = [&](Session& s, const std::function<void(size_t)>& after = {}) {
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      auto l = s.eval(std::span<const int32_t>(&tokens[i], 1));
      out.emplace_back(l.begin(), l.end());
      if (after) after(i);
    }
    return out;
  };
  SessionOptions ro = options(m.path, "only:reference"),
                 ho = hot_expert_options(m.path, backends, dense + experts_per_layer / 2, true);
  ro.n_ctx = ho.n_ctx = int64_t(tokens.size());
  Session reference(ro);
  const auto want = run(reference);
  Session s(ho);
  std::vector<HotExpertLayer> first;
  const auto got = run(s, [&](size_t i) {
    if (i + 1 == steps) first = s.hot_experts();
  });
  ASSERT_FALSE(first.empty()) << "split after " << steps << " steps";
  const auto last = s.hot_experts();
  ASSERT_EQ(last.size(), first.size());
  EXPECT_GE(s.hot_expert_changes(), 1);
  bool moved = false;
  for (size_t l = 0; l < last.size(); ++l) {
    moved = moved || last[l].experts != first[l].experts;
    EXPECT_EQ(last[l].experts.size(), first[l].experts.size()) << "a set keeps its size";
  }
  EXPECT_TRUE(moved);
  std::printf("[ measured ] %s\n", s.placement_summary().c_str());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_LE(nmse(want[i], got[i]), 1e-6) << "step " << i;
}

// The split is a trial: where decode's steps after it take longer than those before it (here
// the split layers' products sleep), the next review undoes it. The sets are gone,
// nothing of the hot experts is resident or bound, the residency plan
// is the one without hot experts, and every step's logits stay the reference's.
TEST(MoeHotExperts, ASplitThatSlowsDecodeIsUndone) {
  ExpertHeavy m;
  const auto [dense, experts_per_layer] = dense_and_layer_experts(m.path);
  const auto backends = timed_backends(true);
  const size_t steps = size_t(Session::kHotReviewSteps);
  std::vector<int32_t> tokens(1 + 3 * steps, 5);
  SessionOptions ro = options(m.path, "only:reference"),
                 ho = hot_expert_options(m.path, backends, dense + experts_per_layer / 2, true),
                 wo = hot_expert_options(m.path, backends, dense + experts_per_layer / 2, false);
  ro.n_ctx = ho.n_ctx = wo.n_ctx = int64_t(tokens.size());
  Session reference(ro), s(ho), whole(wo);
  bool split = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::span<const int32_t> t(&tokens[i], 1);
    const auto want = reference.eval(t);
    const std::vector<float> want_copy(want.begin(), want.end());
    whole.eval(t);
    const auto got = s.eval(t);
    EXPECT_LE(nmse(want_copy, std::vector<float>(got.begin(), got.end())), 1e-6) << "step " << i;
    split = split || !s.hot_experts().empty();
  }
  EXPECT_TRUE(split) << "split after " << steps << " steps";
  EXPECT_TRUE(s.hot_experts().empty()) << s.placement_summary();
  EXPECT_NE(s.hot_experts_outcome().find("undone"), std::string::npos) << s.hot_experts_outcome();
  for (int l = 0; l < s.config().n_layer; ++l) {
    for (const char* what : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "hot_map"}) {
      EXPECT_FALSE(s.executor().residency().contains("gpu", hot_expert_name(l, what)));
      // Their host data is freed: the executor no longer knows them.
      EXPECT_THROW(s.executor().preload_weight(hot_expert_name(l, what), "gpu"), Error);
    }
  }
  ASSERT_TRUE(s.scheduler().residency_plan() && whole.scheduler().residency_plan());
  EXPECT_EQ(s.scheduler().residency_plan()->home, whole.scheduler().residency_plan()->home);
  std::printf("[ measured ] %s\n", s.placement_summary().c_str());
}

}  // namespace
}  // namespace tandem
