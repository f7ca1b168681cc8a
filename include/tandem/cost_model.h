// The cost model: exact FLOP and byte counts per op from the real shapes, and per-backend
// device and link profiles (built-in defaults, measured by `tandem calibrate`, overridable from
// JSON) that turn them into time.
//
//   roofline_us = max(flops / peak_flops[dtype class], bytes / memory_bandwidth)
//                 (a one-token product: bytes / memory_bandwidth alone)
//   compute_us  = (roofline_us * efficiency(op key, roofline_us) + launch_us) * learned factor
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
#include <vector>

#include "tandem/backend.h"
#include "tandem/graph.h"
#include "tandem/op.h"

namespace tandem {

// A link between a backend's memory and host memory (PCIe, NVLink-C2C, ...). bandwidth_gbs and
// latency_us (host to device, pageable memory) are what estimates use; calibration also records
// the other direction and page-locked (pinned) host memory, 0 where not measured.
struct LinkProfile {
  double bandwidth_gbs = 25.0;  // GB/s (1e9 bytes per second)
  double latency_us = 10.0;     // per transfer
  double to_host_bandwidth_gbs = 0.0;
  double to_host_latency_us = 0.0;
  double pinned_bandwidth_gbs = 0.0;  // host to device from page-locked memory (streamed weights)
  double pinned_latency_us = 0.0;
};

// What a measured entry applies to: an op, the dtype that picks its kernel (a matmul's weight,
// attention's KV cache, else the first input's) and, for matmul and attention, whether it
// handles one token (matrix-vector, a decode step).
struct OpKey {
  OpKind op = OpKind::Input;
  DType dtype = DType::F32;
  bool one_token = false;
  // The op that runs just before (the previous compute node: runs go in graph order), for the
  // small ops whose time depends on what that one left in the caches: in a decode layer the K
  // cache write after the K RoPE reads 1.0 us and the V write after it 0.7 (1B, 2-core VM), which
  // one sample of both missed by 25-40% each. Input: not kept apart (products, attention, the
  // ops calibration times alone). A key without samples of its own takes the plain key's.
  OpKind after = OpKind::Input;
  auto operator<=>(const OpKey&) const = default;
};
OpKey op_key(const Graph& graph, const Node& node);
std::string op_key_name(
    const OpKey& key);  // "quantized_matmul q4_0 vec", "kv_write f32 after rope"

// One timed run of an op at one shape (tandem calibrate).
struct OpSample {
  double flops = 0.0;
  double bytes = 0.0;
  double us = 0.0;  // median measured time, launch included
};

// Learned from timed runs: actual / estimate ratios of one (op key, size bucket), one per graph
// run (the median of that run's ops, whose times move together); the median of the most recent
// (at least kMinLearnedSamples) scales the estimate, so a stray run does not move it.
struct LearnedTimes {
  std::vector<double> ratios;  // at most kLearnedSamples, oldest first
};
inline constexpr size_t kLearnedSamples = 16;
inline constexpr size_t kMinLearnedSamples = 3;

struct BackendProfile {
  std::array<double, kDTypeClassCount> peak_gflops{};  // GFLOP/s per DTypeClass
  double memory_bandwidth_gbs = 0.0;                   // GB/s
  double launch_us = 0.0;                              // fixed cost per op
  // A device's ops inside a segment it runs as one (a CUDA graph replayed, each kernel's start
  // overlapping the one before): calibration times ops alone, each paying its launch and the
  // latency of its first loads. segment_launch_us: the least an op costs there (tiny ops in a
  // row); segment_saving_us: what an op saves there against its time alone (one-token products
  // in a row). 0: not measured (an op costs its estimate, as on a host backend; without a
  // saving, launch_us - segment_launch_us).
  double segment_launch_us = 0.0;
  double segment_saving_us = 0.0;
  LinkProfile link;  // to host memory (unused on host backends)
  // Measured op times per key, sorted by size: between them an op's time over its roofline
  // time (its efficiency) is interpolated in log(size); outside, the nearest one holds.
  std::map<OpKey, std::vector<OpSample>> op_samples;
  // Keyed by (op key, size bucket: see size_bucket()).
  std::map<std::pair<OpKey, int>, LearnedTimes> learned;
  bool calibrated = false;  // figures measured on this device (else built-in)
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
// The reference backend is a plain, single-threaded oracle: slow on purpose.
inline constexpr double kDefaultReferenceGflops = 1.0;
inline constexpr double kDefaultReferenceBandwidthGbs = 2.0;
inline constexpr double kDefaultReferenceLaunchUs = 1.0;
inline constexpr std::string_view kReferenceBackendId = "reference";

// Work of one node from its shapes: the op descriptor's formula (tandem/op.h, src/core/ops/).
OpWork op_work(const Graph& graph, const Node& node);

struct OpCost {
  double compute_us = 0.0;
  double transfer_us = 0.0;
  size_t memory_bytes = 0;
  double total_us() const { return compute_us + transfer_us; }
};

// The median (the mean of the middle two for an even count); throws InvalidArgument when empty.
double median(std::vector<double> values);

// Runs over which the scheduler spreads a weight's one-time upload when it compares backends
// (decode reuses every weight hundreds of times; 32 keeps short prompts honest).
inline constexpr double kWeightReuseRuns = 32.0;

class CostModel {
 public:
  // Built-in defaults for both kinds, no per-backend overrides.
  CostModel() = default;

  static BackendProfile default_profile(BackendKind kind);
  // The built-in figures for one backend: the kind's, or the reference backend's own.
  static BackendProfile default_profile(std::string_view backend_id, BackendKind kind);

  // Profiles are looked up by backend id ("cuda:0"), then by kind ("cpu", "gpu"), then the
  // built-in figures.
  void set_profile(std::string id_or_kind, const BackendProfile& profile);
  BackendProfile profile(std::string_view backend_id, BackendKind kind) const;
  BackendProfile profile(const Backend& backend) const {
    return profile(backend.backend_id(), backend.kind());
  }

  // Overrides from JSON; keys are backend ids or kinds, every field optional:
  //   {"profiles": {"gpu": {"peak_gflops": {"f32": 6e4, "f16": 8e5, "quantized": 4e5},
  //                         "memory_bandwidth_gbs": 3350, "launch_us": 4,
  //                         "link": {"bandwidth_gbs": 55, "latency_us": 8}}}}
  // A profile may also carry "op_samples" and "learned" (as profile_to_json writes them).
  // Throws Error{Io} for an unreadable file, Error{Format} for bad JSON or a bad value.
  void load_json_file(const std::string& path);
  void load_json(std::string_view text);
  std::string to_json() const;

  // Records a timed run of `node` on `backend_id` (actual_us measured alone, launch included):
  // its ratio to the estimate without learning waits for end_observations(), which adds the
  // median ratio of each (backend, op key, size bucket) observed since to the profile. Call it
  // once per graph run.
  // work_scale: the share of its work bound the op did (attention_work_scale), so an attention
  // over a short context teaches the model nothing about a long one.
  void observe(const Graph& graph, const Node& node, std::string_view backend_id, BackendKind kind,
               double actual_us, double work_scale = 1.0);
  void end_observations();

  // The cost of running `node` on a backend with `profile`. input_hops[i] says how far
  // node.inputs[i] is from that backend: 0 resident, 1 one link copy (host <-> device),
  // 2 device -> host -> device. Empty: everything resident. Repeated storages count once. A
  // weight is copied once and then read by every later run: its transfer counts 1 / weight_runs
  // (the scheduler passes kWeightReuseRuns for device candidates).
  static OpCost estimate(const Graph& graph, const Node& node, const BackendProfile& profile,
                         std::span<const uint8_t> input_hops = {}, double weight_runs = 1.0) {
    return estimate(graph, node, profile, profile.link, input_hops, weight_runs);
  }
  // The same with the input copies priced over `link` (a host candidate pulling device data
  // prices it over that device's link).
  static OpCost estimate(const Graph& graph, const Node& node, const BackendProfile& profile,
                         const LinkProfile& link, std::span<const uint8_t> input_hops,
                         double weight_runs);
  static double transfer_us(size_t bytes, const LinkProfile& link, int hops = 1);
  // An op's compute estimate (learned factor included) when it does work_scale of the work its
  // shapes bound (flops and bytes scaled), as compute_us of estimate() at 1.
  static double compute_us_at(const Graph& graph, const Node& node, const BackendProfile& profile,
                              double work_scale);
  // The share of its work bound an Attention node does with these positions (one per query
  // token, on the host): the keys it reads over every query, pos + 1 each, against the cache
  // length each (estimate()'s bound: positions are data); 1 for any other op.
  static double attention_work_scale(const Graph& graph, const Node& node,
                                     const int32_t* positions);
  // An op's time inside a device segment from its estimate alone (compute_us): less the
  // segment's saving where measured, never below the segment's per-op cost. The planner prices
  // steps with it; telemetry compares ops timed alone with compute_us.
  static double in_segment_us(double compute_us, const BackendProfile& profile);
  // A streamed weight's copy: from page-locked host memory (the executor keeps such copies of
  // streamed weights), at the pinned figures where measured, else the link's.
  static double stream_us(size_t bytes, const LinkProfile& link);
  // An activation's copy over `hops` links: through the host arena, which is page-locked on a
  // device that measured pinned figures (see Backend::allocate_host), else pageable.
  static double activation_us(size_t bytes, const LinkProfile& link, int hops = 1);
  // compute_us without the learned factor. A K-quant key without samples uses the samples of the
  // 32-element format of about its size (Q4_0 for Q4_K and Q5_K, Q8_0 for Q6_K).
  static double calibrated_compute_us(const OpWork& work, const OpKey& key,
                                      const BackendProfile& profile);
  // max(flops / peak, bytes / bandwidth) in microseconds.
  static double roofline_us(const OpWork& work, const BackendProfile& profile);
  // Learned entries are grouped by half octaves of the unlearned estimate.
  static int size_bucket(double compute_us);
  // The median learned ratio for (key, bucket), or 1 with fewer than kMinLearnedSamples.
  static double learned_factor(const BackendProfile& profile, const OpKey& key, int bucket);

 private:
  std::map<std::string, BackendProfile, std::less<>> profiles_;
  std::map<std::pair<std::string, std::pair<OpKey, int>>, std::vector<double>> pending_;
};

}  // namespace tandem
