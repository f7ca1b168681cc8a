// `tandem calibrate`: measures every backend for the cost model and saves the profile that
// run, bench and logits load.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>

#include "bench_report.h"
#include "commands_impl.h"
#include "engine_flags.h"
#include "tandem/calibration.h"
#include "tandem/error.h"
#include "tandem/registry.h"
#include "tandem/runtime.h"
#include "tandem/scheduler.h"

namespace tandem::cli {

namespace {

void print_profile(const DeviceKey& key, const BackendProfile& p, double seconds) {
  std::printf("%s\n", key.describe().c_str());
  std::printf(
      "  measured in %.1f s: launch %.2f us, memory %.1f GB/s, peak GFLOP/s f32 %.1f, "
      "f16 %.1f, quantized %.1f\n",
      seconds, p.launch_us, p.memory_bandwidth_gbs, p.peak_gflops[0], p.peak_gflops[1],
      p.peak_gflops[2]);
  if (key.kind == "gpu") {
    const LinkProfile& l = p.link;
    std::printf(
        "  link to device %.1f GB/s + %.1f us (pinned %.1f GB/s + %.1f us), to host "
        "%.1f GB/s + %.1f us\n",
        l.bandwidth_gbs, l.latency_us, l.pinned_bandwidth_gbs, l.pinned_latency_us,
        l.to_host_bandwidth_gbs, l.to_host_latency_us);
  }
  std::printf("  %-28s %14s %12s %10s %8s\n", "op", "GFLOP", "MB", "us", "eff");
  for (const auto& [key_op, samples] : p.op_samples) {
    for (const OpSample& s : samples) {
      OpWork w;
      w.flops = s.flops;
      w.bytes = s.bytes;
      w.dtype_class = dtype_class(key_op.dtype);
      const double roofline = CostModel::roofline_us(w, p);
      std::printf("  %-28s %14.4f %12.3f %10.1f %8.2f\n", op_key_name(key_op).c_str(),
                  s.flops * 1e-9, s.bytes * 1e-6, s.us,
                  roofline > 0 ? std::max(s.us - p.launch_us, 0.0) / roofline : 0.0);
    }
  }
}

struct ModelPass {
  std::vector<std::string> models;
  std::vector<std::string> strategies;
  int n_prompt = 32, n_gen = 16, threads = 0;
};

// The model's own ops, timed one by one where they run and learned into the profile at `path`:
// kModelPassPrompts prefills of n_prompt tokens and one generation of n_gen (random tokens, as
// bench), so every op key and size bucket the model meets has its kMinLearnedSamples runs. The
// microbenchmarks above time each op class alone on buffers of their own; in a model's step the
// same products read weights mapped from the file between other ops, and on some hosts run
// slower than alone (bench/NOTES.md): this measures them there.
constexpr int kModelPassPrompts = 3;

void run_model_pass(const ModelPass& m, const std::string& model, const std::string& path) {
  std::mt19937 rng(1);
  for (const std::string& strategy : m.strategies) {
    SessionOptions eo;
    eo.model_path = model;
    eo.strategy = strategy;
    eo.threads = m.threads;
    eo.cost_profile = path;
    eo.n_ctx = m.n_prompt + m.n_gen + 1;
    eo.timing = TimingMode::PerOp;
    eo.learn = true;
    const auto t0 = std::chrono::steady_clock::now();
    Session engine(eo);
    for (int i = 0; i < kModelPassPrompts && m.n_prompt > 0; ++i) {
      start_bench_test(engine, 0, rng);
      run_bench_test(engine, m.n_prompt, 0, rng);
    }
    start_bench_test(engine, 0, rng);
    run_bench_test(engine, 0, m.n_gen, rng);
    const EstimateReport report = estimate_report(engine.executor().telemetry().get_telemetry());
    engine.save_learned();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "%s, strategy %s: %d prefills of %d tokens and %d generated, %zu ops timed in %.1f s "
        "(median |error| of the estimates before %.1f%%), learned\n",
        engine.config().name.c_str(), strategy.c_str(), m.n_prompt > 0 ? kModelPassPrompts : 0,
        m.n_prompt, m.n_gen, report.ops, s, 100.0 * report.median_abs_error);
  }
}

}  // namespace

void add_calibrate(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand(
      "calibrate", "Measure each backend's op times and links for the cost model and save them");
  struct Opts {
    bool quick = false, verbose = false;
    std::string out;
    ModelPass pass;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_flag("--quick", o->quick, "Fewer shapes and repetitions (what run does on first use)");
  cmd->add_option("-t,--threads", o->pass.threads, "CPU threads (0: physical cores), as for run");
  cmd->add_option("-o,--output", o->out,
                  "Profile file to write (default: this machine's under $XDG_CACHE_HOME/tandem/, "
                  "which run, bench and logits load)");
  cmd->add_flag("-v,--verbose", o->verbose, "Print every measured shape");
  cmd->add_option("-m,--model", o->pass.models,
                  "Also time this model's own ops where they run (a few prefills and a "
                  "generation, one op at a time) and learn them into the profile; repeat for "
                  "several models");
  cmd->add_option("-p,--n-prompt", o->pass.n_prompt, "With -m: prompt tokens of each prefill")
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o->pass.n_gen, "With -m: tokens generated")->capture_default_str();
  cmd->add_option("--strategy", o->pass.strategies,
                  "With -m: the strategies to run the model under (default: cpu, and gpu "
                  "where there is a GPU)");
  cmd->callback([&run, o]() {
    run = [o]() {
      ModelPass& pass = o->pass;
      TANDEM_CHECK_ARG(pass.threads >= 0 && pass.threads <= 1024, "--threads",
                       "must be in [0, 1024]");
      TANDEM_CHECK_ARG(pass.n_prompt >= 0 && pass.n_prompt <= 4096, "--n-prompt",
                       "must be in [0, 4096]");
      TANDEM_CHECK_ARG(pass.n_gen >= int(kMinLearnedSamples) && pass.n_gen <= 4096, "--n-gen",
                       "must be in [" + std::to_string(kMinLearnedSamples) + ", 4096]");
      for (const auto& m : pass.models) {
        TANDEM_CHECK_ARG(std::filesystem::is_regular_file(m), "--model", "no such file: " + m);
      }
      if (!pass.models.empty()) {
        // By default the CPU, and the GPUs where there are some.
        if (pass.strategies.empty()) {
          pass.strategies = gpu_present() ? std::vector<std::string>{"cpu", "gpu"}
                                          : std::vector<std::string>{"cpu"};
        }
        for (const auto& s : pass.strategies) Strategy::parse(s);  // refused before measuring
      }
      BackendOptions bo;
      bo.cpu_threads = pass.threads;
      std::vector<CalibratedDevice> devices;
      for (const auto& b : available_backends(bo)) {
        CalibrationOptions co;
        co.quick = o->quick;
        if (o->verbose)
          co.progress = [](std::string_view line) {
            std::fprintf(stderr, "  %.*s\n", int(line.size()), line.data());
          };
        std::fprintf(stderr, "calibrating %s ...\n", b->backend_id().c_str());
        const auto t0 = std::chrono::steady_clock::now();
        devices.push_back({device_key(*b), calibrate_backend(*b, co)});
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (o->verbose) {
          print_profile(devices.back().key, devices.back().profile, s);
        } else {
          const BackendProfile& p = devices.back().profile;
          std::printf(
              "%s\n  measured in %.1f s: launch %.2f us, memory %.1f GB/s, peak GFLOP/s "
              "f32 %.1f, f16 %.1f, quantized %.1f\n",
              devices.back().key.describe().c_str(), s, p.launch_us, p.memory_bandwidth_gbs,
              p.peak_gflops[0], p.peak_gflops[1], p.peak_gflops[2]);
        }
      }
      std::vector<DeviceKey> keys;
      for (const auto& d : devices) keys.push_back(d.key);
      const std::string path = o->out.empty() ? default_cost_profile_path(keys) : o->out;
      write_cost_profile(path, devices);
      std::printf("cost profile written to %s\n", path.c_str());
      for (const auto& m : pass.models) run_model_pass(pass, m, path);
      return 0;
    };
  });
}

}  // namespace tandem::cli
