#include "op_compare.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace tandem::cpu::cpu_test {

namespace {

std::vector<uint8_t> random_tensor(const TensorDesc& d, const OpCase& c, std::mt19937& rng) {
  std::vector<uint8_t> bytes(d.bytes() + 64);
  const int64_t n = d.elements();
  if (d.dtype == DType::I32) {
    auto* p = reinterpret_cast<int32_t*>(bytes.data());
    if (c.increasing_ints) {
      std::uniform_int_distribution<int32_t> base(0, std::max<int32_t>(0, c.int_max - int32_t(n)));
      const int32_t b = base(rng);
      for (int64_t i = 0; i < n; ++i) p[i] = b + int32_t(i);
    } else {
      std::uniform_int_distribution<int32_t> dist(0, c.int_max - 1);
      for (int64_t i = 0; i < n; ++i) p[i] = dist(rng);
    }
    return bytes;
  }
  if (d.dtype == DType::I8) {
    std::uniform_int_distribution<int> dist(-128, 127);
    for (int64_t i = 0; i < n; ++i) bytes[size_t(i)] = uint8_t(dist(rng));
    return bytes;
  }
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = dist(rng);
  const int64_t row = d.ne[0];
  for (int64_t r = 0; r < d.rows(); ++r) {
    from_f32(d.dtype, values.data() + r * row, bytes.data() + r * d.nb[1], row);
  }
  return bytes;
}

std::vector<double> as_f64(const TensorDesc& d, const uint8_t* data) {
  std::vector<double> out;
  const int64_t row = d.ne[0];
  std::vector<float> tmp(static_cast<size_t>(row));
  for (int64_t r = 0; r < d.rows(); ++r) {
    if (d.dtype == DType::I32 || d.dtype == DType::I8) {
      for (int64_t i = 0; i < row; ++i) {
        out.push_back(d.dtype == DType::I32
                          ? double(reinterpret_cast<const int32_t*>(data + r * d.nb[1])[i])
                          : double(reinterpret_cast<const int8_t*>(data + r * d.nb[1])[i]));
      }
      continue;
    }
    to_f32(d.dtype, data + r * d.nb[1], tmp.data(), row);
    for (float v : tmp) out.push_back(v);
  }
  return out;
}

}  // namespace

double compare_with_reference(CpuBackend& cpu, const OpCase& c, uint32_t seed) {
  Graph g;
  const TensorId id = c.build(g);
  const Node& node = g.node(id);
  std::mt19937 rng(seed);
  // One buffer per storage owner, so views (strided copies) read their owner's bytes.
  std::vector<std::vector<uint8_t>> storage(g.size());
  std::vector<TensorRef> inputs;
  for (TensorId in : node.inputs) {
    const TensorId owner = g.storage_of(in);
    if (storage[size_t(owner)].empty())
      storage[size_t(owner)] = random_tensor(g.tensor(owner), c, rng);
    inputs.push_back({&g.tensor(in), storage[size_t(owner)].data() + g.tensor(in).view_offset});
  }
  const TensorDesc& od = g.tensor(id);
  std::vector<uint8_t> out_cpu(od.bytes() + 64, 0), out_ref(od.bytes() + 64, 0);
  if (node.op == OpKind::KvWrite) {  // the output aliases the cache: start from its contents
    std::memcpy(out_cpu.data(), inputs[0].data, od.bytes());
    std::memcpy(out_ref.data(), inputs[0].data, od.bytes());
  }
  NodeExecution e_cpu{&node, inputs, {&od, out_cpu.data()}};
  NodeExecution e_ref{&node, inputs, {&od, out_ref.data()}};
  cpu.execute(g, e_cpu);
  cpu.synchronize();
  reference_execute(g, e_ref);
  const std::vector<double> a = as_f64(od, out_ref.data()), b = as_f64(od, out_cpu.data());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += a[i] * a[i];
  }
  return den > 0.0 ? num / den : num;
}

double nmse_f32(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got) {
  const auto* a = reinterpret_cast<const float*>(want.data());
  const auto* b = reinterpret_cast<const float*>(got.data());
  double num = 0.0, den = 0.0;
  for (size_t j = 0; j < want.size() / sizeof(float); ++j) {
    num += double(a[j] - b[j]) * double(a[j] - b[j]);
    den += double(a[j]) * double(a[j]);
  }
  return num / den;
}

}  // namespace tandem::cpu::cpu_test
