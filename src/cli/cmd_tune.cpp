// `tandem tune`: measures a family of placements under the GPU budget (the -ngl values that
// fit, the output layer on the GPU or not, FFN-only and attention-only offload, for a mixture
// of experts its experts in host memory and the --n-cpu-moe values that fit, and auto),
// ranks them by measured prompt and generation speed, says where auto stands, and can save the
// best for run and bench (--placement FILE).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <random>

#include "bench_report.h"
#include "cli_util.h"
#include "commands_impl.h"
#include "engine_flags.h"
#include "placement_file.h"
#include "tandem/bytes.h"
#include "tandem/error.h"
#include "tandem/registry.h"
#include "tandem/runtime.h"

namespace tandem::cli {

namespace {

struct Variant {
  std::string label;
  SessionOptions options;
  double predicted_pp = 0.0, predicted_tg = 0.0;
  size_t device_bytes = 0;
  double pp = 0.0, tg = 0.0, score = 0.0;
  std::string placement;
};

double median_rate(const std::vector<double>& seconds, int tokens) {
  std::vector<double> s = seconds;
  std::sort(s.begin(), s.end());
  return s.empty() ? 0.0 : tokens / s[s.size() / 2];
}

// -ngl N's pins, as the engine makes them (layers >= N, the embedding and below n_layer + 1 the
// output on the host); with_output keeps the output layer off that list.
std::vector<TensorPin> ngl_pins(int n, int n_layer, bool with_output) {
  std::vector<TensorPin> pins;
  std::string layers;
  for (int l = n; l < n_layer; ++l) layers += (layers.empty() ? "" : "|") + std::to_string(l);
  if (!layers.empty()) pins.push_back({"^blk\\.(" + layers + ")\\..*$", "cpu"});
  pins.push_back({"^token_embd\\.weight$", "cpu"});
  if (!with_output && n <= n_layer) pins.push_back({"^output(_norm)?\\.weight$", "cpu"});
  return pins;
}

}  // namespace

void add_tune(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand(
      "tune",
      "Measure a family of placements under the GPU budget, rank them, show where auto "
      "stands, and save the best (--save FILE, for run/bench --placement FILE)");
  struct Opts {
    EngineFlags engine;
    int n_prompt = 512, n_gen = 64, reps = 2;
    std::string save;
  };
  auto o = std::make_shared<Opts>();
  o->engine.add(*cmd);
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens of the prefill test")
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen, "Tokens of the generation test")->capture_default_str();
  cmd->add_option("-r,--repetitions", o->reps, "Timed repetitions (after a warm-up)")
      ->capture_default_str();
  cmd->add_option("--save", o->save, "Write the best placement to FILE (JSON)");
  cmd->callback([&run, o]() {
    run = [o]() {
      TANDEM_CHECK_ARG(o->n_prompt >= 1 && o->n_gen >= 1, "tune", "-p and -n must be >= 1");
      TANDEM_CHECK_ARG(o->reps >= 1 && o->reps <= 100, "--repetitions", "must be in [1, 100]");
      TANDEM_CHECK_ARG(o->engine.n_gpu_layers.empty() && o->engine.placement.empty(), "tune",
                       "tune chooses the placement: drop --n-gpu-layers and --placement");
      const bool gpu = gpu_present();
      SessionOptions base = o->engine.to_options(gpu ? "gpu" : "cpu");
      print_gpu_flags_warning(o->engine);
      if (base.n_ctx == 0) base.n_ctx = o->n_prompt + o->n_gen + 1;
      base.record_events = false;
      // As run and bench: auto weighed with the built-in figures would not be auto (on an H100,
      // a MoE under 8 GiB: 1,951 t/s prefill uncalibrated against ~5,700 calibrated).
      base.calibrate_if_missing = true;
      std::vector<Variant> variants;
      auto add = [&](std::string label, std::string strategy, std::vector<TensorPin> pins) {
        Variant v{std::move(label), base};
        v.options.strategy = std::move(strategy);
        v.options.pins.insert(v.options.pins.end(), pins.begin(), pins.end());
        variants.push_back(std::move(v));
      };
      int n_layer = 0;
      // A MoE model's --n-cpu-moe N pins (the experts of layers 0..N-1 in host memory), per N.
      std::vector<std::vector<TensorPin>> moe_pins;
      {
        Session probe(base);
        n_layer = int(probe.config().n_layer);
        if (probe.config().is_moe()) {
          for (int n = 0; n <= n_layer; ++n)
            moe_pins.push_back(host_expert_pins(n_layer, n, probe.scheduler().backends()));
        }
      }
      add("auto", "auto", {});
      if (!gpu) {
        add("cpu", "cpu", {});
      } else {
        // The -ngl values whose resident bytes fit the budget: the largest, and a few below.
        auto predicted = [&](Variant& v) {
          Session e(v.options);
          auto phases = e.plan_phases(o->n_prompt);
          v.predicted_pp = o->n_prompt * 1e6 / phases[0].predicted_us;
          v.predicted_tg = 1e6 / phases[1].predicted_us;
          Residency r;
          for (const auto& p : phases) r = residency_after(*p.graph, *p.placement, std::move(r));
          v.device_bytes = 0;
          for (const auto& b : e.scheduler().backends()) {
            if (!b->host_accessible()) v.device_bytes += r.resident_bytes(b->backend_id());
          }
        };
        // -ngl N as the user types it (no budget: its weights and KV caches decide the bytes);
        // the largest N whose bytes fit the budget, and a few below it.
        SessionOptions unbudgeted = base;
        unbudgeted.gpu_memory.reset();
        int fit = -1;
        for (int n = n_layer + 1; n >= 0 && fit < 0; --n) {
          Variant v{"", unbudgeted};
          v.options.strategy = "gpu";
          auto pins = ngl_pins(n, n_layer, false);
          v.options.pins.insert(v.options.pins.end(), pins.begin(), pins.end());
          predicted(v);
          if (!base.gpu_memory || v.device_bytes <= *base.gpu_memory) fit = n;
        }
        auto add_ngl = [&](std::string label, std::vector<TensorPin> pins) {
          Variant v{std::move(label), unbudgeted};
          v.options.strategy = "gpu";
          v.options.pins.insert(v.options.pins.end(), pins.begin(), pins.end());
          predicted(v);
          if (!base.gpu_memory || v.device_bytes <= *base.gpu_memory)
            variants.push_back(std::move(v));
        };
        for (int n : {fit, fit - 2, fit - 4, 0}) {
          if (n < 0 || (n == 0 && fit <= 4)) continue;
          add_ngl("-ngl " + std::to_string(n), ngl_pins(n, n_layer, false));
        }
        if (fit >= 1 && fit <= n_layer) {
          add_ngl("-ngl " + std::to_string(fit - 1) + " + output on the GPU",
                  ngl_pins(fit - 1, n_layer, true));
        }
        // Under the budget: the strategy offloads what fits of the class not pinned.
        add("FFN weights offloaded (-ot attn=cpu)", "gpu", {{"attn_", "cpu"}});
        add("attention weights offloaded (-ot ffn=cpu)", "gpu", {{"ffn_", "cpu"}});
        if (!moe_pins.empty()) {
          add("experts in host memory (--cpu-moe)", "gpu", moe_pins.back());
          // As llama.cpp's users place a mixture of experts: every layer on the GPU (-ngl 99)
          // and the experts of the first N layers in host memory (--n-cpu-moe N), for the
          // smallest N whose bytes fit and two above it. The bytes fall as N grows: bisection.
          std::map<int, Variant> by_n;
          const std::vector<TensorPin> all_layers = ngl_pins(n_layer + 1, n_layer, false);
          auto moe = [&](int n) -> Variant& {
            auto it = by_n.find(n);
            if (it != by_n.end()) return it->second;
            Variant v{"-ngl 99 --n-cpu-moe " + std::to_string(n), unbudgeted};
            v.options.strategy = "gpu";
            v.options.pins.insert(v.options.pins.end(), all_layers.begin(), all_layers.end());
            v.options.pins.insert(v.options.pins.end(), moe_pins[size_t(n)].begin(),
                                  moe_pins[size_t(n)].end());
            predicted(v);
            return by_n.emplace(n, std::move(v)).first->second;
          };
          auto fits = [&](int n) {
            return !base.gpu_memory || moe(n).device_bytes <= *base.gpu_memory;
          };
          if (fits(n_layer)) {
            int lo = 0, hi = n_layer;
            while (lo < hi) {
              const int mid = (lo + hi) / 2;
              if (fits(mid)) {
                hi = mid;
              } else {
                lo = mid + 1;
              }
            }
            for (int n : {hi, hi + 2, hi + 4}) {
              if (n <= n_layer) variants.push_back(moe(n));
            }
          }
        }
        for (Variant& v : variants) {
          if (v.device_bytes == 0) predicted(v);
        }
      }
      std::mt19937 rng(1);
      Progress progress("tune", variants.size());
      for (size_t i = 0; i < variants.size(); ++i) {
        Variant& v = variants[i];
        Session engine(v.options);
        auto empty_context = [&] { start_bench_test(engine, 0, rng); };
        v.pp = median_rate(
            time_test(
                o->reps, [&] { run_bench_test(engine, o->n_prompt, 0, rng); }, {}, empty_context),
            o->n_prompt);
        v.tg = median_rate(
            time_test(
                o->reps, [&] { run_bench_test(engine, 0, o->n_gen, rng); }, {}, empty_context),
            o->n_gen);
        v.placement = engine.placement_summary();
        progress.update(i + 1);
      }
      progress.finish();
      double best_pp = 0.0, best_tg = 0.0;
      for (const Variant& v : variants) {
        best_pp = std::max(best_pp, v.pp);
        best_tg = std::max(best_tg, v.tg);
      }
      // Ranked by the sum of each speed relative to the best measured (2: best at both).
      for (Variant& v : variants) v.score = v.pp / best_pp + v.tg / best_tg;
      std::vector<size_t> order(variants.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return variants[a].score > variants[b].score; });
      std::printf("%-4s %-44s %12s %10s %12s %10s %11s %6s\n", "rank", "placement",
                  ("pp" + std::to_string(o->n_prompt) + " t/s").c_str(),
                  ("tg" + std::to_string(o->n_gen) + " t/s").c_str(), "predicted pp", "pred. tg",
                  "GPU bytes", "score");
      size_t auto_rank = 0;
      for (size_t r = 0; r < order.size(); ++r) {
        const Variant& v = variants[order[r]];
        if (v.label == "auto") auto_rank = r + 1;
        std::printf("%-4zu %-44s %12.1f %10.2f %12.1f %10.2f %11s %6.3f\n", r + 1, v.label.c_str(),
                    v.pp, v.tg, v.predicted_pp, v.predicted_tg,
                    format_bytes(v.device_bytes).c_str(), v.score);
      }
      const Variant& best = variants[order[0]];
      const auto& a = *std::find_if(variants.begin(), variants.end(),
                                    [](const Variant& v) { return v.label == "auto"; });
      std::printf(
          "\nauto ranks %zu of %zu: prefill %.0f%% and generation %.0f%% of the best measured\n",
          auto_rank, variants.size(), 100.0 * a.pp / best_pp, 100.0 * a.tg / best_tg);
      if (!o->save.empty()) {
        PlacementFile f;
        f.label = best.label;
        f.model = base.model_path.substr(base.model_path.find_last_of('/') + 1);
        f.n_layer = n_layer;
        f.strategy = best.options.strategy;
        f.gpu_memory = best.options.gpu_memory;
        f.pins = best.options.pins;
        write_file(o->save, placement_to_json(f), "--save");
        std::printf("saved '%s' to %s (use: --placement %s)\n", best.label.c_str(), o->save.c_str(),
                    o->save.c_str());
      }
      return 0;
    };
  });
}

}  // namespace tandem::cli
