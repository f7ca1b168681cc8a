// `tandem bench` like llama-bench: each test runs once untimed before its timed repetitions;
// the report gives every sample, the mean and the sample standard deviation in md, csv, json
// and jsonl; -p/-n/-ngl take comma lists; --stats never reaches a timed figure.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_report.h"
#include "cli_harness.h"
#include "tandem/runtime.h"

namespace {

using cli_test::lines;
using cli_test::Result;
using cli_test::tandem;
using cli_test::tiny_model;
namespace fs = std::filesystem;
using tandem::cli::BenchResult;
using tandem::cli::format_bench_results;
using tandem::cli::time_test;

TEST(Bench, WarmUpRunIsNeverTimed) {
  // A fake clock advanced by the runs: the first (warm-up) run costs 1000 s, every other 2 s.
  double clock_s = 0.0;
  int runs = 0;
  auto run = [&] { clock_s += runs++ == 0 ? 1000.0 : 2.0; };
  std::vector<double> seconds = time_test(3, run, [&] { return clock_s; });
  EXPECT_EQ(runs, 4) << "one warm-up and three timed repetitions";
  EXPECT_EQ(seconds, (std::vector<double>{2.0, 2.0, 2.0}));
}

TEST(Bench, ContextBeforeEachRunIsNeverTimed) {
  // The setup (a test's context at depth) costs 500 s on the fake clock before every run, the
  // run 2 s: only the runs are timed, and the setup precedes the warm-up too.
  double clock_s = 0.0;
  std::vector<std::string> order;
  auto setup = [&] {
    clock_s += 500.0;
    order.push_back("setup");
  };
  auto run = [&] {
    clock_s += 2.0;
    order.push_back("run");
  };
  std::vector<double> seconds = time_test(
      2, run, [&] { return clock_s; }, setup);
  EXPECT_EQ(seconds, (std::vector<double>{2.0, 2.0}));
  EXPECT_EQ(order, (std::vector<std::string>{"setup", "run", "setup", "run", "setup", "run"}));
}

BenchResult result_with(std::vector<double> seconds) {
  BenchResult r;
  r.model = "m 2L";
  r.strategy = "cpu";
  r.test = "tg10";
  r.n_gen = 10;
  r.seconds = std::move(seconds);
  return r;
}

TEST(Bench, ReportGivesSamplesMeanAndSampleStddev) {
  // 10 tokens in 1, 0.5 and 0.25 s: 10, 20 and 40 t/s; mean 70/3, sample stddev
  // sqrt(((10-m)^2 + (20-m)^2 + (40-m)^2) / 2).
  const BenchResult r = result_with({1.0, 0.5, 0.25});
  const double mean = 70.0 / 3.0;
  const double stddev =
      std::sqrt((std::pow(10 - mean, 2) + std::pow(20 - mean, 2) + std::pow(40 - mean, 2)) / 2.0);
  auto j = nlohmann::json::parse(format_bench_results({r}, "json"));
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["samples_ts"], (std::vector<double>{10.0, 20.0, 40.0}));
  EXPECT_EQ(j[0]["samples_ns"], (std::vector<int64_t>{1000000000, 500000000, 250000000}));
  EXPECT_NEAR(j[0]["avg_ts"].get<double>(), mean, 1e-9);
  EXPECT_NEAR(j[0]["stddev_ts"].get<double>(), stddev, 1e-9);
  EXPECT_EQ(j[0]["avg_ns"].get<int64_t>(), 583333333);
  EXPECT_EQ(j[0]["repetitions"], 3);
  EXPECT_TRUE(j[0]["n_gpu_layers"].is_null());
  EXPECT_TRUE(j[0]["n_cpu_moe"].is_null());

  std::string md = format_bench_results({r}, "md");
  EXPECT_NE(md.find("23.33 ± 15.28"), std::string::npos) << md;
  EXPECT_EQ(md.find("ngl"), std::string::npos) << "no -ngl column without -ngl";
  EXPECT_EQ(md.find("n_cpu_moe"), std::string::npos) << "no -ncmoe column without -ncmoe";
  // --n-cpu-moe values, --cpu-moe written as "all".
  BenchResult moe = r, all = r;
  moe.n_cpu_moe = 8;
  all.n_cpu_moe = tandem::kAllLayers;
  j = nlohmann::json::parse(format_bench_results({moe, all}, "json"));
  EXPECT_EQ(j[0]["n_cpu_moe"], 8);
  EXPECT_EQ(j[1]["n_cpu_moe"], "all");
  md = format_bench_results({moe, all}, "md");
  EXPECT_NE(md.find("| n_cpu_moe |"), std::string::npos) << md;
  EXPECT_NE(md.find("| all "), std::string::npos) << md;

  std::istringstream csv(format_bench_results({r, r}, "csv"));
  std::string header, row;
  std::getline(csv, header);
  EXPECT_EQ(header.rfind("model,strategy,n_gpu_layers,n_cpu_moe,test,", 0), 0u) << header;
  int rows = 0;
  while (std::getline(csv, row)) ++rows;
  EXPECT_EQ(rows, 2);

  std::istringstream jsonl(format_bench_results({r, r}, "jsonl"));
  int objects = 0;
  for (std::string line; std::getline(jsonl, line); ++objects) {
    EXPECT_EQ(nlohmann::json::parse(line)["test"], "tg10");
  }
  EXPECT_EQ(objects, 2);
}

TEST(Bench, OutputFormatIsDashO) {
  const std::string& m = tiny_model();
  Result r = tandem("bench -m " + m + " -p 8 -n 2 -r 2 --strategy cpu -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  for (const auto& row : j) EXPECT_EQ(row["samples_ns"].size(), 2u);
  r = tandem("bench -m " + m + " -p 8 -n 0 -r 2 --strategy cpu -o csv");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("model,strategy,", 0), 0u) << r.out;
  EXPECT_EQ(lines(r.out), 2u) << r.out;
  r = tandem("bench -m " + m + " -p 8 -n 0 -r 2 --strategy cpu -o jsonl");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["test"], "pp8");
}

TEST(Bench, ListsOfPromptGenAndNglRunEachValue) {
  const std::string& m = tiny_model();
  Result r = tandem("bench -m " + m + " -p 8,16 -n 2 -r 1 --strategy cpu -ngl 0,1,2 -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 9u) << "3 -ngl values x (pp8, pp16, tg2)";
  std::vector<std::string> seen;
  for (const auto& row : j) {
    seen.push_back(std::to_string(row["n_gpu_layers"].get<int>()) + " " +
                   row["test"].get<std::string>());
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"0 pp8", "0 pp16", "0 tg2", "1 pp8", "1 pp16", "1 tg2",
                                            "2 pp8", "2 pp16", "2 tg2"}));
  r = tandem("bench -m " + m + " -p 8 -n 0 -r 1 --strategy cpu -ngl 0,2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| ngl "), std::string::npos) << r.out;
  r = tandem("bench -m " + m + " -p 8 -n 0 -r 1 --strategy cpu -ngl 0,-4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--n-gpu-layers"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << "checked before the first run: " << r.out;
}

TEST(Bench, DepthRunsEachTestAfterThatManyTokensOfContext) {
  // llama-bench's -d: every test of every depth, named "tgN @ dD", n_depth in the report; the
  // context must fit (tiny's context length is far above 8 + 16 + 4).
  const std::string& m = tiny_model();
  Result r = tandem("bench -m " + m + " -p 4 -n 4 -d 0,16 -r 1 --strategy cpu -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  std::vector<std::string> seen;
  for (const auto& row : j) {
    seen.push_back(row["test"].get<std::string>() + " " +
                   std::to_string(row["n_depth"].get<int>()));
    EXPECT_GT(row["avg_ts"].get<double>(), 0.0);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"pp4 0", "tg4 0", "pp4 @ d16 16", "tg4 @ d16 16"}));
  r = tandem("bench -m " + m + " -p 4 -n 0 -d -1 -r 1 --strategy cpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--n-depth"), std::string::npos) << r.err;
}

TEST(Bench, StatsRunIsSeparateFromTheTimedRuns) {
  const std::string& m = tiny_model();
  Result timed = tandem("bench -m " + m + " -p 8 -n 2 -r 3 --strategy cpu");
  ASSERT_EQ(timed.code, 0) << timed.err;
  EXPECT_NE(timed.out.find("op times not measured"), std::string::npos) << timed.out;
  Result stats = tandem("bench -m " + m + " -p 8 -n 2 -r 3 --strategy cpu --stats");
  ASSERT_EQ(stats.code, 0) << stats.err;
  EXPECT_NE(stats.out.find("per-op times from one untimed run"), std::string::npos) << stats.out;
  EXPECT_EQ(stats.out.find("op times not measured"), std::string::npos) << stats.out;
  Result json = tandem("bench -m " + m + " -p 8 -n 2 -r 3 --strategy cpu --stats -o json");
  ASSERT_EQ(json.code, 0) << json.err;
  for (const auto& row : nlohmann::json::parse(json.out)) {
    EXPECT_EQ(row["samples_ns"].size(), 3u) << "the --stats run is not a sample";
  }
}

TEST(Bench, TraceRunIsSeparateFromTheTimedRuns) {
  const std::string& m = tiny_model();
  const fs::path trace =
      fs::temp_directory_path() / ("tandem_bench_trace_" + std::to_string(getpid()) + ".json");
  Result json =
      tandem("bench -m " + m + " -p 8 -n 2 -r 3 --strategy cpu -o json --trace " + trace.string());
  ASSERT_EQ(json.code, 0) << json.err;
  for (const auto& row : nlohmann::json::parse(json.out)) {
    EXPECT_EQ(row["samples_ns"].size(), 3u) << "the traced run is not a sample";
  }
  ASSERT_TRUE(fs::exists(trace));
  std::ifstream file(trace);
  const auto events = nlohmann::json::parse(file);
  EXPECT_FALSE(events.empty());
  fs::remove(trace);
  // The timed engine runs with timing off: its summary has no measured op times.
  Result md = tandem("bench -m " + m + " -p 8 -n 2 -r 3 --strategy cpu --trace " + trace.string());
  ASSERT_EQ(md.code, 0) << md.err;
  EXPECT_NE(md.out.find("op times not measured"), std::string::npos) << md.out;
  fs::remove(trace);
}

}  // namespace
