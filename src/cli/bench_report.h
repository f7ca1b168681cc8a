// `tandem bench` results: timing one test like llama-bench (an untimed warm-up run, then the
// timed repetitions) and the report in llama-bench's formats (md, csv, json, jsonl).
#pragma once

#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace tandem::cli {

class Engine;

// One llama-bench test on `engine`, once: n_prompt > 0 evaluates that many random tokens at
// once (ppN); otherwise n_gen tokens are generated one by one (tgN). Tokens come from `rng`.
void run_bench_test(Engine& engine, int n_prompt, int n_gen, std::mt19937& rng);

struct BenchResult {
  std::string model, strategy, test, placement;
  std::optional<int> n_gpu_layers;
  int n_prompt = 0, n_gen = 0;
  std::vector<double> seconds;  // one per timed repetition, in order

  int n_tokens() const { return n_prompt + n_gen; }
  std::vector<double> tokens_per_s() const;
};

// Runs `run` once untimed (uploads weights, builds plans, warms caches), then `repetitions`
// times timed with `now_s` (seconds; steady clock unless a test passes its own).
std::vector<double> time_test(int repetitions, const std::function<void()>& run,
                              const std::function<double()>& now_s = {});

// The output formats of llama-bench that Tandem writes; `format` is one of them.
inline const std::vector<std::string>& bench_output_formats() {
  static const std::vector<std::string> formats{"md", "csv", "json", "jsonl"};
  return formats;
}
std::string format_bench_results(const std::vector<BenchResult>& results,
                                 const std::string& format);

}  // namespace tandem::cli
