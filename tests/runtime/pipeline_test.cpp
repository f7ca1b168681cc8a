// The pipeline across processes, with its ranks as threads (make_local_transports): the whole
// protocol without NCCL. Each rank has backends of its own (test backends with reference
// kernels, a fake GPU among them), so a pipeline computes what one process computes.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../temp_dir.h"
#include "tandem/error.h"
#include "tandem/model/synthetic.h"
#include "tandem/pipeline.h"
#include "tandem/registry.h"
#include "tandem/runtime.h"
#include "test_backends.h"

namespace tandem {
namespace {

// A tiny model of four layers (three ranks need three), and another of the same shape.
const std::string& model_path(uint64_t seed = 11) {
  static std::map<uint64_t, std::string> paths;
  auto it = paths.find(seed);
  if (it != paths.end()) return it->second;
  const std::string p = (test::process_temp_dir("tandem_pipeline_test_") /
                         ("tiny4_" + std::to_string(seed) + ".gguf"))
                            .string();
  SyntheticSpec spec = synthetic_preset("tiny", DType::Q8_0, seed);
  spec.n_layer = 4;
  spec.threads = 1;
  write_synthetic_model(spec, p);
  return paths.emplace(seed, p).first->second;
}

SessionOptions options_for(const std::string& path = model_path()) {
  SessionOptions o;
  o.model_path = path;
  o.backends = {test::make_cpu("cpu"), test::make_gpu("gpu")};
  o.strategy = "gpu";
  o.n_ctx = 32;
  o.kv_dtype = DType::F32;
  o.no_calibrate = true;
  return o;
}

// Ranks 1.. as threads serving rank 0's sessions; the test is rank 0.
class Ranks {
 public:
  Ranks(int n, const std::function<SessionOptions(int)>& options_of, double timeout_s = 60.0)
      : transports_(make_local_transports(n, timeout_s)), errors_(size_t(n)) {
    for (int r = 1; r < n; ++r) {
      SessionOptions o = options_of(r);
      o.pipeline = transports_[size_t(r)];
      threads_.emplace_back([this, r, o] {
        try {
          serve_pipeline_rank(o);
        } catch (const std::exception& e) {
          errors_[size_t(r)] = e.what();
        }
      });
    }
  }
  ~Ranks() {
    if (!joined_) transports_[0]->abort("the test ended");
    join();
  }
  const std::shared_ptr<PipelineTransport>& leader() const { return transports_[0]; }
  // Waits for every rank; their errors ("" where a rank ended cleanly).
  const std::vector<std::string>& join() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    joined_ = true;
    return errors_;
  }
  void end() {
    end_pipeline(*leader());
    join();
  }

 private:
  std::vector<std::shared_ptr<PipelineTransport>> transports_;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
  bool joined_ = false;
};

const std::vector<int32_t> kPrompt = {1, 22, 333, 44, 5};
const std::vector<int32_t> kDecoded = {7, 111, 13, 170};

// The prompt's logits at every position, then one token at a time, then a fresh prompt after
// reset.
std::vector<std::vector<float>> run_steps(Session& s) {
  std::vector<std::vector<float>> out;
  auto keep = [&](std::span<const float> l) { out.emplace_back(l.begin(), l.end()); };
  keep(s.eval(kPrompt, /*all_logits=*/true));
  for (int32_t t : kDecoded) keep(s.decode(t));
  s.reset();
  keep(s.prefill(kDecoded));
  keep(s.decode(9));
  return out;
}

void expect_equal(const std::vector<std::vector<float>>& got,
                  const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "step " << i;
    for (size_t j = 0; j < got[i].size(); ++j)
      ASSERT_EQ(got[i][j], want[i][j]) << "step " << i << " logit " << j;
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineGraph, RefusesALayerRangeOutsideTheModel) {
  gguf::File file = gguf::File::open(model_path());
  const LlamaConfig config = LlamaConfig::from_gguf(file);
  const std::vector<std::pair<int, int>> bad = {{2, 2}, {3, 2}, {-1, 2}, {0, 5}};
  for (auto [begin, end] : bad) {
    LlamaGraphOptions o;
    o.layer_begin = begin;
    o.layer_end = end;
    EXPECT_THROW(build_llama_graph(config, file, o), Error) << begin << ", " << end;
  }
  LlamaGraphOptions middle;
  middle.n_tokens = 3;
  middle.layer_begin = 1;
  middle.layer_end = 3;
  const LlamaGraph lg = build_llama_graph(config, file, middle);
  EXPECT_EQ(lg.tokens, kNoTensor);
  EXPECT_EQ(lg.logits, kNoTensor);
  ASSERT_NE(lg.hidden_in, kNoTensor);
  EXPECT_EQ(lg.output(), lg.hidden_out);
  EXPECT_EQ(lg.graph.tensor(lg.hidden_out).dtype, DType::F32);
  EXPECT_EQ(lg.graph.tensor(lg.hidden_out).elements(), 3 * config.n_embd);
}

TEST(Pipeline, TwoAndThreeRanksGiveTheLogitsOfOneProcess) {
  std::vector<std::vector<float>> one;
  size_t one_resident = 0;
  {
    Session alone(options_for());
    one = run_steps(alone);
    one_resident = alone.executor().resident_bytes("gpu");
  }
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    // The other ranks run rank 0's strategy, context and KV type, whatever their own options
    // say: a context of 8 could not hold the steps, an f16 cache would change the logits.
    Ranks ranks(n, [](int) {
      SessionOptions o = options_for();
      o.n_ctx = 8;
      o.kv_dtype = DType::F16;
      o.strategy = "cpu";
      return o;
    });
    {
      SessionOptions o = options_for();
      o.pipeline = ranks.leader();
      Session leader(o);
      // Rank 0 holds its own layers only: [0, 2) of 4 with two ranks, [0, 2) with three
      // (llama.cpp's split of 4 layers by 1:1:1 is 2, 1, 1).
      EXPECT_EQ(leader.layers().begin, 0);
      EXPECT_EQ(leader.layers().end, 2);
      expect_equal(run_steps(leader), one);
      EXPECT_NE(leader.executor().kv_cache_backend(kv_cache_name(true, 1)), "");
      EXPECT_EQ(leader.executor().kv_cache_backend(kv_cache_name(true, 2)), "");
      EXPECT_EQ(leader.executor().kv_cache_backend(kv_cache_name(true, 3)), "");
      EXPECT_NE(leader.placement_summary().find("pipeline of " + std::to_string(n) +
                                                " ranks, layers [0, 2) [2, "),
                std::string::npos)
          << leader.placement_summary();
      // Half the layers, no output layer: well under what one process holds.
      EXPECT_LT(leader.executor().resident_bytes("gpu"), one_resident * 3 / 4);
    }
    ranks.end();
    for (const std::string& e : ranks.join()) EXPECT_EQ(e, "");
  }
}

TEST(Pipeline, SeveralSessionsInTurnAndASkewedSplit) {
  std::vector<std::vector<float>> one;
  {
    Session alone(options_for());
    one = run_steps(alone);
  }
  Ranks ranks(2, [](int) { return options_for(); });
  for (std::vector<double> split : {std::vector<double>{3, 1}, std::vector<double>{1, 3}}) {
    SessionOptions o = options_for();
    o.pipeline = ranks.leader();
    o.tensor_split = split;
    Session leader(o);
    EXPECT_EQ(leader.layers().end, split[0] == 3 ? 3 : 1);
    expect_equal(run_steps(leader), one);
  }
  ranks.end();
  for (const std::string& e : ranks.join()) EXPECT_EQ(e, "");
}

// With three ranks a session's end travels rank to rank (0 -> 1 -> 2) before the next session
// opens: every rank must be back waiting for it.
TEST(Pipeline, ThreeRanksServeSessionsInTurn) {
  std::vector<std::vector<float>> one;
  {
    Session alone(options_for());
    one = run_steps(alone);
  }
  Ranks ranks(3, [](int) { return options_for(); });
  for (std::vector<double> split :
       {std::vector<double>{2, 1, 1}, std::vector<double>{1, 1, 2}, std::vector<double>{1, 2, 1}}) {
    SessionOptions o = options_for();
    o.pipeline = ranks.leader();
    o.tensor_split = split;
    Session leader(o);
    EXPECT_EQ(leader.layers().end, int(split[0]));
    expect_equal(run_steps(leader), one);
  }
  ranks.end();
  for (const std::string& e : ranks.join()) EXPECT_EQ(e, "");
}

// Rank 0 leaves the context to the model (n_ctx 0): every rank sizes its caches the same way and
// takes steps of any length up to it.
TEST(Pipeline, TheModelsDefaultContextOnEveryRank) {
  SessionOptions base = options_for();
  base.n_ctx = 0;
  std::vector<std::vector<float>> one;
  int64_t n_ctx = 0;
  {
    Session alone(base);
    n_ctx = alone.n_ctx();
    one = run_steps(alone);
  }
  ASSERT_GT(n_ctx, int64_t(kPrompt.size()));
  Ranks ranks(2, [](int) {
    SessionOptions o = options_for();
    o.n_ctx = 8;
    return o;
  });
  {
    SessionOptions o = base;
    o.pipeline = ranks.leader();
    Session leader(o);
    EXPECT_EQ(leader.n_ctx(), n_ctx);
    expect_equal(run_steps(leader), one);
  }
  ranks.end();
  for (const std::string& e : ranks.join()) EXPECT_EQ(e, "");
}

// Without output.weight the last rank multiplies by the token embedding, which it maps too.
TEST(Pipeline, TiedEmbeddingsOnTheLastRank) {
  SyntheticSpec spec = synthetic_preset("tiny", DType::Q8_0, 5);
  spec.n_layer = 3;
  spec.tied_embeddings = true;
  spec.threads = 1;
  const std::string path =
      (test::process_temp_dir("tandem_pipeline_test_") / "tied3.gguf").string();
  write_synthetic_model(spec, path);
  std::vector<std::vector<float>> one;
  {
    Session alone(options_for(path));
    one = run_steps(alone);
  }
  Ranks ranks(3, [&](int) { return options_for(path); });
  {
    SessionOptions o = options_for(path);
    o.pipeline = ranks.leader();
    Session leader(o);
    expect_equal(run_steps(leader), one);
  }
  ranks.end();
  for (const std::string& e : ranks.join()) EXPECT_EQ(e, "");
}

TEST(Pipeline, RefusesMoreRanksThanLayers) {
  SyntheticSpec spec = synthetic_preset("tiny", DType::F32, 3);  // two layers
  const std::string path =
      (test::process_temp_dir("tandem_pipeline_test_") / "tiny2.gguf").string();
  spec.threads = 1;
  write_synthetic_model(spec, path);
  Ranks ranks(3, [&](int) { return options_for(path); });
  SessionOptions o = options_for(path);
  o.pipeline = ranks.leader();
  const std::string error = error_of([&] { Session leader(o); });
  EXPECT_NE(error.find("3 ranks for a model of 2 layers"), std::string::npos) << error;
  const auto& errors = ranks.join();
  for (int r = 1; r < 3; ++r)
    EXPECT_NE(errors[size_t(r)].find("every rank needs a layer"), std::string::npos) << errors[r];
}

TEST(Pipeline, RefusesAnotherModelOnARank) {
  Ranks ranks(2, [](int) { return options_for(model_path(12)); });
  SessionOptions o = options_for();
  o.pipeline = ranks.leader();
  const std::string error = error_of([&] { Session leader(o); });
  EXPECT_NE(error.find("rank 1 maps another model"), std::string::npos) << error;
  EXPECT_NE(ranks.join()[1].find("another model"), std::string::npos) << ranks.join()[1];
}

TEST(Pipeline, RefusesASplitThatLeavesARankWithoutLayers) {
  for (auto [split, expected] :
       {std::pair{std::vector<double>{1, 0}, "rank 1 gets no layer"},
        std::pair{std::vector<double>{1, 1, 1}, "3 proportions for 2 ranks"}}) {
    Ranks ranks(2, [](int) { return options_for(); });
    SessionOptions o = options_for();
    o.pipeline = ranks.leader();
    o.tensor_split = split;
    const std::string error = error_of([&] { Session leader(o); });
    EXPECT_NE(error.find(expected), std::string::npos) << error;
    EXPECT_NE(ranks.join()[1].find(expected), std::string::npos) << ranks.join()[1];
  }
}

TEST(Pipeline, ARankThatCannotLoadStopsRankZero) {
  Ranks ranks(2, [](int) {
    SessionOptions o = options_for();
    o.backends.push_back(nullptr);
    return o;
  });
  SessionOptions o = options_for();
  o.pipeline = ranks.leader();
  const std::string error = error_of([&] { Session leader(o); });
  EXPECT_NE(error.find("rank 1: "), std::string::npos) << error;
  EXPECT_NE(error.find("is null"), std::string::npos) << error;
  EXPECT_NE(ranks.join()[1], "");
}

TEST(Pipeline, ARankThatFailsMidStepStopsRankZero) {
  auto gpu1 = test::make_gpu("gpu");
  Ranks ranks(2, [&](int) {
    SessionOptions o = options_for();
    o.backends = {test::make_cpu("cpu"), gpu1};
    return o;
  });
  SessionOptions o = options_for();
  o.pipeline = ranks.leader();
  Session leader(o);
  leader.prefill(kPrompt);
  gpu1->fail_on_op = int(OpKind::Attention);  // rank 1 waits for the next step meanwhile
  const std::string error = error_of([&] { leader.decode(7); });
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("injected failure"), std::string::npos) << error;
  EXPECT_NE(ranks.join()[1].find("injected failure"), std::string::npos) << ranks.join()[1];
  // The session is stopped: later steps fail at once rather than wait.
  EXPECT_THROW(leader.decode(7), Error);
}

TEST(Pipeline, RankZeroGivesUpOnARankThatNeverAnswers) {
  auto transports = make_local_transports(2, /*timeout_s=*/0.2);
  SessionOptions o = options_for();
  o.pipeline = transports[0];
  const std::string error = error_of([&] { Session leader(o); });
  EXPECT_NE(error.find("no message from rank 1"), std::string::npos) << error;
}

TEST(Pipeline, RefusesBadRankSetups) {
  EXPECT_THROW(make_local_transports(0), Error);
  EXPECT_THROW(make_local_transports(2, 0.0), Error);
  auto transports = make_local_transports(2);
  SessionOptions o = options_for();
  o.pipeline = transports[0];
  EXPECT_THROW(serve_pipeline_rank(o), Error);  // rank 0 leads, it does not serve
  o.layers = LayerRange{0, 2};
  EXPECT_THROW(Session{o}, Error);  // rank 0 chooses its own layers
  SessionOptions range = options_for();
  range.layers = LayerRange{2, 6};
  EXPECT_THROW(Session{range}, Error);
  if (!nccl_available()) {
    EXPECT_THROW(nccl_unique_id(), Error);
  }
}

TEST(Pipeline, ALayerRangeRefusesAHiddenStateOfTheWrongSize) {
  SessionOptions o = options_for();
  o.layers = LayerRange{2, 4};
  Session stage(o);
  std::vector<float> hidden(3 * size_t(stage.config().n_embd) - 1, 0.5f);
  EXPECT_THROW(stage.eval_stage(std::vector<int32_t>{1, 2, 3}, 0, hidden), Error);
  EXPECT_THROW(stage.eval(std::vector<int32_t>{1, 2, 3}), Error);  // no hidden state at all
  hidden.push_back(0.5f);
  EXPECT_EQ(stage.eval_stage(std::vector<int32_t>{1, 2, 3}, 0, hidden).size(),
            size_t(stage.config().n_vocab));
}

// ---- NCCL, where the build has it and the machine has the GPUs ----

int gpu_count() {
  int n = 0;
  for (const std::string& id : available_backend_ids()) n += id.starts_with("cuda:");
  return n;
}

// A communicator of one rank on one GPU: a broadcast leaves the bytes as they are, a message
// to itself is refused.
TEST(NcclTransport, OneRankOnOneGpu) {
  if (!nccl_available() || gpu_count() < 1) GTEST_SKIP() << "needs NCCL and a GPU";
  auto t = make_nccl_transport(0, 1, nccl_unique_id(), 0, 30.0);
  std::vector<int32_t> v = {1, 2, 3, 4};
  t->broadcast(v.data(), v.size() * sizeof(int32_t), 0);
  EXPECT_EQ(v, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_THROW(t->send(v.data(), 4, 0), Error);
}

// The pipeline over NCCL, ranks as threads on two GPUs: the logits of one process on one GPU.
TEST(NcclTransport, TwoRanksOnTwoGpusGiveTheLogitsOfOneGpu) {
  if (!nccl_available() || gpu_count() < 2) GTEST_SKIP() << "needs NCCL and two GPUs";
  auto on_gpu = [](int device) {
    SessionOptions o = options_for();
    o.backends = {create_backend("cpu"), create_backend("cuda:" + std::to_string(device))};
    return o;
  };
  std::vector<std::vector<float>> one;
  {
    Session alone(on_gpu(0));
    one = run_steps(alone);
  }
  const std::string id = nccl_unique_id();
  std::string worker_error;
  std::shared_ptr<PipelineTransport> t0;
  std::thread worker([&] {
    try {
      SessionOptions o = on_gpu(1);
      o.pipeline = make_nccl_transport(1, 2, id, 1, 60.0);
      serve_pipeline_rank(o);
    } catch (const std::exception& e) {
      worker_error = e.what();
    }
  });
  std::vector<std::vector<float>> two;
  std::string error = error_of([&] {
    t0 = make_nccl_transport(0, 2, id, 0, 60.0);
    SessionOptions o = on_gpu(0);
    o.pipeline = t0;
    {
      Session leader(o);
      two = run_steps(leader);
    }
    end_pipeline(*t0);
  });
  if (!error.empty() && t0) t0->abort(error);
  worker.join();
  ASSERT_EQ(error, "");
  ASSERT_EQ(worker_error, "");
  ASSERT_EQ(two.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(two[i].size(), one[i].size());
    double num = 0, den = 0;
    for (size_t j = 0; j < one[i].size(); ++j) {
      num += (double(two[i][j]) - one[i][j]) * (double(two[i][j]) - one[i][j]);
      den += double(one[i][j]) * one[i][j];
    }
    EXPECT_LE(num / den, 1e-6) << "step " << i;
  }
}

// A rank whose peers never join gives up after its timeout, with an error, not a hang (last:
// an abort that hung would keep the tests above from running).
TEST(NcclTransport, JoiningWithoutThePeersTimesOut) {
  if (!nccl_available() || gpu_count() < 1) GTEST_SKIP() << "needs NCCL and a GPU";
  const std::string error =
      error_of([] { make_nccl_transport(0, 2, nccl_unique_id(), 0, /*timeout_s=*/3.0); });
  EXPECT_NE(error.find("no answer in 3 s"), std::string::npos) << error;
}

}  // namespace
}  // namespace tandem
