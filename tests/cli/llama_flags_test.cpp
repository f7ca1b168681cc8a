// llama.cpp's one-dash flags reach Tandem's parser as Tandem's; the llama.cpp and llama-bench
// flags Tandem lacks are refused by name (not misread as a short flag and its value); GPU flags
// on a machine without a GPU say so; `devices` says why a backend this build knows is absent.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_harness.h"
#include "llama_flags.h"
#include "tandem/registry.h"

namespace {

using cli_test::lines;
using cli_test::Result;
using cli_test::tandem;
using cli_test::tiny_model;
using tandem::cli::translate_llama_flags;

bool gpu_present() {
  for (const auto& id : tandem::available_backend_ids()) {
    if (id.rfind("cuda:", 0) == 0) return true;
  }
  return false;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(LlamaFlags, OneDashSpellingsBecomeTandemsAndValuesStayAsTyped) {
  std::vector<std::string> args{"run", "-ngl", "3",    "-fa", "-ot", "-ngl=cpu", "-ts",
                                "3,1", "-sm",  "none", "-p",  "-fa", "-n",       "-1"};
  EXPECT_EQ(translate_llama_flags(args), "");
  const std::vector<std::string> expected{"run",
                                          "--ngl",
                                          "3",
                                          "--flash-attn",
                                          "--override-tensor",
                                          "-ngl=cpu",
                                          "--tensor-split",
                                          "3,1",
                                          "--split-mode",
                                          "none",
                                          "-p",
                                          "-fa",
                                          "-n",
                                          "-1"};
  EXPECT_EQ(args, expected) << "a prompt or an override pattern is free text, never a flag";
  std::vector<std::string> moe{"bench", "-ncmoe", "0,8", "-cmoe"};
  EXPECT_EQ(translate_llama_flags(moe), "");
  EXPECT_EQ(moe, (std::vector<std::string>{"bench", "--n-cpu-moe", "0,8", "--cpu-moe"}));
  std::vector<std::string> serve{"serve", "-np", "8", "-c", "4096"};
  EXPECT_EQ(translate_llama_flags(serve), "");
  EXPECT_EQ(serve, (std::vector<std::string>{"serve", "--parallel", "8", "-c", "4096"}));
}

TEST(LlamaFlags, FlagsTandemLacksAreRefusedByName) {
  struct Case {
    std::vector<std::string> args;
    std::string flag, hint;
  };
  const std::vector<Case> cases{
      {{"run", "-ctk", "q8_0"}, "-ctk", "--kv-type"},
      {{"bench", "--cache-type-v=q8_0"}, "--cache-type-v", "--kv-type"},
      {{"run", "-nkvo"}, "-nkvo", "not supported"},
      {{"run", "-mg", "1"}, "-mg", "only:cuda:N"},
      {{"run", "-tb", "4"}, "-tb", "-t"},
      {{"bench", "-ub", "512"}, "-ub", "one batch"},
      {{"run", "-b", "512"}, "-b", "one batch"},
      {{"run", "-cnv"}, "-cnv", "one prompt"},
      {{"run", "--mlock"}, "--mlock", "memory-maps"},
      {{"bench", "-mmp", "0"}, "-mmp", "memory-maps"},
      {{"run", "-dev", "cuda0"}, "-dev", "--strategy"},
      {{"bench", "-pg", "512,128"}, "-pg", "-p and -n"},
      {{"run", "--numa", "distribute"}, "--numa", "not supported"},
      {{"run", "-xyz"}, "-xyz", "unknown flag"},
  };
  for (auto c : cases) {
    const std::string error = translate_llama_flags(c.args);
    EXPECT_EQ(error.rfind(c.flag + ": ", 0), 0u) << c.flag << ": " << error;
    EXPECT_NE(error.find(c.hint), std::string::npos) << c.flag << ": " << error;
  }
}

TEST(LlamaFlags, CacheTypesMapToOneKvType) {
  // Equal K and V types (f16 unless given, as in llama.cpp) become --kv-type.
  std::vector<std::string> args{"run", "-ctk", "f32", "-p", "-ctk", "--cache-type-v=f32"};
  EXPECT_EQ(translate_llama_flags(args), "");
  EXPECT_EQ(args, (std::vector<std::string>{"run", "-p", "-ctk", "--kv-type", "f32"}))
      << "the prompt '-ctk' is text";
  args = {"bench", "-ctv", "f16"};
  EXPECT_EQ(translate_llama_flags(args), "");
  EXPECT_EQ(args, (std::vector<std::string>{"bench", "--kv-type", "f16"}));
  // Different types, unknown types, a llama-bench list, a missing type: refused by name.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused{
      {{"run", "-ctk", "f32"}, "-ctk/-ctv: separate K and V cache types (f32, f16)"},
      {{"bench", "-ctk", "f16,q8_0"}, "-ctk: cache type 'f16,q8_0' is not supported"},
      {{"run", "--cache-type-k=q4_0"}, "--cache-type-k: cache type 'q4_0' is not supported"},
      {{"run", "-ctv"}, "-ctv: needs a cache type"},
  };
  for (auto [a, want] : refused) {
    const std::string error = translate_llama_flags(a);
    EXPECT_EQ(error.rfind(want, 0), 0u) << error;
  }
  // The binary runs with them.
  const std::string& m = tiny_model();
  Result r = tandem("run -m " + m + " -p hi -n 1 --strategy cpu -ctk f32 -ctv f32");
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST(LlamaFlags, RefusedByTheBinaryWithOneLineAndNothingOnStdout) {
  const std::string& m = tiny_model();
  for (std::string flag : {"-ctk q8_0", "-nkvo", "-mg 0", "-tb 2", "-ub 64", "-cnv", "-dev cpu"}) {
    Result r = tandem("run -m " + m + " -p hi -n 1 --strategy cpu " + flag);
    EXPECT_EQ(r.code, 2) << flag;
    EXPECT_EQ(lines(r.err), 1u) << flag << "\n" << r.err;
    const std::string name = flag.substr(0, flag.find(' '));
    EXPECT_EQ(r.err.rfind("tandem: error: " + name + ": ", 0), 0u) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  Result r = tandem("bench -m " + m + " -r 1 --strategy cpu -pg 8,4");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("tandem: error: -pg: ", 0), 0u) << r.err;
  // A prompt that looks like a flag is a prompt.
  r = tandem("run -m " + m + " -p -cnv -n 0 --strategy cpu");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "-cnv\n");
}

TEST(LlamaFlags, PromptFromAFileLikeLlamaCpp) {
  const std::string& m = tiny_model();
  const auto dir =
      std::filesystem::temp_directory_path() / ("tandem_prompt_file_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "prompt.txt").string();
  std::ofstream(file) << "a\\nb\n";  // a\nb and a final newline, which llama.cpp drops
  Result r = tandem("run -m " + m + " -n 0 --strategy cpu -f " + file);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "a\\nb\n");
  r = tandem("run -m " + m + " -n 0 --strategy cpu -e --file " + file);
  EXPECT_EQ(r.out, "a\nb\n");
  // -p and -f exclude each other; one of them is needed; a missing file is named.
  EXPECT_EQ(tandem("run -m " + m + " -p hi -f " + file).code, 2);
  r = tandem("run -m " + m + " -n 1 --strategy cpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("-p TEXT or -f FILE"), std::string::npos) << r.err;
  r = tandem("run -m " + m + " -n 1 --strategy cpu -f " + (dir / "missing.txt").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("[--file] cannot read"), std::string::npos) << r.err;
  r = tandem("run -m " + m + " -n 1 --strategy cpu -f " + dir.string());
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
  EXPECT_EQ(tandem("run -m " + m + " -p '' -n 1 --strategy cpu").code, 0)
      << "an empty prompt is BOS";
  std::filesystem::remove_all(dir);
}

TEST(LlamaFlags, GpuFlagsWithoutAGpuSaySoOnce) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present";
  const std::string& m = tiny_model();
  const std::string run = "run -m " + m + " -p hi -n 1 --strategy cpu ";
  for (std::string flag : {"--gpu-mem 1G", "-ngl 2", "--ngl 99", "-ts 1"}) {
    Result r = tandem(run + flag);
    ASSERT_EQ(r.code, 0) << flag << ": " << r.err;
    EXPECT_EQ(count(r.err, "tandem: warning: "), 1u) << flag << ": " << r.err;
    EXPECT_NE(r.err.find("no GPU on this machine, so everything runs on the CPU (cuda: "),
              std::string::npos)
        << r.err;
  }
  Result r = tandem(run + "--gpu-mem 1G -ngl 2");
  EXPECT_NE(r.err.find("--gpu-mem, --n-gpu-layers: no GPU"), std::string::npos) << r.err;
  r = tandem(run + "-ngl 0");
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << "-ngl 0 asks for no GPU: " << r.err;
  r = tandem("bench -m " + m + " -p 8 -n 0 -r 1 --strategy cpu -ngl 0,1,2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count(r.err, "--n-gpu-layers: no GPU"), 1u) << r.err;
  r = tandem("logits -m " + m + " --tokens 1,2 --out /dev/null --strategy cpu --gpu-mem 1G");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count(r.err, "--gpu-mem: no GPU"), 1u) << r.err;
}

TEST(LlamaFlags, DevicesSaysWhyABackendIsAbsent) {
  const auto absent = tandem::absent_backends();
  if (!gpu_present()) {
    bool cuda = false;
    for (const auto& a : absent) cuda = cuda || a.name == "cuda";
    EXPECT_TRUE(cuda) << "no GPU is listed, so cuda must be absent with a reason";
  }
  Result r = tandem("devices");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const auto& a : absent) {
    EXPECT_FALSE(a.reason.empty()) << a.name;
    EXPECT_NE(r.out.find(a.name + ": absent: " + a.reason), std::string::npos) << r.out;
  }
  r = tandem("devices --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  size_t listed_absent = 0;
  for (const auto& e : j) {
    if (e["available"] == false) {
      ++listed_absent;
      EXPECT_FALSE(e["reason"].get<std::string>().empty()) << e.dump();
    } else {
      EXPECT_TRUE(e.contains("capabilities")) << e.dump();
    }
  }
  EXPECT_EQ(listed_absent, absent.size());
}

}  // namespace
