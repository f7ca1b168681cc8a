// `tandem calibrate`: measures every backend for the cost model and saves the profile that
// run, bench and logits load.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>

#include "commands_impl.h"
#include "tandem/calibration.h"
#include "tandem/error.h"
#include "tandem/registry.h"

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

}  // namespace

void add_calibrate(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand(
      "calibrate", "Measure each backend's op times and links for the cost model and save them");
  struct Opts {
    bool quick = false, verbose = false;
    int threads = 0;
    std::string out;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_flag("--quick", o->quick, "Fewer shapes and repetitions (what run does on first use)");
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0: physical cores), as for run");
  cmd->add_option("-o,--output", o->out,
                  "Profile file to write (default: this machine's under $XDG_CACHE_HOME/tandem/, "
                  "which run, bench and logits load)");
  cmd->add_flag("-v,--verbose", o->verbose, "Print every measured shape");
  cmd->callback([&run, o]() {
    run = [o]() {
      TANDEM_CHECK_ARG(o->threads >= 0 && o->threads <= 1024, "--threads", "must be in [0, 1024]");
      BackendOptions bo;
      bo.cpu_threads = o->threads;
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
      return 0;
    };
  });
}

}  // namespace tandem::cli
