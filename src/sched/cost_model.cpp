#include "tandem/cost_model.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/error.h"

namespace tandem {

DTypeClass dtype_class(DType dtype) {
  switch (dtype) {
    case DType::F16:
    case DType::BF16:
      return DTypeClass::F16;
    case DType::I8:
    case DType::Q8_0:
    case DType::Q4_0:
      return DTypeClass::Quantized;
    default:
      return DTypeClass::F32;
  }
}

std::string_view dtype_class_name(DTypeClass c) {
  switch (c) {
    case DTypeClass::F32:
      return "f32";
    case DTypeClass::F16:
      return "f16";
    case DTypeClass::Quantized:
      return "quantized";
  }
  return "unknown";
}

size_t data_bytes(const TensorDesc& desc) {
  return row_bytes(desc.dtype, desc.ne[0]) * size_t(desc.rows());
}

OpWork op_work(const Graph& graph, const Node& node) {
  OpWork w;
  if (!is_compute(node.op)) return w;
  auto in = [&](size_t i) -> const TensorDesc& { return graph.tensor(node.inputs[i]); };
  const TensorDesc& out = graph.tensor(node.id);
  const auto n = double(out.elements());
  double in_bytes = 0.0;
  for (TensorId id : node.inputs) in_bytes += double(data_bytes(graph.tensor(id)));
  // Most ops read every input once and write their output once.
  w.bytes = in_bytes + double(data_bytes(out));
  switch (node.op) {
    case OpKind::Copy:
      w.flops = in(0).dtype == out.dtype ? 0.0 : n;  // one conversion per element
      break;
    case OpKind::GetRows: {
      // Only the selected rows of the table are read.
      const TensorDesc& table = in(0);
      w.bytes = double(data_bytes(in(1))) +
                double(in(1).ne[0]) * double(row_bytes(table.dtype, table.ne[0])) +
                double(data_bytes(out));
      w.dtype_class = dtype_class(table.dtype);
      break;
    }
    case OpKind::MatMul:
    case OpKind::QuantizedMatMul: {
      const TensorDesc &a = in(0), &b = in(1);
      w.flops = 2.0 * double(a.ne[0]) * double(a.ne[1]) * double(b.ne[1]) * double(b.ne[2]) *
                double(b.ne[3]);
      w.dtype_class = dtype_class(a.dtype);
      break;
    }
    case OpKind::Add:
    case OpKind::Mul:
    case OpKind::Scale:
      w.flops = n;
      break;
    case OpKind::Silu:
      w.flops = 4.0 * n;  // negate, exp, add, divide
      break;
    case OpKind::Gelu:
      w.flops = 8.0 * n;  // the tanh approximation
      break;
    case OpKind::SwiGlu:
      w.flops = 5.0 * n;  // silu then multiply
      break;
    case OpKind::Softmax:
      // scale, max, subtract, exp, sum, divide (+ mask add)
      w.flops = (6.0 + (node.inputs.size() > 1 ? 1.0 : 0.0)) * n;
      break;
    case OpKind::RmsNorm:
      w.flops = (3.0 + (node.inputs.size() > 1 ? 1.0 : 0.0)) * n;  // square, add, scale [* w]
      break;
    case OpKind::LayerNorm:
      // mean add, subtract, square, add, scale [* w] [+ b]
      w.flops = (5.0 + double(node.inputs.size() - 1)) * n;
      break;
    case OpKind::Rope:
      // 6 per rotated pair (4 multiplies, 2 adds), n_rot/2 pairs per row
      w.flops = 3.0 * double(node.params.n_rot) * double(in(0).rows());
      break;
    case OpKind::Attention: {
      // Every query head attends over the whole cache length C (positions are data, so C is
      // the planning bound): 2D for q.k, 2D for p.v, 5 for scale, max, exp, sum, divide.
      const TensorDesc &q = in(0), &k = in(1);
      const double D = double(q.ne[0]), Hq = double(q.ne[1]), T = double(q.ne[2]),
                   C = double(k.ne[2]);
      w.flops = Hq * T * C * (4.0 * D + 5.0);
      w.dtype_class = DTypeClass::F32;
      break;
    }
    case OpKind::Dequantize:
      w.flops = n;  // one scale multiply per element
      w.dtype_class = dtype_class(in(0).dtype);
      break;
    case OpKind::KvWrite: {
      // Reads src and positions, writes T rows of the cache (not the whole cache).
      const TensorDesc &cache = in(0), &src = in(1);
      w.bytes = double(data_bytes(src)) + double(data_bytes(in(2))) +
                double(src.ne[2]) * double(row_bytes(cache.dtype, cache.ne[0] * cache.ne[1]));
      break;
    }
    default:
      break;
  }
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
