// Calibration: measures each backend's op times, dispatch cost and host link into a
// BackendProfile, and keeps the results in a cost-profile file keyed by the device, under
// $XDG_CACHE_HOME/tandem/ (else ~/.cache/tandem/). Commands that build a scheduler load it.
//
//   {"format": "tandem-cost-profile", "version": 1,
//    "devices": [{"device": {DeviceKey fields}, "profile": {BackendProfile as cost_model.h}}]}
#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/backend.h"
#include "tandem/cost_model.h"
#include "tandem/telemetry.h"

namespace tandem {

// What a measured profile is valid for: the same backend on the same device and host, with the
// same features (CPU kernel set and thread count, GPU architecture) and driver.
struct DeviceKey {
  std::string backend;   // "cpu", "cuda:0"
  std::string kind;      // "cpu" | "gpu"
  std::string host_cpu;  // /proc/cpuinfo's model name
  std::string device;    // a GPU's model and memory, "" for the host
  std::string driver;    // the NVIDIA driver version where known, else ""
  std::string features;  // the backend's features, comma separated
  bool operator==(const DeviceKey&) const = default;
  std::string describe() const;  // "cpu on AMD EPYC (avx2,..., threads_2)"
};
DeviceKey device_key(const Backend& backend);

struct CalibrationOptions {
  bool quick = false;  // fewer shapes and repetitions: a few seconds per backend
  std::function<void(std::string_view)> progress;  // one line per measured group
};

// Measures `backend` (timed with its own timer, median of several runs after a warm-up):
// matmul per weight dtype it runs (one token and many), attention (one token and many), the
// elementwise ops of a LLaMA block, a tiny op (launch cost) and, for a device, its host link
// each way (pageable and page-locked). Returns a profile with calibrated = true.
BackendProfile calibrate_backend(Backend& backend, const CalibrationOptions& options = {});

// ---- fitting (pure, testable on synthetic measurements) ----
struct LinkFit {
  double bandwidth_gbs = 0.0;
  double latency_us = 0.0;
};
// Least-squares line time = latency + bytes / bandwidth through (bytes, us) points; needs two
// distinct sizes. Throws InvalidArgument otherwise.
LinkFit fit_link(std::span<const std::pair<double, double>> bytes_us);
// Base figures from the op samples: peak GFLOP/s per dtype class is the best rate of a matrix
// product over many tokens, memory bandwidth the best of the others larger than 16 MB (any
// size where none is), each beyond the launch cost; what was never measured keeps its value.
void fit_base_figures(BackendProfile& profile);

// ---- cost-profile files ----
struct CalibratedDevice {
  DeviceKey key;
  BackendProfile profile;
};
std::string default_cost_profile_dir();
// One file per set of devices: "<dir>/cost-profile-<hash of the keys>.json".
std::string default_cost_profile_path(std::span<const DeviceKey> keys);
std::string cost_profile_to_json(std::span<const CalibratedDevice> devices);
// Throws Error{Format} "[cost profile] <source>: why" for anything malformed.
std::vector<CalibratedDevice> cost_profile_from_json(std::string_view text,
                                                     const std::string& source);
void write_cost_profile(const std::string& path, std::span<const CalibratedDevice> devices);
// Throws Error{Io} when the file cannot be read, Error{Format} when it is corrupt.
std::vector<CalibratedDevice> read_cost_profile(const std::string& path);
// Sets each device's profile in `model` by backend id. Refuses (Error{Format}, naming `source`)
// a file made for another device: an entry whose backend is here with another key, or no entry
// for any backend here. Backends with no entry keep their figures.
void apply_cost_profile(std::span<const CalibratedDevice> devices, std::span<const DeviceKey> here,
                        const std::string& source, CostModel& model);

// How a command gets its cost model.
struct CostProfileOptions {
  std::string path;                  // "" : the default path for these backends
  bool calibrate_if_missing = true;  // a quick calibration when there is no file (run, bench)
  bool use_builtin = false;          // --no-calibrate: built-in figures, with a warning
};
struct LoadedCostModel {
  CostModel model;
  std::string path;  // where it came from or was saved ("" : built-in figures only)
  std::vector<DeviceKey> keys;
  bool measured = false;  // true when the figures came from a file or a calibration
};
// Loads the profile for `backends` (the reference backend keeps its built-in figures), or
// calibrates quickly and saves it, or falls back to the built-in figures: every notice and
// refusal is one line on `log`.
LoadedCostModel load_cost_model(std::span<const std::shared_ptr<Backend>> backends,
                                const CostProfileOptions& options, std::ostream& log);
// Writes the profiles of the calibrated backends in `loaded` back to its file (after learning).
void save_cost_model(const LoadedCostModel& loaded);

// ---- estimates against measurements ----
// Actual over estimated time beyond which the run summary names an op type.
inline constexpr double kEstimateStrayFactor = 1.5;
struct EstimateError {
  std::string op_type;  // "quantized_matmul on cpu"
  size_t count = 0;
  double estimated_us = 0.0;
  double actual_us = 0.0;
  double median_abs_error = 0.0;  // median over ops of |estimated - actual| / actual
};
struct EstimateReport {
  size_t ops = 0;
  double median_abs_error = 0.0;  // over every timed op
  std::vector<EstimateError> by_type;
};
// Over the timed op events (actual_us >= 0).
EstimateReport estimate_report(std::span<const ExecutionEvent> events);
// "estimate vs actual: median |error| 9.1% over 1234 ops" and one line per type past
// kEstimateStrayFactor either way ("attention on cpu: actual 2.4x the estimate").
void print_estimate_report(const EstimateReport& report, std::ostream& os);

}  // namespace tandem
