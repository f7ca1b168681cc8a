#include "tandem/cost_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cost_model_json.h"
#include "tandem/error.h"

namespace tandem {

OpWork op_work(const Graph& graph, const Node& node) {
  OpWork w;
  if (!is_compute(node.op)) return w;
  // Most ops read every input once and write their output once; the descriptor says otherwise.
  for (TensorId id : node.inputs) w.bytes += double(data_bytes(graph.tensor(id)));
  w.bytes += double(data_bytes(graph.tensor(node.id)));
  if (const auto work = op_descriptor(node.op).work) work(graph, node, w);
  return w;
}

BackendProfile CostModel::default_profile(BackendKind kind) {
  BackendProfile p;
  if (kind == BackendKind::Cpu) {
    p.peak_gflops = {kDefaultCpuF32Gflops, kDefaultCpuF16Gflops, kDefaultCpuQuantizedGflops};
    p.memory_bandwidth_gbs = kDefaultCpuBandwidthGbs;
    p.launch_us = kDefaultCpuLaunchUs;
  } else {
    p.peak_gflops = {kDefaultGpuF32Gflops, kDefaultGpuF16Gflops, kDefaultGpuQuantizedGflops};
    p.memory_bandwidth_gbs = kDefaultGpuBandwidthGbs;
    p.launch_us = kDefaultGpuLaunchUs;
  }
  p.link.bandwidth_gbs = kDefaultLinkBandwidthGbs;
  p.link.latency_us = kDefaultLinkLatencyUs;
  return p;
}

BackendProfile CostModel::default_profile(std::string_view backend_id, BackendKind kind) {
  BackendProfile p = default_profile(kind);
  if (backend_id == kReferenceBackendId) {
    p.peak_gflops.fill(kDefaultReferenceGflops);
    p.memory_bandwidth_gbs = kDefaultReferenceBandwidthGbs;
    p.launch_us = kDefaultReferenceLaunchUs;
  }
  return p;
}

namespace {

// Products and attention: one token or many, and their size alone (their samples span the sizes
// of every model). The other ops also by the op that runs before them (OpKey::after).
bool priced_by_size(OpKind op) {
  return op == OpKind::MatMul || op == OpKind::QuantizedMatMul || op == OpKind::Attention ||
         op == OpKind::ExpertMatMul;
}

}  // namespace

OpKey op_key(const Graph& graph, const Node& node) {
  OpKey key;
  key.op = node.op;
  // The dtype that picks the kernel: a matmul's weight, attention's KV cache, else input 0's.
  const size_t typed = node.op == OpKind::Attention ? 1 : 0;
  if (node.inputs.size() > typed) key.dtype = graph.tensor(node.inputs[typed]).dtype;
  if ((node.op == OpKind::MatMul || node.op == OpKind::QuantizedMatMul) && node.inputs.size() > 1) {
    const TensorDesc& b = graph.tensor(node.inputs[1]);
    key.one_token = b.ne[1] * b.ne[2] * b.ne[3] == 1;
  } else if (node.op == OpKind::ExpertMatMul && node.inputs.size() > 2) {
    key.one_token = graph.tensor(node.inputs[2]).ne[1] == 1;  // ids [k, tokens]
  } else if (node.op == OpKind::Attention && !node.inputs.empty()) {
    const TensorDesc& q = graph.tensor(node.inputs[0]);
    key.one_token = q.ne[2] * q.ne[3] == 1;
  }
  if (!priced_by_size(node.op)) {
    for (size_t id = size_t(node.id); id-- > 0;) {
      const OpKind before = graph.nodes()[id].op;
      if (is_compute(before)) {
        key.after = before;
        break;
      }
    }
  }
  return key;
}

std::string op_key_name(const OpKey& key) {
  std::string name(op_name(key.op));
  name += " ";
  name += dtype_name(key.dtype);
  if (priced_by_size(key.op)) name += key.one_token ? " vec" : " mat";
  if (key.after != OpKind::Input) {
    name += " after ";
    name += op_name(key.after);
  }
  return name;
}

void CostModel::set_profile(std::string id_or_kind, const BackendProfile& profile) {
  profiles_[std::move(id_or_kind)] = profile;
}

BackendProfile CostModel::profile(std::string_view backend_id, BackendKind kind) const {
  if (auto it = profiles_.find(backend_id); it != profiles_.end()) return it->second;
  // The reference backend is a CPU backend, but never as fast as the calibrated one.
  if (backend_id != kReferenceBackendId) {
    if (auto it = profiles_.find(backend_kind_name(kind)); it != profiles_.end()) return it->second;
  }
  return default_profile(backend_id, kind);
}

double CostModel::stream_us(size_t bytes, const LinkProfile& link) {
  if (!(link.pinned_bandwidth_gbs > 0.0)) return transfer_us(bytes, link, 1);
  return double(bytes) / (link.pinned_bandwidth_gbs * 1e3) + link.pinned_latency_us;
}

double CostModel::in_segment_us(double compute_us, const BackendProfile& profile) {
  if (!(profile.segment_launch_us > 0.0)) return compute_us;
  const double saving = profile.segment_saving_us > 0.0
                            ? profile.segment_saving_us
                            : profile.launch_us - profile.segment_launch_us;
  return std::max(compute_us - saving, profile.segment_launch_us);
}

double CostModel::activation_us(size_t bytes, const LinkProfile& link, int hops) {
  if (hops <= 0) return 0.0;
  return double(hops) * stream_us(bytes, link);
}

double CostModel::transfer_us(size_t bytes, const LinkProfile& link, int hops) {
  if (hops <= 0) return 0.0;
  return double(hops) * (double(bytes) / (link.bandwidth_gbs * 1e3) + link.latency_us);
}

OpCost CostModel::estimate(const Graph& graph, const Node& node, const BackendProfile& profile,
                           const LinkProfile& link, std::span<const uint8_t> input_hops,
                           double weight_runs) {
  OpCost cost;
  if (!is_compute(node.op)) return cost;
  cost.compute_us = compute_us_at(graph, node, profile, 1.0);

  TensorId seen[8];
  size_t n_seen = 0;
  std::vector<TensorId> seen_more;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    TensorId s = graph.storage_of(node.inputs[i]);
    bool dup = std::find(seen, seen + n_seen, s) != seen + n_seen ||
               std::find(seen_more.begin(), seen_more.end(), s) != seen_more.end();
    if (dup) continue;
    if (n_seen < 8) {
      seen[n_seen++] = s;
    } else {
      seen_more.push_back(s);
    }
    size_t bytes = graph.tensor(s).bytes();
    cost.memory_bytes += bytes;
    int hops = i < input_hops.size() ? input_hops[i] : 0;
    const OpKind op = graph.node(s).op;
    if (op == OpKind::Weight) {
      cost.transfer_us += transfer_us(bytes, link, hops) / weight_runs;
    } else if (op == OpKind::KvCache) {
      cost.transfer_us += transfer_us(bytes, link, hops);
    } else {
      cost.transfer_us += activation_us(bytes, link, hops);
    }
  }
  const TensorDesc& out = graph.tensor(node.id);
  if (!out.is_view()) cost.memory_bytes += out.bytes();
  return cost;
}

double CostModel::roofline_us(const OpWork& w, const BackendProfile& profile) {
  const double gflops = profile.peak_gflops[size_t(w.dtype_class)];
  const double flop_us = gflops > 0 ? w.flops / (gflops * 1e3) : 0.0;
  const double byte_us =
      profile.memory_bandwidth_gbs > 0 ? w.bytes / (profile.memory_bandwidth_gbs * 1e3) : 0.0;
  return std::max(flop_us, byte_us);
}

namespace {
// A sample no slower than the launch op has efficiency 0; the geometric interpolation needs a
// floor, far below any real op's.
constexpr double kMinEfficiency = 1e-3;

// A K-quant product that calibration did not measure takes the efficiency of the 32-element
// format nearest its bits per weight (Q4_K, Q5_K: Q4_0; Q6_K: Q8_0) at its own roofline: the
// same integer dot kernels over other blocks, and its bytes still come from its own rows.
OpKey sampled_key(const OpKey& key, const BackendProfile& profile) {
  if (profile.op_samples.count(key)) return key;
  OpKey proxy = key;
  // Not measured after this op: the op's samples of any other context (timed alone).
  if (key.after != OpKind::Input) {
    proxy.after = OpKind::Input;
    if (profile.op_samples.count(proxy)) return proxy;
  }
  // K-quants without samples of their own take Q4_0's or (Q6_K) Q8_0's.
  if (is_k_quant(key.dtype)) {
    proxy.dtype = key.dtype == DType::Q6_K ? DType::Q8_0 : DType::Q4_0;
    if (profile.op_samples.count(proxy)) return proxy;
  }
  // An expert product is a dense product per chosen expert (each backend groups the pairs by
  // expert): calibration samples it (measure_experts); a profile without those samples takes
  // the efficiency of the dense product of its weights' dtype rather than the bare roofline,
  // which put the CPU's Qwen3-30B-A3B prefill experts 3.7x too fast.
  if (key.op == OpKind::ExpertMatMul) {
    proxy.op = dtype_traits(key.dtype).is_quantized ? OpKind::QuantizedMatMul : OpKind::MatMul;
  }
  return proxy;
}

// A matrix-vector product reads each weight once for two flops: memory bound wherever it runs,
// even where the peak of a product over many tokens is below the rate its bytes arrive at (a few
// CPU threads), so its time and its samples' scale with bytes alone.
double key_roofline_us(const OpWork& w, const OpKey& key, const BackendProfile& profile) {
  const bool vector_product =
      key.one_token && (key.op == OpKind::MatMul || key.op == OpKind::QuantizedMatMul);
  if (vector_product && profile.memory_bandwidth_gbs > 0)
    return w.bytes / (profile.memory_bandwidth_gbs * 1e3);
  return CostModel::roofline_us(w, profile);
}

}  // namespace

double CostModel::calibrated_compute_us(const OpWork& w, const OpKey& key,
                                        const BackendProfile& profile) {
  const double roofline = key_roofline_us(w, key, profile);
  const auto it = profile.op_samples.find(sampled_key(key, profile));
  if (it == profile.op_samples.end() || it->second.empty() || roofline <= 0.0)
    return roofline + profile.launch_us;
  // Efficiency of each sample at its own roofline time, interpolated geometrically in
  // log(roofline): between two samples the time beyond the launch is the geometric mean of
  // theirs, weighted by where the op's size falls, so it always lies between them. (Linear in
  // the efficiency, an op between a launch-bound sample and a large one cost up to ten times
  // either: a 3 MB kv_write between 0.09 MB in 16 us and 12.6 MB in 14 us came out at 110 us.)
  const std::vector<OpSample>& samples = it->second;
  auto point = [&](const OpSample& s) {
    OpWork sw = w;
    sw.flops = s.flops;
    sw.bytes = s.bytes;
    const double r = std::max(key_roofline_us(sw, key, profile), 1e-9);
    return std::pair{r, std::max(s.us - profile.launch_us, 0.0) / r};
  };
  auto [r0, e0] = point(samples.front());
  double eff = e0;
  if (roofline > r0) {
    for (size_t i = 1; i < samples.size(); ++i) {
      auto [r1, e1] = point(samples[i]);
      if (roofline <= r1) {
        const double t = r1 > r0 ? std::log(roofline / r0) / std::log(r1 / r0) : 1.0;
        eff = std::exp((1.0 - t) * std::log(std::max(e0, kMinEfficiency)) +
                       t * std::log(std::max(e1, kMinEfficiency)));
        break;
      }
      r0 = r1;
      e0 = e1;
      eff = e1;
    }
  }
  return roofline * eff + profile.launch_us;
}

int CostModel::size_bucket(double compute_us) {
  return int(std::floor(2.0 * std::log2(std::max(compute_us, 1e-3))));
}

double median(std::vector<double> values) {
  TANDEM_CHECK_ARG(!values.empty(), "median", "no values");
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + long(mid), values.end());
  double m = values[mid];
  if (values.size() % 2 == 0) {
    m = (m + *std::max_element(values.begin(), values.begin() + long(mid))) / 2.0;
  }
  return m;
}

double CostModel::learned_factor(const BackendProfile& profile, const OpKey& key, int bucket) {
  const auto it = profile.learned.find({key, bucket});
  if (it == profile.learned.end() || it->second.ratios.size() < kMinLearnedSamples) return 1.0;
  return median(it->second.ratios);
}

namespace {

OpWork scaled_work(const Graph& graph, const Node& node, double work_scale) {
  OpWork w = op_work(graph, node);
  if (work_scale > 0.0 && work_scale < 1.0) {
    w.flops *= work_scale;
    w.bytes *= work_scale;
  }
  return w;
}

}  // namespace

double CostModel::compute_us_at(const Graph& graph, const Node& node, const BackendProfile& profile,
                                double work_scale) {
  if (!is_compute(node.op)) return 0.0;
  const OpKey key = op_key(graph, node);
  double us = calibrated_compute_us(scaled_work(graph, node, work_scale), key, profile);
  if (!profile.learned.empty()) us *= learned_factor(profile, key, size_bucket(us));
  return us;
}

double CostModel::attention_work_scale(const Graph& graph, const Node& node,
                                       const int32_t* positions) {
  if (node.op != OpKind::Attention || node.inputs.size() < 4 || !positions) return 1.0;
  const int64_t C = graph.tensor(node.inputs[1]).ne[2];
  const int64_t T = graph.tensor(node.inputs[3]).elements();
  if (C <= 0 || T <= 0) return 1.0;
  double keys = 0.0;
  for (int64_t t = 0; t < T; ++t)
    keys += double(std::clamp<int64_t>(int64_t(positions[t]) + 1, 1, C));
  return keys / (double(T) * double(C));
}

void CostModel::observe(const Graph& graph, const Node& node, std::string_view backend_id,
                        BackendKind kind, double actual_us, double work_scale) {
  if (!is_compute(node.op) || !(actual_us > 0.0)) return;
  auto it = profiles_.find(backend_id);
  if (it == profiles_.end()) {
    it = profiles_.emplace(std::string(backend_id), profile(backend_id, kind)).first;
  }
  BackendProfile& p = it->second;
  const OpKey key = op_key(graph, node);
  const double base = calibrated_compute_us(scaled_work(graph, node, work_scale), key, p);
  if (!(base > 0.0)) return;
  pending_[{it->first, {key, size_bucket(base)}}].push_back(actual_us / base);
}

void CostModel::end_observations() {
  for (auto& [where, ratios] : pending_) {
    std::vector<double>& kept = profiles_.at(where.first).learned[where.second].ratios;
    if (kept.size() >= kLearnedSamples) kept.erase(kept.begin());
    kept.push_back(median(std::move(ratios)));
  }
  pending_.clear();
}

// ---- JSON ----

namespace {

using nlohmann::json;

double number(const json& j, const char* key, double fallback, const std::string& where) {
  if (!j.contains(key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_number() || !(v.get<double>() >= 0.0)) {
    throw_error(ErrorCode::Format, "cost model json",
                where + "." + key + " must be a number >= 0 (got " + v.dump() + ")");
  }
  return v.get<double>();
}

const char* const kWhat = "cost model json";

[[noreturn]] void bad(const std::string& message) {
  throw_error(ErrorCode::Format, kWhat, message);
}

const json& object_at(const json& j, const char* key, const std::string& where) {
  const json& v = j.at(key);
  if (!v.is_object()) bad(where + "." + key + " must be an object");
  return v;
}

OpKey parse_op_key(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("op") || !j.at("op").is_string() || !j.contains("dtype") ||
      !j.at("dtype").is_string()) {
    bad(where + " must be an object with \"op\" and \"dtype\" names");
  }
  OpKey key;
  const auto op = op_from_name(j.at("op").get<std::string>());
  if (!op) bad(where + ".op: unknown op '" + j.at("op").get<std::string>() + "'");
  const auto dtype = dtype_from_name(j.at("dtype").get<std::string>());
  if (!dtype) bad(where + ".dtype: unknown dtype '" + j.at("dtype").get<std::string>() + "'");
  key.op = *op;
  key.dtype = *dtype;
  key.one_token = j.value("one_token", false);
  if (j.contains("after")) {
    const json& after = j.at("after");
    const auto before = after.is_string() ? op_from_name(after.get<std::string>()) : std::nullopt;
    if (!before) bad(where + ".after: unknown op " + after.dump());
    key.after = *before;
  }
  return key;
}

json op_key_json(const OpKey& key) {
  json j = {{"op", std::string(op_name(key.op))},
            {"dtype", std::string(dtype_name(key.dtype))},
            {"one_token", key.one_token}};
  if (key.after != OpKind::Input) j["after"] = std::string(op_name(key.after));
  return j;
}

std::vector<double> numbers(const json& j, const std::string& where) {
  if (!j.is_array()) bad(where + " must be an array of numbers");
  std::vector<double> out;
  for (const json& v : j) {
    if (!v.is_number() || !(v.get<double>() >= 0.0) || !std::isfinite(v.get<double>()))
      bad(where + " must hold numbers >= 0 (got " + v.dump() + ")");
    out.push_back(v.get<double>());
  }
  return out;
}

}  // namespace

namespace detail {

BackendProfile profile_from_json(const json& j, BackendProfile p, const std::string& where) {
  if (!j.is_object()) bad(where + " must be an object");
  if (j.contains("peak_gflops")) {
    const json& g = object_at(j, "peak_gflops", where);
    for (int c = 0; c < kDTypeClassCount; ++c) {
      std::string key(dtype_class_name(DTypeClass(c)));
      p.peak_gflops[size_t(c)] =
          number(g, key.c_str(), p.peak_gflops[size_t(c)], where + ".peak_gflops");
    }
  }
  p.memory_bandwidth_gbs = number(j, "memory_bandwidth_gbs", p.memory_bandwidth_gbs, where);
  p.launch_us = number(j, "launch_us", p.launch_us, where);
  p.segment_launch_us = number(j, "segment_launch_us", p.segment_launch_us, where);
  p.segment_saving_us = number(j, "segment_saving_us", p.segment_saving_us, where);
  if (j.contains("link")) {
    const json& l = object_at(j, "link", where);
    const std::string lw = where + ".link";
    LinkProfile& k = p.link;
    k.bandwidth_gbs = number(l, "bandwidth_gbs", k.bandwidth_gbs, lw);
    k.latency_us = number(l, "latency_us", k.latency_us, lw);
    k.to_host_bandwidth_gbs = number(l, "to_host_bandwidth_gbs", k.to_host_bandwidth_gbs, lw);
    k.to_host_latency_us = number(l, "to_host_latency_us", k.to_host_latency_us, lw);
    k.pinned_bandwidth_gbs = number(l, "pinned_bandwidth_gbs", k.pinned_bandwidth_gbs, lw);
    k.pinned_latency_us = number(l, "pinned_latency_us", k.pinned_latency_us, lw);
  }
  if (p.memory_bandwidth_gbs <= 0 || p.link.bandwidth_gbs <= 0) {
    bad(where + " bandwidths must be > 0");
  }
  if (j.contains("calibrated")) {
    if (!j.at("calibrated").is_boolean()) bad(where + ".calibrated must be true or false");
    p.calibrated = j.at("calibrated").get<bool>();
  }
  if (j.contains("op_samples")) {
    const json& ops = j.at("op_samples");
    if (!ops.is_array()) bad(where + ".op_samples must be an array");
    p.op_samples.clear();
    for (size_t i = 0; i < ops.size(); ++i) {
      const std::string w = where + ".op_samples[" + std::to_string(i) + "]";
      const OpKey key = parse_op_key(ops[i], w);
      if (!ops[i].contains("samples") || !ops[i].at("samples").is_array())
        bad(w + ".samples must be an array of [flops, bytes, us]");
      std::vector<OpSample>& samples = p.op_samples[key];
      for (const json& s : ops[i].at("samples")) {
        std::vector<double> v = numbers(s, w + ".samples[]");
        if (v.size() != 3 || !(v[2] > 0.0)) bad(w + ".samples[] must be [flops, bytes, us > 0]");
        samples.push_back({v[0], v[1], v[2]});
      }
      std::sort(samples.begin(), samples.end(), [](const OpSample& a, const OpSample& b) {
        return a.flops + a.bytes < b.flops + b.bytes;
      });
    }
  }
  if (j.contains("learned")) {
    const json& learned = j.at("learned");
    if (!learned.is_array()) bad(where + ".learned must be an array");
    p.learned.clear();
    for (size_t i = 0; i < learned.size(); ++i) {
      const std::string w = where + ".learned[" + std::to_string(i) + "]";
      const OpKey key = parse_op_key(learned[i], w);
      if (!learned[i].contains("bucket") || !learned[i].at("bucket").is_number_integer())
        bad(w + ".bucket must be an integer");
      if (!learned[i].contains("ratios")) bad(w + ".ratios is missing");
      std::vector<double> r = numbers(learned[i].at("ratios"), w + ".ratios");
      if (r.size() > kLearnedSamples) r.erase(r.begin(), r.end() - long(kLearnedSamples));
      p.learned[{key, learned[i].at("bucket").get<int>()}].ratios = std::move(r);
    }
  }
  return p;
}

json profile_to_json(const BackendProfile& p) {
  json g = json::object();
  for (int c = 0; c < kDTypeClassCount; ++c) {
    g[std::string(dtype_class_name(DTypeClass(c)))] = p.peak_gflops[size_t(c)];
  }
  const LinkProfile& k = p.link;
  json j = {{"peak_gflops", g},
            {"memory_bandwidth_gbs", p.memory_bandwidth_gbs},
            {"launch_us", p.launch_us},
            {"segment_launch_us", p.segment_launch_us},
            {"segment_saving_us", p.segment_saving_us},
            {"link",
             {{"bandwidth_gbs", k.bandwidth_gbs},
              {"latency_us", k.latency_us},
              {"to_host_bandwidth_gbs", k.to_host_bandwidth_gbs},
              {"to_host_latency_us", k.to_host_latency_us},
              {"pinned_bandwidth_gbs", k.pinned_bandwidth_gbs},
              {"pinned_latency_us", k.pinned_latency_us}}},
            {"calibrated", p.calibrated}};
  if (!p.op_samples.empty()) {
    json ops = json::array();
    for (const auto& [key, samples] : p.op_samples) {
      json e = op_key_json(key);
      e["samples"] = json::array();
      for (const OpSample& s : samples) e["samples"].push_back({s.flops, s.bytes, s.us});
      ops.push_back(std::move(e));
    }
    j["op_samples"] = std::move(ops);
  }
  if (!p.learned.empty()) {
    json learned = json::array();
    for (const auto& [kb, times] : p.learned) {
      json e = op_key_json(kb.first);
      e["bucket"] = kb.second;
      e["ratios"] = times.ratios;
      learned.push_back(std::move(e));
    }
    j["learned"] = std::move(learned);
  }
  return j;
}

}  // namespace detail

void CostModel::load_json(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) throw_error(ErrorCode::Format, "cost model json", "not valid JSON");
  if (!j.is_object() || !j.contains("profiles") || !j.at("profiles").is_object()) {
    throw_error(ErrorCode::Format, "cost model json", "expected {\"profiles\": {...}}");
  }
  // Parse everything first so a bad entry changes nothing.
  std::map<std::string, BackendProfile, std::less<>> parsed;
  for (const auto& [key, value] : j.at("profiles").items()) {
    // Fields left out keep the values of the entry's kind ("kind": "cpu"|"gpu"; guessed from
    // the key when absent: "gpu..." and "cuda..." are GPUs).
    bool gpu = key.rfind("gpu", 0) == 0 || key.rfind("cuda", 0) == 0;
    if (value.is_object() && value.contains("kind") && value.at("kind").is_string()) {
      gpu = value.at("kind").get<std::string>() == "gpu";
    }
    BackendProfile base = profile(key, gpu ? BackendKind::Gpu : BackendKind::Cpu);
    parsed[key] = detail::profile_from_json(value, base, "profiles." + key);
  }
  for (auto& [key, p] : parsed) profiles_[key] = p;
}

void CostModel::load_json_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw_error(ErrorCode::Io, "cost model json", "cannot open '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  load_json(ss.str());
}

std::string CostModel::to_json() const {
  json profiles = json::object();
  profiles["cpu"] = detail::profile_to_json(profile("cpu", BackendKind::Cpu));
  profiles["gpu"] = detail::profile_to_json(profile("gpu", BackendKind::Gpu));
  for (const auto& [key, p] : profiles_) profiles[key] = detail::profile_to_json(p);
  return json{{"profiles", profiles}}.dump(2);
}

}  // namespace tandem
