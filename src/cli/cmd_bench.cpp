// `tandem bench`: prompt-processing and generation throughput like llama-bench (random tokens,
// no sampling), several strategies and -ngl values side by side; every test has an untimed
// warm-up run, then avg ± stddev over the timed repetitions.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>

#include "bench_report.h"
#include "cli_util.h"
#include "commands_impl.h"
#include "engine_flags.h"
#include "ranks.h"
#include "tandem/error.h"
#include "tandem/registry.h"
#include "tandem/runtime.h"

namespace tandem::cli {

namespace {

std::vector<std::string> default_strategies() {
  if (gpu_present()) return {"cpu", "gpu", "auto"};
  return {"cpu", "auto"};
}

struct BenchOptions {
  EngineFlags engine;
  std::vector<std::string> strategies;
  std::vector<int> n_prompt{512}, n_gen{128}, n_depth{0};
  int reps = 5;
  std::string output = "md";
  uint64_t seed = 1;
  bool stats = false;
  std::string trace;
};

// The tests of one engine: ppN evaluates N random tokens at once, tgN generates N one by one;
// "@ dD" after D tokens of context (llama-bench's names).
struct BenchTest {
  std::string name;
  int n_prompt = 0, n_gen = 0, n_depth = 0;
};

std::vector<BenchTest> bench_tests(const BenchOptions& o) {
  std::vector<BenchTest> tests;
  for (int d : o.n_depth) {
    const std::string at = d > 0 ? " @ d" + std::to_string(d) : "";
    for (int p : o.n_prompt) {
      if (p > 0) tests.push_back({"pp" + std::to_string(p) + at, p, 0, d});
    }
    for (int n : o.n_gen) {
      if (n > 0) tests.push_back({"tg" + std::to_string(n) + at, 0, n, d});
    }
  }
  return tests;
}

int run_bench(const BenchOptions& o) {
  const auto& formats = bench_output_formats();
  TANDEM_CHECK_ARG(std::find(formats.begin(), formats.end(), o.output) != formats.end(),
                   "-o/--output-format", "must be md, csv, json or jsonl (got " + o.output + ")");
  for (int v : o.n_prompt) TANDEM_CHECK_ARG(v >= 0, "--n-prompt", "must be >= 0");
  for (int v : o.n_gen) TANDEM_CHECK_ARG(v >= 0, "--n-gen", "must be >= 0");
  for (int v : o.n_depth) TANDEM_CHECK_ARG(v >= 0, "--n-depth", "must be >= 0");
  const std::vector<BenchTest> tests = bench_tests(o);
  TANDEM_CHECK_ARG(!tests.empty(), "--n-prompt/--n-gen",
                   "need a positive prompt or generation length");
  TANDEM_CHECK_ARG(o.reps >= 1 && o.reps <= 1000, "--repetitions", "must be in [1, 1000]");
  // A saved placement brings its own strategy.
  const std::vector<std::string> strategies = !o.strategies.empty() ? o.strategies
                                              : !o.engine.placement.empty()
                                                  ? std::vector<std::string>{"placement"}
                                                  : default_strategies();
  const size_t ngl_count = std::max<size_t>(1, o.engine.n_gpu_layers.size());
  const size_t moe_count = std::max<size_t>(1, o.engine.n_cpu_moe.size());
  int max_tokens = 1;
  for (const auto& t : tests) max_tokens = std::max(max_tokens, t.n_depth + t.n_prompt + t.n_gen);
  // Every flag is checked before the first model load.
  for (const auto& strategy : strategies) {
    for (size_t i = 0; i < ngl_count; ++i) {
      for (size_t m = 0; m < moe_count; ++m) o.engine.to_options(strategy, i, m);
    }
  }
  print_gpu_flags_warning(o.engine);
  SessionOptions first = o.engine.to_options(strategies.front());
  first.calibrate_if_missing = true;  // the other ranks' sessions, as rank 0's below
  RankRole ranks(o.engine, first);
  if (ranks.done()) return ranks.exit_code();

  std::vector<BenchResult> results;
  std::ostringstream summaries;
  std::mt19937 rng(uint32_t(o.seed));
  for (const auto& strategy : strategies) {
    for (size_t config = 0; config < ngl_count * moe_count; ++config) {
      const size_t ngl_index = config / moe_count, moe_index = config % moe_count;
      SessionOptions eo = o.engine.to_options(strategy, ngl_index, moe_index);
      eo.pipeline = ranks.transport();
      eo.calibrate_if_missing = true;
      if (eo.n_ctx == 0) eo.n_ctx = max_tokens + 1;
      std::string label =
          o.engine.placement.empty() ? strategy : eo.strategy + " (" + o.engine.placement + ")";
      if (eo.n_gpu_layers) label += " ngl " + std::to_string(*eo.n_gpu_layers);
      if (eo.n_cpu_moe) label += " ncmoe " + ncmoe_text(*eo.n_cpu_moe);
      {
        Session engine(eo);  // timing off: the timed figures never include per-op timing
        const std::string model =
            engine.config().name + " " + std::to_string(engine.config().n_layer) + "L";
        Progress progress("bench " + label, tests.size());
        for (size_t t = 0; t < tests.size(); ++t) {
          BenchResult r{model,
                        strategy,
                        tests[t].name,
                        "",
                        eo.n_gpu_layers,
                        eo.n_cpu_moe,
                        tests[t].n_prompt,
                        tests[t].n_gen,
                        tests[t].n_depth,
                        {}};
          r.seconds = time_test(
              o.reps, [&] { run_bench_test(engine, tests[t].n_prompt, tests[t].n_gen, rng); }, {},
              [&] { start_bench_test(engine, tests[t].n_depth, rng); });
          r.placement = engine.placement_summary();
          results.push_back(r);
          progress.update(t + 1);
        }
        progress.finish();
        summaries << "### strategy " << label << "\n" << engine.placement_summary() << "\n";
        if (!o.stats) engine.executor().telemetry().print_debug_summary(summaries);
      }
      if (!o.trace.empty()) {
        // A separate, untimed pass: every test once to warm up, then once on a device timeline.
        eo.timing = TimingMode::Timeline;
        Session engine(eo);
        for (const auto& test : tests) {
          start_bench_test(engine, test.n_depth, rng);
          run_bench_test(engine, test.n_prompt, test.n_gen, rng);
        }
        engine.executor().telemetry().clear_telemetry();
        for (const auto& test : tests) {
          start_bench_test(engine, test.n_depth, rng);
          if (test.n_depth > 0) engine.executor().telemetry().clear_telemetry();
          run_bench_test(engine, test.n_prompt, test.n_gen, rng);
        }
        const size_t configs = strategies.size() * ngl_count * moe_count;
        const size_t index = size_t(&strategy - strategies.data()) * ngl_count * moe_count + config;
        const std::string path =
            configs == 1 ? o.trace : o.trace + "." + std::to_string(index) + ".json";
        write_file(path, engine.executor().telemetry().to_chrome_trace_json(), "--trace");
        summaries << "trace of one untimed run of every test (" << label << "): " << path << "\n";
      }
      if (o.stats) {
        // A separate, untimed pass with per-op timing (it synchronizes after every op).
        eo.timing = TimingMode::PerOp;
        eo.learn = true;
        Session engine(eo);
        for (const auto& test : tests) {
          start_bench_test(engine, test.n_depth, rng);
          run_bench_test(engine, test.n_prompt, test.n_gen, rng);
        }
        summaries << "per-op times from one untimed run of every test:\n";
        engine.executor().telemetry().print_debug_summary(summaries);
        print_estimate_report(estimate_report(engine.executor().telemetry().get_telemetry()),
                              summaries);
        engine.save_learned();
      }
      summaries << "\n";
    }
  }
  std::cout << format_bench_results(results, o.output);
  if (o.output == "md") std::cout << summaries.str();
  return 0;
}

}  // namespace

void add_bench(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("bench", "Measure prompt and generation throughput per strategy");
  auto o = std::make_shared<BenchOptions>();
  o->engine.add(*cmd, /*model_required=*/true, /*list_of_ngl=*/true);
  o->engine.add_ranks(*cmd);
  cmd->add_option("-p,--n-prompt", o->n_prompt,
                  "Prompt tokens, a comma list like llama-bench (0: no prompt test)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen,
                  "Generated tokens, a comma list like llama-bench (0: no generation test)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-d,--n-depth", o->n_depth,
                  "Tokens of context before each test, a comma list like llama-bench's -d "
                  "(the context is evaluated untimed before every repetition)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", o->reps,
                  "Timed repetitions of each test (after one untimed warm-up run)")
      ->capture_default_str();
  cmd->add_option("--strategy", o->strategies,
                  "Strategies to compare (repeat or comma-separate): gpu, cpu, auto, only:BACKEND "
                  "(default: cpu, gpu where a GPU is present, auto)")
      ->delimiter(',');
  cmd->add_option("-o,--output-format,--output", o->output,
                  "Output format as llama-bench's -o: md, csv, json or jsonl")
      ->capture_default_str();
  cmd->add_option("-s,--seed", o->seed, "Seed of the random tokens")->capture_default_str();
  cmd->add_flag("--stats", o->stats,
                "After the timed runs, time every op in one separate untimed run of every test "
                "and print the per-op summary");
  cmd->add_option("--trace", o->trace,
                  "After the timed runs, write a Chrome trace of one untimed run of every test "
                  "(after a warm-up), segments and streamed copies timed on the devices' queues; "
                  "FILE.N.json for the N-th strategy, -ngl and -ncmoe when there are several");
  cmd->callback([&run, o]() { run = [o]() { return run_bench(*o); }; });
}

}  // namespace tandem::cli
