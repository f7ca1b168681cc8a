// The cost model: exact FLOP and byte counts per op from the real shapes, and per-backend
// device and link profiles (built-in defaults, overridable from JSON) that turn them into time.
//
//   compute_us  = max(flops / peak_flops[dtype class], bytes / memory_bandwidth) + launch_us
//   transfer_us = sum over inputs not resident on the backend of hops * (bytes / link + latency),
//                 a weight's divided by the runs its one upload serves (weight_runs)
//   memory_bytes = bytes of every distinct input storage + the output (0 when it aliases)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "tandem/backend.h"
#include "tandem/graph.h"
#include "tandem/op.h"

namespace tandem {

// A link between a backend's memory and host memory (PCIe, NVLink-C2C, ...).
struct LinkProfile {
  double bandwidth_gbs = 25.0;  // GB/s (1e9 bytes per second)
  double latency_us = 10.0;     // per transfer
};

struct BackendProfile {
  std::array<double, kDTypeClassCount> peak_gflops{};  // GFLOP/s per DTypeClass
  double memory_bandwidth_gbs = 0.0;                   // GB/s
  double launch_us = 0.0;                              // fixed cost per op
  LinkProfile link;                                    // to host memory (unused on host backends)
};

// Built-in defaults: rough public figures for a server CPU socket and an H100-class GPU over
// PCIe 5. They are a starting point; `tandem calibrate` or a JSON file replaces them.
inline constexpr double kDefaultCpuF32Gflops = 1000.0;
inline constexpr double kDefaultCpuF16Gflops = 500.0;
inline constexpr double kDefaultCpuQuantizedGflops = 1000.0;
inline constexpr double kDefaultCpuBandwidthGbs = 100.0;
inline constexpr double kDefaultCpuLaunchUs = 2.0;
inline constexpr double kDefaultGpuF32Gflops = 50000.0;
inline constexpr double kDefaultGpuF16Gflops = 400000.0;
inline constexpr double kDefaultGpuQuantizedGflops = 200000.0;
inline constexpr double kDefaultGpuBandwidthGbs = 2000.0;
inline constexpr double kDefaultGpuLaunchUs = 5.0;
inline constexpr double kDefaultLinkBandwidthGbs = 25.0;
inline constexpr double kDefaultLinkLatencyUs = 10.0;

// Work of one node from its shapes: the op descriptor's formula (tandem/op.h, src/core/ops/).
OpWork op_work(const Graph& graph, const Node& node);

struct OpCost {
  double compute_us = 0.0;
  double transfer_us = 0.0;
  size_t memory_bytes = 0;
  double total_us() const { return compute_us + transfer_us; }
};

// Runs over which the scheduler spreads a weight's one-time upload when it compares backends
// (decode reuses every weight hundreds of times; 32 keeps short prompts honest).
inline constexpr double kWeightReuseRuns = 32.0;

class CostModel {
 public:
  // Built-in defaults for both kinds, no per-backend overrides.
  CostModel() = default;

  static BackendProfile default_profile(BackendKind kind);

  // Profiles are looked up by backend id ("cuda:0"), then by kind ("cpu", "gpu").
  void set_profile(std::string id_or_kind, const BackendProfile& profile);
  BackendProfile profile(std::string_view backend_id, BackendKind kind) const;
  BackendProfile profile(const Backend& backend) const {
    return profile(backend.backend_id(), backend.kind());
  }

  // Overrides from JSON; keys are backend ids or kinds, every field optional:
  //   {"profiles": {"gpu": {"peak_gflops": {"f32": 6e4, "f16": 8e5, "quantized": 4e5},
  //                         "memory_bandwidth_gbs": 3350, "launch_us": 4,
  //                         "link": {"bandwidth_gbs": 55, "latency_us": 8}}}}
  // Throws Error{Io} for an unreadable file, Error{Format} for bad JSON or a bad value.
  void load_json_file(const std::string& path);
  void load_json(std::string_view text);
  std::string to_json() const;

  // The cost of running `node` on a backend with `profile`. input_hops[i] says how far
  // node.inputs[i] is from that backend: 0 resident, 1 one link copy (host <-> device),
  // 2 device -> host -> device. Empty: everything resident. Repeated storages count once. A
  // weight is copied once and then read by every later run: its transfer counts 1 / weight_runs
  // (the scheduler passes kWeightReuseRuns for device candidates).
  static OpCost estimate(const Graph& graph, const Node& node, const BackendProfile& profile,
                         std::span<const uint8_t> input_hops = {}, double weight_runs = 1.0);
  static double transfer_us(size_t bytes, const LinkProfile& link, int hops = 1);

 private:
  std::map<std::string, BackendProfile, std::less<>> profiles_;
};

}  // namespace tandem
