#include "tandem/calibration.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <tuple>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "calibration_measure.h"
#include "cost_model_json.h"
#include "tandem/blocks.h"
#include "tandem/bytes.h"
#include "tandem/error.h"
#include "tandem/hash.h"

namespace tandem {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string trim(std::string s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

// The value after "key:" on the first line of `path` that starts with `key`, or "".
std::string field_of(const std::string& path, std::string_view key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon != std::string::npos) return trim(line.substr(colon + 1));
  }
  return "";
}

std::string host_cpu_model() {
  std::string model = field_of("/proc/cpuinfo", "model name");
  return model.empty() ? "unknown cpu" : model;
}

// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..." -> "550.54.15".
std::string nvidia_driver_version() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(f, line)) return "";
  std::istringstream words(line);
  std::string w, found;
  while (words >> w) {
    if (!w.empty() && std::isdigit(static_cast<unsigned char>(w[0])) &&
        w.find('.') != std::string::npos) {
      found = w;
      break;
    }
  }
  return found;
}

// The model of the index-th GPU the driver lists (by PCI address), or "".
std::string nvidia_gpu_model(int index) {
  std::error_code ec;
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  if (index < 0 || size_t(index) >= dirs.size()) return "";
  return field_of(dirs[size_t(index)] + "/information", "Model");
}

}  // namespace

// ---- device keys ----

std::string DeviceKey::describe() const {
  std::string s = backend + " on " + (device.empty() ? host_cpu : device + ", host " + host_cpu);
  if (!driver.empty()) s += ", driver " + driver;
  return s + " (" + features + ")";
}

DeviceKey device_key(const Backend& backend) {
  DeviceKey key;
  key.backend = backend.backend_id();
  key.kind = std::string(backend_kind_name(backend.kind()));
  key.host_cpu = host_cpu_model();
  std::vector<std::string> features = backend.features();
  std::sort(features.begin(), features.end());
  for (const auto& f : features) key.features += (key.features.empty() ? "" : ",") + f;
  if (backend.kind() == BackendKind::Gpu) {
    key.driver = nvidia_driver_version();
    const auto colon = key.backend.find(':');
    const int index = colon == std::string::npos ? 0 : std::atoi(key.backend.c_str() + colon + 1);
    const std::string model = nvidia_gpu_model(index);
    const double gib = double(backend.memory().total_bytes) / double(size_t(1) << 30);
    char memory[32];
    std::snprintf(memory, sizeof memory, "%.0f GiB", gib);
    key.device = (model.empty() ? std::string("gpu") : model) + " " + memory;
  }
  return key;
}

// ---- fitting ----

LinkFit fit_link(std::span<const std::pair<double, double>> bytes_us) {
  const double n = double(bytes_us.size());
  double sx = 0, sy = 0;
  for (const auto& [x, y] : bytes_us) {
    sx += x;
    sy += y;
  }
  const double mx = sx / std::max(n, 1.0), my = sy / std::max(n, 1.0);
  double sxx = 0, sxy = 0;
  for (const auto& [x, y] : bytes_us) {
    sxx += (x - mx) * (x - mx);
    sxy += (x - mx) * (y - my);
  }
  TANDEM_CHECK_ARG(bytes_us.size() >= 2 && sxx > 0, "fit_link", "needs two distinct sizes");
  // A slope at or below zero (noise) means the link is faster than we can see: bound it by
  // the largest transfer alone.
  double slope = sxy / sxx;  // us per byte
  if (!(slope > 0)) {
    const auto& big = *std::max_element(bytes_us.begin(), bytes_us.end());
    slope = big.second / big.first;
  }
  LinkFit fit;
  fit.bandwidth_gbs = 1.0 / (slope * 1e3);
  fit.latency_us = std::max(0.0, my - slope * mx);
  return fit;
}

namespace {

// Time beyond the launch cost, never below a twentieth of the whole (noise on tiny ops).
double work_us(const OpSample& s, double launch_us) {
  return std::max(s.us - launch_us, 0.05 * s.us);
}

// Larger than the last-level caches of the machines we run on.
constexpr double kStreamingBytes = 16e6;

bool is_matmul(OpKind op) {
  return op == OpKind::MatMul || op == OpKind::QuantizedMatMul;
}

}  // namespace

void fit_base_figures(BackendProfile& p) {
  std::array<double, kDTypeClassCount> best_gflops{};
  // Bandwidth from samples larger than any cache where there are some.
  double best_gbs = 0.0, best_streaming_gbs = 0.0;
  for (const auto& [key, samples] : p.op_samples) {
    for (const OpSample& s : samples) {
      const double us = work_us(s, p.launch_us);
      // Compute peaks from matrix products over many tokens; bandwidth from everything that
      // streams memory (one-token products and the elementwise ops).
      if (is_matmul(key.op) && !key.one_token) {
        double& g = best_gflops[size_t(dtype_class(key.dtype))];
        g = std::max(g, s.flops / (us * 1e3));
      } else if (key.op != OpKind::Attention) {
        best_gbs = std::max(best_gbs, s.bytes / (us * 1e3));
        if (s.bytes >= kStreamingBytes)
          best_streaming_gbs = std::max(best_streaming_gbs, s.bytes / (us * 1e3));
      }
    }
  }
  for (int c = 0; c < kDTypeClassCount; ++c) {
    if (best_gflops[size_t(c)] > 0) p.peak_gflops[size_t(c)] = best_gflops[size_t(c)];
  }
  if (best_streaming_gbs > 0) best_gbs = best_streaming_gbs;
  if (best_gbs > 0) p.memory_bandwidth_gbs = best_gbs;
}

// ---- measurement ----

namespace {

struct Budget {
  int reps;             // timed runs per shape (after one warm-up)
  int tiny_reps;        // for the launch-cost op
  double max_point_us;  // stop repeating a shape once its runs took this long (at least 3)
  detail::DecodeLayerPasses layer_passes;
};
// The quick decode layer runs 10-30 passes (5-15 before 2026-11-27: on a 2-core VM, 1B 14.2 /
// 8B 15.2% median error against 15.3 / 16.1% in five pairs of calibrations, for 0.1-0.3 s more).
constexpr Budget kQuickBudget{5, 31, 60e3, {10, 30, 120e3}};
constexpr Budget kFullBudget{11, 101, 600e3, {11, 33, 600e3}};
constexpr double kQuickMaxRunUs = 20e3;

// Host data for one tensor: random values in [-1, 1] (converted to its dtype), written one row
// and then repeated, so a large weight costs one conversion; positions count up to `pos_end`
// and row ids stay inside the table.
void fill_host_data(const TensorDesc& t, int64_t pos_end, int64_t id_limit, SplitMix64& rng,
                    uint8_t* out) {
  if (t.dtype == DType::I32) {
    auto* v = reinterpret_cast<int32_t*>(out);
    const int64_t n = t.elements();
    for (int64_t i = 0; i < n; ++i) {
      v[i] = id_limit > 0 ? int32_t(rng.next() % uint64_t(id_limit)) : int32_t(pos_end - n + i);
    }
    return;
  }
  const int64_t row = t.ne[0];
  std::vector<float> values(static_cast<size_t>(row));
  for (float& v : values) v = float(double(rng.next() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  const size_t rb = row_bytes(t.dtype, row), bytes = t.bytes();
  from_f32(t.dtype, values.data(), out, row);
  for (size_t off = rb; off + rb <= bytes; off += rb) std::memcpy(out + off, out, rb);
}

// In a model's graph an op's inputs were mostly written or streamed long enough before that the
// caches no longer hold them (each matmul streams megabytes of weights through them); timed
// back to back on the same buffers, a small op would run from L1 and a weight that fits the
// last-level cache from there. So on host memory every buffer is flushed to DRAM before each run,
// and then the activations are written again by the pool as the op before would have
// (prepare_like_a_graph). (Flushing only weights and caches, activations left as the previous
// timed run of the same op left them, was tried on 2026-11-26 on a 16-thread host: the one-token
// elementwise estimates fell to a fifth of their time in a graph; the median error rose.)

// clflush is ordered against every other clflush: on some hosts (a 300 MiB L3 measured 2026-11-26)
// flushing the quick calibration's buffers took 5.2 of its 5.7 s. clflushopt is not, and large
// buffers are split over threads.
#if defined(__x86_64__) || defined(__i386__)
bool has_clflushopt() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b >> 23) & 1u;  // CPUID.(EAX=7,ECX=0):EBX.CLFLUSHOPT[bit 23]
}

__attribute__((target("clflushopt"))) void flush_lines_opt(const char* p, size_t bytes) {
  constexpr size_t kLine = 64;
  for (size_t off = 0; off < bytes; off += kLine) __builtin_ia32_clflushopt(p + off);
}

void flush_lines(const char* p, size_t bytes) {
  static const bool opt = has_clflushopt();
  constexpr size_t kLine = 64;
  if (opt) {
    flush_lines_opt(p, bytes);
  } else {
    for (size_t off = 0; off < bytes; off += kLine) __builtin_ia32_clflush(p + off);
  }
}
#endif

constexpr size_t kFlushBytesPerThread = size_t(8) << 20;
constexpr unsigned kMaxFlushThreads = 8;

}  // namespace

namespace detail {

// A buffer on `b` holding fill_host_data's values: written in place on host memory (a large
// weight costs its page faults once), else through a host copy.
Buffer buffer_with_data(Backend& b, const TensorDesc& t, int64_t pos_end, int64_t id_limit,
                        SplitMix64& rng) {
  Buffer buffer = b.allocate(std::max<size_t>(t.bytes(), 1));
  if (b.host_accessible()) {
    fill_host_data(t, pos_end, id_limit, rng, static_cast<uint8_t*>(buffer.data()));
  } else {
    std::vector<uint8_t> data(t.bytes());
    fill_host_data(t, pos_end, id_limit, rng, data.data());
    b.copy_from_host(buffer.data(), data.data(), data.size());
  }
  return buffer;
}

void flush_from_caches(const void* data, size_t bytes) {
#if defined(__x86_64__) || defined(__i386__)
  const auto* p = static_cast<const char*>(data);
  const unsigned threads = static_cast<unsigned>(std::min<size_t>(
      {bytes / kFlushBytesPerThread, kMaxFlushThreads, std::thread::hardware_concurrency()}));
  if (threads < 2) {
    flush_lines(p, bytes);
  } else {
    const size_t chunk = align_up(bytes / threads, 64);
    std::vector<std::thread> workers;
    for (size_t off = chunk; off < bytes; off += chunk) {
      workers.emplace_back(flush_lines, p + off, std::min(chunk, bytes - off));
    }
    flush_lines(p, std::min(chunk, bytes));
    for (std::thread& w : workers) w.join();
  }
  __builtin_ia32_mfence();
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace detail

namespace {

using detail::buffer_with_data;
using detail::CalibrationSpent;
using detail::flush_from_caches;
using detail::kFirstPosition;
using detail::seconds_since;

class Calibrator {
 public:
  Calibrator(Backend& backend, const CalibrationOptions& options)
      : b_(backend),
        options_(options),
        budget_(options.quick ? kQuickBudget : kFullBudget),
        start_(std::chrono::steady_clock::now()) {}

  BackendProfile run() {
    profile_ = CostModel::default_profile(b_.backend_id(), b_.kind());
    profile_.op_samples.clear();
    profile_.learned.clear();
    measure_launch();
    if (b_.kind() == BackendKind::Cpu && b_.host_accessible()) {
      // LLaMA 3.2 1B's and 3.1 8B's layers, then the 1B's over 32 cache positions for its
      // attention alone (DecodeLayerShape). The first warms up for kFirstLayerWarmUpSeconds: on a
      // 2-core VM the first ~0.2 s of memory-bound work after the process stood idle read every
      // product 1.5-1.9x its run time in 7 of 12 calibrations. After each pass's flush the pool
      // works for kLeadInSeconds: with one lead-in product, 16 threads read the 1B's one-token
      // products at 1.15-1.23x their run times (bench/NOTES.md).
      detail::DecodeLayerPasses passes = budget_.layer_passes;
      passes.warm_up_s = kFirstLayerWarmUpSeconds;
      passes.lead_in_s = kLeadInSeconds;
      for (const detail::DecodeLayerShape& d :
           {detail::DecodeLayerShape{2048, 32, 8, 64, 8192},
            detail::DecodeLayerShape{4096, 32, 8, 128, 14336},
            detail::DecodeLayerShape{2048, 32, 8, 64, 8192, 32, true}}) {
        for (const auto& [key, sample] : detail::measure_decode_layer(
                 b_, d, passes, [this] { lead_in(); }, rng_, spent_)) {
          add_sample(key, sample);
          in_place_least_us_ = std::min(in_place_least_us_, sample.us);
        }
        passes.warm_up_s = 0.0;  // one untimed pass
      }
      say("decode blocks");
    }
    measure_matmuls();
    measure_experts();
    measure_attention();
    measure_elementwise();
    if (b_.kind() == BackendKind::Gpu) measure_link();
    if (!b_.host_accessible()) {
      const detail::SegmentFigures seg = detail::measure_segments(b_, budget_.reps, rng_);
      profile_.segment_launch_us = std::min(seg.per_op_us, profile_.launch_us);
      profile_.segment_saving_us = seg.saving_us;
      say("segments: " + std::to_string(profile_.segment_launch_us) + " us an op, " +
          std::to_string(profile_.segment_saving_us) + " us saved by a product");
    }
    // Again once the backend has worked for a while: the first calibration on an H100 that had
    // stood idle read the launch at 12.96 us, the next three 6.2-7.5 us, and one-token ops timed
    // in a run take 7.6-9 us (2026-11-27); five quick calibrations of a 2-core VM's CPU read
    // 0.78-1.52 us, where a one-token rope measured in place takes 0.44. A backend's launch is
    // what it costs once running, so the lower reading counts (it is the floor of every small
    // op's estimate).
    // An op timed in place costs its launch and more: the least of them bounds the launch too
    // (the 1B's K RoPE, 0.46 us, under a launch read at 0.94 that every small op's estimate
    // kept to).
    const double first = profile_.launch_us;
    measure_launch();
    profile_.launch_us = std::min({first, profile_.launch_us, in_place_least_us_});
    fit_base_figures(profile_);
    profile_.calibrated = true;
    return profile_;
  }

 private:
  using Clock = std::chrono::steady_clock;
  double in_place_least_us_ = INFINITY;  // the quickest op of the decode layers

  // Each line ends with the seconds since calibration of this backend began and, for the ops
  // timed since the last line, the seconds spent preparing inputs, flushing them from the caches
  // and running the op (warm-up included), so a slow phase shows where the time went.
  void say(const std::string& line) {
    if (!options_.progress) return;
    char at[128];
    std::snprintf(at, sizeof at, " (%.2f s; setup %.2f, flush %.2f, runs %.2f)",
                  seconds_since(start_), spent_.setup, spent_.flush, spent_.runs);
    spent_ = {};
    options_.progress(line + at);
  }

  // Median time of `node` alone; false when the backend cannot run it or runs out of memory.
  bool time_node(const Graph& g, TensorId node_id, int reps, int64_t pos_end, int64_t id_limit,
                 double& median_us) {
    const Node& node = g.node(node_id);
    if (!b_.can_execute(g, node)) return false;
    const Clock::time_point setup_start = Clock::now();
    std::map<TensorId, Buffer> buffers;
    try {
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        const TensorId in = node.inputs[i];
        if (buffers.count(in)) continue;
        const TensorDesc& t = g.tensor(in);
        // Only a get_rows' row ids and an expert product's expert ids index a table; other I32
        // inputs are positions.
        const bool ids =
            (node.op == OpKind::GetRows && i == 1) || (node.op == OpKind::ExpertMatMul && i == 2);
        const int64_t limit = ids ? id_limit : 0;
        buffers[in] = buffer_with_data(b_, t, pos_end, limit, rng_);
      }
      const bool aliases = op_descriptor(node.op).aliases_output;
      if (!aliases) buffers[node_id] = b_.allocate(std::max<size_t>(g.tensor(node_id).bytes(), 1));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::OutOfMemory) throw;
      return false;
    }
    const TensorId out_storage = g.storage_of(node_id);
    NodeExecution exec = execution_of(
        g, node, [&](TensorId id) { return buffers.at(id == node_id ? out_storage : id).data(); });
    b_.synchronize();
    spent_.setup += seconds_since(setup_start);
    const Clock::time_point warm_up = Clock::now();
    b_.execute(g, exec);  // warm-up: lazily built kernels, page faults
    b_.synchronize();
    spent_.runs += seconds_since(warm_up);
    std::vector<double> times;
    double spent = 0.0;
    for (int r = 0; r < reps && (r < 3 || spent < budget_.max_point_us); ++r) {
      if (b_.host_accessible()) {
        const Clock::time_point flush = Clock::now();
        for (const auto& [id, buffer] : buffers) flush_from_caches(buffer.data(), buffer.bytes());
        spent_.flush += seconds_since(flush);
        prepare_like_a_graph(g, node, buffers);
      }
      const Clock::time_point run = Clock::now();
      b_.timer_start();
      b_.execute(g, exec);
      times.push_back(b_.timer_stop_us());
      spent_.runs += seconds_since(run);
      spent += times.back();
    }
    median_us = median(times);
    return true;
  }

  // In a graph an op's activations were just written by the op before, with the pool's workers,
  // which still poll for work when this op starts. After a flush (milliseconds) the workers
  // sleep and every input is in DRAM: waking them alone cost a one-token matrix-vector product a
  // quarter more than in a graph (1B, 16 threads), and reading cold activations made one-token
  // elementwise ops 2-3x dearer. So each F32 activation input is rewritten in place (x + 0) just
  // before the timed run; weights and KV caches stay flushed. Then a small one-token product runs,
  // as one precedes most ops of a decode step: it wakes the workers (a rewrite shorter than the
  // pool's grain runs on the caller alone) and leaves the translation caches as a product does.
  void prepare_like_a_graph(const Graph& g, const Node& node,
                            const std::map<TensorId, Buffer>& buffers) {
    for (TensorId in : node.inputs) {
      if (g.node(in).op != OpKind::Input || g.tensor(in).dtype != DType::F32) continue;
      rewrite(buffers.at(in).data(), g.tensor(in).elements());
    }
    lead_in();
  }
  // A one-token q4_0 product of about a small decode projection's weight (1B's 2048 x 2048 is
  // 2.4 MB), writing a buffer of its own with the pool as a projection does.
  static constexpr int64_t kLeadInRows = 2048;
  static constexpr int64_t kLeadInInputs = 2560;
  void lead_in() {
    if (!lead_in_) {
      lead_in_ = std::make_unique<LeadIn>();
      LeadIn& p = *lead_in_;
      p.w = p.g.weight("w", DType::Q4_0, {kLeadInInputs, kLeadInRows});
      p.b = p.g.input("b", DType::F32, {kLeadInInputs, 1});
      p.c = p.g.matmul(p.w, p.b);
      p.runs = b_.can_execute(p.g, p.g.node(p.c));
      if (!p.runs) return;  // a host backend without q4_0 products: no lead-in
      for (TensorId id : {p.w, p.b}) {
        p.buffers[id] = buffer_with_data(b_, p.g.tensor(id), 0, 0, rng_);
      }
      p.buffers[p.c] = b_.allocate(size_t(kLeadInRows) * sizeof(float));
    }
    LeadIn& p = *lead_in_;
    if (!p.runs) return;
    b_.execute(p.g, execution_of(p.g, p.g.node(p.c),
                                 [&](TensorId id) { return p.buffers.at(id).data(); }));
  }
  static constexpr double kFirstLayerWarmUpSeconds = 0.25, kLeadInSeconds = 0.002;
  struct LeadIn {
    Graph g;
    TensorId w = kNoTensor, b = kNoTensor, c = kNoTensor;
    bool runs = false;
    std::map<TensorId, Buffer> buffers;
  };
  std::unique_ptr<LeadIn> lead_in_;

  // x + 0 into x over n floats.
  void rewrite(void* x, int64_t n) {
    auto& r = rewriters_[n];
    if (!r) {
      r = std::make_unique<Rewriter>();
      r->x = r->g.input("x", DType::F32, {n});
      r->z = r->g.input("z", DType::F32, {n});
      r->c = r->g.add(r->x, r->z);
      r->zeros = b_.allocate(size_t(n) * sizeof(float));
      std::memset(r->zeros.data(), 0, size_t(n) * sizeof(float));
    }
    NodeExecution exec = execution_of(
        r->g, r->g.node(r->c), [&](TensorId id) { return id == r->z ? r->zeros.data() : x; });
    b_.execute(r->g, exec);
  }
  struct Rewriter {
    Graph g;
    TensorId x = kNoTensor, z = kNoTensor, c = kNoTensor;
    Buffer zeros;
  };
  std::map<int64_t, std::unique_ptr<Rewriter>> rewriters_;

  // A quick calibration skips a shape whose run would take longer than kQuickMaxRunUs, predicted
  // from the largest shape of the same op key measured so far at the same rate: the large
  // prefill shapes cost milliseconds on a GPU, and seconds on a small CPU.
  bool too_slow_for_quick(const OpWork& w, const std::vector<OpSample>& samples) const {
    if (!options_.quick || samples.empty()) return false;
    const OpSample& largest = samples.back();
    const double predicted_us = largest.us * (w.flops + w.bytes) / (largest.flops + largest.bytes);
    return predicted_us > kQuickMaxRunUs;
  }

  void record(const Graph& g, TensorId node_id, int64_t pos_end = 0, int64_t id_limit = 0) {
    const Node& node = g.node(node_id);
    const OpWork w = op_work(g, node);
    OpKey key = op_key(g, node);
    key.after = OpKind::Input;  // timed alone, after nothing in particular
    const auto known = profile_.op_samples.find(key);
    if (known != profile_.op_samples.end() && too_slow_for_quick(w, known->second)) return;
    if (measured_in_place(key, w)) return;
    double us = 0.0;
    if (!time_node(g, node_id, budget_.reps, pos_end, id_limit, us)) return;
    add_sample(key, {w.flops, w.bytes, us});
  }

  // A shape the decode block measured in place (after whichever op) is not measured again alone.
  bool measured_in_place(const OpKey& key, const OpWork& w) const {
    for (const auto& [k, samples] : profile_.op_samples) {
      if (k.op != key.op || k.dtype != key.dtype || k.one_token != key.one_token) continue;
      if (std::any_of(samples.begin(), samples.end(), [&](const OpSample& s) {
            return s.flops == w.flops && s.bytes == w.bytes;
          })) {
        return true;
      }
    }
    return false;
  }
  void add_sample(const OpKey& key, OpSample sample) {
    sample.us = std::max(sample.us, 1e-3);
    std::vector<OpSample>& samples = profile_.op_samples[key];
    samples.push_back(sample);
    std::sort(samples.begin(), samples.end(), [](const OpSample& a, const OpSample& b) {
      return a.flops + a.bytes < b.flops + b.bytes;
    });
  }

  void measure_launch() {
    Graph g;
    TensorId a = g.input("a", DType::F32, {16});
    TensorId c = g.add(a, g.input("b", DType::F32, {16}));
    double us = 0.0;
    if (time_node(g, c, budget_.tiny_reps, 0, 0, us)) profile_.launch_us = us;
    say("launch " + std::to_string(profile_.launch_us) + " us");
  }

  void measure_matmuls() {
    // Weight shapes (n_in, n_out) spanning LLaMA 1B to 8B projections: one token, a short prompt
    // (16) and many.
    struct Shape {
      int64_t k, m, tokens;
    };
    std::vector<Shape> shapes;
    if (options_.quick) {
      shapes = {{1024, 1024, 1},   {2048, 8192, 1},   {4096, 14336, 1},
                {1024, 1024, 32},  {2048, 2048, 16},  {4096, 4096, 16},
                {2048, 2048, 128}, {4096, 4096, 512}, {4096, 14336, 512}};
    } else {
      shapes = {{1024, 1024, 1},  {2048, 2048, 1},   {4096, 4096, 1},  {2048, 8192, 1},
                {4096, 14336, 1}, {1024, 1024, 16},  {2048, 2048, 16}, {4096, 4096, 16},
                {2048, 2048, 64}, {4096, 4096, 128}, {2048, 8192, 512}};
    }
    for (DType dt : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16,
                     DType::BF16, DType::F32}) {
      for (const Shape& s : shapes) {
        // Full-precision weights at the largest shapes cost more to set up than they teach.
        if (options_.quick && s.k * s.m > 4096 * 4096 && !dtype_traits(dt).is_quantized) continue;
        Graph g;
        TensorId w = g.weight("w", dt, {s.k, s.m});
        TensorId x = g.input("x", DType::F32, {s.k, s.tokens});
        record(g, g.matmul(w, x));
      }
      say("matmul " + std::string(dtype_name(dt)));
    }
  }

  void measure_experts() {
    // Expert products (MoE layers) in the shape of a Qwen3-30B-A3B layer's gate (2,048 x 768,
    // 8 chosen per token) over 32 experts chosen uniformly: one token, and batches with 4 and
    // 16 pairs per expert. Each backend groups the pairs by expert in its own kernel, so the dense
    // products' samples do not tell this op's speed (on 16 CPU threads the prefill experts ran
    // 2.2x slower than the dense Q4_0 product's efficiency predicted).
    constexpr int64_t kExperts = 32, kChosen = 8;
    for (DType dt : {DType::Q4_0, DType::Q8_0}) {
      for (int64_t tokens : {int64_t(1), int64_t(16), int64_t(64)}) {
        Graph g;
        TensorId w = g.weight("w", dt, {2048, 768, kExperts});
        TensorId x = g.input("x", DType::F32, {2048, 1, tokens});
        TensorId ids = g.input("ids", DType::I32, {kChosen, tokens});
        record(g, g.expert_matmul(w, x, ids), 0, kExperts);
      }
      say("expert_matmul " + std::string(dtype_name(dt)));
    }
  }

  void measure_attention() {
    struct Shape {
      int64_t head_dim, cache, tokens;
    };
    // Decode from a short context up (32 keys: a query's fixed work, which the keys do not
    // scale, weighs most there; below the smallest sample the estimate scales its time by the
    // keys read), then prefill batches.
    std::vector<Shape> shapes =
        options_.quick
            ? std::vector<Shape>{{64, 32, 1},
                                 {64, 256, 1},
                                 {128, 2048, 1},
                                 {64, 128, 32},
                                 {128, 512, 512}}
            : std::vector<Shape>{{64, 32, 1},   {128, 32, 1},   {64, 256, 1},  {128, 512, 1},
                                 {64, 2048, 1}, {128, 4096, 1}, {64, 128, 32}, {128, 512, 128}};
    constexpr int64_t kHeads = 32, kKvHeads = 8;
    for (DType kv : {DType::F16, DType::F32}) {
      for (const Shape& s : shapes) {
        Graph g;
        TensorId q = g.input("q", DType::F32, {s.head_dim, kHeads, s.tokens});
        TensorId kc = g.kv_cache("k", kv, {s.head_dim, kKvHeads, s.cache});
        TensorId vc = g.kv_cache("v", kv, {s.head_dim, kKvHeads, s.cache});
        TensorId pos = g.input("pos", DType::I32, {s.tokens});
        // Positions at the end of the cache: every key is read, as the estimate assumes.
        record(g, g.attention(q, kc, vc, pos, 1.0f / std::sqrt(float(s.head_dim))), s.cache);
      }
    }
    say("attention");
  }

  void measure_elementwise() {
    // Row length x rows: one decode token of a 1B/8B model up to a prefill batch.
    struct Shape {
      int64_t n, rows;
    };
    std::vector<Shape> shapes =
        options_.quick ? std::vector<Shape>{{2048, 1}, {14336, 1}, {2048, 16}, {4096, 512}}
                       : std::vector<Shape>{{2048, 1},  {4096, 1},   {14336, 1},
                                            {2048, 32}, {4096, 128}, {8192, 512}};
    for (const Shape& s : shapes) {
      auto f32 = [&](Graph& g, const char* name) {
        return g.input(name, DType::F32, {s.n, s.rows});
      };
      {
        Graph g;
        record(g, g.add(f32(g, "a"), f32(g, "b")));
      }
      {
        Graph g;
        record(g, g.mul(f32(g, "a"), f32(g, "b")));
      }
      {
        Graph g;
        record(g, g.swiglu(f32(g, "a"), f32(g, "b")));
      }
      {
        Graph g;
        record(g, g.silu(f32(g, "a")));
      }
      {
        Graph g;
        record(g, g.scale(f32(g, "a"), 0.5f));
      }
      {
        Graph g;
        record(g, g.softmax(f32(g, "a")));
      }
      {
        Graph g;
        record(g, g.rms_norm(f32(g, "a"), g.weight("w", DType::F32, {s.n}), 1e-5f));
      }
      {
        Graph g;
        record(g, g.copy(f32(g, "a"), DType::F16));
      }
      const int64_t head_dim = s.n >= 4096 ? 128 : 64;
      {
        Graph g;
        TensorId x = g.input("x", DType::F32, {head_dim, s.n / head_dim, s.rows});
        TensorId pos = g.input("pos", DType::I32, {s.rows});
        record(g, g.rope(x, pos, int32_t(head_dim), 500000.0f), kFirstPosition + s.rows);
      }
      for (DType kv : {DType::F16, DType::F32}) {
        Graph g;
        const int64_t cache = std::max<int64_t>(256, s.rows);
        TensorId c = g.kv_cache("k", kv, {head_dim, s.n / head_dim, cache});
        TensorId src = g.input("src", DType::F32, {head_dim, s.n / head_dim, s.rows});
        TensorId pos = g.input("pos", DType::I32, {s.rows});
        record(g, g.kv_write(c, src, pos), cache);
      }
      for (DType dt : {DType::Q4_0, DType::Q8_0, DType::F16, DType::BF16, DType::F32}) {
        Graph g;
        constexpr int64_t kTableRows = 256;
        TensorId table = g.weight("table", dt, {s.n, kTableRows});
        TensorId ids = g.input("ids", DType::I32, {s.rows});
        record(g, g.get_rows(table, ids), 0, kTableRows);
      }
    }
    say("elementwise");
  }

  // Host clock around the copy and a synchronize: the copy may run on another queue than the
  // one the backend's timer marks.
  template <typename Copy>
  double time_copy(Copy&& copy) {
    std::vector<double> times;
    copy();
    b_.synchronize();
    for (int r = 0; r < budget_.reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      copy();
      b_.synchronize();
      times.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(times);
  }

  void measure_link() {
    std::vector<size_t> sizes{size_t(64) << 10, size_t(1) << 20, size_t(16) << 20};
    if (!options_.quick) sizes.push_back(size_t(128) << 20);
    std::vector<uint8_t> host(sizes.back(), 1);
    Buffer device = b_.allocate(sizes.back());
    std::vector<std::pair<double, double>> to_device, to_host, pinned;
    for (size_t n : sizes) {
      to_device.push_back(
          {double(n), time_copy([&] { b_.copy_from_host(device.data(), host.data(), n); })});
      to_host.push_back(
          {double(n), time_copy([&] { b_.copy_to_host(host.data(), device.data(), n); })});
    }
    // A device may keep a page-locked copy of exactly the bytes it was given: one per size,
    // prepared before its copies are timed.
    for (size_t n : sizes) {
      if (!b_.prepare_stream_source(host.data(), n)) {
        pinned.clear();
        break;
      }
      pinned.push_back({double(n), time_copy([&] {
                          b_.stream_from_host(device.data(), host.data(), n, 0);
                          b_.wait_stream_event(0);
                        })});
    }
    b_.release_stream_source(host.data());
    LinkProfile& link = profile_.link;
    const LinkFit d = fit_link(to_device), h = fit_link(to_host);
    link.bandwidth_gbs = d.bandwidth_gbs;
    link.latency_us = d.latency_us;
    link.to_host_bandwidth_gbs = h.bandwidth_gbs;
    link.to_host_latency_us = h.latency_us;
    if (!pinned.empty()) {
      const LinkFit p = fit_link(pinned);
      link.pinned_bandwidth_gbs = p.bandwidth_gbs;
      link.pinned_latency_us = p.latency_us;
    }
    say("link");
  }

  Backend& b_;
  const CalibrationOptions& options_;
  Budget budget_;
  Clock::time_point start_;
  CalibrationSpent spent_;
  BackendProfile profile_;
  SplitMix64 rng_{0x5EED};
};

}  // namespace

BackendProfile calibrate_backend(Backend& backend, const CalibrationOptions& options) {
  return Calibrator(backend, options).run();
}

}  // namespace tandem
