// `tandem bench` results: timing one test like llama-bench (an untimed warm-up run, then the
// timed repetitions) and the report in llama-bench's formats (md, csv, json, jsonl).
#pragma once

#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace tandem {
class Session;
}  // namespace tandem

namespace tandem::cli {

// Before each run of a test (untimed): an empty context, then `n_depth` random tokens evaluated
// at once, as llama-bench's -d (a test at depth N runs after N tokens of context).
void start_bench_test(Session& engine, int n_depth, std::mt19937& rng);
// One llama-bench test on `engine`, once, after start_bench_test: n_prompt > 0 evaluates that
// many random tokens at once (ppN); otherwise n_gen tokens are generated one by one (tgN).
// Tokens come from `rng`.
void run_bench_test(Session& engine, int n_prompt, int n_gen, std::mt19937& rng);

struct BenchResult {
  std::string model, strategy, test, placement;
  std::optional<int> n_gpu_layers;
  std::optional<int> n_cpu_moe;  // kAllLayers: --cpu-moe
  int n_prompt = 0, n_gen = 0;
  int n_depth = 0;              // tokens of context before the test (not counted in t/s)
  std::vector<double> seconds;  // one per timed repetition, in order

  int n_tokens() const { return n_prompt + n_gen; }
  std::vector<double> tokens_per_s() const;
};

// Runs `run` once untimed (uploads weights, builds plans, warms caches), then `repetitions`
// times timed with `now_s` (seconds; steady clock unless a test passes its own). `setup`, when
// given, runs before every run and is never timed (the context of a test at depth).
std::vector<double> time_test(int repetitions, const std::function<void()>& run,
                              const std::function<double()>& now_s = {},
                              const std::function<void()>& setup = {});

// A --n-cpu-moe value as the reports write it ("all" for --cpu-moe).
std::string ncmoe_text(int n_cpu_moe);

// The output formats of llama-bench that Tandem writes; `format` is one of them.
inline const std::vector<std::string>& bench_output_formats() {
  static const std::vector<std::string> formats{"md", "csv", "json", "jsonl"};
  return formats;
}
std::string format_bench_results(const std::vector<BenchResult>& results,
                                 const std::string& format);

}  // namespace tandem::cli
