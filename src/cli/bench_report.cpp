#include "bench_report.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_util.h"
#include "tandem/runtime.h"

namespace tandem::cli {

void start_bench_test(Session& engine, int n_depth, std::mt19937& rng) {
  engine.reset();
  if (n_depth <= 0) return;
  std::uniform_int_distribution<int32_t> token(0, int32_t(engine.config().n_vocab - 1));
  std::vector<int32_t> context(static_cast<size_t>(n_depth));
  for (auto& t : context) t = token(rng);
  engine.eval(context);
}

void run_bench_test(Session& engine, int n_prompt, int n_gen, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(0, int32_t(engine.config().n_vocab - 1));
  if (n_prompt > 0) {
    std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
    for (auto& t : prompt) t = token(rng);
    engine.eval(prompt);
    return;
  }
  int32_t t = token(rng);
  for (int i = 0; i < n_gen; ++i) {
    engine.eval(std::span<const int32_t>(&t, 1));
    t = token(rng);
  }
}

namespace {

double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int64_t> to_ns(const std::vector<double>& seconds) {
  std::vector<int64_t> ns;
  for (double s : seconds) ns.push_back(int64_t(s * 1e9 + 0.5));
  return ns;
}

nlohmann::ordered_json to_json(const BenchResult& r) {
  std::vector<double> ns_double;
  for (double s : r.seconds) ns_double.push_back(s * 1e9);
  const MeanStd ns = mean_std(ns_double);
  const MeanStd ts = mean_std(r.tokens_per_s());
  nlohmann::ordered_json j{{"model", r.model},
                           {"strategy", r.strategy},
                           {"n_gpu_layers", nullptr},
                           {"n_cpu_moe", nullptr},
                           {"test", r.test},
                           {"n_prompt", r.n_prompt},
                           {"n_gen", r.n_gen},
                           {"n_depth", r.n_depth},
                           {"repetitions", r.seconds.size()},
                           {"avg_ns", int64_t(ns.mean + 0.5)},
                           {"stddev_ns", int64_t(ns.stddev + 0.5)},
                           {"avg_ts", ts.mean},
                           {"stddev_ts", ts.stddev},
                           {"samples_ns", to_ns(r.seconds)},
                           {"samples_ts", r.tokens_per_s()},
                           {"placement", r.placement}};
  if (r.n_gpu_layers) j["n_gpu_layers"] = *r.n_gpu_layers;
  if (r.n_cpu_moe) {
    j["n_cpu_moe"] = *r.n_cpu_moe == kAllLayers ? nlohmann::ordered_json("all")
                                                : nlohmann::ordered_json(*r.n_cpu_moe);
  }
  return j;
}

std::string csv_field(const nlohmann::ordered_json& v) {
  std::string text;
  if (v.is_string()) {
    text = v.get<std::string>();
  } else if (v.is_array()) {
    for (const auto& e : v) text += (text.empty() ? "" : " ") + e.dump();
  } else if (!v.is_null()) {
    text = v.dump();
  }
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

}  // namespace

std::string ncmoe_text(int n_cpu_moe) {
  return n_cpu_moe == kAllLayers ? "all" : std::to_string(n_cpu_moe);
}

std::vector<double> BenchResult::tokens_per_s() const {
  std::vector<double> ts;
  for (double s : seconds) ts.push_back(s > 0.0 ? double(n_tokens()) / s : 0.0);
  return ts;
}

std::vector<double> time_test(int repetitions, const std::function<void()>& run,
                              const std::function<double()>& now_s,
                              const std::function<void()>& setup) {
  const auto& now = now_s ? now_s : std::function<double()>(steady_now_s);
  if (setup) setup();
  run();  // warm-up, never part of a figure
  std::vector<double> seconds;
  for (int i = 0; i < repetitions; ++i) {
    if (setup) setup();
    const double t0 = now();
    run();
    seconds.push_back(now() - t0);
  }
  return seconds;
}

std::string format_bench_results(const std::vector<BenchResult>& results,
                                 const std::string& format) {
  std::ostringstream out;
  if (format == "json" || format == "jsonl") {
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    for (const auto& r : results) {
      if (format == "jsonl") out << to_json(r).dump() << "\n";
      all.push_back(to_json(r));
    }
    if (format == "json") out << all.dump(2) << "\n";
    return out.str();
  }
  if (format == "csv") {
    bool header = true;
    for (const auto& r : results) {
      const nlohmann::ordered_json j = to_json(r);
      std::string line;
      if (header) {
        for (const auto& [key, value] : j.items()) line += (line.empty() ? "" : ",") + key;
        out << line << "\n";
        line.clear();
        header = false;
      }
      for (const auto& [key, value] : j.items())
        line += (line.empty() ? "" : ",") + csv_field(value);
      out << line << "\n";
    }
    return out.str();
  }
  bool any_ngl = false, any_ncmoe = false;
  for (const auto& r : results) {
    any_ngl = any_ngl || r.n_gpu_layers.has_value();
    any_ncmoe = any_ncmoe || r.n_cpu_moe.has_value();
  }
  std::vector<std::string> header{"model", "strategy"};
  if (any_ngl) header.push_back("ngl");
  if (any_ncmoe) header.push_back("n_cpu_moe");
  for (const char* h : {"placement", "test", "reps", "t/s"}) header.push_back(h);
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : results) {
    const MeanStd ms = mean_std(r.tokens_per_s());
    char ts[64];
    std::snprintf(ts, sizeof ts, "%.2f ± %.2f", ms.mean, ms.stddev);
    std::vector<std::string> row{r.model, r.strategy};
    if (any_ngl) row.push_back(r.n_gpu_layers ? std::to_string(*r.n_gpu_layers) : "-");
    if (any_ncmoe) row.push_back(r.n_cpu_moe ? ncmoe_text(*r.n_cpu_moe) : "-");
    for (std::string cell :
         {r.placement, r.test, std::to_string(r.seconds.size()), std::string(ts)}) {
      row.push_back(cell);
    }
    rows.push_back(row);
  }
  out << markdown_table(header, rows) << "\n";
  return out.str();
}

}  // namespace tandem::cli
