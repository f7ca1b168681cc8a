// llama.cpp's common flags mean what they mean there: -fa, -e, -s, -n -1, -ot, -ngl; what
// Tandem does not support is refused with one line naming the flag; --strict without a GPU says
// what to do and prints nothing to stdout.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_harness.h"
#include "cli_util.h"
#include "tandem/registry.h"

namespace {

using cli_test::lines;
using cli_test::Result;
using cli_test::slurp;
using cli_test::tandem;
using cli_test::tiny_model;
namespace fs = std::filesystem;

bool gpu_present() {
  for (const auto& id : tandem::available_backend_ids()) {
    if (id.rfind("cuda:", 0) == 0) return true;
  }
  return false;
}

void expect_refused(const std::string& args, const std::string& flag) {
  Result r = tandem(args);
  EXPECT_NE(r.code, 0) << args;
  EXPECT_EQ(lines(r.err), 1u) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(flag), std::string::npos) << args << "\n" << r.err;
}

TEST(Flags, FlashAttentionIsAcceptedAndOffIsRefused) {
  const std::string& m = tiny_model();
  for (std::string fa : {"-fa", "--flash-attn", "-fa on", "-fa 1", "--flash-attn auto"}) {
    Result r = tandem("run -m " + m + " -p hi -n 2 --strategy cpu " + fa);
    EXPECT_EQ(r.code, 0) << fa << ": " << r.err;
  }
  Result r = tandem("bench -m " + m + " -p 8 -n 0 -r 1 --strategy cpu -fa 1");
  EXPECT_EQ(r.code, 0) << r.err;
  expect_refused("run -m " + m + " -p hi --strategy cpu -fa off", "--flash-attn");
  expect_refused("bench -m " + m + " -p 8 -n 0 -r 1 --strategy cpu -fa 0", "--flash-attn");
  r = tandem("run --help");
  EXPECT_NE(r.out.find("always fused"), std::string::npos) << r.out;
}

TEST(Flags, MultiGpuFlagsAreCheckedBeforeLoading) {
  const std::string& m = tiny_model();
  const std::string run = "run -m " + m + " -p hi -n 1 --strategy cpu ";
  expect_refused(run + "-sm row", "--split-mode");
  expect_refused(run + "--split-mode rows", "--split-mode");
  expect_refused(run + "-ts 1,-1", "--tensor-split");
  expect_refused(run + "-ts one", "--tensor-split");
  expect_refused(run + "-ts 0,0", "--tensor-split");
  expect_refused(run + "-ts 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "--tensor-split");
  expect_refused(run + "-sm none -ts 1", "--tensor-split");
  expect_refused(run + "--gpu-mem cuda:63=1G", "--gpu-mem");
  expect_refused(run + "--gpu-mem cpu=1G", "--gpu-mem");
  expect_refused(run + "--gpu-mem 1G,2G", "--gpu-mem");
  expect_refused(run + "--gpu-mem cuda:0=lots", "--gpu-mem");
  // Accepted everywhere: one proportion (llama.cpp's meaning with a single device), one GPU.
  for (std::string ok : {"-ts 1", "--tensor-split 2", "-sm none", "-sm layer", "--gpu-mem 1G"}) {
    Result r = tandem(run + ok);
    EXPECT_EQ(r.code, 0) << ok << ": " << r.err;
  }
  Result r = tandem("bench -m " + m + " -p 8 -n 0 -r 1 --strategy cpu -ts 1 -sm layer");
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST(Flags, EscapeProcessesThePromptLikeLlamaCpp) {
  using tandem::cli::process_escapes;
  EXPECT_EQ(process_escapes("a\\nb\\tc\\rd"), "a\nb\tc\rd");
  EXPECT_EQ(process_escapes("\\'\\\"\\\\"), "'\"\\");
  EXPECT_EQ(process_escapes("\\x41\\x7a"), "Az");
  EXPECT_EQ(process_escapes("\\q \\x4 end\\"), "\\q \\x4 end\\") << "unknown escapes stay";
  const std::string& m = tiny_model();
  Result plain = tandem("run -m " + m + " -p 'a\\nb' -n 0 --strategy cpu");
  Result escaped = tandem("run -m " + m + " -p 'a\\nb' -n 0 --strategy cpu -e");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(escaped.code, 0) << escaped.err;
  EXPECT_EQ(plain.out, "a\\nb\n");
  EXPECT_EQ(escaped.out, "a\nb\n");
  EXPECT_EQ(tandem("run -m " + m + " -p 'a\\nb' -n 0 --strategy cpu --escape").out, "a\nb\n");
}

TEST(Flags, SeedMakesSamplingRepeatable) {
  const std::string& m = tiny_model();
  auto sample = [&](const std::string& seed) {
    return tandem("run -m " + m + " -p hello -n 16 --temp 1.5 --top-k 0 --strategy cpu " + seed);
  };
  Result a = sample("-s 7"), b = sample("--seed 7"), c = sample("-s 8");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out) << "seeds 7 and 8 sampled the same 16 tokens";
  Result random = sample("-s -1");
  ASSERT_EQ(random.code, 0) << random.err;
  EXPECT_NE(random.err.find("seed: "), std::string::npos) << "a random seed is printed";
  expect_refused("run -m " + m + " -p hi -s -2", "--seed");
}

TEST(Flags, PredictMinusOneRunsUntilTheContextIsFull) {
  const std::string& m = tiny_model();
  // The tiny model's vocabulary has no end-of-sequence text, so -1 stops at the context: 16
  // positions, 2 used by the prompt (BOS + "hi"), then one sampled token per position left.
  Result r = tandem("run -m " + m + " -p hi -n -1 -c 16 --greedy --strategy cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("generation: 15 tokens"), std::string::npos) << r.err;
  expect_refused("run -m " + m + " -p hi -n -2", "--n-predict");
}

TEST(Flags, OverrideTensorIsDashOt) {
  const std::string& m = tiny_model();
  for (std::string cmd : {"run -m " + m + " -p hi -n 2 --strategy cpu",
                          "bench -m " + m + " -p 8 -n 0 -r 1 --strategy cpu"}) {
    Result r = tandem(cmd + " -ot 'blk\\.0\\..*=cpu'");
    EXPECT_EQ(r.code, 0) << cmd << ": " << r.err;
    r = tandem(cmd + " --override-tensor 'blk\\.0\\..*=cpu'");
    EXPECT_EQ(r.code, 0) << cmd << ": " << r.err;
    expect_refused(cmd + " -ot 'blk\\.0\\..*'", "--override-tensor");
  }
  expect_refused("run -m " + m + " -p hi -o 'blk\\.0\\..*=cpu'", "-ot");
}

TEST(Flags, NglIsOneValueInRunAndAListInBench) {
  const std::string& m = tiny_model();
  Result r = tandem("run -m " + m + " -p hi -n 2 --strategy cpu -ngl 1");
  EXPECT_EQ(r.code, 0) << r.err;
  expect_refused("run -m " + m + " -p hi -ngl 1,2", "--n-gpu-layers");
  expect_refused("run -m " + m + " -p hi -ngl -3", "--n-gpu-layers");
}

// llama.cpp's --n-cpu-moe / -ncmoe and --cpu-moe / -cmoe: pins of the first layers' expert
// tensors to the host (the reasons name them), one value in run and a list in bench, bad values
// refused by name, a documented no-op on a model without experts; plan shows the experts.
TEST(Flags, NCpuMoePinsTheFirstLayersExperts) {
  const std::string moe =
      (tandem::test::process_temp_dir("tandem_cli_test_") / "tiny_moe_f32.gguf").string();
  Result r = tandem("synth --preset tiny-moe --type f32 -o " + moe);
  ASSERT_EQ(r.code, 0) << r.err;
  r = tandem("plan -m " + moe + " --strategy cpu -p 4 --ops -ncmoe 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("on weight 'blk.0.ffn_down_exps.weight' -> cpu"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("on weight 'blk.1.ffn_down_exps.weight'"), std::string::npos) << r.out;
  r = tandem("plan -m " + moe + " --strategy cpu -p 4 --ops -cmoe");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("on weight 'blk.1.ffn_down_exps.weight' -> cpu"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("experts: 4 per layer, 2 read per token"), std::string::npos) << r.out;
  r = tandem("run -m " + moe + " -p hi -n 2 --strategy cpu --n-cpu-moe 1");
  EXPECT_EQ(r.code, 0) << r.err;
  r = tandem("bench -m " + moe + " -p 4 -n 0 -r 1 --strategy cpu -ncmoe 0,2 -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 2u) << r.out;
  EXPECT_EQ(rows[0]["n_cpu_moe"], 0);
  EXPECT_EQ(rows[1]["n_cpu_moe"], 2);
  expect_refused("run -m " + moe + " -p hi --n-cpu-moe -1", "--n-cpu-moe");
  expect_refused("bench -m " + moe + " -p 4 -n 0 -ncmoe 1,-1", "--n-cpu-moe");
  expect_refused("run -m " + moe + " -p hi -ncmoe 1,2", "--n-cpu-moe");
  expect_refused("run -m " + moe + " -p hi -cmoe -ncmoe 1", "--cpu-moe");
  // A dense model: nothing to pin, as in llama.cpp, and a note says so.
  r = tandem("run -m " + tiny_model() + " -p hi -n 1 --strategy cpu -ncmoe 2");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--n-cpu-moe: the model has no experts"), std::string::npos) << r.err;
}

TEST(Flags, StrictWithoutAGpuSaysWhatToDoAndPrintsNothing) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present; --strict has nothing to refuse";
  const std::string& m = tiny_model();
  for (std::string cmd : {"run -m " + m + " -p hello -n 4 --strict",
                          "run -m " + m + " -p hello -n 4 --strict --strategy gpu",
                          "bench -m " + m + " -p 8 -n 0 -r 1 --strict --strategy gpu",
                          "logits -m " + m + " --tokens 1,2 --out /dev/null --strict"}) {
    Result r = tandem(cmd);
    EXPECT_NE(r.code, 0) << cmd;
    EXPECT_EQ(lines(r.err), 1u) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("--strict"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("no GPU"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--strategy cpu"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << cmd << " printed: " << r.out;
  }
  Result ok = tandem("run -m " + m + " -p hello -n 2 --strict --strategy cpu");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

}  // namespace

namespace {

TEST(Flags, CalibrateWritesAProfileThatRunLoadsAndBadOnesAreRefused) {
  const std::string& m = tiny_model();
  const auto dir =
      std::filesystem::temp_directory_path() / ("tandem-flags-calib-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string profile = (dir / "p.json").string();
  Result cal = tandem("calibrate --quick -t 1 -o " + profile);
  ASSERT_EQ(cal.code, 0) << cal.err;
  EXPECT_NE(cal.out.find("cost profile written to " + profile), std::string::npos) << cal.out;
  // The profile is used as it is: nothing measured, nothing refused.
  Result ok = tandem("run -m " + m + " -p hi -n 2 -t 1 --strategy cpu --cost-profile " + profile);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ok.err.find("calibrating"), std::string::npos) << ok.err;
  EXPECT_EQ(ok.err.find("warning"), std::string::npos) << ok.err;
  // Another thread count is another device: refused, and the run goes on on built-in figures.
  Result foreign =
      tandem("run -m " + m + " -p hi -n 2 -t 2 --strategy cpu --cost-profile " + profile);
  ASSERT_EQ(foreign.code, 0) << foreign.err;
  EXPECT_NE(foreign.err.find(profile + ": made for another device"), std::string::npos)
      << foreign.err;
  // Corrupt.
  const std::string corrupt = (dir / "corrupt.json").string();
  std::ofstream(corrupt) << "{\"format\": \"tandem-cost";
  Result bad = tandem("run -m " + m + " -p hi -n 2 -t 1 --strategy cpu --cost-profile " + corrupt);
  ASSERT_EQ(bad.code, 0) << bad.err;
  EXPECT_NE(bad.err.find(corrupt + ": not valid JSON"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("built-in"), std::string::npos) << bad.err;
  // --no-calibrate warns.
  Result none = tandem("run -m " + m + " -p hi -n 2 -t 1 --strategy cpu --no-calibrate");
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_NE(none.err.find("--no-calibrate"), std::string::npos) << none.err;
  // --stats prints the estimate report.
  Result stats =
      tandem("run -m " + m + " -p hi -n 2 -t 1 --strategy cpu --stats --cost-profile " + profile);
  ASSERT_EQ(stats.code, 0) << stats.err;
  EXPECT_NE(stats.err.find("estimate vs actual: median |error|"), std::string::npos) << stats.err;
  // So does a run that times one step in two.
  Result sampled = tandem("run -m " + m + " -p hi -n 4 -t 1 --strategy cpu --learn-every 2 " +
                          "--cost-profile " + profile);
  ASSERT_EQ(sampled.code, 0) << sampled.err;
  EXPECT_NE(sampled.err.find("estimate vs actual: median |error|"), std::string::npos)
      << sampled.err;
  std::filesystem::remove_all(dir);
}

TEST(Flags, CalibrateWithAModelLearnsItsOpsAndRefusesBadInputFirst) {
  const std::string& m = tiny_model();
  const auto& dir = tandem::test::process_temp_dir("tandem-flags-pass-");
  const std::string profile = (dir / "p.json").string();
  // Bad input is refused before anything is measured or written.
  for (const std::string& bad :
       {"-m " + (dir / "missing.gguf").string(), "-m " + m + " --strategy sideways",
        "-m " + m + " -n 2", "-m " + m + " -p -1"}) {
    Result r = tandem("calibrate --quick -t 1 -o " + profile + " " + bad);
    EXPECT_NE(r.code, 0) << bad;
    EXPECT_NE(r.err.find("error"), std::string::npos) << bad << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(profile)) << bad;
  }
  Result cal =
      tandem("calibrate --quick -t 1 -o " + profile + " -m " + m + " -p 8 -n 4 --strategy cpu");
  ASSERT_EQ(cal.code, 0) << cal.err;
  EXPECT_NE(cal.out.find("strategy cpu: 3 prefills of 8 tokens and 4 generated"), std::string::npos)
      << cal.out;
  // Without -m the profile holds no learned entries; with it, the model's op keys have theirs.
  auto learned_keys = [](const std::string& path) {
    size_t n = 0;
    const nlohmann::json j = nlohmann::json::parse(slurp(path));
    for (const auto& dev : j.at("devices")) {
      const auto& p = dev.at("profile");
      if (!p.contains("learned")) continue;
      for (const auto& e : p.at("learned")) {
        if (e.at("ratios").size() >= 3) ++n;  // enough runs to move the estimate
      }
    }
    return n;
  };
  EXPECT_GT(learned_keys(profile), 0u) << slurp(profile).substr(0, 400);
  const std::string plain = (dir / "plain.json").string();
  ASSERT_EQ(tandem("calibrate --quick -t 1 -o " + plain).code, 0);
  EXPECT_EQ(learned_keys(plain), 0u);
  // run loads the learned profile without a warning.
  Result ok = tandem("run -m " + m + " -p hi -n 2 -t 1 --strategy cpu --cost-profile " + profile);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ok.err.find("warning"), std::string::npos) << ok.err;
}

}  // namespace
