#include "tandem/cost_model.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

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
  p.link = {kDefaultLinkBandwidthGbs, kDefaultLinkLatencyUs};
  return p;
}

void CostModel::set_profile(std::string id_or_kind, const BackendProfile& profile) {
  profiles_[std::move(id_or_kind)] = profile;
}

BackendProfile CostModel::profile(std::string_view backend_id, BackendKind kind) const {
  if (auto it = profiles_.find(backend_id); it != profiles_.end()) return it->second;
  if (auto it = profiles_.find(backend_kind_name(kind)); it != profiles_.end()) return it->second;
  return default_profile(kind);
}

double CostModel::transfer_us(size_t bytes, const LinkProfile& link, int hops) {
  if (hops <= 0) return 0.0;
  return double(hops) * (double(bytes) / (link.bandwidth_gbs * 1e3) + link.latency_us);
}

OpCost CostModel::estimate(const Graph& graph, const Node& node, const BackendProfile& profile,
                           std::span<const uint8_t> input_hops, double weight_runs) {
  OpCost cost;
  if (!is_compute(node.op)) return cost;
  OpWork w = op_work(graph, node);
  double gflops = profile.peak_gflops[size_t(w.dtype_class)];
  double flop_us = gflops > 0 ? w.flops / (gflops * 1e3) : 0.0;
  double byte_us =
      profile.memory_bandwidth_gbs > 0 ? w.bytes / (profile.memory_bandwidth_gbs * 1e3) : 0.0;
  cost.compute_us = std::max(flop_us, byte_us) + profile.launch_us;

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
    const double runs = graph.node(s).op == OpKind::Weight ? weight_runs : 1.0;
    cost.transfer_us += transfer_us(bytes, profile.link, hops) / runs;
  }
  const TensorDesc& out = graph.tensor(node.id);
  if (!out.is_view()) cost.memory_bytes += out.bytes();
  return cost;
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

BackendProfile parse_profile(const json& j, BackendProfile p, const std::string& where) {
  if (!j.is_object()) {
    throw_error(ErrorCode::Format, "cost model json", where + " must be an object");
  }
  if (j.contains("peak_gflops")) {
    const json& g = j.at("peak_gflops");
    if (!g.is_object()) {
      throw_error(ErrorCode::Format, "cost model json", where + ".peak_gflops must be an object");
    }
    for (int c = 0; c < kDTypeClassCount; ++c) {
      std::string key(dtype_class_name(DTypeClass(c)));
      p.peak_gflops[size_t(c)] =
          number(g, key.c_str(), p.peak_gflops[size_t(c)], where + ".peak_gflops");
    }
  }
  p.memory_bandwidth_gbs = number(j, "memory_bandwidth_gbs", p.memory_bandwidth_gbs, where);
  p.launch_us = number(j, "launch_us", p.launch_us, where);
  if (j.contains("link")) {
    const json& l = j.at("link");
    if (!l.is_object()) {
      throw_error(ErrorCode::Format, "cost model json", where + ".link must be an object");
    }
    p.link.bandwidth_gbs = number(l, "bandwidth_gbs", p.link.bandwidth_gbs, where + ".link");
    p.link.latency_us = number(l, "latency_us", p.link.latency_us, where + ".link");
  }
  if (p.memory_bandwidth_gbs <= 0 || p.link.bandwidth_gbs <= 0) {
    throw_error(ErrorCode::Format, "cost model json", where + " bandwidths must be > 0");
  }
  return p;
}

json profile_json(const BackendProfile& p) {
  json g = json::object();
  for (int c = 0; c < kDTypeClassCount; ++c) {
    g[std::string(dtype_class_name(DTypeClass(c)))] = p.peak_gflops[size_t(c)];
  }
  return {{"peak_gflops", g},
          {"memory_bandwidth_gbs", p.memory_bandwidth_gbs},
          {"launch_us", p.launch_us},
          {"link", {{"bandwidth_gbs", p.link.bandwidth_gbs}, {"latency_us", p.link.latency_us}}}};
}

}  // namespace

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
    parsed[key] = parse_profile(value, base, "profiles." + key);
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
  profiles["cpu"] = profile_json(profile("cpu", BackendKind::Cpu));
  profiles["gpu"] = profile_json(profile("gpu", BackendKind::Gpu));
  for (const auto& [key, p] : profiles_) profiles[key] = profile_json(p);
  return json{{"profiles", profiles}}.dump(2);
}

}  // namespace tandem
