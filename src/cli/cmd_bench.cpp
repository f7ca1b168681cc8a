// `tandem bench`: prompt-processing and generation throughput like llama-bench (random tokens,
// no sampling), several strategies side by side, mean and spread over repetitions.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_util.h"
#include "commands_impl.h"
#include "engine.h"
#include "engine_flags.h"
#include "tandem/error.h"
#include "tandem/registry.h"

namespace tandem::cli {

namespace {

struct BenchResult {
  std::string strategy, test, placement;
  int n_prompt = 0, n_gen = 0;
  std::vector<double> tokens_per_s;
};

double time_s(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<std::string> default_strategies() {
  std::vector<std::string> s{"cpu"};
  for (const auto& id : available_backend_ids()) {
    if (id.rfind("cuda:", 0) == 0) {
      s.push_back("gpu");
      break;
    }
  }
  s.push_back("auto");
  return s;
}

}  // namespace

void add_bench(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("bench", "Measure prompt and generation throughput per strategy");
  struct Opts {
    EngineFlags engine;
    std::vector<std::string> strategies;
    int n_prompt = 512, n_gen = 128, reps = 5;
    std::string output = "md";
    uint64_t seed = 1;
  };
  auto o = std::make_shared<Opts>();
  o->engine.add(*cmd);
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens (0: skip the prompt test)")
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen, "Generated tokens (0: skip the generation test)")
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", o->reps, "Repetitions of each test")->capture_default_str();
  cmd->add_option("--strategy", o->strategies,
                  "Strategies to compare (repeat or comma-separate): gpu, cpu, auto, only:BACKEND "
                  "(default: cpu, gpu where a GPU is present, auto)")
      ->delimiter(',');
  cmd->add_option("--output-format", o->output, "md or json")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random tokens")->capture_default_str();
  cmd->callback([&run, o]() {
    run = [o]() {
      TANDEM_CHECK_ARG(o->output == "md" || o->output == "json", "--output-format",
                       "must be md or json (got " + o->output + ")");
      TANDEM_CHECK_ARG(o->n_prompt >= 0 && o->n_gen >= 0 && (o->n_prompt + o->n_gen) > 0,
                       "--n-prompt/--n-gen", "need a positive prompt or generation length");
      TANDEM_CHECK_ARG(o->reps >= 1 && o->reps <= 1000, "--repetitions", "must be in [1, 1000]");
      std::vector<std::string> strategies =
          o->strategies.empty() ? default_strategies() : o->strategies;
      std::vector<BenchResult> results;
      std::ostringstream summaries;
      std::mt19937 rng(uint32_t(o->seed));
      std::string model_desc;
      for (const auto& strategy : strategies) {
        EngineOptions eo = o->engine.to_options(strategy);
        if (eo.n_ctx == 0) eo.n_ctx = std::max(o->n_prompt, 1) + o->n_gen + 1;
        eo.record_events = true;
        Engine engine(eo);
        if (model_desc.empty()) {
          model_desc = engine.config().name + " " + std::to_string(engine.config().n_layer) + "L";
        }
        std::uniform_int_distribution<int32_t> token(0, int32_t(engine.config().n_vocab - 1));
        std::vector<int32_t> prompt(size_t(std::max(o->n_prompt, 1)));
        for (auto& t : prompt) t = token(rng);
        Progress progress("bench " + strategy, uint64_t(o->reps + 1) * 2);
        uint64_t step = 0;
        auto run_prompt = [&]() {
          engine.reset();
          engine.eval(std::span<const int32_t>(prompt.data(), size_t(o->n_prompt)));
        };
        auto run_gen = [&]() {
          engine.reset();
          int32_t t = prompt[0];
          for (int i = 0; i < o->n_gen; ++i) {
            engine.eval(std::span<const int32_t>(&t, 1));
            t = token(rng);
          }
        };
        if (o->n_prompt > 0) {
          BenchResult r{strategy, "pp" + std::to_string(o->n_prompt), "", o->n_prompt, 0, {}};
          run_prompt();  // warm-up: uploads weights, builds plans
          progress.update(++step);
          for (int i = 0; i < o->reps; ++i) {
            r.tokens_per_s.push_back(o->n_prompt / time_s(run_prompt));
            progress.update(++step);
          }
          r.placement = engine.placement_summary();
          results.push_back(r);
        }
        if (o->n_gen > 0) {
          BenchResult r{strategy, "tg" + std::to_string(o->n_gen), "", 0, o->n_gen, {}};
          run_gen();
          progress.update(++step);
          for (int i = 0; i < o->reps; ++i) {
            r.tokens_per_s.push_back(o->n_gen / time_s(run_gen));
            progress.update(++step);
          }
          r.placement = engine.placement_summary();
          results.push_back(r);
        }
        progress.finish();
        summaries << "### strategy " << strategy << "\n" << engine.placement_summary() << "\n";
        engine.executor().telemetry().print_debug_summary(summaries);
        summaries << "\n";
      }
      if (o->output == "json") {
        nlohmann::json j = nlohmann::json::array();
        for (const auto& r : results) {
          MeanStd ms = mean_std(r.tokens_per_s);
          j.push_back({{"model", o->engine.model},
                       {"strategy", r.strategy},
                       {"test", r.test},
                       {"n_prompt", r.n_prompt},
                       {"n_gen", r.n_gen},
                       {"repetitions", o->reps},
                       {"samples_ts", r.tokens_per_s},
                       {"avg_ts", ms.mean},
                       {"stddev_ts", ms.stddev},
                       {"placement", r.placement}});
        }
        std::cout << j.dump(2) << "\n";
        return 0;
      }
      std::vector<std::vector<std::string>> rows;
      for (const auto& r : results) {
        MeanStd ms = mean_std(r.tokens_per_s);
        char ts[64];
        std::snprintf(ts, sizeof ts, "%.2f ± %.2f", ms.mean, ms.stddev);
        rows.push_back({model_desc, r.strategy, r.placement, r.test, ts});
      }
      std::cout << markdown_table({"model", "strategy", "placement", "test", "t/s"}, rows) << "\n";
      std::cout << summaries.str();
      return 0;
    };
  });
}

}  // namespace tandem::cli
