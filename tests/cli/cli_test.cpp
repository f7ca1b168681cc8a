// The `tandem` command as a user meets it: every --help works; wrong flags, missing files and
// malformed models give one clear line and a non-zero exit; bench prints its table and valid
// JSON; greedy runs give the same tokens on every strategy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_harness.h"
#include "tandem/model/sampler.h"
#include "tandem/runtime.h"

namespace {

using cli_test::lines;
using cli_test::Result;
using cli_test::slurp;
using cli_test::tandem;
using cli_test::tiny_model;
namespace fs = std::filesystem;

TEST(Cli, EverySubcommandHasHelp) {
  std::vector<std::string> subs = {"run",       "bench",      "plan",    "tune",
                                   "calibrate", "synth",      "inspect", "devices",
                                   "tokenize",  "detokenize", "logits"};
#ifdef TANDEM_HAVE_SERVER
  subs.push_back("serve");
#endif
  for (const std::string& sub : subs) {
    Result r = tandem(sub + " --help");
    EXPECT_EQ(r.code, 0) << sub << ": " << r.err;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub;
  }
  Result r = tandem("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("bench"), std::string::npos);
}

TEST(Cli, BadInputGivesOneLineAndNonZeroExit) {
  const std::string& m = tiny_model();
  fs::path junk =
      fs::temp_directory_path() / ("tandem_cli_junk_" + std::to_string(getpid()) + ".gguf");
  std::ofstream(junk) << "this is not a gguf file at all, it is text";
  struct Bad {
    std::string args, expect;
  } cases[] = {
      {"run -m " + m + " -p hi --no-such-flag", "no-such-flag"},
      {"run -p hi", "--model"},
      {"frobnicate", "frobnicate"},
      {"run -m /nonexistent/model.gguf -p hi", "/nonexistent/model.gguf"},
      {"inspect /nonexistent/model.gguf", "/nonexistent/model.gguf"},
      {"inspect " + junk.string(), junk.string()},
      {"run -m " + junk.string() + " -p hi", junk.string()},
      {"bench -m " + m + " --strategy warp-drive", "warp-drive"},
      {"bench -m " + m + " --output-format xml", "--output-format"},
      {"bench -m " + m + " -o sql", "-o/--output-format"},
      {"run -m " + m + " -p hi --gpu-mem lots", "--gpu-mem"},
      {"run -m " + m + " -p hi --kv-type q4_0", "--kv-type"},
      {"run -m " + m + " -p hi --strategy only:cuda:7", "cuda:7"},
      {"logits -m " + m + " --tokens 1,x,3 --out /tmp/x.bin", "--tokens"},
      {"logits -m " + m + " --tokens 1,99999 --out /tmp/x.bin", "99999"},
      {"detokenize -m " + m + " 1 2 999999", "999999"},
      {"synth --preset huge -o /tmp/x.gguf", "huge"},
      {"synth --preset tiny --moe-skew 2 -o /tmp/x.gguf", "--moe-skew"},
      {"synth --preset tiny-moe --moe-skew=-1 -o /tmp/x.gguf", "moe_skew"},
      {"run -m " + m + " -p hi -ot 'blk\\.0\\..*'", "--override-tensor"},
      {"run -m " + m + " -p hi --ranks -1", "--ranks"},
      {"logits -m " + m + " --tokens 1 --out /tmp/x.bin --ranks 65", "--ranks"},
      // No NCCL, or fewer GPUs than ranks: refused before a rank starts.
      {"bench -m " + m + " --ranks 64", "--ranks"},
      {"run -m " + m + " -p hi --ranks 2 -ts 1,1,1", "3 proportions for 2 ranks"},
  };
  for (const auto& c : cases) {
    Result r = tandem(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_EQ(lines(r.err), 1u) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\n" << r.err;
  }
  fs::remove(junk);
}

TEST(Cli, InspectDevicesTokenize) {
  const std::string& m = tiny_model();
  Result r = tandem("inspect " + m);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("token_embd.weight"), std::string::npos);
  EXPECT_NE(r.out.find("llama.block_count"), std::string::npos);
  r = tandem("inspect --json " + m);
  ASSERT_EQ(r.code, 0);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["metadata"]["general.architecture"], "llama");
  r = tandem("devices --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto d = nlohmann::json::parse(r.out);
  ASSERT_GE(d.size(), 1u);
  EXPECT_EQ(d[0]["backend"], "reference");
  EXPECT_GT(d[0]["capabilities"].size(), 10u);

  std::string vocab = std::string(TANDEM_VOCAB_DIR) + "/ggml-vocab-llama-spm.gguf";
  if (!fs::exists(vocab)) GTEST_SKIP() << "no vocab file at " << vocab;
  r = tandem("tokenize --json -m " + vocab + " --no-bos 'Hello world'");
  ASSERT_EQ(r.code, 0) << r.err;
  auto ids = nlohmann::json::parse(r.out);
  ASSERT_EQ(ids.size(), 2u);
  r = tandem("detokenize -m " + vocab + " " + std::to_string(int(ids[0])) + "," +
             std::to_string(int(ids[1])));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello world\n");
}

// A mixture-of-experts preset, skewed: inspect names its experts, and it runs.
TEST(Cli, SynthesizesAndInspectsAnExpertModel) {
  const std::string path =
      (tandem::test::process_temp_dir("tandem_cli_test_") / "tiny_moe.gguf").string();
  Result r = tandem("synth --preset tiny-qwen3moe --type q8_0 --moe-skew 3 -o " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  r = tandem("inspect " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("mixture of experts: 8 experts, 2 used per token"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("blk.1.ffn_down_exps.weight"), std::string::npos);
  r = tandem("inspect --json " + path);
  ASSERT_EQ(r.code, 0);
  EXPECT_EQ(nlohmann::json::parse(r.out)["experts"], "8 experts, 2 used per token");
  r = tandem("logits -m " + path + " --tokens 1,2,3 --out " + path + ".logits");
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST(Cli, BenchPrintsOneRowPerStrategyAndTestAndValidJson) {
  const std::string& m = tiny_model();
  Result r = tandem("bench -m " + m + " -p 16 -n 4 -r 2 --strategy cpu,auto,only:reference");
  ASSERT_EQ(r.code, 0) << r.err;
  for (std::string s : {"| cpu ", "| auto ", "| only:reference "}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  }
  EXPECT_NE(r.out.find("pp16"), std::string::npos);
  EXPECT_NE(r.out.find("tg4"), std::string::npos);
  r = tandem("bench -m " + m +
             " -p 16 -n 4 -r 2 --strategy cpu --strategy auto --output-format json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 4u);
  for (const auto& row : j) {
    EXPECT_EQ(row["samples_ts"].size(), 2u);
    EXPECT_GT(row["avg_ts"].get<double>(), 0.0);
  }
}

TEST(Cli, LogitsWritesTheLastPositionOrAll) {
  const std::string& m = tiny_model();
  fs::path out = fs::temp_directory_path() / ("tandem_cli_logits_" + std::to_string(getpid()));
  Result r = tandem("logits -m " + m + " --tokens 1,2,3 --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(fs::file_size(out), 512u * 4);
  r = tandem("logits -m " + m + " --tokens 1,2,3 --all --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(fs::file_size(out), 3u * 512 * 4);
  fs::remove(out);
}

// Greedy generation per strategy, in process, keeping each step's logits.
std::vector<int32_t> greedy(const std::string& model, const std::string& strategy,
                            std::vector<std::vector<float>>* logits_out) {
  tandem::SessionOptions o;
  o.model_path = model;
  o.strategy = strategy;
  o.n_ctx = 64;
  tandem::Session e(o);
  std::vector<int32_t> toks{1, 17, 42, 99};
  auto l = e.eval(toks);
  std::vector<int32_t> out;
  tandem::Sampler s(tandem::SamplerParams::greedy());
  for (int i = 0; i < 24; ++i) {
    logits_out->emplace_back(l.begin(), l.end());
    int32_t t = s.sample(l);
    out.push_back(t);
    l = e.eval(std::span<const int32_t>(&t, 1));
  }
  return out;
}

TEST(Cli, GreedyRunGivesTheSameTokensOnEveryStrategy) {
  const std::string& m = tiny_model();
  std::vector<std::vector<float>> ref_logits;
  auto ref = greedy(m, "only:reference", &ref_logits);
  for (std::string strategy : {"cpu", "gpu", "auto"}) {
    std::vector<std::vector<float>> logits;
    auto got = greedy(m, strategy, &logits);
    for (size_t i = 0; i < ref.size(); ++i) {
      if (got[i] == ref[i]) continue;
      // A divergence is only acceptable where the reference's two best candidates lie within
      // the conformance tolerance of each other.
      const auto& l = ref_logits[i];
      float a = l[size_t(ref[i])], b = l[size_t(got[i])];
      std::printf("[ report ] %s diverges at step %zu: %d vs %d, logits %.7g vs %.7g\n",
                  strategy.c_str(), i, ref[i], got[i], a, b);
      EXPECT_LE(std::fabs(a - b), 1e-4f * std::max(1.0f, std::fabs(a))) << strategy;
      break;
    }
  }
  // The command-line run prints the same text on two strategies.
  Result c = tandem("run -m " + m + " -p 'hello' -n 12 --greedy --strategy cpu");
  Result r = tandem("run -m " + m + " -p 'hello' -n 12 --greedy --strategy only:reference");
  ASSERT_EQ(c.code, 0) << c.err;
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(c.out, r.out);
  EXPECT_NE(c.err.find("tokens/s"), std::string::npos);
  EXPECT_NE(c.err.find("execution summary"), std::string::npos);
}

}  // namespace

namespace {

TEST(Cli, PlanShowsWhereTensorsAndOpsGoWithoutRunning) {
  const std::string& m = tiny_model();
  Result r = tandem("plan -m " + m + " --strategy auto -p 8");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* want : {"where tensors live", "prefill (8 tokens): predicted",
                           "decode (1 token): predicted", "candidates auto weighed"}) {
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  }
  // --ops adds each op with its backend and the reason, for both phases.
  Result ops = tandem("plan -m " + m + " --strategy cpu -p 8 --ops");
  ASSERT_EQ(ops.code, 0) << ops.err;
  size_t tables = 0;
  for (size_t at = ops.out.find("est_us  reason"); at != std::string::npos;
       at = ops.out.find("est_us  reason", at + 1)) {
    ++tables;
  }
  EXPECT_EQ(tables, 2u) << ops.out;
  EXPECT_NE(ops.out.find("matmul"), std::string::npos) << ops.out;
  EXPECT_NE(ops.out.find("cpu_available"), std::string::npos) << ops.out;
  Result j = tandem("plan -m " + m + " --strategy cpu -p 8 --json");
  ASSERT_EQ(j.code, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out);
  ASSERT_EQ(doc["phases"].size(), 2u);
  EXPECT_EQ(doc["phases"][0]["tokens"], 8);
  EXPECT_GT(doc["phases"][1]["predicted_us"].get<double>(), 0.0);
  EXPECT_EQ(doc["phases"][1]["ops"]["cpu"].get<int>() > 0, true);
  EXPECT_FALSE(doc["tensors"].empty());
  for (const auto& t : doc["tensors"]) EXPECT_EQ(t["home"], "host") << t.dump();
  EXPECT_FALSE(doc.contains("residency"));  // only auto searches one
  Result bad = tandem("plan -m " + m + " -p 0");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("prompt length"), std::string::npos) << bad.err;
}

TEST(Cli, TuneSavesTheBestPlacementAndRunReadsIt) {
  const std::string& m = tiny_model();
  const fs::path saved =
      fs::temp_directory_path() / ("tandem_tune_" + std::to_string(getpid()) + ".json");
  Result r = tandem("tune -m " + m + " -p 4 -n 2 -r 1 --save " + saved.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("auto ranks"), std::string::npos) << r.out;
  auto doc = nlohmann::json::parse(std::ifstream(saved));
  EXPECT_EQ(doc["format"], "tandem-placement");
  EXPECT_EQ(doc["model"], fs::path(m).filename().string());
  // The saved placement round-trips: run and bench take it.
  Result run = tandem("run -m " + m + " -p hi -n 2 --greedy --placement " + saved.string());
  EXPECT_EQ(run.code, 0) << run.err;
  Result bench = tandem("bench -m " + m + " -p 4 -n 0 -r 1 --placement " + saved.string());
  EXPECT_EQ(bench.code, 0) << bench.err;
  // A corrupt file, a file of another kind and a file for another model are refused by name.
  const fs::path junk = saved.string() + ".junk";
  std::ofstream(junk) << "{ not json";
  Result c = tandem("run -m " + m + " -p hi --placement " + junk.string());
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.err.find("not JSON"), std::string::npos) << c.err;
  std::ofstream(junk) << R"({"format": "something-else"})";
  c = tandem("run -m " + m + " -p hi --placement " + junk.string());
  EXPECT_NE(c.err.find("not a saved placement"), std::string::npos) << c.err;
  // Fields of the wrong type are refused the same way (the reader once let JSON's own type
  // errors escape).
  std::ofstream(junk) << R"({"format": 7})";
  c = tandem("run -m " + m + " -p hi --placement " + junk.string());
  EXPECT_NE(c.err.find("not a saved placement"), std::string::npos) << c.err;
  std::ofstream(junk) << R"({"format": "tandem-placement", "version": "1"})";
  c = tandem("run -m " + m + " -p hi --placement " + junk.string());
  EXPECT_NE(c.err.find("version \"1\""), std::string::npos) << c.err;
  // Numbers that are not whole (a float beyond every integer's range once made the conversion
  // undefined) are refused by name.
  nlohmann::json bad = doc;
  bad["gpu_mem"] = 1.6e68;
  std::ofstream(junk) << bad.dump();
  c = tandem("run -m " + m + " -p hi --placement " + junk.string());
  EXPECT_NE(c.err.find("gpu_mem is not a byte count"), std::string::npos) << c.err;
  bad = doc;
  bad["n_layer"] = 1.5;
  std::ofstream(junk) << bad.dump();
  c = tandem("run -m " + m + " -p hi --placement " + junk.string());
  EXPECT_NE(c.err.find("n_layer is not an integer"), std::string::npos) << c.err;
  doc["model"] = "other.gguf";
  std::ofstream(junk) << doc.dump();
  c = tandem("run -m " + m + " -p hi --placement " + junk.string());
  EXPECT_NE(c.err.find("tuned for other.gguf"), std::string::npos) << c.err;
  Result both = tandem("run -m " + m + " -p hi -ngl 1 --placement " + saved.string());
  EXPECT_NE(both.err.find("drop --n-gpu-layers"), std::string::npos) << both.err;
  fs::remove(saved);
  fs::remove(junk);
}

#ifdef TANDEM_HAVE_SERVER
// `tandem serve` listens, and SIGTERM stops it gracefully with exit code 0. (The HTTP API is
// tested in tests/server.)
TEST(Cli, ServeStopsOnSigterm) {
  const fs::path dir = fs::temp_directory_path() / ("tandem_cli_serve_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string err = (dir / "err").string(), rc = (dir / "rc").string();
  const std::string script = std::string(TANDEM_BIN) + " serve -m " + tiny_model() +
                             " --port 0 -np 2 -c 128 --strategy cpu --no-calibrate 2>" + err +
                             " & pid=$!; for i in $(seq 1 200); do grep -q listening " + err +
                             " && break; sleep 0.05; done; kill -TERM $pid; wait $pid; echo $? >" +
                             rc;
  ASSERT_EQ(std::system(("sh -c '" + script + "'").c_str()), 0);
  const std::string log = slurp(err);
  EXPECT_EQ(slurp(rc), "0\n") << log;
  EXPECT_NE(log.find("2 slots of 64 positions; listening on http://127.0.0.1:"), std::string::npos)
      << log;
  EXPECT_NE(log.find("stopping"), std::string::npos) << log;
  EXPECT_NE(log.find("tandem serve: stopped"), std::string::npos) << log;
  fs::remove_all(dir);
}
#endif

}  // namespace
