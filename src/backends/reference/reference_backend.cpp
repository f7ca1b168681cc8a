#include "reference_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tandem/error.h"

namespace tandem {

namespace {

constexpr size_t kAlignment = 64;

// Reads a whole tensor (contiguous or strided) as float32, in logical order.
std::vector<float> load_f32(const TensorRef& t) {
  const TensorDesc& d = *t.desc;
  std::vector<float> out(size_t(d.elements()));
  const auto* base = static_cast<const uint8_t*>(t.data);
  const int64_t row = d.ne[0];
  size_t k = 0;
  for (int64_t i3 = 0; i3 < d.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < d.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < d.ne[1]; ++i1) {
        const uint8_t* p = base + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3];
        if (dtype_traits(d.dtype).is_quantized || d.nb[0] == dtype_traits(d.dtype).block_bytes) {
          to_f32(d.dtype, p, out.data() + k, row);
          k += size_t(row);
        } else {
          for (int64_t i0 = 0; i0 < row; ++i0) to_f32(d.dtype, p + i0 * d.nb[0], &out[k++], 1);
        }
      }
  return out;
}

// Writes float32 values, in logical order, into a contiguous tensor of any dtype.
void store_f32(const TensorRef& t, const std::vector<float>& values) {
  const TensorDesc& d = *t.desc;
  auto* base = static_cast<uint8_t*>(t.data);
  const int64_t row = d.ne[0];
  for (int64_t r = 0; r < d.rows(); ++r) {
    from_f32(d.dtype, values.data() + r * row, base + r * d.nb[1], row);
  }
}

float* f32(const TensorRef& t) {
  return static_cast<float*>(t.data);
}
const int32_t* i32(const TensorRef& t) {
  return static_cast<const int32_t*>(t.data);
}

void run_copy(const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& o = *e.output.desc;
  if (a.dtype == DType::I32 || a.dtype == DType::I8) {  // integer copies keep their bits
    size_t es = size_t(dtype_traits(a.dtype).block_bytes);
    auto* dst = static_cast<uint8_t*>(e.output.data);
    const auto* src = static_cast<const uint8_t*>(e.inputs[0].data);
    for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < a.ne[1]; ++i1)
          for (int64_t i0 = 0; i0 < a.ne[0]; ++i0) {
            std::memcpy(dst, src + i0 * a.nb[0] + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3], es);
            dst += es;
          }
    (void)o;
    return;
  }
  store_f32(e.output, load_f32(e.inputs[0]));
}

void run_get_rows(const NodeExecution& e) {
  const TensorDesc& table = *e.inputs[0].desc;
  const int32_t* ids = i32(e.inputs[1]);
  const int64_t n = e.inputs[1].desc->ne[0];
  const auto* base = static_cast<const uint8_t*>(e.inputs[0].data);
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = ids[i];
    if (r < 0 || r >= table.ne[1]) {
      throw_error(
          ErrorCode::InvalidArgument, "reference get_rows",
          "row id " + std::to_string(r) + " outside [0, " + std::to_string(table.ne[1]) + ")");
    }
    to_f32(table.dtype, base + r * table.nb[1], f32(e.output) + i * table.ne[0], table.ne[0]);
  }
}

void run_matmul(const NodeExecution& e) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const int64_t K = a.ne[0], M = a.ne[1], N = b.ne[1];
  const auto* abase = static_cast<const uint8_t*>(e.inputs[0].data);
  const float* bdata = f32(e.inputs[1]);
  float* out = f32(e.output);
  std::vector<float> arow(static_cast<size_t>(K));
  for (int64_t i3 = 0; i3 < b.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < b.ne[2]; ++i2) {
      const int64_t a2 = i2 / (b.ne[2] / a.ne[2]), a3 = i3 / (b.ne[3] / a.ne[3]);
      const float* bmat = bdata + (i3 * b.ne[2] + i2) * K * N;
      float* omat = out + (i3 * b.ne[2] + i2) * M * N;
      for (int64_t m = 0; m < M; ++m) {
        to_f32(a.dtype, abase + m * a.nb[1] + a2 * a.nb[2] + a3 * a.nb[3], arow.data(), K);
        for (int64_t n = 0; n < N; ++n) {
          double acc = 0.0;
          const float* bcol = bmat + n * K;
          for (int64_t k = 0; k < K; ++k) acc += double(arow[size_t(k)]) * double(bcol[k]);
          omat[n * M + m] = float(acc);
        }
      }
    }
}

template <typename F>
void run_binary(const NodeExecution& e, F f) {
  const TensorDesc& a = *e.inputs[0].desc;
  const TensorDesc& b = *e.inputs[1].desc;
  const float* x = f32(e.inputs[0]);
  const float* y = f32(e.inputs[1]);
  float* o = f32(e.output);
  for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < a.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < a.ne[0]; ++i0) {
          int64_t ia = ((i3 * a.ne[2] + i2) * a.ne[1] + i1) * a.ne[0] + i0;
          int64_t ib =
              (((i3 % b.ne[3]) * b.ne[2] + i2 % b.ne[2]) * b.ne[1] + i1 % b.ne[1]) * b.ne[0] +
              i0 % b.ne[0];
          o[ia] = f(x[ia], y[ib]);
        }
}

template <typename F>
void run_unary(const NodeExecution& e, F f) {
  const float* x = f32(e.inputs[0]);
  float* o = f32(e.output);
  for (int64_t i = 0; i < e.output.desc->elements(); ++i) o[i] = f(x[i]);
}

float silu(float x) {
  return float(double(x) / (1.0 + std::exp(-double(x))));
}
float gelu(float x) {
  // ggml's tanh approximation.
  constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;
  constexpr double kCoef = 0.044715;
  double v = x;
  return float(0.5 * v * (1.0 + std::tanh(kSqrt2OverPi * v * (1.0 + kCoef * v * v))));
}

void run_softmax(const NodeExecution& e) {
  const float scale = e.node->params.scale;
  const TensorDesc& a = *e.inputs[0].desc;
  const float* x = f32(e.inputs[0]);
  const float* mask = e.inputs.size() > 1 ? f32(e.inputs[1]) : nullptr;
  float* o = f32(e.output);
  const int64_t n = a.ne[0];
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t r = 0; r < a.rows(); ++r) {
    const int64_t i1 = r % a.ne[1];
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      v[size_t(i)] = double(x[r * n + i]) * scale + (mask ? double(mask[i1 * n + i]) : 0.0);
      mx = std::max(mx, v[size_t(i)]);
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      v[size_t(i)] = mx == -INFINITY ? 0.0 : std::exp(v[size_t(i)] - mx);
      sum += v[size_t(i)];
    }
    for (int64_t i = 0; i < n; ++i) o[r * n + i] = sum > 0 ? float(v[size_t(i)] / sum) : 0.0f;
  }
}

void run_norm(const NodeExecution& e, bool rms) {
  const float eps = e.node->params.eps;
  const TensorDesc& a = *e.inputs[0].desc;
  const float* x = f32(e.inputs[0]);
  const float* w = e.inputs.size() > 1 ? f32(e.inputs[1]) : nullptr;
  const float* b = e.inputs.size() > 2 ? f32(e.inputs[2]) : nullptr;
  float* o = f32(e.output);
  const int64_t n = a.ne[0];
  for (int64_t r = 0; r < a.rows(); ++r) {
    const float* xr = x + r * n;
    double mean = 0.0;
    if (!rms) {
      for (int64_t i = 0; i < n; ++i) mean += xr[i];
      mean /= double(n);
    }
    double var = 0.0;
    for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= double(n);
    const double inv = 1.0 / std::sqrt(var + double(eps));
    for (int64_t i = 0; i < n; ++i) {
      double y = (xr[i] - mean) * inv;
      if (w) y *= w[i];
      if (b) y += b[i];
      o[r * n + i] = float(y);
    }
  }
}

void run_rms_norm(const NodeExecution& e) {
  run_norm(e, true);
}
void run_layer_norm(const NodeExecution& e) {
  run_norm(e, false);
}

void run_rope(const NodeExecution& e) {
  const OpParams& p = e.node->params;
  const TensorDesc& a = *e.inputs[0].desc;
  const float* x = f32(e.inputs[0]);
  const int32_t* pos = i32(e.inputs[1]);
  float* o = f32(e.output);
  const int64_t d = a.ne[0];
  for (int64_t t = 0; t < a.ne[2]; ++t)
    for (int64_t h = 0; h < a.ne[1]; ++h) {
      const float* xr = x + (t * a.ne[1] + h) * d;
      float* orow = o + (t * a.ne[1] + h) * d;
      for (int64_t i = 0; i < d; ++i) orow[i] = xr[i];
      for (int64_t i = 0; i < p.n_rot; i += 2) {
        double theta = double(pos[t]) * std::pow(double(p.freq_base), -double(i) / p.n_rot);
        double c = std::cos(theta), s = std::sin(theta);
        double x0 = xr[i], x1 = xr[i + 1];
        orow[i] = float(x0 * c - x1 * s);
        orow[i + 1] = float(x0 * s + x1 * c);
      }
    }
}

void run_attention(const NodeExecution& e) {
  const float scale = e.node->params.scale;
  const TensorDesc& q = *e.inputs[0].desc;
  const TensorDesc& k = *e.inputs[1].desc;
  const std::vector<float> kf = load_f32(e.inputs[1]);
  const std::vector<float> vf = load_f32(e.inputs[2]);
  const float* qd = f32(e.inputs[0]);
  const int32_t* pos = i32(e.inputs[3]);
  float* o = f32(e.output);
  const int64_t D = q.ne[0], Hq = q.ne[1], T = q.ne[2], Hkv = k.ne[1], C = k.ne[2];
  const int64_t group = Hq / Hkv;
  std::vector<double> score(static_cast<size_t>(C)), acc(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    if (pos[t] < 0 || pos[t] >= C) {
      throw_error(ErrorCode::InvalidArgument, "reference attention",
                  "position " + std::to_string(pos[t]) + " outside the cache [0, " +
                      std::to_string(C) + ")");
    }
    const int64_t n_kv = int64_t(pos[t]) + 1;
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / group;
      const float* qr = qd + (t * Hq + h) * D;
      double mx = -INFINITY;
      for (int64_t j = 0; j < n_kv; ++j) {
        const float* kr = kf.data() + (j * Hkv + hk) * D;
        double s = 0.0;
        for (int64_t i = 0; i < D; ++i) s += double(qr[i]) * double(kr[i]);
        score[size_t(j)] = s * scale;
        mx = std::max(mx, score[size_t(j)]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n_kv; ++j) {
        double w = std::exp(score[size_t(j)] - mx);
        sum += w;
        const float* vr = vf.data() + (j * Hkv + hk) * D;
        for (int64_t i = 0; i < D; ++i) acc[size_t(i)] += w * vr[i];
      }
      float* orow = o + (t * Hq + h) * D;
      for (int64_t i = 0; i < D; ++i) orow[i] = float(acc[size_t(i)] / sum);
    }
  }
}

void run_kv_write(const NodeExecution& e) {
  const TensorDesc& cache = *e.output.desc;
  const TensorDesc& src = *e.inputs[1].desc;
  const float* s = f32(e.inputs[1]);
  const int32_t* pos = i32(e.inputs[2]);
  auto* base = static_cast<uint8_t*>(e.output.data);
  const int64_t row = src.ne[0] * src.ne[1];  // one token's [head_dim, kv_heads]
  for (int64_t t = 0; t < src.ne[2]; ++t) {
    if (pos[t] < 0 || pos[t] >= cache.ne[2]) {
      throw_error(ErrorCode::InvalidArgument, "reference kv_write",
                  "position " + std::to_string(pos[t]) + " outside the cache [0, " +
                      std::to_string(cache.ne[2]) + ")");
    }
    from_f32(cache.dtype, s + t * row, base + pos[t] * cache.nb[2], row);
  }
}

void run_add(const NodeExecution& e) {
  run_binary(e, [](float a, float b) { return a + b; });
}
void run_mul(const NodeExecution& e) {
  run_binary(e, [](float a, float b) { return a * b; });
}
void run_scale(const NodeExecution& e) {
  run_unary(e, [s = e.node->params.scale](float x) { return x * s; });
}
void run_silu(const NodeExecution& e) {
  run_unary(e, silu);
}
void run_gelu(const NodeExecution& e) {
  run_unary(e, gelu);
}
void run_swiglu(const NodeExecution& e) {
  const float* g = f32(e.inputs[0]);
  const float* u = f32(e.inputs[1]);
  float* o = f32(e.output);
  for (int64_t i = 0; i < e.output.desc->elements(); ++i) o[i] = silu(g[i]) * u[i];
}
void run_dequantize(const NodeExecution& e) {
  store_f32(e.output, load_f32(e.inputs[0]));
}

KernelTable<ReferenceKernel> builtin_kernels() {
  const std::vector<DType> floats{DType::F32, DType::F16, DType::BF16};
  const std::vector<DType> convertible{DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                                       DType::Q4_0};
  KernelTable<ReferenceKernel> t;
  t.add(OpKind::Copy, convertible, run_copy);
  t.add(OpKind::Copy, {DType::I32}, run_copy);
  t.add(OpKind::Copy, {DType::I8}, run_copy);
  for (DType d : convertible) t.add(OpKind::GetRows, {d, DType::I32, DType::F32}, run_get_rows);
  for (DType d : floats) t.add(OpKind::MatMul, {d, DType::F32}, run_matmul);
  t.add(OpKind::QuantizedMatMul, {DType::Q8_0, DType::F32}, run_matmul);
  t.add(OpKind::QuantizedMatMul, {DType::Q4_0, DType::F32}, run_matmul);
  t.add(OpKind::Add, {DType::F32}, run_add);
  t.add(OpKind::Mul, {DType::F32}, run_mul);
  t.add(OpKind::Scale, {DType::F32}, run_scale);
  t.add(OpKind::Softmax, {DType::F32}, run_softmax);
  t.add(OpKind::RmsNorm, {DType::F32}, run_rms_norm);
  t.add(OpKind::LayerNorm, {DType::F32}, run_layer_norm);
  t.add(OpKind::Silu, {DType::F32}, run_silu);
  t.add(OpKind::Gelu, {DType::F32}, run_gelu);
  t.add(OpKind::SwiGlu, {DType::F32}, run_swiglu);
  t.add(OpKind::Rope, {DType::F32, DType::I32}, run_rope);
  t.add(OpKind::Attention, {DType::F32, DType::I32}, run_attention);
  t.add(OpKind::Attention, {DType::F32, DType::F16, DType::I32}, run_attention);
  for (DType d : {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16}) {
    t.add(OpKind::Dequantize, {d, DType::F32}, run_dequantize);
  }
  t.add(OpKind::KvWrite, {DType::F32, DType::I32}, run_kv_write);
  t.add(OpKind::KvWrite, {DType::F16, DType::F32, DType::I32}, run_kv_write);
  return t;
}

}  // namespace

MemoryInfo HostBackend::memory() const {
  long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
  long page = sysconf(_SC_PAGE_SIZE);
  return {size_t(pages) * size_t(page), size_t(avail) * size_t(page)};
}

Buffer HostBackend::allocate(size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) {
    throw_error(ErrorCode::OutOfMemory, backend_id() + " allocate",
                "out of memory (need " + std::to_string(bytes) + " bytes)");
  }
  return Buffer(this, p, bytes);
}

void HostBackend::free_buffer(void* data, size_t) {
  std::free(data);
}
void HostBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void HostBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void HostBackend::copy_within(void* dst, const void* src, size_t bytes) {
  std::memmove(dst, src, bytes);
}

KernelTable<ReferenceKernel>& reference_kernels() {
  static KernelTable<ReferenceKernel> table = builtin_kernels();
  return table;
}

std::vector<OpCapability> ReferenceBackend::reference_capabilities() {
  return reference_kernels().capabilities();
}

ReferenceBackend::ReferenceBackend() : HostBackend("reference"), kernels_(reference_kernels()) {}

void ReferenceBackend::execute(const Graph& graph, const NodeExecution& exec) {
  CapabilityCheck c = check(graph, *exec.node);
  const ReferenceKernel* kernel = kernels_.find(exec, features());
  if (!c.ok() || !kernel) throw_error(ErrorCode::Unsupported, "reference", c.detail);
  (*kernel)(exec);
}

void reference_execute(const Graph& graph, const NodeExecution& e) {
  (void)graph;
  const ReferenceKernel* kernel = reference_kernels().find(e, {});
  if (!kernel) {
    throw_error(ErrorCode::Unsupported, "reference",
                "op " + std::string(op_name(e.node->op)) + " is not executable");
  }
  (*kernel)(e);
}

std::shared_ptr<Backend> make_reference_backend() {
  return std::make_shared<ReferenceBackend>();
}

}  // namespace tandem
